// Metrics: JSON-lines records of a run (--metrics run.jsonl), one object per line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ddpv {

// One JSON object built field by field, in insertion order:
//   JsonRecord r; r.add("event", "step").add("loss", 0.25).add("step", int64_t{10});
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, const std::string& value);
  JsonRecord& add(const std::string& key, const char* value);
  JsonRecord& add(const std::string& key, double value);  // NaN/Inf written as null
  JsonRecord& add(const std::string& key, int64_t value);
  JsonRecord& add(const std::string& key, int value) { return add(key, int64_t{value}); }
  JsonRecord& add(const std::string& key, bool value);
  JsonRecord& add(const std::string& key, const std::vector<double>& values);  // a JSON array
  std::string str() const;  // {"event": "step", "loss": 0.25, "step": 10}

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // key, encoded value
};

std::string json_escape(const std::string& s);

// Appends records to a file, one line each, flushed per line so a killed run keeps what it
// logged. An empty path makes a writer that does nothing (ranks other than 0, or no --metrics).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: keep existing lines (a resumed run continues the same file).
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  void write(const JsonRecord& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ddpv

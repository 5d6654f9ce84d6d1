// Metrics: JSON encoding of one record per line, and the line-buffered writer of --metrics.
#include "ddpv/train/metrics.hpp"

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <utility>

#include "ddpv/core/error.hpp"

namespace ddpv {

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {  // other control characters
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;  // printable ASCII and UTF-8 bytes pass through unchanged
        }
    }
  }
  return out;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  // Built by append: GCC 12 flags `"literal" + std::string&&` with a false -Wrestrict.
  std::string encoded = "\"";
  encoded += json_escape(value);
  encoded += '"';
  fields_.emplace_back(key, std::move(encoded));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const char* value) {
  return add(key, std::string(value ? value : ""));
}

namespace {

std::string json_number(double value) {
  // JSON has no NaN or Infinity; null keeps the line parseable and says "no value".
  if (!std::isfinite(value)) return "null";
  // 9 significant digits round-trip every float and keep lines short; %g never prints a bare
  // "inf" or a trailing "." here, so the result is always a valid JSON number.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  return buf;
}

}  // namespace

JsonRecord& JsonRecord::add(const std::string& key, double value) {
  fields_.emplace_back(key, json_number(value));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, int64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%" PRId64, value);
  fields_.emplace_back(key, buf);
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::vector<double>& values) {
  std::string encoded = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) encoded += ", ";
    encoded += json_number(values[i]);
  }
  encoded += ']';
  fields_.emplace_back(key, std::move(encoded));
  return *this;
}

std::string JsonRecord::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i > 0) out += ", ";
    out += '"';
    out += json_escape(fields_[i].first);
    out += "\": ";
    out += fields_[i].second;
  }
  out += '}';
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  DDPV_CHECK(file_ != nullptr, "cannot open metrics file ", path,
             " for writing: ", std::strerror(errno),
             " (check --metrics and that its directory exists)");
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);  // a failed close cannot be reported from here
}

void MetricsWriter::write(const JsonRecord& record) {
  if (file_ == nullptr) return;
  const std::string line = record.str() + "\n";
  // One fwrite and one fflush per record, so a killed run leaves only whole lines behind.
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  DDPV_CHECK(ok, "writing metrics file ", path_, " failed: ", std::strerror(errno));
}

}  // namespace ddpv

// Metrics JSON lines: exact encodings worked out by hand, and a file parsed back by Python's json.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "ddpv/train/metrics.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JsonEscape, HandlesQuotesBackslashesControlsAndUtf8) {
  EXPECT_EQ(json_escape("plain"), "plain");
  EXPECT_EQ(json_escape("a\"b"), "a\\\"b");
  EXPECT_EQ(json_escape("c:\\dir"), "c:\\\\dir");
  EXPECT_EQ(json_escape("l1\nl2\r\t"), "l1\\nl2\\r\\t");
  EXPECT_EQ(json_escape(std::string("\b\f", 2)), "\\b\\f");
  EXPECT_EQ(json_escape(std::string("\x01\x1f", 2)), "\\u0001\\u001f");
  EXPECT_EQ(json_escape(std::string("nul\0x", 5)), "nul\\u0000x");
  EXPECT_EQ(json_escape("\x7f"), "\x7f");  // DEL is legal inside a JSON string
  EXPECT_EQ(json_escape("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x9a\x80"),
            "caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x9a\x80");  // UTF-8 passes through
}

TEST(JsonRecord, EncodesEachTypeExactly) {
  JsonRecord r;
  r.add("event", "step").add("loss", 0.25).add("step", int64_t{10}).add("epoch", 2);
  EXPECT_EQ(r.str(), "{\"event\": \"step\", \"loss\": 0.25, \"step\": 10, \"epoch\": 2}");

  JsonRecord n;
  n.add("nan", std::numeric_limits<double>::quiet_NaN())
      .add("inf", std::numeric_limits<double>::infinity())
      .add("ninf", -std::numeric_limits<double>::infinity())
      .add("yes", true)
      .add("no", false)
      .add("big", int64_t{-9007199254740993})
      .add("tiny", 1.5e-7)
      .add("third", 1.0 / 3.0)
      .add("whole", 3.0)
      .add("k\"ey", std::string("v\\al"));
  EXPECT_EQ(n.str(),
            "{\"nan\": null, \"inf\": null, \"ninf\": null, \"yes\": true, \"no\": false, "
            "\"big\": -9007199254740993, \"tiny\": 1.5e-07, \"third\": 0.333333333, "
            "\"whole\": 3, \"k\\\"ey\": \"v\\\\al\"}");
  EXPECT_EQ(JsonRecord().str(), "{}");
}

TEST(JsonRecord, EncodesArraysOfNumbers) {
  JsonRecord r;
  r.add("busy", std::vector<double>{1.5, 0.25, 3.0})
      .add("none", std::vector<double>{})
      .add("odd", std::vector<double>{std::numeric_limits<double>::quiet_NaN(), -2e-10});
  EXPECT_EQ(r.str(), "{\"busy\": [1.5, 0.25, 3], \"none\": [], \"odd\": [null, -2e-10]}");
}

TEST(JsonRecord, NineSignificantDigitsRoundTripFloats) {
  for (float f : {0.1f, 1.0f / 3.0f, 2.3025851f, 123456.789f, 1e-30f, 3.4e38f}) {
    JsonRecord r;
    r.add("v", static_cast<double>(f));
    const std::string s = r.str();
    const float back = std::strtof(s.c_str() + 6, nullptr);  // after {"v":
    EXPECT_EQ(back, f) << s;
  }
}

TEST(MetricsWriter, DisabledWithEmptyPath) {
  MetricsWriter w;
  EXPECT_FALSE(w.enabled());
  w.write(JsonRecord().add("event", "step"));  // a no-op
  MetricsWriter w2("");
  EXPECT_FALSE(w2.enabled());
}

TEST(MetricsWriter, OneLinePerRecordFlushedAndAppendable) {
  test::TempDir dir;
  const std::string path = dir.file("run.jsonl");
  {
    MetricsWriter w(path);
    EXPECT_TRUE(w.enabled());
    EXPECT_EQ(w.path(), path);
    w.write(JsonRecord().add("event", "step").add("step", 1).add("loss", 2.5));
    // Flushed per line: readable while the writer is still open (a killed run keeps it).
    EXPECT_EQ(read_lines(path),
              std::vector<std::string>{"{\"event\": \"step\", \"step\": 1, \"loss\": 2.5}"});
    w.write(JsonRecord().add("event", "epoch").add("val_acc", 0.5));
  }
  {
    MetricsWriter w(path, /*append=*/true);
    w.write(JsonRecord().add("event", "summary").add("epochs", 2));
  }
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "{\"event\": \"epoch\", \"val_acc\": 0.5}");
  EXPECT_EQ(lines[2], "{\"event\": \"summary\", \"epochs\": 2}");
  {
    MetricsWriter w(path);  // not append: starts over
    w.write(JsonRecord().add("event", "step"));
  }
  EXPECT_EQ(read_lines(path).size(), 1u);
}

TEST(MetricsWriter, BadPathNamesIt) {
  try {
    MetricsWriter w("/nonexistent-dir/x/run.jsonl");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/nonexistent-dir/x/run.jsonl"), std::string::npos) << e.what();
  }
}

// An independent parser: Python's json module reads every line back with the values we wrote.
TEST(MetricsWriter, PythonJsonParsesEveryLine) {
  const char* python = "/usr/bin/python3";
  if (std::system("/usr/bin/python3 -c 'import json' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << python << " with the json module is not available";
  test::TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsWriter w(path);
    w.write(JsonRecord()
                .add("event", "step")
                .add("name", std::string("q\"b\\s\n\t\x01 caf\xc3\xa9"))
                .add("loss", 0.693147182)
                .add("lr", 1e-05)
                .add("bad", std::numeric_limits<double>::quiet_NaN())
                .add("step", int64_t{1} << 40)
                .add("ok", true));
    w.write(JsonRecord().add("event", "summary").add("images_per_s", 1234.5));
  }
  const std::string script = dir.file("check.py");
  std::ofstream(script)
      << "import json, sys\n"
         "lines = open(sys.argv[1], encoding='utf-8').read().splitlines()\n"
         "a, b = [json.loads(l) for l in lines]\n"
         "assert list(a) == ['event', 'name', 'loss', 'lr', 'bad', 'step', 'ok'], list(a)\n"
         "assert a['name'] == 'q\"b\\\\s\\n\\t\\x01 caf\\u00e9', repr(a['name'])\n"
         "assert a['loss'] == 0.693147182 and a['lr'] == 1e-05, a\n"
         "assert a['bad'] is None and a['step'] == 2**40 and a['ok'] is True, a\n"
         "assert b == {'event': 'summary', 'images_per_s': 1234.5}, b\n"
         "print('ok')\n";
  const std::string cmd = std::string(python) + " " + script + " " + path + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "ok\n");
}

}  // namespace
}  // namespace ddpv

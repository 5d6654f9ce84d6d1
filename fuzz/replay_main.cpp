// ddpv-fuzz-replay: runs files through the fuzz targets without libFuzzer (Note [One source,
// two programs]).
//   ddpv-fuzz-replay FUZZ_DIR              every target over FUZZ_DIR/corpus/<target>/* and
//                                          FUZZ_DIR/regressions/<target>/*
//   ddpv-fuzz-replay --target NAME FILE... the files through one target
// A target that has no input at all is an error, so none goes unexercised unnoticed.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

namespace fs = std::filesystem;
using ddpv::fuzz::Target;

namespace {

std::vector<uint8_t> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

const Target* find(const std::string& name) {
  for (const Target& t : ddpv::fuzz::targets())
    if (name == t.name) return &t;
  return nullptr;
}

int run(const Target& t, const fs::path& file) {
  const std::vector<uint8_t> bytes = read_all(file);
  // An empty vector's data() may be null; libFuzzer never passes null.
  const uint8_t empty = 0;
  return t.fn(bytes.empty() ? &empty : bytes.data(), bytes.size());
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::sort(ddpv::fuzz::targets().begin(), ddpv::fuzz::targets().end(),
            [](const Target& a, const Target& b) { return std::strcmp(a.name, b.name) < 0; });
  if (argc >= 3 && std::strcmp(argv[1], "--target") == 0) {
    const Target* t = find(argv[2]);
    if (!t) {
      std::fprintf(stderr, "ddpv-fuzz-replay: no target '%s'\n", argv[2]);
      return 2;
    }
    for (int i = 3; i < argc; ++i) run(*t, argv[i]);
    std::printf("ddpv-fuzz-replay: %s: %d inputs, no crash\n", t->name, argc - 3);
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: ddpv-fuzz-replay FUZZ_DIR | --target NAME FILE...\n");
    return 2;
  }
  const fs::path dir = argv[1];
  int failed = 0, total = 0;
  for (const Target& t : ddpv::fuzz::targets()) {
    int n = 0;
    for (const char* kind : {"corpus", "regressions"})
      for (const fs::path& f : files_in(dir / kind / t.name)) {
        std::printf("%s %s\n", t.name, f.lexically_relative(dir).c_str());
        std::fflush(stdout);
        run(t, f);
        ++n;
      }
    std::printf("ddpv-fuzz-replay: %s: %d inputs, no crash\n", t.name, n);
    if (n == 0) {
      std::fprintf(stderr, "ddpv-fuzz-replay: target %s has no input under %s/{corpus,regressions}/%s\n",
                   t.name, dir.c_str(), t.name);
      ++failed;
    }
    total += n;
  }
  std::printf("ddpv-fuzz-replay: %d inputs through %zu targets\n", total,
              ddpv::fuzz::targets().size());
  return failed ? 1 : 0;
}

// ddpv-convert: subcommand dispatch and the one place that turns errors into exit codes.
#include <csignal>
#include <cstdio>
#include <iostream>

#include "convert.hpp"
#include "ddpv/core/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: ddpv-convert <command> [options]   (ddpv-convert <command> --help for its options)\n"
    "\n"
    "commands:\n"
    "  idx      MNIST-family IDX files (gzip or raw) -> image store\n"
    "  cifar    CIFAR-10 / CIFAR-100 binary batches -> image store\n"
    "  folder   root/<class>/<image> tree of JPEG and PNG files -> image store\n"
    "  inspect  print a store's summary and check every invariant\n"
    "\n"
    "exit status: 0 success, 1 bad data or I/O error, 2 usage error\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace ddpv::convert;
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  // Under `ulimit -f` (RLIMIT_FSIZE, set by some batch systems) a write past the limit raises
  // SIGXFSZ, which kills with a core dump; ignored, the write fails with EFBIG and is reported
  // as one line, like a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  const Args args(argv + 2, argv + argc);
  try {
    if (command == "idx") return run_idx(args);
    if (command == "cifar") return run_cifar(args);
    if (command == "folder") return run_folder(args);
    if (command == "inspect") return run_inspect(args);
    std::cerr << "ddpv-convert: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "ddpv-convert " << command << ": " << e.what() << " (see ddpv-convert " << command
              << " --help)\n";
    return 2;
  } catch (const ddpv::Error& e) {
    std::cerr << "ddpv-convert " << command << ": error: " << e.message() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ddpv-convert " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}

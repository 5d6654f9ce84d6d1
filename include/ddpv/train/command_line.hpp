// ddpv-train's command line: the options, a --config file of `key = value` lines, and their
// checks, apart from main() so that tests and the config fuzz target parse what users write
// exactly as the program does.
#pragma once

#include <iosfwd>
#include <string>

#include "ddpv/train/options.hpp"

namespace ddpv {

struct CommandLine {
  enum Action { kTrain, kHelp, kVersion };
  Action action = kTrain;
  TrainOptions options;  // parsed and validated (validate_options) for kTrain
  std::string help;      // the usage text, for kHelp
};

// Parses argv[1..argc) and, when --config FILE is given, that file (the command line wins).
// Every mistake, in either, throws UsageError with one line: an unknown or malformed option, an
// unreadable config file, a value validate_options() refuses.
CommandLine parse_command_line(int argc, const char* const* argv);
// The same with the config text read from `config` (no --config option is opened).
CommandLine parse_command_line(int argc, const char* const* argv, std::istream& config);

}  // namespace ddpv

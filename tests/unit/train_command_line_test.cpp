// ddpv-train's command line as users write it: the options that are choices (Note [Choices])
// parse into their enums from the command line and a config file, refuse any other word naming
// the ones they take, and print back as words that parse to the same values.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "ddpv/train/command_line.hpp"

namespace ddpv {
namespace {

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddpv-train");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

CommandLine parse_config(const std::string& text) {
  std::istringstream in(text);
  const char* argv[] = {"ddpv-train", "--synthetic"};
  return parse_command_line(2, argv, in);
}

std::string refusal(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(CommandLine, ChoicesParseIntoTheirEnums) {
  const TrainOptions d = parse({"--synthetic"}).options;
  EXPECT_EQ(d.device, DeviceChoice::kAuto);
  EXPECT_EQ(d.precision, Precision::kF32);
  EXPECT_EQ(d.reduce_dtype, ReduceDtype::kF32);
  EXPECT_EQ(d.lr_schedule, LrShape::kCosine);
  EXPECT_EQ(d.mpi_progress, MpiProgress::kNonBlocking);

  const TrainOptions o = parse({"--synthetic", "--device", "cpu", "--reduce-dtype", "bf16",
                                "--lr-schedule", "step", "--mpi-progress", "thread"})
                             .options;
  EXPECT_EQ(o.device, DeviceChoice::kCpu);
  EXPECT_EQ(o.reduce_dtype, ReduceDtype::kBF16);
  EXPECT_EQ(o.lr_schedule, LrShape::kStep);
  EXPECT_EQ(o.mpi_progress, MpiProgress::kThread);

  const TrainOptions c = parse_config("lr-schedule = constant\nreduce-dtype = bf16\n").options;
  EXPECT_EQ(c.lr_schedule, LrShape::kConstant);
  EXPECT_EQ(c.reduce_dtype, ReduceDtype::kBF16);
  // The command line wins over the file.
  std::istringstream in("lr-schedule = constant\n");
  const char* argv[] = {"ddpv-train", "--synthetic", "--lr-schedule", "step"};
  EXPECT_EQ(parse_command_line(4, argv, in).options.lr_schedule, LrShape::kStep);
}

TEST(CommandLine, AnUnknownWordIsRefusedNamingTheOptionAndItsWords) {
  struct Case {
    const char* option;
    const char* words;
  };
  for (const Case& c : {Case{"--device", "auto, cpu or cuda"},
                        Case{"--precision", "fp32, bf16 or fp16"},
                        Case{"--reduce-dtype", "fp32 or bf16"},
                        Case{"--lr-schedule", "constant, step or cosine"},
                        Case{"--mpi-progress", "nonblocking or thread"}}) {
    const std::string e = refusal({"--synthetic", c.option, "linear"});
    EXPECT_NE(e.find(c.option), std::string::npos) << e;
    EXPECT_NE(e.find("'linear'"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("use ") + c.words), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  }
  // Words are exact: no case folding, no prefixes.
  EXPECT_NE(refusal({"--synthetic", "--precision", "BF16"}), "no error");
  EXPECT_NE(refusal({"--synthetic", "--lr-schedule", "cos"}), "no error");
  // In a config file the option is named as it is written there.
  try {
    parse_config("mpi-progress = threads\n");
    FAIL() << "mpi-progress = threads was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("mpi-progress"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nonblocking or thread"), std::string::npos) << e.what();
  }
}

// Note [Tuning options]: the backend switches are options, each refused on the backend it
// does not tune.
TEST(CommandLine, TuningOptionsParseAndNameTheirBackend) {
  const TrainOptions d = parse({"--synthetic"}).options;
  EXPECT_EQ(d.cpu_layout, CpuLayout::kBlocked);
  EXPECT_EQ(d.cpu_conv, ConvAlgorithm::kAuto);
  EXPECT_FALSE(d.no_fuse);
  EXPECT_EQ(d.cuda_bn, BatchNormPath::kEx);
  const TrainOptions o = parse({"--synthetic", "--device", "cpu", "--cpu-layout", "nhwc",
                                "--cpu-conv", "winograd", "--no-fuse"})
                             .options;
  EXPECT_EQ(o.cpu_layout, CpuLayout::kNhwc);
  EXPECT_EQ(o.cpu_conv, ConvAlgorithm::kWinograd);
  EXPECT_TRUE(o.no_fuse);
  const TrainOptions c = parse_config("cpu-conv = direct\nno-fuse = true\n").options;
  EXPECT_EQ(c.cpu_conv, ConvAlgorithm::kDirect);
  EXPECT_TRUE(c.no_fuse);
  const TrainOptions back = parse_config(options_to_config(o)).options;
  EXPECT_EQ(back.cpu_layout, o.cpu_layout);
  EXPECT_EQ(back.cpu_conv, o.cpu_conv);
  EXPECT_EQ(back.no_fuse, o.no_fuse);
  EXPECT_EQ(back.cuda_bn, o.cuda_bn);
  EXPECT_EQ(d.cpu_bf16, CpuBf16::kAuto);
  const TrainOptions f =
      parse({"--synthetic", "--precision", "bf16", "--cpu-bf16", "fallback"}).options;
  EXPECT_EQ(f.cpu_bf16, CpuBf16::kFallback);
  EXPECT_EQ(parse_config(options_to_config(f)).options.cpu_bf16, CpuBf16::kFallback);
  EXPECT_EQ(parse_config("precision = bf16\ncpu-bf16 = onednn\n").options.cpu_bf16,
            CpuBf16::kOneDnn);

  std::string e = refusal({"--synthetic", "--cpu-conv", "fft"});
  EXPECT_NE(e.find("use auto, direct or winograd"), std::string::npos) << e;
  e = refusal({"--synthetic", "--cpu-bf16", "amx"});
  EXPECT_NE(e.find("use auto, onednn or fallback"), std::string::npos) << e;
  e = refusal({"--synthetic", "--cpu-bf16", "onednn"});  // fp32: the switch would do nothing
  EXPECT_NE(e.find("add --precision bf16"), std::string::npos) << e;
  e = refusal({"--synthetic", "--cuda-bn", "fast"});
  EXPECT_NE(e.find("use ex or legacy"), std::string::npos) << e;
  e = refusal({"--synthetic", "--device", "cpu", "--cuda-bn", "legacy"});
  EXPECT_NE(e.find("--cuda-bn tunes the CUDA backend"), std::string::npos) << e;
  try {  // a CPU switch on a CUDA run, as validation sees it
    TrainOptions g;
    g.synthetic = true;
    g.no_fuse = true;
    validate_options(g, /*cuda_device=*/true);
    ADD_FAILURE() << "--no-fuse was accepted on a CUDA run";
  } catch (const UsageError& u) {
    EXPECT_NE(std::string(u.what()).find("--device cpu"), std::string::npos) << u.what();
  }
}

TEST(CommandLine, AliasesParseAndPrintAsTheirFirstWord) {
  EXPECT_EQ(find_choice<DeviceChoice>("gpu"), DeviceChoice::kCuda);
  EXPECT_STREQ(choice_name(DeviceChoice::kCuda), "cuda");
  EXPECT_EQ(find_choice<Precision>("f32"), Precision::kF32);
  EXPECT_STREQ(choice_name(Precision::kF32), "fp32");
  if (cuda_device_count() == 0) {
    // --device gpu is --device cuda, which a machine without a GPU refuses under that name.
    const std::string e = refusal({"--synthetic", "--device", "gpu"});
    EXPECT_NE(e.find("--device cuda"), std::string::npos) << e;
  }
}

// What a checkpoint stores (options_to_config) parses back to the same choices.
TEST(CommandLine, StoredConfigParsesBackToTheSameChoices) {
  const TrainOptions o = parse({"--synthetic", "--device", "cpu", "--reduce-dtype", "bf16",
                                "--lr-schedule", "constant", "--mpi-progress", "thread"})
                             .options;
  const std::string text = options_to_config(o);
  EXPECT_NE(text.find("\nlr-schedule = constant\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nmpi-progress = thread\n"), std::string::npos) << text;
  // The stored text names data = (empty) and synthetic = true, as the run had them.
  const TrainOptions back = parse_config(text).options;
  EXPECT_EQ(back.device, o.device);
  EXPECT_EQ(back.precision, o.precision);
  EXPECT_EQ(back.reduce_dtype, o.reduce_dtype);
  EXPECT_EQ(back.lr_schedule, o.lr_schedule);
  EXPECT_EQ(back.mpi_progress, o.mpi_progress);
}

TEST(CommandLine, HelpShowsEachChoiceDefaultAsAWord) {
  const CommandLine cl = parse({"--help"});
  ASSERT_EQ(cl.action, CommandLine::kHelp);
  for (const char* shown : {"--device arg (=auto)", "--precision arg (=fp32)",
                            "--reduce-dtype arg (=fp32)", "--lr-schedule arg (=cosine)",
                            "--mpi-progress arg (=nonblocking)"})
    EXPECT_NE(cl.help.find(shown), std::string::npos) << shown << "\n" << cl.help;
}

}  // namespace
}  // namespace ddpv

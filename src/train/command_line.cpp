// ddpv-train's options (Boost.Program_options), the --config file and their checks.
#include "ddpv/train/command_line.hpp"

#include <boost/program_options.hpp>
#include <cctype>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv {

// Boost.Program_options reads a value of type E through validate(), found by argument-dependent
// lookup; for an enum with a table of words (Note [Choices]) this one takes exactly those words
// and refuses any other naming them all. Boost fills in the option's name as the user wrote it
// (--precision on the command line, precision in a config file). Declared before its first use
// in describe(), and at namespace scope so that lookup finds it.
template <class E, class = decltype(choices(E{}))>
void validate(boost::any& value, const std::vector<std::string>& words, E*, int) {
  namespace po = boost::program_options;
  po::validators::check_first_occurrence(value);
  const std::string& word = po::validators::get_single_string(words);
  const std::optional<E> e = find_choice<E>(word);
  if (!e) {
    // Note [Placeholders in values]: the word holds no %token%, so it may be part of the
    // template (Boost's own %value% is emptied when it adds the option's name).
    throw po::error_with_option_name("the argument ('" + word +
                                     "') for option '%canonical_option%' is invalid: use " +
                                     choice_list<E>());
  }
  value = *e;
}

namespace {

namespace po = boost::program_options;

// An option whose value is one of an enum's words (Note [Choices]), with the default shown.
template <class E>
po::typed_value<E>* choice(E* field) {
  return po::value(field)->default_value(*field, choice_name(*field));
}

po::options_description describe(TrainOptions& o) {
  po::options_description data("Data");
  data.add_options()
    ("data", po::value(&o.data), "HDF5 image store made by ddpv-convert")
    ("train-split", po::value(&o.train_split)->default_value(o.train_split), "split to train on")
    ("val-split", po::value(&o.val_split)->default_value(o.val_split), "split to evaluate after each epoch (auto: val, else test, whichever the store has; none: skip)")
    ("drop-last", po::bool_switch(&o.drop_last), "drop each epoch's last step when it is short of the global batch")
    ("synthetic", po::bool_switch(&o.synthetic), "random images and labels of the model's input shape (benchmarks)")
    ("synthetic-size", po::value(&o.synthetic_size)->default_value(o.synthetic_size), "samples per synthetic epoch")
    ("no-augment", po::bool_switch(), "no random crop and flip in training")
    ("cache-mb", po::value(&o.cache_mb)->default_value(o.cache_mb), "hold a split in memory when it fits (MiB per rank; JPEG stores: the bytes this rank reads, up to its share)")
    ("crop", po::value(&o.crop)->default_value(o.crop), "JPEG stores: side of the training crop (RandomResizedCrop) and of the evaluation centre crop (0: the store's size)")
    ("loader-threads", po::value(&o.loader_threads)->default_value(o.loader_threads), "threads decoding and augmenting batches per rank (0: as many as --threads gives the rank)");
  po::options_description model("Model and device");
  model.add_options()
    ("model", po::value(&o.model)->default_value(o.model), "lenet | resnet20 | resnet56 | resnet18 | resnet50")
    ("device", choice(&o.device), "auto | cpu | cuda (auto: a GPU when one is visible)")
    ("precision", choice(&o.precision), "fp32 | bf16 (bf16 activations and activation gradients; parameters, gradients, optimizer state and loss stay fp32)")
    ("reduce-dtype", choice(&o.reduce_dtype), "gradient allreduce type: fp32, or bf16 (half the bytes, rounded gradients)")
    ("threads", po::value(&o.threads)->default_value(o.threads), "CPU threads per rank (0: this rank's share of the node's cores)");
  po::options_description tuning("Backend tuning (for comparisons and diagnosis; the defaults are the fast paths)");
  tuning.add_options()(
      "cpu-layout", choice(&o.cpu_layout),
      "CPU: activations between layers in channel blocks of the ISA (blocked; under --precision "
      "bf16 on AMX, nhwc, which oneDNN's AMX kernels need) or in nhwc")(
      "cpu-conv", choice(&o.cpu_conv),
      "CPU: stride-1 3x3 and 5x5 convolutions: auto (per layer), direct (oneDNN) or winograd "
      "(ours, where a layer allows it)")(
      "cpu-bf16", choice(&o.cpu_bf16),
      "CPU, --precision bf16: auto (oneDNN's bf16 kernels where the CPU has bf16 instructions, "
      "without AMX our f32 blocks where they need far fewer multiplications; else the "
      "fallback), onednn (oneDNN's bf16 primitives on whatever kernel it has) or fallback "
      "(f32 kernels between bf16 activations)")(
      "no-fuse", po::bool_switch(&o.no_fuse),
      "CPU: run every layer on its own (no convolution + ReLU, BatchNorm + ReLU, ... fusions), to "
      "rule a fusion out")(
      "cuda-bn", choice(&o.cuda_bn),
      "CUDA: BatchNorm on cuDNN's ex functions (NHWC persistent kernels) or its legacy ones");
  po::options_description opt("Optimisation");
  opt.add_options()
    ("epochs", po::value(&o.epochs)->default_value(o.epochs), "epochs to train")
    ("max-steps", po::value(&o.max_steps)->default_value(o.max_steps), "stop after this many optimizer steps in total (0: no limit)")
    ("run-steps", po::value(&o.run_steps)->default_value(o.run_steps), "checkpoint and stop after this many steps of this run (0: no limit)")
    ("batch-size", po::value(&o.batch_size)->default_value(o.batch_size), "batch size per rank")
    ("lr", po::value(&o.lr)->default_value(o.lr), "learning rate for the global batch")
    ("momentum", po::value(&o.momentum)->default_value(o.momentum), "SGD momentum")
    ("nesterov", po::bool_switch(&o.nesterov), "Nesterov momentum")
    ("weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay), "L2 weight decay (not on BatchNorm parameters and biases)")
    ("lr-schedule", choice(&o.lr_schedule), "constant | step | cosine")
    ("warmup-epochs", po::value(&o.warmup_epochs)->default_value(o.warmup_epochs), "linear warmup (epochs, fractions allowed)")
    ("accum-steps", po::value(&o.accum_steps)->default_value(o.accum_steps), "micro-batches per optimizer step (gradient accumulation)")
    ("seed", po::value(&o.seed)->default_value(o.seed), "seed of initialisation, shuffling and augmentation")
    ("deterministic", po::bool_switch(&o.deterministic), "bit-reproducible runs for a fixed world size (CPU)");
  po::options_description dist("Distribution");
  dist.add_options()
    ("bucket-mb", po::value(&o.bucket_mb)->default_value(o.bucket_mb), "gradient bucket size in MiB (0: one per tensor)")
    ("no-overlap", po::bool_switch(&o.no_overlap), "allreduce all gradients after backward instead of during it")
    ("no-shared-update", po::bool_switch(&o.no_shared_update), "CPU: a model copy per rank and an MPI allreduce, even for ranks that share a node")
    ("balance", po::bool_switch(&o.balance), "CPU: split each step's global batch among the ranks by their measured speed, so a slower node takes fewer samples instead of holding the others back")
    ("batch-split", po::value(&o.batch_split), "CPU: each rank's batch, as in 88/40 (summing to ranks x --batch-size): a fixed split, or --balance's first")
    ("mpi-progress", choice(&o.mpi_progress), "CPU: nonblocking (MPI_Iallreduce advanced from backward) | thread")
    ("comm-timeout", po::value(&o.comm_timeout)->default_value(o.comm_timeout), "seconds a rank may wait for the others (a collective, the shared update, a GPU collective) before the job ends, naming the ranks that did not arrive, with exit code 75 (0: never)");
  po::options_description out("Checkpoints and output");
  out.add_options()
    ("checkpoint-dir", po::value(&o.checkpoint_dir), "directory of checkpoints (and `latest`)")
    ("checkpoint-every", po::value(&o.checkpoint_every)->default_value(o.checkpoint_every), "epochs between checkpoints (0: only at the end)")
    ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(o.keep_checkpoints), "checkpoints kept in the directory (0: all)")
    ("resume", po::value(&o.resume), "auto (the directory's newest checkpoint that verifies, if any) or a checkpoint file")
    ("eval-only", po::bool_switch(&o.eval_only), "evaluate the --resume checkpoint on --val-split (loss, top-1, top-5) and exit; trains and writes nothing")
    ("resume-changed", po::bool_switch(&o.resume_changed), "resume although the global batch, --accum-steps or the learning-rate schedule differ from the checkpoint's run")
    ("metrics", po::value(&o.metrics), "JSON-lines metrics file")
    ("log-every", po::value(&o.log_every)->default_value(o.log_every), "steps between metrics records")
    ("no-progress", po::bool_switch(), "no progress bar on a terminal")
    ("profile-layers", po::bool_switch(&o.profile_layers), "time every layer (synchronising the device around each) and print where a step's time goes; slows the run");
  po::options_description test("Testing (not for training runs)");
  test.add_options()
    ("test-busy-per-image", po::value(&o.test_busy_per_image), "CPU: seconds per image each rank's timers add to its busy time, as in 0.03/0.01 (one per rank), so that the rank report, the straggler warning and --balance see a slow rank that is not slow");
  po::options_description all;
  all.add(data).add(model).add(tuning).add(opt).add(dist).add(out).add(test);
  return all;
}

// Note [Placeholders in values]: Boost.Program_options 1.74 builds an error's message by
// replacing tokens such as %value% or %invalid_line% with the offending text; text that itself
// holds the token is substituted again and again, for ever (found by the config fuzz target).
// So any text holding a %word% is refused before Boost sees it.
void refuse_placeholders(const std::string& text, const std::string& where) {
  for (size_t open = text.find('%'); open != std::string::npos; open = text.find('%', open + 1)) {
    size_t end = open + 1;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
      ++end;
    if (end > open + 1 && end < text.size() && text[end] == '%')
      throw UsageError(where + " holds '" + text.substr(open, end - open + 1) +
                       "': no option value may contain a %word% (Boost.Program_options cannot "
                       "report an error in one)");
  }
}

CommandLine parse(int argc, const char* const* argv, std::istream* config_text) {
  for (int i = 1; i < argc; ++i) refuse_placeholders(argv[i], "the command line");
  std::string text;
  if (config_text) {
    text.assign(std::istreambuf_iterator<char>(*config_text), std::istreambuf_iterator<char>());
    refuse_placeholders(text, "the config file");
  }
  CommandLine cl;
  TrainOptions& o = cl.options;
  po::options_description options = describe(o);
  po::options_description generic("General");
  std::string config;
  generic.add_options()("help,h", "this help")("version", "the version")(
      "config", po::value(&config), "file of `key = value` lines (command line wins)");
  po::options_description cli;
  cli.add(generic).add(options);
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, cli), vm);
    if (!config_text && vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      if (!in) throw UsageError("--config " + path + ": cannot read the file");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      refuse_placeholders(text, "--config " + path);
    }
    if (config_text || vm.count("config")) {
      std::istringstream in(text);
      po::store(po::parse_config_file(in, options), vm);
    }
    if (vm.count("help")) {
      std::ostringstream help;
      help << "Usage: mpirun -np N ddpv-train --data STORE.h5 --model NAME [options]\n"
           << "Trains a CNN classifier data-parallel across MPI ranks.\n"
           << cli << "\n";
      cl.action = CommandLine::kHelp;
      cl.help = help.str();
      return cl;
    }
    if (vm.count("version")) {
      cl.action = CommandLine::kVersion;
      return cl;
    }
    po::notify(vm);
    o.augment = !vm["no-augment"].as<bool>();
    o.progress = !vm["no-progress"].as<bool>();
    validate_options(o, resolve_device(o.device) == Device::kCuda);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  } catch (const Error& e) {
    throw UsageError(e.message());
  }
  return cl;
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  return parse(argc, argv, nullptr);
}

CommandLine parse_command_line(int argc, const char* const* argv, std::istream& config) {
  return parse(argc, argv, &config);
}

}  // namespace ddpv

// Option checks and the config-file rendering of TrainOptions.
#include "ddpv/train/options.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include "ddpv/nn/model.hpp"
#include "ddpv/train/schedule.hpp"

namespace ddpv {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// The CPUs this process may run on: its affinity mask (the cores a launcher bound it to, the
// whole node when unbound), or the node's count where the mask cannot be read.
int usable_cpus() {
  cpu_set_t set;
  int cpus = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  return cpus > 0 ? cpus : static_cast<int>(std::thread::hardware_concurrency());
}

}  // namespace

std::span<const ChoiceWord<ReduceDtype>> choices(ReduceDtype) {
  static constexpr ChoiceWord<ReduceDtype> kWords[] = {{"fp32", ReduceDtype::kF32},
                                                       {"bf16", ReduceDtype::kBF16}};
  return kWords;
}

std::span<const ChoiceWord<CpuLayout>> choices(CpuLayout) {
  static constexpr ChoiceWord<CpuLayout> kWords[] = {{"blocked", CpuLayout::kBlocked},
                                                     {"nhwc", CpuLayout::kNhwc}};
  return kWords;
}

void validate_options(const TrainOptions& o, bool cuda_device) {
  require(o.synthetic || !o.data.empty(),
          "--data is required (an HDF5 store made by ddpv-convert), or use --synthetic");
  require(!(o.synthetic && !o.data.empty()), "--synthetic and --data exclude each other");
  bool known_model = false;
  for (const auto& m : model_names()) known_model |= (m == o.model);
  std::string names;
  for (const auto& m : model_names()) names += (names.empty() ? "" : ", ") + m;
  require(known_model, "--model '" + o.model + "' is not in the zoo: use one of " + names);
  require(o.precision != Precision::kF16, "--precision fp16 is not implemented: use bf16 (or fp32)");
  // Note [Tuning options]: each switch tunes one backend; on the other it would do nothing.
  require(!cuda_device || (o.cpu_layout == CpuLayout::kBlocked &&
                           o.cpu_conv == ConvAlgorithm::kAuto && !o.no_fuse &&
                           o.cpu_bf16 == CpuBf16::kAuto),
          "--cpu-layout, --cpu-conv, --cpu-bf16 and --no-fuse tune the CPU backend: drop them, "
          "or run with --device cpu");
  require(o.cpu_bf16 == CpuBf16::kAuto || o.precision == Precision::kBF16,
          "--cpu-bf16 picks the kernels of --precision bf16: add --precision bf16, or drop it");
  require(cuda_device || o.cuda_bn == BatchNormPath::kEx,
          "--cuda-bn tunes the CUDA backend: drop it on a CPU run");
  // Boost reads "inf" and "nan" as numbers; none of these options has a use for them.
  for (const auto& [name, v] : {std::pair{"--lr", o.lr},
                                {"--momentum", o.momentum},
                                {"--weight-decay", o.weight_decay},
                                {"--warmup-epochs", o.warmup_epochs},
                                {"--bucket-mb", o.bucket_mb},
                                {"--comm-timeout", o.comm_timeout},
                                {"--cache-mb", o.cache_mb}}) {
    std::ostringstream got;
    got << v;
    require(std::isfinite(v), std::string(name) + " must be a finite number, got " + got.str());
  }
  require(o.epochs >= 1, "--epochs must be at least 1");
  require(o.max_steps >= 0, "--max-steps must be >= 0 (0: no limit)");
  require(o.run_steps >= 0, "--run-steps must be >= 0 (0: no limit)");
  require(o.batch_size >= 1, "--batch-size (per rank) must be at least 1");
  require(o.lr > 0, "--lr must be positive");
  require(o.momentum >= 0 && o.momentum < 1, "--momentum must be in [0, 1)");
  require(!o.nesterov || o.momentum > 0, "--nesterov needs --momentum > 0");
  require(o.weight_decay >= 0, "--weight-decay must be >= 0");
  require(o.warmup_epochs >= 0, "--warmup-epochs must be >= 0");
  require(o.accum_steps >= 1, "--accum-steps must be at least 1");
  require(o.bucket_mb >= 0, "--bucket-mb must be >= 0 (0: one bucket per tensor)");
  const std::vector<int64_t> split = parse_batch_split(o.batch_split);
  require(split.empty() || !cuda_device,
          "--batch-split needs the CPU backend: drop it, or run with --device cpu");
  require(parse_busy_per_image(o.test_busy_per_image).empty() || !cuda_device,
          "--test-busy-per-image needs the CPU backend (the rank times it feeds are CPU only): "
          "drop it, or run with --device cpu");
  require(!o.balance || !cuda_device,
          "--balance needs the CPU backend (a GPU's busy time needs device timers): drop it");
  require(!o.balance || !o.deterministic,
          "--balance splits each batch by measured speed, so runs are not bit-reproducible: "
          "drop --balance or --deterministic");
  require(o.comm_timeout >= 0, "--comm-timeout must be >= 0 (seconds; 0: no watchdog)");
  require(o.threads >= 0, "--threads must be >= 0 (0: the node's cores shared among its ranks)");
  const int cpus = usable_cpus();
  require(o.threads <= cpus,
          "--threads " + std::to_string(o.threads) + " is more than the " + std::to_string(cpus) +
              " CPUs this rank may run on (its affinity mask: the cores the launcher bound it "
              "to, or the whole node when unbound); give at most " +
              std::to_string(cpus) + ", or 0 for this rank's share of them");
  require(o.checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0: only at the end)");
  require(o.keep_checkpoints >= 0, "--keep-checkpoints must be >= 0 (0: keep all)");
  require(o.resume != "auto" || !o.checkpoint_dir.empty(),
          "--resume auto needs --checkpoint-dir (where `latest` is looked for)");
  require(!o.resume_changed || !o.resume.empty(), "--resume-changed needs --resume");
  require(!o.eval_only || !o.resume.empty(),
          "--eval-only needs --resume FILE (or --resume auto with --checkpoint-dir): the "
          "checkpoint to evaluate");
  require(!o.eval_only || !o.synthetic,
          "--eval-only needs --data: synthetic data has no split to evaluate");
  require(o.log_every >= 1, "--log-every must be at least 1");
  require(o.cache_mb >= 0, "--cache-mb must be >= 0");
  require(o.crop >= 0 && o.crop <= 4096, "--crop must be in 1..4096 (0: the store's size)");
  require(o.loader_threads >= 0 && o.loader_threads <= 256,
          "--loader-threads must be in 0..256 (0: as many as --threads gives the rank)");
  require(o.synthetic_size >= 1, "--synthetic-size must be at least 1");
}

namespace {
// "a/b/c" or "a,b,c": the pieces, empty ones kept (so that "88//40" is refused); none for "".
std::vector<std::string> per_rank_pieces(const std::string& text) {
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find_first_of("/,", pos);
    pieces.push_back(text.substr(pos, end == std::string::npos ? end : end - pos));
    if (end == std::string::npos) return pieces;
    pos = end + 1;
  }
}
}  // namespace

std::vector<int64_t> parse_batch_split(const std::string& text) {
  std::vector<int64_t> sizes;
  for (const std::string& piece : per_rank_pieces(text)) {
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (piece.empty() || used != piece.size() || n < 1) {
      throw UsageError("--batch-split " + text +
                       ": give one positive batch size per rank, as in 88/40");
    }
    sizes.push_back(n);
  }
  return sizes;
}

std::vector<double> parse_busy_per_image(const std::string& text) {
  std::vector<double> seconds;
  for (const std::string& piece : per_rank_pieces(text)) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (piece.empty() || used != piece.size() || !std::isfinite(v) || v < 0) {
      throw UsageError("--test-busy-per-image " + text +
                       ": give one finite number of seconds >= 0 per rank, as in 0.03/0.01");
    }
    seconds.push_back(v);
  }
  return seconds;
}

int auto_threads(int ranks_on_node) {
  const int cpus = usable_cpus();
  // Ranks bound to their own cores see only those; unbound ranks see the whole node.
  const bool bound = cpus < static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, bound ? cpus : cpus / std::max(ranks_on_node, 1));
}

std::string options_to_config(const TrainOptions& o) {
  std::ostringstream s;
  auto b = [](bool v) { return v ? "true" : "false"; };
  s << "data = " << o.data << "\ntrain-split = " << o.train_split << "\nval-split = " << o.val_split
    << "\ndrop-last = " << b(o.drop_last)
    << "\nsynthetic = " << b(o.synthetic) << "\nsynthetic-size = " << o.synthetic_size
    << "\nno-augment = " << b(!o.augment) << "\ncache-mb = " << o.cache_mb
    << "\ncrop = " << o.crop << "\nloader-threads = " << o.loader_threads
    << "\nmodel = " << o.model << "\ndevice = " << choice_name(o.device)
    << "\nprecision = " << choice_name(o.precision)
    << "\nreduce-dtype = " << choice_name(o.reduce_dtype) << "\nthreads = " << o.threads
    << "\ncpu-layout = " << choice_name(o.cpu_layout) << "\ncpu-conv = " << choice_name(o.cpu_conv)
    << "\ncpu-bf16 = " << choice_name(o.cpu_bf16)
    << "\nno-fuse = " << b(o.no_fuse) << "\ncuda-bn = " << choice_name(o.cuda_bn)
    << "\nepochs = " << o.epochs << "\nmax-steps = " << o.max_steps
    << "\nrun-steps = " << o.run_steps << "\nbatch-size = " << o.batch_size << "\nlr = " << o.lr
    << "\nmomentum = " << o.momentum << "\nnesterov = " << b(o.nesterov)
    << "\nweight-decay = " << o.weight_decay << "\nlr-schedule = " << choice_name(o.lr_schedule)
    << "\nwarmup-epochs = " << o.warmup_epochs << "\naccum-steps = " << o.accum_steps
    << "\nseed = " << o.seed << "\ndeterministic = " << b(o.deterministic)
    << "\nbucket-mb = " << o.bucket_mb << "\nno-overlap = " << b(o.no_overlap)
    << "\nno-shared-update = " << b(o.no_shared_update) << "\nbalance = " << b(o.balance)
    << "\nbatch-split = " << o.batch_split << "\nmpi-progress = " << choice_name(o.mpi_progress)
    << "\ncomm-timeout = " << o.comm_timeout << "\ncheckpoint-dir = " << o.checkpoint_dir
    << "\ncheckpoint-every = " << o.checkpoint_every
    << "\nkeep-checkpoints = " << o.keep_checkpoints << "\nmetrics = " << o.metrics
    << "\nlog-every = " << o.log_every << "\n";
  return s.str();
}

}  // namespace ddpv

// TrainOptions: every setting of a training run, as ddpv-train's options and config file give
// them (docs/user-guide.md lists them for users).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/choice.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/train/schedule.hpp"

namespace ddpv {

// --reduce-dtype: the type gradients are allreduced in.
enum class ReduceDtype : uint8_t { kF32, kBF16 };
std::span<const ChoiceWord<ReduceDtype>> choices(ReduceDtype);  // fp32 | bf16

// --cpu-layout: activations between CPU layers in channel blocks (the ISA's) or NHWC.
enum class CpuLayout : uint8_t { kBlocked, kNhwc };
std::span<const ChoiceWord<CpuLayout>> choices(CpuLayout);  // blocked | nhwc

struct TrainOptions {
  // data
  std::string data;                 // HDF5 image store; empty with synthetic
  std::string train_split = "train";
  // "auto": val, else test, whichever the store has (neither: no evaluation); "" or "none":
  // no evaluation; any other name must be a split of the store
  std::string val_split = "auto";
  bool drop_last = false;           // drop each epoch's short last step (DataLoader's drop_last)
  bool synthetic = false;           // random images and labels of the model's input shape
  int64_t synthetic_size = 50000;   // samples per synthetic epoch
  bool augment = true;
  double cache_mb = 2048;
  int crop = 0;                     // JPEG stores: training crop side (0: the store's size)
  int loader_threads = 0;           // decode threads per rank (0: as many as --threads gets)
  // model and device
  std::string model = "lenet";
  // The options that are choices are enums (Note [Choices]); each table gives their words.
  DeviceChoice device = DeviceChoice::kAuto;
  Precision precision = Precision::kF32;       // bf16: CUDA only; fp16: refused
  ReduceDtype reduce_dtype = ReduceDtype::kF32;  // Note [bf16 reduction] in grad_reducer.hpp
  int threads = 0;                  // CPU threads per rank (0: auto, see auto_threads())
  // backend tuning, for comparisons and diagnosis (Note [Tuning options] in backend.hpp)
  CpuLayout cpu_layout = CpuLayout::kBlocked;
  ConvAlgorithm cpu_conv = ConvAlgorithm::kAuto;
  CpuBf16 cpu_bf16 = CpuBf16::kAuto;  // --cpu-bf16 (Note [bf16 on oneDNN])
  bool no_fuse = false;
  BatchNormPath cuda_bn = BatchNormPath::kEx;
  // schedule
  int64_t epochs = 1;
  int64_t max_steps = 0;            // 0: no limit; else stop after this many steps in total
  int64_t run_steps = 0;            // 0: no limit; else checkpoint and stop after this many steps of this run
  int64_t batch_size = 64;          // per rank
  double lr = 0.1;                  // for the global batch
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  LrShape lr_schedule = LrShape::kCosine;
  double warmup_epochs = 0;
  int accum_steps = 1;
  uint64_t seed = 0;
  bool deterministic = false;
  // distribution
  double bucket_mb = 25;
  bool no_overlap = false;
  bool no_shared_update = false;    // CPU: Note [Shared update]
  bool balance = false;             // CPU: Note [Balanced batches]
  std::string batch_split;          // CPU: "88/40", each rank's batch (Note [Balanced batches])
  MpiProgress mpi_progress = MpiProgress::kNonBlocking;  // Note [Communication thread]
  double comm_timeout = 300;        // seconds; 0: no watchdog (Note [Stall watchdog])
  // testing: "0.03/0.01", seconds of work each rank's timers count per image on top of what
  // they measure (Note [Injected busy time]); not stored in checkpoints
  std::string test_busy_per_image;
  // output and checkpoints
  std::string checkpoint_dir;
  int64_t checkpoint_every = 1;     // epochs; 0: only at the end
  int keep_checkpoints = 3;         // 0 keeps all
  std::string resume;               // "", "auto" or a file
  bool eval_only = false;           // evaluate the --resume checkpoint on the val split and stop
  bool resume_changed = false;      // resume although batch or schedule differ (Note [Resume checks])
  std::string metrics;              // JSON-lines file
  int64_t log_every = 50;           // steps between step records and progress updates
  bool progress = true;             // a progress bar when stdout is a terminal
  bool profile_layers = false;      // time each layer (Note [Layer profile]); rank 0 prints it
};

// A mistake in the options: ddpv-train prints it and exits 2 before any training.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Checks the options for consistency (ranges, combinations, CUDA-only settings on a CPU run)
// and throws a UsageError naming the option and what to do; runs before any training.
void validate_options(const TrainOptions& o, bool cuda_device);

// Note [Threads per rank]: --threads 0 (the default) gives each rank the CPUs it may run on
// (its affinity mask) divided by the ranks sharing its node, at least 1: `mpirun -np 2` on a
// 2-core node runs 1 thread per rank, a single rank uses every core, and under Slurm the mask
// already holds the task's --cpus-per-task CPUs.
int auto_threads(int ranks_on_node);

// --batch-split "88/40" (or "88,40"): one positive size per rank; throws a UsageError naming
// the option otherwise. Empty for "".
std::vector<int64_t> parse_batch_split(const std::string& text);

// Note [Injected busy time]: the straggler report and --balance act on the ranks' busy times
// (Note [Rank times]), which on a shared machine move with its load, so tests that make one
// rank slow for real decide by the machine's mood. --test-busy-per-image gives each rank a
// number of seconds per trained image that its timers count as work, without running any
// slower: the report, the straggler rule and the balancer then see busy times that the test
// chose (the measured part, milliseconds per step, is small beside them). CPU only, like the
// figures it feeds. parse_busy_per_image() takes one finite value >= 0 per rank, as in
// 0.03/0.01 (or 0.03,0.01), and throws a UsageError naming the option otherwise; empty for "".
std::vector<double> parse_busy_per_image(const std::string& text);

// One "key = value" line per option, as a config file takes them (stored in checkpoints).
std::string options_to_config(const TrainOptions& o);

}  // namespace ddpv

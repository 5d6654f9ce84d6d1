// ddpv-train: data-parallel training of a CNN classifier across MPI ranks.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <utility>

#include "ddpv/backend/backend.hpp"
#include "ddpv/data/batch_split.hpp"
#include "ddpv/dist/world.hpp"
#include "ddpv/train/options.hpp"
#include "ddpv/train/trainer.hpp"
#include "train/console.hpp"
#include "train/signals.hpp"

namespace po = boost::program_options;
using ddpv::TrainOptions;

namespace {

constexpr const char* kProgram = "ddpv-train";

// The launcher's rank, known before MPI starts, so that --help and usage errors print once.
int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

po::options_description describe(TrainOptions& o) {
  po::options_description data("Data");
  data.add_options()
    ("data", po::value(&o.data), "HDF5 image store made by ddpv-convert")
    ("train-split", po::value(&o.train_split)->default_value(o.train_split), "split to train on")
    ("val-split", po::value(&o.val_split)->default_value(o.val_split), "split to evaluate after each epoch (none: skip)")
    ("synthetic", po::bool_switch(&o.synthetic), "random images and labels of the model's input shape (benchmarks)")
    ("synthetic-size", po::value(&o.synthetic_size)->default_value(o.synthetic_size), "samples per synthetic epoch")
    ("no-augment", po::bool_switch(), "no random crop and flip in training")
    ("cache-mb", po::value(&o.cache_mb)->default_value(o.cache_mb), "hold a split in memory when it fits (MiB per rank)");
  po::options_description model("Model and device");
  model.add_options()
    ("model", po::value(&o.model)->default_value(o.model), "lenet | resnet20 | resnet56 | resnet18 | resnet50")
    ("device", po::value(&o.device)->default_value(o.device), "auto | cpu | cuda (auto: a GPU when one is visible)")
    ("precision", po::value(&o.precision)->default_value(o.precision), "fp32 | bf16 (bf16: CUDA only; fp16: not implemented yet)")
    ("reduce-dtype", po::value(&o.reduce_dtype)->default_value(o.reduce_dtype), "gradient allreduce type: fp32, or bf16 (half the bytes, rounded gradients)")
    ("threads", po::value(&o.threads)->default_value(o.threads), "CPU threads per rank (0: this rank's share of the node's cores)");
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
    ("lr-schedule", po::value(&o.lr_schedule)->default_value(o.lr_schedule), "constant | step | cosine")
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
    ("mpi-progress", po::value(&o.mpi_progress)->default_value(o.mpi_progress), "CPU: nonblocking (MPI_Iallreduce advanced from backward) | thread")
    ("comm-timeout", po::value(&o.comm_timeout)->default_value(o.comm_timeout), "seconds a rank may wait for the others (a collective, the shared update, a GPU collective) before the job ends, naming the ranks that did not arrive, with exit code 75 (0: never)");
  po::options_description out("Checkpoints and output");
  out.add_options()
    ("checkpoint-dir", po::value(&o.checkpoint_dir), "directory of checkpoints (and `latest`)")
    ("checkpoint-every", po::value(&o.checkpoint_every)->default_value(o.checkpoint_every), "epochs between checkpoints (0: only at the end)")
    ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(o.keep_checkpoints), "checkpoints kept in the directory (0: all)")
    ("resume", po::value(&o.resume), "auto (the directory's newest checkpoint that verifies, if any) or a checkpoint file")
    ("resume-changed", po::bool_switch(&o.resume_changed), "resume although the global batch, --accum-steps or the learning-rate schedule differ from the checkpoint's run")
    ("metrics", po::value(&o.metrics), "JSON-lines metrics file")
    ("log-every", po::value(&o.log_every)->default_value(o.log_every), "steps between metrics records")
    ("no-progress", po::bool_switch(), "no progress bar on a terminal")
    ("profile-layers", po::bool_switch(&o.profile_layers), "time every layer (synchronising the device around each) and print where a step's time goes; slows the run");
  po::options_description all;
  all.add(data).add(model).add(opt).add(dist).add(out);
  return all;
}

int print_usage_error(const std::string& what) {
  if (launcher_rank() == 0)
    std::fprintf(stderr, "%s: %s (see %s --help)\n", kProgram, what.c_str(), kProgram);
  return 2;
}

// Note [Rank times]: one line of the ranks' spread, and a warning naming a straggler.
void print_rank_times(const ddpv::RankReport& s) {
  const ddpv::RankSpread& r = s.spread;
  auto range = [&](double ddpv::RankTimes::*field) {
    double lo = s.by_rank[0].*field, hi = lo;
    for (const ddpv::RankTimes& t : s.by_rank) {
      lo = std::min(lo, t.*field);
      hi = std::max(hi, t.*field);
    }
    return std::pair{lo, hi};
  };
  const auto [comm_lo, comm_hi] = range(&ddpv::RankTimes::comm_wait_s);
  const auto [data_lo, data_hi] = range(&ddpv::RankTimes::data_wait_s);
  std::printf(
      "ranks: busy %.2f-%.2f s (median %.2f); the busiest, rank %d on %s, %.1f%% above "
      "the others' median; comm wait %.2f-%.2f s, data wait %.2f-%.2f s\n",
      r.min_s, r.max_s, r.median_s, r.busiest, s.busiest_host.c_str(), 100 * r.above_others,
      comm_lo, comm_hi, data_lo, data_hi);
  if (!s.batch_split.empty()) {
    const std::string speeds = ddpv::speeds_text(s.rank_speed);
    std::printf("balance: the global batch split %s by rank at the end, after %d change%s%s%s\n",
                ddpv::split_text(s.batch_split).c_str(), s.split_changes,
                s.split_changes == 1 ? "" : "s",
                speeds.empty() ? "" : "; speeds (images per busy second) ", speeds.c_str());
  }
  if (s.straggler) {  // without --balance or --batch-split, say what would help
    std::fprintf(stderr, "%s: warning: %s: a slower, throttled or shared node?%s\n", kProgram,
                 ddpv::straggler_text(s).c_str(),
                 s.batch_split.empty() ? " (--balance would give it a smaller share of each batch)"
                                       : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  ddpv::block_stop_signals();  // before any thread starts: Note [No signal on a compute thread]
  TrainOptions o;
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
    if (vm.count("config")) {
      std::ifstream in(vm["config"].as<std::string>());
      if (!in) return print_usage_error("--config " + vm["config"].as<std::string>() + ": cannot read the file");
      po::store(po::parse_config_file(in, options), vm);
    }
    if (vm.count("help")) {
      if (launcher_rank() == 0) {
        std::cout << "Usage: mpirun -np N " << kProgram << " --data STORE.h5 --model NAME [options]\n"
                  << "Trains a CNN classifier data-parallel across MPI ranks.\n"
                  << cli << "\n";
      }
      return 0;
    }
    if (vm.count("version")) {
      if (launcher_rank() == 0) std::cout << kProgram << " " << DDPV_VERSION << "\n";
      return 0;
    }
    po::notify(vm);
    o.augment = !vm["no-augment"].as<bool>();
    o.progress = !vm["no-progress"].as<bool>();
    const bool cuda = ddpv::resolve_device(o.device) == ddpv::Device::kCuda;
    ddpv::validate_options(o, cuda);
  } catch (const po::error& e) {
    return print_usage_error(e.what());
  } catch (const ddpv::UsageError& e) {
    return print_usage_error(e.what());
  } catch (const ddpv::Error& e) {
    return print_usage_error(e.message());
  }

  ddpv::World world(&argc, &argv);
  try {
    if (o.comm_timeout > 0) world.watch_stalls(o.comm_timeout);  // Note [Stall watchdog]
    ddpv::Trainer trainer(o, world);
    const ddpv::TrainSummary s = trainer.run();
    if (world.is_root()) {
      std::printf("done: %lld epochs, %lld steps in %s; val_acc %.4f val_loss %.4f; %.0f img/s "
                  "(%d rank%s x batch %lld); comm wait %.2f s, data wait %.2f s\n",
                  static_cast<long long>(s.epochs), static_cast<long long>(s.steps),
                  ddpv::format_duration(s.elapsed_s).c_str(), s.val_acc, s.val_loss,
                  s.images_per_s, s.world_size, s.world_size == 1 ? "" : "s", static_cast<long long>(o.batch_size),
                  s.comm_wait_s, s.data_wait_s);
      if (s.ranks.by_rank.size() > 1) print_rank_times(s.ranks);
      if (!s.last_checkpoint.empty()) std::printf("checkpoint: %s\n", s.last_checkpoint.c_str());
      if (!o.metrics.empty()) std::printf("metrics: %s\n", o.metrics.c_str());
      if (s.stopped_by_signal) {
        std::printf("%s: stopped by %s after step %lld; %s\n", kProgram,
                    ddpv::signal_name(s.stop_signal), static_cast<long long>(s.steps),
                    s.last_checkpoint.empty()
                        ? "no --checkpoint-dir was given, so nothing was saved"
                        : "resume with the same options plus --resume auto");
      }
      std::fflush(stdout);
    }
  } catch (const ddpv::StartRefused& e) {
    // Every rank throws this together (rank 0's verdict is broadcast), so none is left waiting.
    if (world.is_root()) std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return e.exit_code();
  } catch (const ddpv::TrainingDiverged& e) {
    // Every rank throws this after the same step (they agreed on it), so all exit together.
    if (world.is_root()) std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  } catch (const ddpv::AgreedFailure&) {
    return 1;  // one rank has said what failed, and every rank knows (Note [Agreed failures])
  } catch (const std::exception& e) {
    world.abort_job(kProgram, e);  // Note [One abort]
  }
  return 0;
}

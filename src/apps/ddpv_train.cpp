// ddpv-train: data-parallel training of a CNN classifier across MPI ranks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "ddpv/backend/backend.hpp"
#include "ddpv/data/batch_split.hpp"
#include "ddpv/dist/world.hpp"
#include "ddpv/train/command_line.hpp"
#include "ddpv/train/options.hpp"
#include "ddpv/train/trainer.hpp"
#include "train/console.hpp"
#include "train/signals.hpp"

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
  try {
    ddpv::CommandLine cl = ddpv::parse_command_line(argc, argv);
    if (cl.action == ddpv::CommandLine::kHelp) {
      if (launcher_rank() == 0) std::cout << cl.help;
      return 0;
    }
    if (cl.action == ddpv::CommandLine::kVersion) {
      if (launcher_rank() == 0) std::cout << kProgram << " " << DDPV_VERSION << "\n";
      return 0;
    }
    o = std::move(cl.options);
  } catch (const ddpv::UsageError& e) {
    return print_usage_error(e.what());
  }

  ddpv::World world(&argc, &argv);
  try {
    if (o.comm_timeout > 0) world.watch_stalls(o.comm_timeout);  // Note [Stall watchdog]
    ddpv::Trainer trainer(o, world);
    const ddpv::TrainSummary s = trainer.run();
    if (o.eval_only) {
      if (world.is_root()) {
        std::printf("eval %s: %lld images, loss %.4f, top-1 %.4f, top-5 %.4f (checkpoint at epoch "
                    "%lld, step %lld) in %s\n",
                    s.val_split.c_str(), static_cast<long long>(s.val_images), s.val_loss,
                    s.val_acc, s.val_top5, static_cast<long long>(s.epochs),
                    static_cast<long long>(s.steps), ddpv::format_duration(s.elapsed_s).c_str());
        if (!o.metrics.empty()) std::printf("metrics: %s\n", o.metrics.c_str());
      }
      return 0;
    }
    if (world.is_root()) {
      // A run that never evaluated (--val-split none, or stopped before its first epoch
      // ended) has no validation figures to print: NaN would read as a diverged model.
      char val[64] = "no evaluation";
      if (!std::isnan(s.val_acc))
        std::snprintf(val, sizeof val, "val_acc %.4f val_loss %.4f", s.val_acc, s.val_loss);
      std::printf(
          "done: %lld epochs, %lld steps in %s; %s; %.0f img/s "
          "(%d rank%s x batch %lld); comm wait %.2f s, data wait %.2f s\n",
          static_cast<long long>(s.epochs), static_cast<long long>(s.steps),
          ddpv::format_duration(s.elapsed_s).c_str(), val, s.images_per_s, s.world_size,
          s.world_size == 1 ? "" : "s", static_cast<long long>(o.batch_size), s.comm_wait_s,
          s.data_wait_s);
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

// The trainer's evaluation and what it reports (lines, metrics, summary).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ddpv/core/log.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "train/signals.hpp"
#include "train/trainer_impl.hpp"

namespace ddpv {
namespace {

// Note [Top-5]: a sample is a top-5 hit when fewer than five logits exceed its label's (a tie
// goes the label's way), counted on the host from a copy of the logits: evaluation is not the
// training step, and the copy (n x classes floats) is small beside the forward that made it.
int64_t count_top5(Backend& be, const Tensor& logits, const Tensor& labels, int n, int64_t classes,
                   std::vector<float>& lg, std::vector<int32_t>& lb) {
  lg.resize(static_cast<size_t>(n * classes));
  lb.resize(static_cast<size_t>(n));
  be.copy(lg.data(), Device::kCpu, logits.raw(), logits.device(), lg.size() * sizeof(float));
  be.copy(lb.data(), Device::kCpu, labels.raw(), labels.device(), lb.size() * sizeof(int32_t));
  int64_t hits = 0;
  for (int i = 0; i < n; ++i) {
    const float* row = lg.data() + static_cast<size_t>(i) * classes;
    const float mine = row[lb[static_cast<size_t>(i)]];
    int64_t above = 0;
    for (int64_t c = 0; c < classes; ++c) above += row[c] > mine ? 1 : 0;
    hits += above < 5 ? 1 : 0;
  }
  return hits;
}

// The figures by rank, into a metrics record (epoch or summary).
void add_rank_report(JsonRecord& record, const RankReport& ranks) {
  if (ranks.by_rank.empty()) return;
  std::vector<double> busy, comm, data;
  for (const RankTimes& r : ranks.by_rank) {
    busy.push_back(r.busy_s);
    comm.push_back(r.comm_wait_s);
    data.push_back(r.data_wait_s);
  }
  record.add("rank_busy_s", busy)
      .add("rank_comm_wait_s", comm)
      .add("rank_data_wait_s", data)
      .add("busiest_rank", ranks.spread.busiest)
      .add("busiest_host", ranks.busiest_host)
      .add("straggler", ranks.straggler);
  if (!ranks.batch_split.empty()) {
    record
        .add("batch_split", std::vector<double>(ranks.batch_split.begin(), ranks.batch_split.end()))
        .add("split_changes", static_cast<int64_t>(ranks.split_changes));
  }
  if (!ranks.rank_speed.empty()) record.add("rank_speed", ranks.rank_speed);
}

}  // namespace

// Every validation sample counted exactly once: each rank evaluates its unpadded shard (ranks
// may differ by one sample, and no collective runs inside the loop), then one allreduce.
void Trainer::Impl::evaluate(double* loss, double* acc, double* top5) {
  world.stall_watch()->set_phase(Phase::kEvaluation);
  average_buffers(*model, *comm);  // BatchNorm running statistics agree before evaluation
  double sums[4] = {0, 0, 0, 0};   // loss sum, correct, samples, top-5 correct
  const int64_t classes = data.shape.num_classes;
  std::vector<float> host_logits;
  std::vector<int32_t> host_labels;
  data.val_feed->start_epoch(0, 0);
  while (std::optional<DeviceFeed::Ready> batch = data.val_feed->next()) {
    const int n = static_cast<int>(batch->images.shape()[0]);
    const Tensor& logits = model->forward(batch->images, /*training=*/false);
    const LossResult r = loss_op->forward(n, cact(logits), batch->labels.data<int32_t>());
    if (top5 != nullptr)
      sums[3] += static_cast<double>(
          count_top5(*backend, logits, batch->labels, n, classes, host_logits, host_labels));
    data.val_feed->done();
    sums[0] += r.loss_sum;
    sums[1] += static_cast<double>(r.correct);
    sums[2] += n;
  }
  world.allreduce_sum(sums, 4);
  if (top5 != nullptr) *top5 = sums[3] / std::max(sums[2], 1.0);
  DDPV_CHECK(static_cast<int64_t>(sums[2]) == data.val_source->samples_per_epoch(),
             "evaluation counted ", sums[2], " samples, the split has ",
             data.val_source->samples_per_epoch());
  *loss = sums[0] / std::max(sums[2], 1.0);
  *acc = sums[1] / std::max(sums[2], 1.0);
  if (!std::isfinite(*loss)) throw_diverged("the validation loss is NaN or Inf");
}

void Trainer::Impl::log_step(double lr, double step_loss, double step_acc) {
  const double dt = seconds_since(timing.log_start);
  if (world.is_root() && metrics.enabled()) {
    metrics.write(JsonRecord()
                      .add("event", "step")
                      .add("step", pos.step)
                      .add("epoch", static_cast<double>(pos.epoch) +
                                        static_cast<double>(pos.epoch_step) / pos.steps_per_epoch)
                      .add("loss", step_loss)
                      .add("acc", step_acc)
                      .add("lr", lr)
                      .add("images_per_s", log_totals.samples / std::max(dt, 1e-9)));
  }
  log_totals = {};
  timing.log_start = Clock::now();
}

void Trainer::Impl::log_epoch(double val_loss, double val_acc, const RankReport& ranks) {
  if (!world.is_root()) return;
  const double rate = timing.images / std::max(timing.train_seconds, 1e-9);
  const double elapsed = seconds_since(timing.run_start);
  // An epoch without evaluation (--val-split none) prints no validation figures, not NaN.
  char val[64] = "";
  if (!std::isnan(val_acc))
    std::snprintf(val, sizeof val, " val_loss %.4f val_acc %.4f", val_loss, val_acc);
  std::printf("epoch %lld/%lld train_loss %.4f train_acc %.4f%s lr %.5g img/s %.0f elapsed %s\n",
              static_cast<long long>(pos.epoch), static_cast<long long>(o.epochs),
              epoch_totals.loss(), epoch_totals.acc(), val, schedule->at(pos.step), rate,
              format_duration(elapsed).c_str());
  std::fflush(stdout);
  if (ranks.straggler) {  // Note [Rank times]: said in the epoch it happens, not only at the end
    DDPV_WARN("epoch ", pos.epoch, ": ", straggler_text(ranks));
  }
  JsonRecord record;
  record.add("event", "epoch")
      .add("epoch", pos.epoch)
      .add("step", pos.step)
      .add("train_loss", epoch_totals.loss())
      .add("train_acc", epoch_totals.acc())
      .add("val_loss", val_loss)
      .add("val_acc", val_acc)
      .add("images_per_s", rate)
      .add("elapsed_s", elapsed);
  add_rank_report(record, ranks);
  metrics.write(record);
}

std::string straggler_text(const RankReport& ranks) {
  return "rank " + std::to_string(ranks.spread.busiest) + " on " + ranks.busiest_host +
         " was busy " + std::to_string(std::lround(100 * ranks.spread.above_others)) +
         "% longer than the other ranks' median, and every step they waited for it";
}

RankSpread rank_spread(const std::vector<RankTimes>& ranks) {
  RankSpread s;
  if (ranks.empty()) return s;
  auto median = [](std::vector<double> v) {  // of a sorted copy; v is not empty
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  std::vector<double> busy;
  busy.reserve(ranks.size());
  for (const RankTimes& r : ranks) busy.push_back(r.busy_s);
  const auto most = std::max_element(busy.begin(), busy.end());
  s.busiest = static_cast<int>(most - busy.begin());
  s.max_s = *most;
  s.min_s = *std::min_element(busy.begin(), busy.end());
  s.median_s = median(busy);
  busy.erase(most);
  const double others = busy.empty() ? 0.0 : median(busy);
  s.above_others = others > 0 ? (s.max_s - others) / others : 0.0;
  return s;
}

// Note [Rank times]: the busiest rank is called a straggler when it worked a tenth longer than
// the others' median or more, over a stretch long enough that start-up (the first steps build
// every primitive and touch fresh memory) does not decide it.
bool is_straggler(const RankSpread& spread, int64_t steps) {
  constexpr double kStragglerShare = 0.10;
  constexpr int64_t kStragglerMinSteps = 50;
  return spread.above_others >= kStragglerShare && steps >= kStragglerMinSteps;
}

// Note [Rank times]: every rank's three figures over the stretch, pooled by one allreduce
// (each rank fills its own row), and the busiest rank's host, broadcast by it.

RankTimes Trainer::Impl::my_times() const {
  return {timing.train_seconds - timing.comm_wait - timing.data_wait + timing.injected_busy,
          timing.comm_wait, timing.data_wait};
}

RankReport Trainer::Impl::pool_rank_times(const RankTimes& mark, int64_t steps) const {
  RankReport report;
  if (backend->device() != Device::kCpu) return report;
  const RankTimes now = my_times();
  const int n = world.size(), me = world.rank();
  std::vector<double> rows(static_cast<size_t>(3 * n), 0.0);
  rows[3 * me] = std::max(now.busy_s - mark.busy_s, 0.0);
  rows[3 * me + 1] = now.comm_wait_s - mark.comm_wait_s;
  rows[3 * me + 2] = now.data_wait_s - mark.data_wait_s;
  world.allreduce_sum(rows.data(), 3 * n);
  report.by_rank.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) report.by_rank[r] = {rows[3 * r], rows[3 * r + 1], rows[3 * r + 2]};
  report.spread = rank_spread(report.by_rank);
  report.straggler = is_straggler(report.spread, steps);
  char host[256] = {};
  if (me == report.spread.busiest) world.host().copy(host, sizeof(host) - 1);
  world.broadcast_bytes(host, sizeof(host), report.spread.busiest);
  report.busiest_host = host;
  if (balancer) {
    report.batch_split = balancer->sizes();
    report.split_changes = balancer->changes();
    report.rank_speed = balancer->rates();
  }
  return report;
}

TrainSummary Trainer::Impl::evaluate_only() {
  const auto t0 = Clock::now();
  TrainSummary s;
  evaluate(&s.val_loss, &s.val_acc, &s.val_top5);
  s.steps = pos.step;
  s.epochs = pos.epoch;
  s.val_split = data.val_split;
  s.val_images = data.val_source->samples_per_epoch();
  s.elapsed_s = seconds_since(t0);
  s.world_size = world.size();
  s.global_batch = global_batch();
  if (world.is_root() && metrics.enabled()) {
    metrics.write(JsonRecord()
                      .add("event", "eval")
                      .add("split", data.val_split)
                      .add("step", pos.step)
                      .add("images", s.val_images)
                      .add("val_loss", s.val_loss)
                      .add("val_acc", s.val_acc)
                      .add("val_top5", s.val_top5));
  }
  return s;
}

TrainSummary Trainer::Impl::finish() {
  TrainSummary s;
  s.steps = pos.step;
  s.epochs = pos.epoch;
  const double all_rate = timing.images / std::max(timing.train_seconds, 1e-9);
  s.images_per_s = all_rate;
  if (timing.warm_images >= 0 &&
      pos.step - pos.run_start_step >= 2 * kWarmupSteps) {  // Note [Steady throughput]
    const double t = std::chrono::duration<double>(timing.train_end - timing.warm_start).count() -
                     (timing.paused_at_end - timing.paused_at_warm);
    s.images_per_s = (timing.images - timing.warm_images) / std::max(t, 1e-9);
  }
  s.train_loss = epoch_totals.loss();
  s.train_acc = epoch_totals.acc();
  s.val_loss = last_val_loss;
  s.val_acc = last_val_acc;
  s.elapsed_s = seconds_since(timing.run_start);
  s.comm_wait_s = timing.comm_wait;
  s.data_wait_s = timing.data_wait;
  s.world_size = world.size();
  s.global_batch = global_batch();
  s.stopped_by_signal = stop_signal != 0;
  s.stop_signal = stop_signal;
  s.last_checkpoint = last_checkpoint;
  s.ranks = pool_rank_times(RankTimes{}, pos.step - pos.run_start_step);  // Note [Rank times]
  // The most host memory this rank's tensors held at once: parameters, gradients, optimizer
  // state, activations and batches (the CUDA backend's device memory is not counted here).
  const double host_peak_mib = double(host_memory_stats().peak) / (1 << 20);
  if (world.is_root())
    DDPV_DEBUG("host tensors: peak ", std::round(host_peak_mib * 10) / 10, " MiB on rank 0");
  JsonRecord record;
  record.add("event", "summary")
      .add("model", o.model)
      .add("images_per_s", s.images_per_s)
      .add("images_per_s_all", all_rate)
      .add("val_acc", s.val_acc)
      .add("val_loss", s.val_loss)
      .add("train_loss", s.train_loss)
      .add("train_acc", s.train_acc)
      .add("steps", s.steps)
      .add("epochs", s.epochs)
      .add("elapsed_s", s.elapsed_s)
      .add("train_s", timing.train_seconds)
      .add("world_size", s.world_size)
      .add("global_batch", s.global_batch)
      .add("comm_wait_s", s.comm_wait_s)
      .add("data_wait_s", s.data_wait_s)
      .add("host_tensor_peak_mib", host_peak_mib)
      .add("stopped_by_signal", s.stopped_by_signal)
      .add("checkpoint", s.last_checkpoint);
  add_rank_report(record, s.ranks);  // Note [Rank times]
  metrics.write(record);
  return s;
}

}  // namespace ddpv

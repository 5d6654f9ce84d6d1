// The training loop: set-up of backend, data, model and communication, then the steps.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>

#include "ddpv/core/log.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "ddpv/nn/layer_profile.hpp"
#include "ddpv/nn/layers.hpp"
#include "train/signals.hpp"
#include "train/trainer_impl.hpp"

namespace ddpv {

Trainer::Impl::Impl(const TrainOptions& options, World& w)
    : o(options),
      world(w),
      last_val_loss(std::numeric_limits<double>::quiet_NaN()),
      last_val_acc(std::numeric_limits<double>::quiet_NaN()),
      metrics(w.is_root() && !options.metrics.empty()
                  ? MetricsWriter(options.metrics, options.resume.size() > 0)
                  : MetricsWriter()),
      bar(w.is_root() && options.progress && stdout_is_terminal()) {
  // Note [Agreed failures]: what may fail on some ranks only or on all alike (the backend,
  // the store, the model) runs before the first collective, and the ranks agree on the
  // outcome before any of them enters one. Rank 0's resume has a verdict of its own, which it
  // broadcasts (Note [Resume verdict]).
  std::exception_ptr failure;
  try {
    BackendOptions bo;
    bo.device = resolve_device(o.device);
    if (bo.device == Device::kCuda) bo.device_index = world.device_index(cuda_device_count());
    bo.threads =
        o.threads > 0 ? o.threads : auto_threads(world.local_size());  // Note [Threads per rank]
    if (o.loader_threads == 0) o.loader_threads = bo.threads;
    bo.precision = o.precision;
    bo.deterministic = o.deterministic;
    bo.activation_block = o.cpu_layout == CpuLayout::kNhwc ? 0 : -1;  // Note [Tuning options]
    bo.conv_algorithm = o.cpu_conv;
    bo.fuse_layers = !o.no_fuse;
    bo.cpu_bf16 = o.cpu_bf16;
    bo.cuda_batchnorm = o.cuda_bn;
    backend = make_backend(bo);
    if (o.profile_layers) backend->set_profile(&profile);  // Note [Layer profile]
    if (!o.batch_split.empty())  // on one rank too: a split for another world size is a mistake
      check_split(parse_batch_split(o.batch_split), world.size(), o.batch_size, "--batch-split");
    if (!o.test_busy_per_image.empty()) {  // Note [Injected busy time]
      const std::vector<double> per_rank = parse_busy_per_image(o.test_busy_per_image);
      DDPV_CHECK(static_cast<int>(per_rank.size()) == world.size(), "--test-busy-per-image ",
                 o.test_busy_per_image, ": give one value per rank (", world.size(), ")");
      timing.busy_per_image = per_rank[static_cast<size_t>(world.rank())];
    }
    open_data();
    make_feeds();
    build_model();
    if (world.is_root()) {  // once the model's ops exist: what they run on
      if (const std::string caveat = backend->caveat(); !caveat.empty()) DDPV_WARN(caveat);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  world.agree(failure);
  resume();  // loads on rank 0, or keeps the fresh initialisation
  connect();
}

void Trainer::Impl::open_data() {
  Allocator* staging = backend->staging_allocator();
  if (o.synthetic) {
    data.shape = synthetic_shape(o.model);
    data.train_source = make_synthetic_source(data.shape, o, world.rank(), world.size(), staging);
    return;
  }
  data.store = std::make_unique<ImageStore>(o.data);
  // The model's input is the crop for JPEG splits, the images' size else.
  DDPV_CHECK(o.crop == 0 || data.store->any_encoded(), "--crop ", o.crop, ": store ", o.data,
             " holds raw ", data.store->height(), "x", data.store->width(),
             " images; --crop applies to JPEG stores (leave it out)");
  data.shape = {o.crop > 0 ? o.crop : data.store->height(),
                o.crop > 0 ? o.crop : data.store->width(), data.store->channels(),
                data.store->num_classes()};
  if (!o.eval_only) {  // --eval-only reads no training data
    DDPV_CHECK(data.store->has_split(o.train_split), "--train-split ", o.train_split, ": store ",
               o.data, " has no such split (see `ddpv-convert inspect ", o.data, "`)");
    data.train_source = make_train_source(*data.store, o, world.rank(), world.size(), staging);
  }
  data.val_split = resolve_val_split(*data.store, o.val_split);
  DDPV_CHECK(!o.eval_only || !data.val_split.empty(), "--eval-only: store ", o.data,
             " has neither a val nor a test split; name the split to evaluate with --val-split");
  if (data.val_split.empty() && o.val_split == "auto" && world.is_root()) {
    DDPV_INFO("store ", o.data, " has neither a val nor a test split: no evaluation (name a split "
              "with --val-split)");
  }
  if (!data.val_split.empty()) {
    data.val_source =
        make_eval_source(*data.store, data.val_split, o, world.rank(), world.size(), staging);
  }
}

void Trainer::Impl::make_feeds() {
  if (data.train_source) {
    data.train_uploads = backend->upload_stream(2);
    data.train_feed = std::make_unique<DeviceFeed>(*data.train_source, data.train_uploads.get(),
                                                   backend->allocator());
  }
  if (data.val_source) {
    data.val_uploads = backend->upload_stream(2);
    data.val_feed = std::make_unique<DeviceFeed>(*data.val_source, data.val_uploads.get(),
                                                 backend->allocator());
  }
}

void Trainer::Impl::build_model() {
  model =
      make_model(o.model, *backend, Shape{data.shape.height, data.shape.width, data.shape.channels},
                 static_cast<int>(data.shape.num_classes));
  model->init_parameters(o.seed);
  loss_op = backend->softmax_cross_entropy(static_cast<int>(data.shape.num_classes));
  spans = model->decay_spans();
  sgd.momentum = static_cast<float>(o.momentum);
  sgd.nesterov = o.nesterov;
  sgd.weight_decay = static_cast<float>(o.weight_decay);

  const int64_t batches = data.train_source ? data.train_source->steps_per_epoch() : o.accum_steps;
  pos.steps_per_epoch = batches / o.accum_steps;
  DDPV_CHECK(pos.steps_per_epoch >= 1, "an epoch of ", batches,
             " batches per rank is shorter than --accum-steps ", o.accum_steps,
             ": use a smaller --batch-size or --accum-steps");
  int64_t total = pos.steps_per_epoch * o.epochs;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  const auto warmup = static_cast<int64_t>(std::llround(o.warmup_epochs * pos.steps_per_epoch));
  schedule.emplace(o.lr_schedule, o.lr, total, warmup);

  if (world.is_root() && !o.checkpoint_dir.empty()) {
    // Fail at start-up, not after the first epoch, when the directory cannot be made.
    std::error_code ec;
    std::filesystem::create_directories(o.checkpoint_dir, ec);
    DDPV_CHECK(!ec && std::filesystem::is_directory(o.checkpoint_dir), "--checkpoint-dir ",
               o.checkpoint_dir, ": cannot create it (", ec.message(),
               "); give a writable directory");
  }
  if (balanced(o, world.size()))  // Note [Balanced batches]
    balancer.emplace(world.size(), o.batch_size, parse_batch_split(o.batch_split));
}

// The communicator, and the replicas made equal: rank 0's model, momentum and position.
void Trainer::Impl::connect() {
  if (backend->device() == Device::kCpu) {
    comm = make_mpi_communicator(world, o.mpi_progress);
  } else {
    comm = make_communicator(world, *backend);
  }
  // The CUDA watchdog's (Note [Collective watchdog]); 0 turns both watchdogs off.
  comm->set_timeout(o.comm_timeout > 0 ? o.comm_timeout : kNoTimeout);
  broadcast_parameters(*model, *comm);  // every rank starts from rank 0's model
  comm->broadcast(model->momentum_data(), static_cast<size_t>(model->param_count()) * sizeof(float),
                  0);
  int64_t at[4] = {pos.epoch, pos.epoch_step, pos.step, model->batches_tracked()};
  world.broadcast_bytes(at, sizeof at, 0);
  pos.epoch = at[0];
  pos.epoch_step = at[1];
  pos.step = at[2];
  model->set_batches_tracked(at[3]);
  make_update();
}

// The gradients' way to the optimizer, chosen once the replicas are equal: on CPU the node's
// ranks share one model (Note [Shared update]) unless --no-shared-update or --reduce-dtype bf16
// asks for the allreduce; otherwise buckets are allreduced during backward.
void Trainer::Impl::make_update() {
  std::string why_not = "--no-shared-update";
  if (o.reduce_dtype == ReduceDtype::kBF16) why_not = "--reduce-dtype bf16";
  if (!o.no_shared_update && o.reduce_dtype != ReduceDtype::kBF16) {
    shared = SharedUpdate::create(world, *model, &why_not);
  }
  if (shared) {
    gradients = make_shared_path(*shared);
  } else {
    GradReducerOptions ro;
    ro.overlap = !o.no_overlap;
    ro.reduce_type = o.reduce_dtype == ReduceDtype::kBF16 ? CommType::kBF16 : CommType::kF32;
    ro.backend = backend.get();
    gradients = make_reducer_path(*model, *backend, *comm, spans, o.bucket_mb, ro);
  }
  std::string how = gradients->summary();
  if (!shared && world.size() > 1 && backend->device() == Device::kCpu) how += " (" + why_not + ")";
  if (world.is_root()) {
    const std::string summary = model->summary();
    const size_t first = summary.find('\n');
    DDPV_INFO(summary.substr(0, first), "; ", world.size(), " rank(s) x batch ", o.batch_size,
              (balancer ? " (balanced)" : ""), (o.accum_steps > 1 ? " x accum " : ""),
              (o.accum_steps > 1 ? std::to_string(o.accum_steps) : std::string()), "; ", how);
    // Every layer, with the algorithm and the fusions the backend chose (DDPV_LOG_LEVEL=debug).
    DDPV_DEBUG("layers:\n", summary.substr(first + 1));
  }
}

void Trainer::Impl::throw_diverged(const std::string& what) const {
  throw TrainingDiverged("training diverged: " + what + " at step " + std::to_string(pos.step) +
                         " (epoch " + std::to_string(pos.epoch + 1) +
                         "); no checkpoint was written. Lower --lr, add --warmup-epochs, or "
                         "check the data");
}

namespace {
// Names of the trainer's own phases in the layer profile (Note [Layer profile]); the gradient
// path names its own kinds.
const std::string kProfData = "data", kProfDataKind = "batch from the loader";
const std::string kProfLoss = "loss", kProfLossKind = "softmax cross-entropy";
const std::string kProfReduce = "gradient allreduce", kProfUpdate = "optimizer";
const std::string kProfAgree = "step agreement", kProfAgreeKind = "loss and stop allreduce";
}  // namespace

// One optimizer step: accum_steps micro-batches, one update (Note [One gradient path]), and
// the ranks' agreement on what the step did.
void Trainer::Impl::train_step() {
  // The profile leaves out the warm-up steps (cuDNN's algorithm search, first allocations).
  profile.enable(o.profile_layers && pos.step - pos.run_start_step >= kWarmupSteps);
  comm->set_step(pos.step);  // named by the watchdog when a collective hangs
  world.stall_watch()->set_step(pos.step);
  const auto t_step = Clock::now();
  const double waits_before = timing.data_wait + timing.comm_wait;
  StepTotals mine;
  bool finite = true;
  for (int k = 0; k < o.accum_steps; ++k) finite = micro_batch(k, mine) && finite;
  const double lr = update();
  ++pos.step;
  ++pos.epoch_step;
  const double injected = timing.busy_per_image * mine.samples;  // Note [Injected busy time]
  timing.injected_busy += injected;
  balance_busy +=
      seconds_since(t_step) - (timing.data_wait + timing.comm_wait - waits_before) + injected;
  balance_samples += mine.samples;
  agree(finite, mine, lr);
  if (profile.enabled()) profile.add_step();
  profile.enable(false);  // evaluation is not profiled
  if (balancer && o.balance) balance_step();
}

// Micro-batch k of the step: its batch, forward, loss and backward, the gradients accumulated
// (k > 0) and handed to the gradient path. Adds this rank's loss sum, correct predictions and
// samples to `mine`; false when the loss was not finite.
bool Trainer::Impl::micro_batch(int k, StepTotals& mine) {
  Backend* timed = backend.get();
  StallWatch& watch = *world.stall_watch();  // Note [Stall watchdog]
  const auto t_data = Clock::now();
  watch.set_phase(Phase::kData);
  std::optional<DeviceFeed::Ready> batch;
  {
    ProfileScope scope(timed, kProfData, kProfDataKind, ProfilePhase::kOther);
    batch = data.train_feed->next();
  }
  DDPV_CHECK(batch.has_value(), "the data ran out inside epoch ", pos.epoch, " at step ",
             pos.epoch_step, " (internal: steps per epoch disagree)");
  if (balancer) data.train_source->push_split(balancer->sizes());  // Note [Balanced batches]
  const Tensor& x = batch->images;
  const Tensor& y = batch->labels;
  timing.data_wait += seconds_since(t_data);
  watch.set_phase(Phase::kCompute);

  const int n = static_cast<int>(x.shape()[0]);
  const Tensor& logits = model->forward(x, /*training=*/true);
  bool finite = true;
  {
    ProfileScope scope(timed, kProfLoss, kProfLossKind, ProfilePhase::kOther);
    const LossResult r = loss_op->forward(n, cact(logits), y.data<int32_t>());
    finite = std::isfinite(r.loss_sum);
    mine.add(r.loss_sum, static_cast<double>(r.correct), n);
    ensure_tensor(dlogits, logits.shape(), *backend);
    // The batch's share of the step's mean: 1 / n, or W / G of a balanced split.
    const float scale = balancer
                            ? static_cast<float>(world.size()) / static_cast<float>(batch->global)
                            : 1.0f / static_cast<float>(n);
    loss_op->backward(n, y.data<int32_t>(), mact(dlogits), scale);
  }
  model->backward(dlogits, /*accumulate=*/k > 0, gradients->ready_fn(k == o.accum_steps - 1));
  const auto t_next = Clock::now();
  data.train_feed->done();  // the next batch uploads while this backward runs (Note [Two slots])
  timing.data_wait += seconds_since(t_next);
  const std::string& exchange = gradients->exchange_kind();
  if (!exchange.empty()) {
    watch.set_phase(Phase::kGradients);
    ProfileScope scope(timed, kProfReduce, exchange, ProfilePhase::kOther);
    timing.comm_wait += gradients->finish_backward();
  }
  return finite;
}

// The step's update on the gradients summed over the ranks; returns its learning rate.
double Trainer::Impl::update() {
  const double lr = schedule->at(pos.step);
  sgd.lr = static_cast<float>(lr);
  // Gradients are summed over ranks, so 1 / world size averages them (Note [Folded averaging]).
  sgd.grad_scale = 1.0f / static_cast<float>(world.size()) / static_cast<float>(o.accum_steps);
  ProfileScope scope(backend.get(), kProfUpdate, gradients->update_kind(), ProfilePhase::kOther);
  world.stall_watch()->set_phase(Phase::kGradients);
  timing.comm_wait += gradients->apply(sgd);
  return lr;
}

// Note [One agreement per step]: the stop request, divergence and the step's loss statistics
// travel in one small allreduce, so all ranks stop after the same step (Note [Stop signals])
// and rank 0 reports exact global figures.
// The stop request is a count of ranks per stop signal: with one flag, a rank that had not
// received the signal yet (mpirun forwards it to each rank in turn) stopped without knowing
// which signal, and rank 0 then named neither the signal nor the checkpoint after it.
void Trainer::Impl::agree(bool finite, const StepTotals& mine, double lr) {
  constexpr int kSignals = static_cast<int>(std::size(kStopSignals));
  double agree[4 + kSignals] = {finite ? 0.0 : 1.0, mine.loss_sum, mine.correct, mine.samples};
  const int seen = stop_signal_received();
  for (int k = 0; k < kSignals; ++k) agree[4 + k] = seen == kStopSignals[k];
  {
    world.stall_watch()->set_phase(Phase::kAgreement);
    ProfileScope scope(backend.get(), kProfAgree, kProfAgreeKind, ProfilePhase::kOther);
    world.allreduce_sum(agree, 4 + kSignals);
  }
  if (agree[0] > 0) throw_diverged("the loss became NaN or Inf");
  timing.images += agree[3];
  epoch_totals.add(agree[1], agree[2], agree[3]);
  log_totals.add(agree[1], agree[2], agree[3]);
  for (int k = 0; k < kSignals && !stop; ++k) {
    if (agree[4 + k] > 0) {
      stop = true;
      stop_signal = kStopSignals[k];
    }
  }
  if (pos.step % o.log_every == 0) log_step(lr, log_totals.loss(), log_totals.acc());
}

// Note [Balanced batches]: the first window starts after the warm-up steps (primitives built,
// memory touched), then every BatchBalancer::kEvery steps the ranks pool their figures and all
// decide alike.
void Trainer::Impl::balance_step() {
  const int64_t since_warm = pos.step - pos.run_start_step - kWarmupSteps;
  if (since_warm <= 0 || since_warm % BatchBalancer::kEvery != 0) {
    if (since_warm == 0) balance_busy = balance_samples = 0;
    return;
  }
  world.stall_watch()->set_phase(Phase::kBalance);
  const int n = world.size(), me = world.rank();
  std::vector<double> rows(static_cast<size_t>(2 * n), 0.0);
  rows[static_cast<size_t>(2 * me)] = balance_busy;
  rows[static_cast<size_t>(2 * me + 1)] = balance_samples;
  world.allreduce_sum(rows.data(), 2 * n);
  balance_busy = balance_samples = 0;
  std::vector<double> busy(static_cast<size_t>(n)), samples(static_cast<size_t>(n));
  for (size_t r = 0; r < busy.size(); ++r) {
    busy[r] = rows[2 * r];
    samples[r] = rows[2 * r + 1];
  }
  if (balancer->decide(busy, samples) && world.is_root()) {  // rare: a change must gain 5%
    DDPV_INFO("balance: after step ", pos.step, " the global batch splits ",
              split_text(balancer->sizes()), " by rank (speeds ", speeds_text(balancer->rates()),
              " images per busy second), from the batches not yet queued");
  }
}

TrainSummary Trainer::Impl::run() {
  if (o.eval_only) return evaluate_only();
  StopSignalWatcher watcher;
  timing.run_start = Clock::now();
  pos.run_start_step = pos.step;
  timing.log_start = Clock::now();
  while (pos.epoch < o.epochs && !stop) {
    if (o.max_steps > 0 && pos.step >= o.max_steps) break;
    data.train_feed->start_epoch(pos.epoch, pos.epoch_step * o.accum_steps);
    if (pos.epoch_step == 0) epoch_totals = {};
    const RankTimes epoch_mark = my_times();  // Note [Rank times], per epoch
    const int64_t epoch_first_step = pos.step;
    const auto t_train = Clock::now();
    while (pos.epoch_step < pos.steps_per_epoch && !stop) {
      train_step();
      if (pos.step - pos.run_start_step == kWarmupSteps) {
        timing.warm_images = timing.images;
        timing.warm_start = Clock::now();
        timing.paused_at_warm = timing.paused;
      }
      if (o.max_steps > 0 && pos.step >= o.max_steps) stop = true;
      if (o.run_steps > 0 && pos.step - pos.run_start_step >= o.run_steps) stop = true;
      if (bar.enabled()) {
        const double rate =
            timing.images / std::max(timing.train_seconds + seconds_since(t_train), 1e-9);
        const double left = static_cast<double>(pos.steps_per_epoch - pos.epoch_step) *
                            static_cast<double>(global_batch());
        bar.update(pos.epoch + 1, o.epochs, pos.epoch_step, pos.steps_per_epoch,
                   epoch_totals.loss(), rate, left / std::max(rate, 1e-9));
      }
    }
    timing.train_seconds += seconds_since(t_train);
    bar.clear();
    if (pos.epoch_step < pos.steps_per_epoch) break;  // stopped inside the epoch
    ++pos.epoch;
    pos.epoch_step = 0;
    const auto t_pause = Clock::now();  // evaluation and checkpoints are not training time
    world.stall_watch()->set_phase(Phase::kReport);
    const RankReport epoch_ranks = pool_rank_times(epoch_mark, pos.step - epoch_first_step);
    double val_loss = std::numeric_limits<double>::quiet_NaN(), val_acc = val_loss;
    if (data.val_source) evaluate(&val_loss, &val_acc);
    last_val_loss = val_loss;
    last_val_acc = val_acc;
    log_epoch(val_loss, val_acc, epoch_ranks);
    const bool last = pos.epoch == o.epochs || (o.max_steps > 0 && pos.step >= o.max_steps);
    if (!o.checkpoint_dir.empty() && !last && o.checkpoint_every > 0 &&
        pos.epoch % o.checkpoint_every == 0) {
      save("epoch");
    }
    timing.log_start += Clock::now() - t_pause;
    timing.paused += seconds_since(t_pause);
  }
  timing.train_end = Clock::now();
  timing.paused_at_end = timing.paused;
  world.stall_watch()->set_phase(Phase::kFinish);
  if (o.profile_layers && world.is_root()) std::fputs(profile.report().c_str(), stdout);
  if (!o.checkpoint_dir.empty() && last_checkpoint_step != pos.step) {
    save(stop_signal ? signal_name(stop_signal) : "end");
  }
  return finish();
}

Trainer::Trainer(const TrainOptions& options, World& world)
    : impl_(std::make_unique<Impl>(options, world)) {}
Trainer::~Trainer() = default;
TrainSummary Trainer::run() { return impl_->run(); }

}  // namespace ddpv

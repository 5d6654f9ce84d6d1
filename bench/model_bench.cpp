// Forward + backward throughput of a model on the CPU backend, and its achieved GFLOP/s against
// the sgemm peak of the same threads measured in the same run (oneDNN's dnnl_sgemm).
//   model_bench [--model resnet20] [--batch 64] [--threads 1] [--seconds 3]
//   model_bench --sgemm-only [--threads 2]     (the peak alone)
//   --sgd: each step also runs the SGD update (lr 0.01, momentum 0.9) as the trainer does, so
//   the weights change and per-weight work (Winograd's filter transform) runs every step.
//   --batch-change N: then also times the first step of batch N (new primitives), and steps of
//   batch N and of the batch after it, alternated (an epoch's last, smaller batch and the
//   first of the next: Note [Grow-only activations]).
//   --sync-steps N [--sync-warmup W]: under mpirun, every rank trains its own copy of the model
//   (W more warm-up steps, then N timed ones, with --sgd as given) and waits at an MPI barrier
//   after each step; no gradient is exchanged. Between blocks of those, each rank runs as many
//   steps alone while the others sleep. Rank 0 prints the images/s of all ranks together, each
//   rank's busy time, each rank's images/s alone and how its steps spread together and alone
//   (the 90th percentile over the median) (Note [The step-synchronous ceiling]).
//   --sync-arith (with --sync-steps): the same, but each rank's step is arithmetic in registers
//   as long as the model's step alone, not the model (Note [The arithmetic ceiling]).
//   --jitter: only times 150 runs of a fixed loop of arithmetic in registers (no memory, about
//   a resnet20 step long) and prints the best, median, 90th percentile and worst: how much
//   the machine alone moves from one step-sized stretch of work to the next.
//   --cpu-conv auto|direct|winograd, --cpu-layout blocked|nhwc, --no-fuse: the backend's tuning
//   options, as ddpv-train takes them (Note [Tuning options]).
//   DDPV_AB_SWITCH=NAME in the environment: sets the variable NAME before every second timed
//   step and unsets it before the others, and prints the median of (step with NAME) / (step
//   before it), for a change under a temporary getenv(NAME) switch in the code. On this
//   noisy machine steps minutes apart differ by more than most changes; consecutive steps in
//   one process resolve changes of about a percent (check with a switch that changes nothing).
#include <dnnl.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ddpv/core/rng.hpp"
#include "ddpv/nn/model.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Training FLOPs per image (forward + backward = 3x forward, multiply-adds counted as 2), the
// figures the performance targets are stated in.
double train_gflop_per_image(const std::string& model) {
  if (model == "resnet20") return 0.245;
  if (model == "resnet56") return 0.756;
  if (model == "lenet") return 0.0665;
  return 0;
}

// Best of several runs of a square sgemm large enough to reach the kernel's steady state.
double sgemm_peak_gflops(int threads) {
  omp_set_num_threads(threads);
  const int n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 15; ++rep) {
    const double t0 = now();
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / (now() - t0) / 1e9);
  }
  return best;
}

// `iterations` rounds of 4 independent multiply-adds on 8-float vectors, which stay in
// registers (eight of SSE's sixteen in the baseline build): work that touches no memory. The
// start comes from a volatile, so the compiler cannot run the loop itself (from constants it
// finds each value unchanged by a round, and drops the loop).
void arithmetic(long iterations) {
  using v8 = float __attribute__((vector_size(32)));
  volatile float start = 1.0f;
  v8 acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = v8{} + start + 1e-7f * float(i);
  const v8 mul = v8{} + 0.9999999f, add = v8{} + 1e-7f;
  for (long k = 0; k < iterations; ++k)
    for (auto& a : acc) a = a * mul + add;
  volatile float sink = 0;  // the sums are read, so the loop runs
  for (const auto& a : acc) sink = sink + a[0];
}

// Seconds each of `runs` calls of work took, in order.
template <class Work>
std::vector<double> timed_runs(int runs, const Work& work) {
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) {
    const double t0 = now();
    work();
    seconds.push_back(now() - t0);
  }
  return seconds;
}

// --jitter: 150 runs of arithmetic(iterations); milliseconds of each run, sorted.
std::vector<double> jitter_runs(long iterations) {
  std::vector<double> ms = timed_runs(150, [iterations] { arithmetic(iterations); });
  for (double& t : ms) t *= 1e3;
  std::sort(ms.begin(), ms.end());
  return ms;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// How much longer the 90th-percentile time is than the median: the spread of a run's steps.
double p90_over_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() * 9 / 10] / v[v.size() / 2];
}

// Note [The step-synchronous ceiling]: a synchronous data-parallel trainer runs every step at
// the pace of its slowest rank. On a machine whose cores' speed jitters from step to step (this
// project's 2-core VM, as `model_bench --jitter` shows on arithmetic in registers alone; the
// figures: docs/performance.md, "Where it stands, and what bounds each figure"), the slower
// of two ranks is slower than a typical step even where the two get equal shares over a whole
// run, so two ranks scale by less than 2x whatever the trainer does. This mode measures that
// bound directly: the trainer's own step (forward, loss, backward, SGD) on every rank, a
// barrier after each, nothing exchanged. Its scaling is the most any synchronous trainer of
// this step could reach on the machine of those seconds, and the trainer's scaling over it is
// what its communication, shared update and agreement cost (scripts/bench.sh, the
// step-synchronous ceiling rows). The 1-rank side is measured in the same seconds: the timed
// steps go in four blocks, and each block also runs the same number of steps on every rank
// alone while the others sleep (the order of the two halves alternating between blocks), so
// the machine's drift over a minute, which moves runs taken apart more than most changes,
// cancels.
struct SyncResult {
  int rank = 0;               // this process's; the vectors below are filled on rank 0
  double images_per_s = 0;    // all ranks together, a barrier after each step
  std::vector<double> busy;   // by rank: seconds in its steps together, barriers excluded
  std::vector<double> alone;  // by rank: images/s of its steps alone
  std::vector<double> spread;  // by rank: its 90th-percentile step together over its median
  std::vector<double> spread_alone;  // by rank: the same of its steps alone
};

// A barrier at which a rank that arrives early sleeps instead of spinning, so that the rank
// still working has the machine to itself, as a 1-rank run has.
void sleeping_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Note [The arithmetic ceiling]: the step-synchronous ceiling still runs our step, which reads
// and writes memory, so part of what it loses could be the two ranks' contention for caches
// and DRAM, which a trainer touching less memory would not pay. --sync-arith runs the same
// measurement with a step that touches no memory at all (arithmetic() in registers) and lasts
// as long as the model's step alone, so it keeps only what the machine itself costs a step
// that waits for the slower of two ranks: the cores' speed jittering from step to step and
// two busy cores being slower than one. Where its scaling is below a target, no synchronous
// trainer of steps that long could reach the target on that machine in those seconds. The
// work per step is rank 0's calibration, broadcast, so every rank does exactly the same.
// Alternated with the step-synchronous probe on the 2-core VM, arithmetic scaled further than
// our step at both models' step lengths, and a step that only reads and writes a 256 KB buffer
// about as far as our step. Both probes also time each rank's steps alone, so a spread can be
// told from contention: our step's 90th percentile lies as far above its median alone as
// together, further than arithmetic's either way (docs/performance.md, "Where it stands, and
// what bounds each figure"). Our step spreads as wide with the other rank asleep, so what it
// loses beyond arithmetic is the machine's memory moving under it, not our two ranks.
struct Calibration {
  long iterations = 0;  // of arithmetic(), to last as long as the step
  double step_ms = 0;   // the model's step alone, median of 5
};

// Rank 0 times the model's step and the arithmetic; every rank gets its result.
template <class Step>
Calibration arithmetic_like(const Step& step, int batch) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  double sent[2] = {0, 0};  // iterations, step_ms
  if (rank == 0) {
    const long unit = 1L << 20;
    const double step_s = median_of(timed_runs(5, [&] { step(batch); }));
    const double unit_s = median_of(timed_runs(7, [] { arithmetic(unit); }));
    sent[0] = std::max(1.0, std::floor(double(unit) * step_s / unit_s));
    sent[1] = step_s * 1e3;
  }
  MPI_Bcast(sent, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return {long(sent[0]), sent[1]};
}

template <class Step>
SyncResult run_synchronised(const Step& step, int batch, int warmup, int steps) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 0; i < warmup; ++i) {
    step(batch);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  double busy = 0, together = 0, alone = 0;
  std::vector<double> took, took_alone;  // each step together (barrier excluded), and alone
  auto run_together = [&](int k) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    for (int i = 0; i < k; ++i) {
      const double s = now();
      step(batch);
      took.push_back(now() - s);
      busy += took.back();
      MPI_Barrier(MPI_COMM_WORLD);
    }
    together += now() - t0;
  };
  auto run_alone = [&](int k) {
    for (int q = 0; q < size; ++q) {
      if (q == rank) {
        const std::vector<double> t = timed_runs(k, [&] { step(batch); });
        took_alone.insert(took_alone.end(), t.begin(), t.end());
        alone += std::accumulate(t.begin(), t.end(), 0.0);
      }
      sleeping_barrier();
    }
  };
  const int blocks = std::min(4, steps);
  for (int b = 0; b < blocks; ++b) {
    const int k = steps * (b + 1) / blocks - steps * b / blocks;
    if (b % 2 == 0) {
      run_alone(k);
      run_together(k);
    } else {
      run_together(k);
      run_alone(k);
    }
  }
  SyncResult r;
  r.rank = rank;
  r.images_per_s = double(size) * batch * steps / together;
  r.busy.resize(size_t(size));
  r.alone.resize(size_t(size));
  r.spread.resize(size_t(size));
  r.spread_alone.resize(size_t(size));
  const double alone_rate = double(batch) * steps / alone;
  const double spread = p90_over_median(took), spread_alone = p90_over_median(took_alone);
  MPI_Gather(&busy, 1, MPI_DOUBLE, r.busy.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&alone_rate, 1, MPI_DOUBLE, r.alone.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&spread, 1, MPI_DOUBLE, r.spread.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&spread_alone, 1, MPI_DOUBLE, r.spread_alone.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "resnet20";
  int batch = 64, threads = 1;
  double seconds = 3;
  bool sgemm_only = false;  // scripts/bench.sh: only the peak, for the roofline of a DDP run
  bool jitter = false, sync_arith = false;
  bool sgd = false;
  int change = 0, sync_steps = 0, sync_warmup = 0;
  ddpv::BackendOptions tuning;  // Note [Tuning options]
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sgemm-only")) {
      sgemm_only = true;
      --i;
    } else if (!std::strcmp(argv[i], "--jitter")) {
      jitter = true;
      --i;
    } else if (!std::strcmp(argv[i], "--sync-arith")) {
      sync_arith = true;
      --i;
    } else if (!std::strcmp(argv[i], "--no-fuse")) {
      tuning.fuse_layers = false;
      --i;
    } else if (i + 1 == argc) {
      std::fprintf(stderr, "model_bench: option %s needs a value\n", argv[i]);
      return 2;
    } else if (!std::strcmp(argv[i], "--model"))
      model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds"))
      seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--sgd"))
      sgd = std::atoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--batch-change"))
      change = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--sync-steps"))
      sync_steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--sync-warmup"))
      sync_warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--cpu-conv")) {
      const auto algo = ddpv::find_choice<ddpv::ConvAlgorithm>(argv[i + 1]);
      if (!algo) {
        std::fprintf(stderr, "model_bench: --cpu-conv %s: use %s\n", argv[i + 1],
                     ddpv::choice_list<ddpv::ConvAlgorithm>().c_str());
        return 2;
      }
      tuning.conv_algorithm = *algo;
    } else if (!std::strcmp(argv[i], "--cpu-layout")) {
      const bool nhwc = !std::strcmp(argv[i + 1], "nhwc");
      if (!nhwc && std::strcmp(argv[i + 1], "blocked") != 0) {
        std::fprintf(stderr, "model_bench: --cpu-layout %s: use blocked or nhwc\n", argv[i + 1]);
        return 2;
      }
      tuning.activation_block = nhwc ? 0 : -1;
    } else {
      std::fprintf(stderr, "model_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (sync_steps < 0 || sync_warmup < 0) {
    std::fprintf(stderr, "model_bench: --sync-steps and --sync-warmup must not be negative\n");
    return 2;
  }
  if (sync_arith && sync_steps == 0) {
    std::fprintf(stderr, "model_bench: --sync-arith needs --sync-steps N\n");
    return 2;
  }
  if (jitter) {
    const std::vector<double> ms = jitter_runs(18000000);
    const double best = ms.front();
    std::printf(
        "jitter: 150 runs of arithmetic in registers: best %.1f ms, median +%.1f%%, 90th "
        "percentile +%.1f%%, worst +%.1f%%\n",
        best, 100 * (ms[ms.size() / 2] / best - 1), 100 * (ms[ms.size() * 9 / 10] / best - 1),
        100 * (ms.back() / best - 1));
    return 0;
  }
  if (sgemm_only) {
    std::printf("sgemm peak %.1f GFLOP/s (%d thread%s, dnnl_sgemm 1024^3, best run)\n",
                sgemm_peak_gflops(threads), threads, threads == 1 ? "" : "s");
    return 0;
  }
  using namespace ddpv;
  BackendOptions bo = tuning;
  bo.threads = threads;
  auto backend = make_backend(bo);
  std::printf("backend: %s\n", backend->name().c_str());
  const Shape in = model_name == "lenet" ? Shape{28, 28, 1} : Shape{32, 32, 3};
  auto model = make_model(model_name, *backend, in, 10);
  model->init_parameters(1);
  auto loss = backend->softmax_cross_entropy(10);
  const int rows = std::max(batch, change);  // --batch-change may ask for a larger batch
  Tensor x = Tensor::empty(Shape{rows, in[0], in[1], in[2]}, DType::kF32);
  Tensor y = Tensor::empty(Shape{rows}, DType::kI32);
  Tensor dl = Tensor::empty(Shape{rows, 10}, DType::kF32);
  Rng rng(3);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.normal();
  for (int i = 0; i < rows; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform_int(10));
  SgdConfig sgd_config;
  sgd_config.lr = 0.01f;
  const std::vector<ParamSpan> spans = model->decay_spans();
  auto step = [&](int n) {
    const Tensor& logits = model->forward(x.slice(0, n), true);
    loss->forward(n, logits.data<float>(), y.data<int32_t>());
    loss->backward(n, y.data<int32_t>(), dl.data<float>(), 1.0f / n);
    model->backward(dl.slice(0, n), false);
    if (sgd)
      backend->sgd_update(sgd_config, spans, model->param_count(), model->param_data(),
                          model->grad_data(), model->momentum_data());
  };
  for (int i = 0; i < 3; ++i) step(batch);  // primitives, caches, page faults
  if (sync_steps > 0) {                     // Note [The step-synchronous ceiling]
    MPI_Init(&argc, &argv);
    SyncResult r;
    char what[64] = "";
    if (sync_arith) {  // Note [The arithmetic ceiling]
      const Calibration c = arithmetic_like(step, batch);
      r = run_synchronised([&c](int) { arithmetic(c.iterations); }, batch, sync_warmup, sync_steps);
      std::snprintf(what, sizeof what, " arithmetic %.2f ms", c.step_ms);
    } else {
      r = run_synchronised(step, batch, sync_warmup, sync_steps);
    }
    if (r.rank == 0) {
      std::printf("sync ranks %zu steps %d batch %d%s: %.1f images/s in all; busy s by rank",
                  r.busy.size(), sync_steps, batch, what, r.images_per_s);
      for (double b : r.busy) std::printf(" %.4f", b);
      std::printf("; alone images/s by rank");
      for (double a : r.alone) std::printf(" %.1f", a);
      std::printf("; step p90/median by rank");
      for (double q : r.spread) std::printf(" %.3f", q);
      std::printf("; alone step p90/median by rank");
      for (double q : r.spread_alone) std::printf(" %.3f", q);
      std::printf("\n");
    }
    MPI_Finalize();
    return 0;
  }
  std::vector<double> times;
  const double end = now() + seconds;
  const char* ab = std::getenv("DDPV_AB_SWITCH");
  std::vector<double> ratios;
  double last_off = 0;  // the step before
  while (now() < end || times.size() < 5) {
    const bool on = ab != nullptr && times.size() % 2 == 1;
    if (ab != nullptr) {
      if (on)
        setenv(ab, "1", 1);
      else
        unsetenv(ab);
    }
    const double t0 = now();
    step(batch);
    times.push_back(now() - t0);
    if (on) ratios.push_back(times.back() / last_off);
    last_off = times.back();
  }
  if (ab != nullptr) {
    std::sort(ratios.begin(), ratios.end());
    std::printf("A/B %s: on/off step ratio median %.4f over %zu pairs\n", ab,
                ratios[ratios.size() / 2], ratios.size());
  }
  std::sort(times.begin(), times.end());
  // Note [Best versus median]: this machine is shared and noisy. The roofline ratio compares
  // like with like: the least-disturbed step against the least-disturbed sgemm (both the best
  // of their samples); the median step is reported as the typical throughput.
  const double median = times[times.size() / 2], best = times.front();
  const double peak = sgemm_peak_gflops(threads);
  const double per_image = train_gflop_per_image(model_name);
  std::printf(
      "model %s batch %d threads %d: forward+backward%s %.2f ms/step median, %.2f best "
      "(%zu steps): %.0f images/s median, %.0f best\n",
      model_name.c_str(), batch, threads, sgd ? "+sgd" : "", median * 1e3, best * 1e3, times.size(),
      batch / median, batch / best);
  std::printf(
      "achieved %.1f GFLOP/s best (%.3f GFLOP/image) = %.1f%% of the sgemm peak %.1f "
      "GFLOP/s (%d thread%s, best of its runs, measured in this run)\n",
      batch / best * per_image, per_image, 100.0 * batch / best * per_image / peak, peak, threads,
      threads == 1 ? "" : "s");
  if (change > 0 && change != batch) {
    // The first step at a batch size not seen before builds its primitives and plans and
    // touches its buffers (what --balance pays for each new size: Note [Balanced batches]).
    const double t_first = now();
    step(change);
    std::printf("batch change: the first step of %d (a new batch size) %.2f ms\n", change,
                (now() - t_first) * 1e3);
    const int rounds = 10;
    double down = 0, up = 0;
    for (int r = 0; r < rounds; ++r) {
      double t0 = now();
      step(change);
      down += now() - t0;
      t0 = now();
      step(batch);
      up += now() - t0;
    }
    std::printf(
        "batch change: a step of %d after %d %.2f ms, of %d after %d %.2f ms (means of %d)\n",
        change, batch, down / rounds * 1e3, batch, change, up / rounds * 1e3, rounds);
  }
  return 0;
}

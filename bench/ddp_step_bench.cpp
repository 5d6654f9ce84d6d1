// Training-step time of a zoo model under DDP with the gradient reducer's variants side by
// side: overlap vs --no-overlap vs --bucket-mb 0, communication thread vs non-blocking MPI, and
// no communication at all (the compute floor). Synthetic data; rank 0 prints the table.
//   mpirun -np 2 build/bin/ddp_step_bench [model=resnet20] [batch=64] [steps=10] [threads=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddpv/core/rng.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/grad_reducer.hpp"
#include "ddpv/dist/world.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Variant {
  const char* name;
  ddpv::MpiProgress progress;
  bool overlap;
  double bucket_mb;
  bool communicate;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One variant's communicator and reducer, and its step times (slowest rank, ms).
struct Runner {
  const Variant* v;
  std::unique_ptr<ddpv::Communicator> comm;
  std::unique_ptr<ddpv::GradReducer> reducer;
  std::vector<double> step_ms, wait_ms;
};

// Note [Benchmarking on a shared machine] (bench/allreduce_bench.cpp): variants take turns
// step by step, so load from other processes spreads over all of them, and the table shows
// the best and the median step.
class StepBench {
 public:
  StepBench(const ddpv::World& world, ddpv::Model& model, int batch)
      : world_(world), model_(model), batch_(batch) {
    const ddpv::Shape& in = model.input_shape();
    images_.resize(static_cast<size_t>(batch * in.numel()));
    ddpv::Rng rng(ddpv::derive_key(5, static_cast<uint64_t>(world.rank())));
    for (float& x : images_) x = rng.normal();
    for (int i = 0; i < batch; ++i)
      labels_.push_back(static_cast<int32_t>(rng.uniform_int(model.num_classes())));
    x_ = ddpv::Tensor::wrap(images_.data(), ddpv::Shape{batch, in[0], in[1], in[2]},
                            ddpv::DType::kF32);
    dlogits_ = ddpv::Tensor::empty(ddpv::Shape{batch, model.num_classes()}, ddpv::DType::kF32);
    loss_ = model.backend().softmax_cross_entropy(model.num_classes());
    spans_ = model.decay_spans();
  }

  void step(Runner& r, bool record) {
    ddpv::Backend& be = model_.backend();
    r.reducer->set_sync(r.v->communicate);
    world_.barrier();
    const auto t0 = Clock::now();
    const ddpv::Tensor& logits = model_.forward(x_, true);
    loss_->forward(batch_, logits.data<float>(), labels_.data());
    loss_->backward(batch_, labels_.data(), dlogits_.data<float>(),
                    1.0f / static_cast<float>(batch_));
    model_.backward(dlogits_, false, r.reducer->ready_fn());
    const auto t1 = Clock::now();
    r.reducer->wait();
    const double wait = ms_since(t1);
    ddpv::SgdConfig sgd;
    sgd.lr = 0.01f;
    sgd.grad_scale = r.reducer->grad_scale();
    be.sgd_update(sgd, spans_, model_.param_count(), model_.param_data(), model_.grad_data(),
                  model_.momentum_data());
    // The step is as slow as its slowest rank.
    int64_t us[2] = {static_cast<int64_t>(ms_since(t0) * 1000), static_cast<int64_t>(wait * 1000)};
    world_.allreduce_max(us, 2);
    if (record) {
      r.step_ms.push_back(static_cast<double>(us[0]) / 1000);
      r.wait_ms.push_back(static_cast<double>(us[1]) / 1000);
    }
  }

 private:
  const ddpv::World& world_;
  ddpv::Model& model_;
  int batch_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
  ddpv::Tensor x_, dlogits_;
  std::unique_ptr<ddpv::SoftmaxCrossEntropyOp> loss_;
  std::vector<ddpv::ParamSpan> spans_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    ddpv::World world(&argc, &argv);
    const std::string model_name = argc > 1 ? argv[1] : "resnet20";
    const int batch = argc > 2 ? std::atoi(argv[2]) : 64;
    const int steps = argc > 3 ? std::atoi(argv[3]) : 10;
    const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
    auto backend = ddpv::make_backend(ddpv::BackendOptions{.threads = threads});
    const bool imagenet = model_name == "resnet18" || model_name == "resnet50";
    auto model = ddpv::make_model(model_name, *backend,
                                  imagenet ? ddpv::Shape{224, 224, 3} : ddpv::Shape{32, 32, 3},
                                  imagenet ? 1000 : 10);
    model->init_parameters(1);
    const Variant variants[] = {
        {"no communication", ddpv::MpiProgress::kNonBlocking, true, 25, false},
        {"overlap, 25 MiB, non-blocking", ddpv::MpiProgress::kNonBlocking, true, 25, true},
        {"no-overlap, 25 MiB, non-blocking", ddpv::MpiProgress::kNonBlocking, false, 25, true},
        {"overlap, bucket 0, non-blocking", ddpv::MpiProgress::kNonBlocking, true, 0, true},
        {"overlap, 25 MiB, thread", ddpv::MpiProgress::kThread, true, 25, true},
        {"no-overlap, 25 MiB, thread", ddpv::MpiProgress::kThread, false, 25, true},
        {"overlap, bucket 0, thread", ddpv::MpiProgress::kThread, true, 0, true},
    };
    std::vector<Runner> runners;
    for (const Variant& v : variants) {
      Runner r{&v, ddpv::make_mpi_communicator(world, v.progress), nullptr, {}, {}};
      r.reducer = std::make_unique<ddpv::GradReducer>(
          ddpv::BucketPlan(model->params(), v.bucket_mb), *r.comm, model->grad_data(),
          ddpv::GradReducerOptions{.overlap = v.overlap});
      runners.push_back(std::move(r));
    }
    StepBench bench(world, *model, batch);
    for (int s = 0; s < 1 + steps; ++s)  // round 0 warms up
      for (Runner& r : runners) bench.step(r, s > 0);
    if (world.rank() == 0) {
      std::printf(
          "%s, batch %d per rank, %d ranks, %d thread(s) per rank, %lld parameters "
          "(%.2f MiB of gradients), %d steps per variant, interleaved\n",
          model_name.c_str(), batch, world.size(), threads,
          static_cast<long long>(model->num_parameters()),
          static_cast<double>(model->param_count()) * 4 / (1 << 20), steps);
      std::printf("%-34s %10s %10s %18s\n", "variant", "best ms", "median ms", "median wait ms");
      for (const Runner& r : runners) {
        std::printf("%-34s %10.1f %10.1f %18.2f\n", r.v->name,
                    *std::min_element(r.step_ms.begin(), r.step_ms.end()), median(r.step_ms),
                    median(r.wait_ms));
      }
    }
  } catch (const std::exception& e) {
    ddpv::abort_job("ddp_step_bench", e);
  }
  return 0;
}

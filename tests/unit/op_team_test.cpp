// Note [No team of one] (src/backend/cpu/team.hpp): with one thread, the CPU backend's loops
// must not enter libgomp at all, since each region it opens ends in a futex system call. This
// test interposes GOMP_parallel, the call every `#pragma omp parallel` compiles to (the
// executable's definition wins over libgomp's, for the backend's static library and for
// oneDNN's shared one alike), and counts the regions of whole training steps: forward,
// loss, backward, the SGD update and an evaluation forward of lenet and resnet20.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/rng.hpp"
#include "ddpv/nn/model.hpp"

namespace {

std::atomic<long> g_regions{0};

}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  using Entry = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const auto real = reinterpret_cast<Entry>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  g_regions.fetch_add(1, std::memory_order_relaxed);
  real(fn, data, threads, flags);
}

namespace ddpv {
namespace {

// The OpenMP regions opened by two training steps and one evaluation forward of `name` on a
// CPU backend of `threads` threads (one step before counting: first calls build primitives).
long regions_of_steps(const std::string& name, int threads) {
  BackendOptions bo;
  bo.threads = threads;
  auto backend = make_backend(bo);
  const Shape in = name == "lenet" ? Shape{28, 28, 1} : Shape{32, 32, 3};
  auto model = make_model(name, *backend, in, 10);
  model->init_parameters(1);
  auto loss = backend->softmax_cross_entropy(10);
  const int batch = 16;
  Tensor x = Tensor::empty(Shape{batch, in[0], in[1], in[2]}, DType::kF32);
  Tensor y = Tensor::empty(Shape{batch}, DType::kI32);
  Tensor dl = Tensor::empty(Shape{batch, 10}, DType::kF32);
  Rng rng(5);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.normal();
  for (int i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform_int(10));
  SgdConfig sgd;
  sgd.lr = 0.01f;
  sgd.momentum = 0.9f;
  const std::vector<ParamSpan> spans = model->decay_spans();
  auto step = [&] {
    const Tensor& logits = model->forward(x, true);
    loss->forward(batch, logits.data<float>(), y.data<int32_t>());
    loss->backward(batch, y.data<int32_t>(), dl.data<float>(), 1.0f / batch);
    model->backward(dl, false);
    backend->sgd_update(sgd, spans, model->param_count(), model->param_data(), model->grad_data(),
                        model->momentum_data());
  };
  step();
  const long before = g_regions.load();
  step();
  step();
  model->forward(x, false);
  return g_regions.load() - before;
}

TEST(CpuTeam, OneThreadOpensNoOpenMpRegion) {
  for (const char* name : {"lenet", "resnet20"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(regions_of_steps(name, 1), 0);
    // The counter sees the backend's regions: with three threads the same steps open many
    // (every Winograd transform and product of each chunk, the SGD update, ...).
    EXPECT_GT(regions_of_steps(name, 3), 20);
  }
}

}  // namespace
}  // namespace ddpv

// The NCCL communicator with one rank (a GPU machine has one GPU, and NCCL takes one rank per
// GPU): collectives give the right values, and are ordered with the backend's compute stream
// both ways (Note [Stream-ordered collectives]). Skips visibly without a GPU.
#include <cstdlib>
#include <string>
#include <vector>

#include "ddpv/core/dtype.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/world.hpp"
#include "support/test_support.hpp"

namespace ddpv::test {
namespace {

TEST(CudaNccl, OneRankCollectivesAreCorrectAndStreamOrdered) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU case skipped";
  // A singleton MPI start (no mpirun) as root, as on the GPU test machine.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  World world;
  ASSERT_EQ(world.size(), 1) << "run this test as a single process";
  BackendOptions opt;
  opt.device = Device::kCuda;
  opt.device_index = world.device_index(cuda_device_count());
  auto gpu = make_backend(opt);
  auto comm = make_communicator(world, *gpu);
  EXPECT_NE(comm->name().find("nccl"), std::string::npos) << comm->name();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), Device::kCuda);

  // Stream order: fill on the compute stream -> async allreduce -> scale on the compute stream
  // queued right after wait(). Large enough that a missing dependency would show.
  const int64_t n = 1 << 22;
  DeviceBuffer buf(gpu.get(), static_cast<size_t>(n));
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum, ReduceOp::kMax}) {
    gpu->fill(n, 1.5f, buf.data());
    auto work = comm->allreduce_async(buf.data(), n, CommType::kF32, op);
    work->wait();
    gpu->scale(n, 2.0f, buf.data());
    const std::vector<float> host = buf.to_host();
    EXPECT_EQ(host.front(), 3.0f) << reduce_op_name(op);
    EXPECT_EQ(host.back(), 3.0f) << reduce_op_name(op);
  }

  // Blocking forms and other types.
  const std::vector<float> values = random_vector(1000, 9);
  DeviceBuffer v(gpu.get(), values);
  comm->allreduce(v.data(), 1000, ReduceOp::kSum);
  EXPECT_EQ(v.to_host(), values);
  comm->broadcast(v.data(), 1000 * sizeof(float), 0);
  EXPECT_EQ(v.to_host(), values);
  Tensor ints = Tensor::empty(Shape{4}, DType::kI32, gpu->allocator());
  EXPECT_THROW(comm->allreduce(ints.raw(), 4, CommType::kI32, ReduceOp::kAvg), Error);
  comm->allreduce(ints.raw(), 4, CommType::kI32, ReduceOp::kMax);
  comm->barrier();

  // bf16 (--reduce-dtype bf16): the reducer's path, cast -> allreduce -> cast back, in order on
  // the streams; with one rank the sum is the bf16 rounding of the input.
  Tensor half = Tensor::empty(Shape{1000}, DType::kBF16, gpu->allocator());
  auto* h = static_cast<uint16_t*>(half.raw());
  gpu->cast_to_bf16(1000, v.data(), h);
  comm->allreduce_async(h, 1000, CommType::kBF16, ReduceOp::kSum)->wait();
  gpu->cast_from_bf16(1000, h, v.data());
  const std::vector<float> rounded = v.to_host();
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(rounded[i], bf16_to_f32(f32_to_bf16(values[i]))) << i;

  // A handle destroyed without wait() still orders the compute stream after it.
  gpu->fill(n, 4.0f, buf.data());
  comm->allreduce_async(buf.data(), n, CommType::kF32, ReduceOp::kAvg).reset();
  EXPECT_EQ(buf.to_host().back(), 4.0f);

  comm->set_step(42);
  comm->set_timeout(30);
  EXPECT_THROW(comm->set_timeout(0), Error);
}

}  // namespace
}  // namespace ddpv::test

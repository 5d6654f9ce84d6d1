// Keeping the model replicas of all ranks equal: initial broadcast, BatchNorm statistics
// averaging, and a hash to verify bit-identical parameters.
#include <cstring>
#include <vector>

#include "ddpv/core/error.hpp"
#include "ddpv/dist/grad_reducer.hpp"

namespace ddpv {

void broadcast_parameters(Model& model, Communicator& comm, int root) {
  DDPV_CHECK(comm.device() == model.backend().device(), "communicator on ",
             device_name(comm.device()), " cannot move a model on ",
             device_name(model.backend().device()));
  // The arenas are contiguous, so the whole model is two collectives.
  comm.broadcast(model.param_data(), static_cast<size_t>(model.param_count()) * sizeof(float),
                 root);
  if (model.buffer_count() > 0) {
    comm.broadcast(model.buffer_data(), static_cast<size_t>(model.buffer_count()) * sizeof(float),
                   root);
  }
}

void average_buffers(Model& model, Communicator& comm) {
  if (model.buffer_count() == 0) return;
  // One collective over the whole buffer arena. num_batches_tracked holds the same integer on
  // every rank: the sum W * n is exact in float below 2^24 and dividing it by W gives n back.
  comm.allreduce(model.buffer_data(), model.buffer_count(), ReduceOp::kAvg);
}

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed) {
  // FNV-1a, 64 bit: order-sensitive and plenty for telling replicas apart.
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t model_hash(Model& model) {
  Backend& be = model.backend();
  auto to_host = [&](const float* src, int64_t count) {
    std::vector<float> host(static_cast<size_t>(count));
    if (count > 0)
      be.copy(host.data(), Device::kCpu, src, be.device(), host.size() * sizeof(float));
    return host;
  };
  const std::vector<float> p = to_host(model.param_data(), model.param_count());
  const std::vector<float> b = to_host(model.buffer_data(), model.buffer_count());
  return hash_bytes(b.data(), b.size() * sizeof(float),
                    hash_bytes(p.data(), p.size() * sizeof(float)));
}

}  // namespace ddpv

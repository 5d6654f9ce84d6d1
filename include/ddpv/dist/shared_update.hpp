// SharedUpdate: the ranks of a node keep one copy of the parameters and the momentum in shared
// memory and update it together after backward, in place of a gradient allreduce followed by
// an optimizer step on every rank (Note [Shared update] in src/dist/shared_update.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {

class Model;
class World;

class SharedUpdate {
 public:
  // Collective over the world: every rank calls it at the same point, after the model's
  // parameters and momentum are equal on all ranks. It moves the model's arenas into node
  // shared memory (Model::bind_arenas) and returns the update, or returns null on every rank
  // alike and leaves the model as it was, with the reason in *why_not: one rank, a backend
  // whose memory is not the host's, nodes with different numbers of ranks, or shared memory
  // that could not be made (each rank that failed also warns why).
  static std::unique_ptr<SharedUpdate> create(const World& world, Model& model,
                                              std::string* why_not);
  ~SharedUpdate();
  SharedUpdate(const SharedUpdate&) = delete;
  SharedUpdate& operator=(const SharedUpdate&) = delete;

  // Once every rank's backward has written its gradients: sums them over all ranks and applies
  // one SGD step (cfg.grad_scale as for Backend::sgd_update, so 1 / world size averages). When
  // it returns, every rank of the node sees the new parameters. Returns the seconds spent
  // waiting for other ranks and, across nodes, for the network.
  double step(const SgdConfig& cfg);

  // For the last backward before a step (not the earlier ones of gradient accumulation): tells
  // the other ranks of the node which gradients are final, so that they can update those
  // parameters while this rank's backward goes on (Note [Updating while others finish]).
  // Empty across nodes. Valid while the update lives.
  GradReadyFn ready_fn();
  // The update's unit of work, in floats of the arena (Note [Updating while others finish]).
  static constexpr int64_t kChunkFloats = 16384;
  // The chunks of the arena this rank has updated while another rank's backward was still
  // writing gradients (Note [Updating while others finish]).
  int64_t early_chunks() const;

  std::string summary() const;  // "shared update: 2 ranks per node x 1 node, ..."

  struct Impl;

 private:
  explicit SharedUpdate(std::unique_ptr<Impl> impl);
  double step_one_node(const SgdConfig& cfg);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpv

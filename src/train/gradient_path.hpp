// GradientPath: how a step's gradients reach the optimizer, one interface for the trainer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/dist/grad_reducer.hpp"
#include "ddpv/dist/shared_update.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {

// Note [One gradient path]: a step runs accum_steps micro-batches, then one update. Between
// the backward passes and the updated parameters there are two ways (Note [Shared update]:
// the node's ranks update one shared copy together; otherwise buckets are allreduced during
// backward, then each rank updates its own copy), and the trainer sees only this:
//   for each micro-batch k:  model.backward(dy, k > 0, path.ready_fn(last));
//                            waited += path.finish_backward();
//   then:                    waited += path.apply(sgd);
// where last is k == accum_steps - 1. Both ways are collective: every rank calls the three
// at the same points. The seconds returned are those spent waiting for other ranks (Note
// [Rank times]).
class GradientPath {
 public:
  virtual ~GradientPath() = default;
  // The callback for the coming backward: told of each gradient as it is final, so that the
  // exchange can start before backward ends. `last`: the step's last micro-batch, the only
  // one whose gradients are final (empty for the others where nothing is to be done).
  virtual GradReadyFn ready_fn(bool last) = 0;
  // After each backward: the seconds waited for what that backward started.
  virtual double finish_backward() = 0;
  // The step's update, on the gradients summed over ranks (cfg.grad_scale averages them):
  // the seconds waited for the others.
  virtual double apply(const SgdConfig& cfg) = 0;
  // For the start-up line: "mpi (...); 3 buckets ..." or "shared update: ...".
  virtual std::string summary() const = 0;
  // The names of the profile's rows for finish_backward() and apply() (Note [Layer profile]);
  // an empty name: not timed.
  virtual const std::string& exchange_kind() const = 0;
  virtual const std::string& update_kind() const = 0;
};

// Buckets allreduced by `comm` during backward, then Backend::sgd_update on each rank.
std::unique_ptr<GradientPath> make_reducer_path(Model& model, Backend& backend,
                                                Communicator& comm,
                                                const std::vector<ParamSpan>& spans,
                                                double bucket_mb, GradReducerOptions options);
// The node's ranks update one shared copy (SharedUpdate::create succeeded). `shared` must
// outlive the path; the trainer holds it apart because it must also outlive the model, whose
// arenas it may hold, while a reducer must go before the model and the communicator.
std::unique_ptr<GradientPath> make_shared_path(SharedUpdate& shared);

}  // namespace ddpv

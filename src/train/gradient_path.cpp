// The two gradient paths behind GradientPath (Note [One gradient path]).
#include "train/gradient_path.hpp"

#include "ddpv/core/clock.hpp"

namespace ddpv {
namespace {

const std::string kNotTimed;
const std::string kReduceWait = "wait after backward";
const std::string kSgdUpdate = "sgd update";
const std::string kSharedUpdate = "shared update (+ wait)";

class ReducerPath final : public GradientPath {
 public:
  ReducerPath(Model& model, Backend& backend, Communicator& comm,
              const std::vector<ParamSpan>& spans, double bucket_mb, GradReducerOptions options)
      : model_(model),
        backend_(backend),
        spans_(spans),
        reduce_bf16_(options.reduce_type == CommType::kBF16),
        comm_name_(comm.name()),
        reducer_(BucketPlan(model.params(), bucket_mb), comm, model.grad_data(), options) {}

  GradReadyFn ready_fn(bool last) override {
    reducer_.set_sync(last);  // accumulation: only the last micro-batch communicates
    return reducer_.ready_fn();
  }
  double finish_backward() override {
    const auto t = Clock::now();
    reducer_.wait();
    return seconds_since(t);
  }
  double apply(const SgdConfig& cfg) override {
    backend_.sgd_update(cfg, spans_, model_.param_count(), model_.param_data(),
                        model_.grad_data(), model_.momentum_data());
    return 0;
  }
  std::string summary() const override {
    return comm_name_ + (reduce_bf16_ ? " in bf16; " : "; ") + reducer_.plan().summary();
  }
  const std::string& exchange_kind() const override { return kReduceWait; }
  const std::string& update_kind() const override { return kSgdUpdate; }

 private:
  Model& model_;
  Backend& backend_;
  const std::vector<ParamSpan>& spans_;
  bool reduce_bf16_;
  std::string comm_name_;
  GradReducer reducer_;
};

class SharedPath final : public GradientPath {
 public:
  explicit SharedPath(SharedUpdate& shared) : shared_(shared) {}
  // Only the last backward's gradients are final: the others' tell the node nothing.
  GradReadyFn ready_fn(bool last) override { return last ? shared_.ready_fn() : GradReadyFn{}; }
  double finish_backward() override { return 0; }  // the exchange is the update itself
  double apply(const SgdConfig& cfg) override { return shared_.step(cfg); }
  std::string summary() const override { return shared_.summary(); }
  const std::string& exchange_kind() const override { return kNotTimed; }
  const std::string& update_kind() const override { return kSharedUpdate; }

 private:
  SharedUpdate& shared_;
};

}  // namespace

std::unique_ptr<GradientPath> make_reducer_path(Model& model, Backend& backend,
                                                Communicator& comm,
                                                const std::vector<ParamSpan>& spans,
                                                double bucket_mb, GradReducerOptions options) {
  return std::make_unique<ReducerPath>(model, backend, comm, spans, bucket_mb, options);
}

std::unique_ptr<GradientPath> make_shared_path(SharedUpdate& shared) {
  return std::make_unique<SharedPath>(shared);
}

}  // namespace ddpv

// Private to the backends: bases for ops whose kernels compute on f32 activations. Each takes
// the interface's typed views (Note [Activation dtype]), checks that they are f32, and calls
// the *_f32 entry points its kernels implement: the CPU backend's fp32 ops, which bf16
// activations reach through the fallback's adapters (Note [bf16 fallback on the CPU]), handing
// them f32 copies. (The CUDA ops take the views themselves: Note [Casts at the edges].)
#pragma once

#include "ddpv/backend/backend.hpp"

namespace ddpv {

// Conv2dOp and LinearOp take the same arguments (a weighted op: x, w, b -> y).
template <class Op>
class F32WeightedOp : public Op {
 public:
  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) final {
    forward_f32(n, x.f32(), w, b, y.f32());
  }
  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) final {
    backward_f32(n, x.f32(), w, dy.f32(), dx.f32(), dw, db, accumulate);
  }
  virtual void forward_f32(int n, const float* x, const float* w, const float* b, float* y) = 0;
  virtual void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx,
                            float* dw, float* db, bool accumulate) = 0;
};
using F32Conv2dOp = F32WeightedOp<Conv2dOp>;
using F32LinearOp = F32WeightedOp<LinearOp>;

class F32BatchNormOp : public BatchNormOp {
 public:
  void forward_train(int n, ConstAct x, const float* gamma, const float* beta, MutAct y,
                     float* running_mean, float* running_var) final {
    forward_train_f32(n, x.f32(), gamma, beta, y.f32(), running_mean, running_var);
  }
  void forward_infer(int n, ConstAct x, const float* gamma, const float* beta,
                     const float* running_mean, const float* running_var, MutAct y) final {
    forward_infer_f32(n, x.f32(), gamma, beta, running_mean, running_var, y.f32());
  }
  void backward(int n, ConstAct x, const float* gamma, ConstAct dy, MutAct dx, float* dgamma,
                float* dbeta, bool accumulate) final {
    backward_f32(n, x.f32(), gamma, dy.f32(), dx.f32(), dgamma, dbeta, accumulate);
  }
  virtual void forward_train_f32(int n, const float* x, const float* gamma, const float* beta,
                                 float* y, float* running_mean, float* running_var) = 0;
  virtual void forward_infer_f32(int n, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y) = 0;
  virtual void backward_f32(int n, const float* x, const float* gamma, const float* dy, float* dx,
                            float* dgamma, float* dbeta, bool accumulate) = 0;
};

class F32Pool2dOp : public Pool2dOp {
 public:
  void forward(int n, ConstAct x, MutAct y) final { forward_f32(n, x.f32(), y.f32()); }
  void backward(int n, ConstAct dy, MutAct dx) final { backward_f32(n, dy.f32(), dx.f32()); }
  virtual void forward_f32(int n, const float* x, float* y) = 0;
  virtual void backward_f32(int n, const float* dy, float* dx) = 0;
};

class F32SoftmaxCrossEntropyOp : public SoftmaxCrossEntropyOp {
 public:
  LossResult forward(int n, ConstAct logits, const int32_t* labels) final {
    return forward_f32(n, logits.f32(), labels);
  }
  void backward(int n, const int32_t* labels, MutAct dlogits, float scale) final {
    backward_f32(n, labels, dlogits.f32(), scale);
  }
  virtual LossResult forward_f32(int n, const float* logits, const int32_t* labels) = 0;
  virtual void backward_f32(int n, const int32_t* labels, float* dlogits, float scale) = 0;
};

class F32FusedBlockOp : public FusedBlockOp {
 public:
  void forward(int n, bool training, ConstAct x, const FusedBlockParams& p, ConstAct residual,
               float* saved, MutAct y) final {
    forward_f32(n, training, x.f32(), p, residual.f32(), saved, y.f32());
  }
  void backward(int n, ConstAct x, const FusedBlockParams& p, const float* saved, ConstAct y,
                ConstAct dy, float* scratch, MutAct dx, bool accumulate) final {
    backward_f32(n, x.f32(), p, saved, y.f32(), dy.f32(), scratch, dx.f32(), accumulate);
  }
  virtual void forward_f32(int n, bool training, const float* x, const FusedBlockParams& p,
                           const float* residual, float* saved, float* y) = 0;
  virtual void backward_f32(int n, const float* x, const FusedBlockParams& p, const float* saved,
                            const float* y, const float* dy, float* scratch, float* dx,
                            bool accumulate) = 0;
};

}  // namespace ddpv

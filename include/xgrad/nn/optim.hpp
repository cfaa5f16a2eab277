// Optimizers: SGD, Momentum (with Nesterov), Adam, AdamW; clip_by_global_norm; learning-rate
// schedules. Each keeps its state (learning rate,
// moments, powers of beta) in tensors it updates in place, so the same step() runs op by op in
// eager mode and is traced into a compiled train step in graph mode, and a checkpoint can save
// the state and resume exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update from `grads`, one per parameter in order (as value_and_grad returns them).
  XGRAD_API void step(const std::vector<Tensor<float>>& grads, SourceLoc loc = SourceLoc::current());

  /// One update from the gradients backward() accumulated in each parameter's grad().
  XGRAD_API void step(SourceLoc loc = SourceLoc::current());

  /// Clears the gradients backward() accumulated.
  void zero_grad() {
    for (auto& p : m_params) p.zero_grad();
  }

  const std::vector<Parameter<float>>& parameters() const { return m_params; }

  /// The learning rate lives in a tensor: changing it does not recompile a jitted train step.
  float learning_rate() const { return m_lr.item(); }
  XGRAD_API void set_learning_rate(float lr, SourceLoc loc = SourceLoc::current());

  /// (name, tensor) of every state tensor: "learning_rate", then per-parameter state named after
  /// the parameter ("moments.fc1.weight"). Checkpoints save and restore these in place.
  XGRAD_API std::vector<std::pair<std::string, TensorBase>> named_state() const;

  const std::string& name() const { return m_name; }

  /// What is wrong with `value` as this optimizer's state tensor `state` (a name of
  /// named_state()), or "" when it fits: a checkpoint is checked with this before it loads, so
  /// a file cannot set what the constructor refuses.
  XGRAD_API virtual std::string state_problem(std::string_view state, const Tensor<float>& value) const;

 protected:
  XGRAD_API Optimizer(std::string name, std::vector<Parameter<float>> params, float lr, float weight_decay,
                      SourceLoc loc);

  /// A state tensor per parameter, zero-initialized, named "<kind>.<parameter name>".
  XGRAD_API std::vector<Tensor<float>> add_per_parameter_state(const std::string& kind);
  XGRAD_API Tensor<float> add_state(const std::string& name, float value);
  static void check_unit_interval(std::string_view op, const char* what, float v, SourceLoc loc) {
    if (!(v >= 0.0f && v < 1.0f)) throw_value_error(op, loc, what, " must be in [0, 1), got ", v);
  }

  virtual void begin_step() {}
  /// Updates parameter i in place from its gradient g (weight decay already added unless decoupled).
  virtual void update(std::size_t i, const Tensor<float>& g) = 0;
  virtual bool decoupled_weight_decay() const { return false; }

  Parameter<float>& param(std::size_t i) { return m_params[i]; }
  const Tensor<float>& lr() const { return m_lr; }
  float weight_decay() const { return m_weight_decay; }

 private:
  static bool valid_learning_rate(float lr) { return lr >= 0.0f && std::isfinite(lr); }
  void check_learning_rate(float lr, SourceLoc loc) const {
    if (!valid_learning_rate(lr)) throw_value_error(m_name, loc, "learning_rate must be finite and >= 0, got ", lr);
  }

  std::string m_name;
  std::vector<Parameter<float>> m_params;
  float m_weight_decay;
  Tensor<float> m_lr;
  std::vector<std::pair<std::string, TensorBase>> m_state;
};

/// p -= lr * (g + weight_decay * p)
class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter<float>> params, float lr, float weight_decay = 0.0f, SourceLoc loc = SourceLoc::current())
      : Optimizer("SGD", std::move(params), lr, weight_decay, loc) {}

 private:
  void update(std::size_t i, const Tensor<float>& g) override { param(i) -= lr() * g; }
};

struct MomentumOptions {
  float weight_decay = 0.0f;
  bool nesterov = false;
};

/// v = momentum * v + g; p -= lr * v, or with Nesterov p -= lr * (g + momentum * v)
/// (MindSpore's Momentum and PyTorch's SGD with momentum and no dampening).
class Momentum : public Optimizer {
 public:
  XGRAD_API Momentum(std::vector<Parameter<float>> params, float lr, float momentum, MomentumOptions options = {},
                     SourceLoc loc = SourceLoc::current());

 private:
  XGRAD_API void update(std::size_t i, const Tensor<float>& g) override;

  float m_momentum;
  bool m_nesterov;
  std::vector<Tensor<float>> m_velocity;
};

struct AdamOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

/// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr * m^ / (sqrt(v^) + eps) with
/// m^ = m / (1 - b1^t), v^ = v / (1 - b2^t). Adam adds weight decay to g (L2); AdamW
/// decays the parameter directly, p -= lr * weight_decay * p, before the update.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Parameter<float>> params, float lr = 1e-3f, AdamOptions options = {},
       SourceLoc loc = SourceLoc::current())
      : Adam("Adam", std::move(params), lr, options, loc) {}

 protected:
  XGRAD_API Adam(std::string name, std::vector<Parameter<float>> params, float lr, AdamOptions options, SourceLoc loc);

 public:
  XGRAD_API std::string state_problem(std::string_view state, const Tensor<float>& value) const override;

 private:
  XGRAD_API void begin_step() override;
  XGRAD_API void update(std::size_t i, const Tensor<float>& g) override;

  AdamOptions m_options;
  std::vector<Tensor<float>> m_moment1, m_moment2;
  Tensor<float> m_beta1_power, m_beta2_power;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter); weight_decay defaults to 0.01.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Parameter<float>> params, float lr = 1e-3f, AdamOptions options = {.weight_decay = 0.01f},
        SourceLoc loc = SourceLoc::current())
      : Adam("AdamW", std::move(params), lr, options, loc) {}

 private:
  bool decoupled_weight_decay() const override { return true; }
};

/// A learning rate for each step (0, 1, ...): give it to any optimizer's set_learning_rate
/// before the step; the rate lives in a tensor, so a compiled train step is not traced again.
using LearningRateSchedule = std::function<float(std::int64_t step)>;

/// Linear warmup, step s < warmup_steps getting base_lr (s + 1) / warmup_steps; then a cosine
/// from base_lr at step warmup_steps down to min_lr at total_steps; min_lr after that.
XGRAD_API LearningRateSchedule warmup_cosine(float base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                                             float min_lr = 0.0f, SourceLoc loc = SourceLoc::current());

/// base_lr times gamma for every step_size steps done (PyTorch's StepLR).
XGRAD_API LearningRateSchedule step_decay(float base_lr, std::int64_t step_size, float gamma,
                                          SourceLoc loc = SourceLoc::current());

/// Gradients scaled so that their global norm (the 2-norm of all of them together) is at most
/// max_norm, as optax's clip_by_global_norm and PyTorch's clip_grad_norm_: each gradient times
/// min(1, max_norm / norm). Returns the clipped gradients and the norm before clipping. Written
/// with ops, so it is traced into a compiled train step like the rest of it.
struct ClippedGrads {
  std::vector<Tensor<float>> grads;
  Tensor<float> global_norm;
};
XGRAD_API ClippedGrads clip_by_global_norm(const std::vector<Tensor<float>>& grads, float max_norm,
                                           SourceLoc loc = SourceLoc::current());

}  // namespace xgrad::optim

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/optim-inl.hpp"
#endif

// Optimizers: SGD, Momentum (with Nesterov), Adam, AdamW. Each keeps its state (learning rate,
// moments, powers of beta) in tensors it updates in place, so the same step() runs op by op in
// eager mode and is traced into a compiled train step in graph mode, and a checkpoint can save
// the state and resume exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/factory.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"

namespace xgrad::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update from `grads`, one per parameter in order (as value_and_grad returns them).
  void step(const std::vector<Tensor<float>>& grads, SourceLoc loc = SourceLoc::current()) {
    if (grads.size() != m_params.size())
      throw_value_error(m_name, loc, "step got ", grads.size(), " gradients for ", m_params.size(), " parameters");
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (grads[i].shape() != m_params[i].shape())
        throw_shape_error(m_name, loc, "the gradient of parameter '", m_params[i].name(), "' has shape ",
                          grads[i].shape(), ", expected ", m_params[i].shape());
    no_grad off;
    begin_step();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      Tensor<float> g = grads[i];
      if (m_weight_decay != 0.0f && !decoupled_weight_decay()) g = g + m_params[i] * m_weight_decay;
      update(i, g);
    }
  }

  /// One update from the gradients backward() accumulated in each parameter's grad().
  void step(SourceLoc loc = SourceLoc::current()) {
    std::vector<Tensor<float>> grads;
    for (const auto& p : m_params) grads.push_back(p.grad().defined() ? p.grad() : zeros_like(Tensor<float>(p)));
    step(grads, loc);
  }

  /// Clears the gradients backward() accumulated.
  void zero_grad() {
    for (auto& p : m_params) p.zero_grad();
  }

  const std::vector<Parameter<float>>& parameters() const { return m_params; }

  /// The learning rate lives in a tensor: changing it does not recompile a jitted train step.
  float learning_rate() const { return m_lr.item(); }
  void set_learning_rate(float lr, SourceLoc loc = SourceLoc::current()) {
    check_learning_rate(lr, loc);
    no_grad off;
    m_lr.assign(scalar<float>(lr));
  }

  /// (name, tensor) of every state tensor: "learning_rate", then per-parameter state named after
  /// the parameter ("moments.fc1.weight"). Checkpoints save and restore these in place.
  std::vector<std::pair<std::string, TensorBase>> named_state() const {
    std::vector<std::pair<std::string, TensorBase>> out{{"learning_rate", m_lr}};
    for (const auto& [name, t] : m_state) out.emplace_back(name, t);
    return out;
  }

  const std::string& name() const { return m_name; }

  /// What is wrong with `value` as this optimizer's state tensor `state` (a name of
  /// named_state()), or "" when it fits: a checkpoint is checked with this before it loads, so
  /// a file cannot set what the constructor refuses.
  virtual std::string state_problem(std::string_view state, const Tensor<float>& value) const {
    if (state == "learning_rate" && !valid_learning_rate(value.item()))
      return xgrad::detail::concat("learning_rate must be finite and >= 0, got ", value.item());
    return "";
  }

 protected:
  Optimizer(std::string name, std::vector<Parameter<float>> params, float lr, float weight_decay, SourceLoc loc)
      : m_name(std::move(name)), m_params(std::move(params)), m_weight_decay(weight_decay) {
    if (m_params.empty()) throw_value_error(m_name, loc, "got no parameters to optimize");
    check_learning_rate(lr, loc);
    if (!(weight_decay >= 0.0f)) throw_value_error(m_name, loc, "weight_decay must be >= 0, got ", weight_decay);
    m_lr = scalar<float>(lr);
  }

  /// A state tensor per parameter, zero-initialized, named "<kind>.<parameter name>".
  std::vector<Tensor<float>> add_per_parameter_state(const std::string& kind) {
    std::vector<Tensor<float>> out;
    for (const auto& p : m_params) {
      out.push_back(zeros<float>(p.shape()));
      m_state.emplace_back(kind + "." + p.name(), out.back());
    }
    return out;
  }
  Tensor<float> add_state(const std::string& name, float value) {
    Tensor<float> t = scalar<float>(value);
    m_state.emplace_back(name, t);
    return t;
  }
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
  Momentum(std::vector<Parameter<float>> params, float lr, float momentum, MomentumOptions options = {},
           SourceLoc loc = SourceLoc::current())
      : Optimizer("Momentum", std::move(params), lr, options.weight_decay, loc),
        m_momentum(momentum),
        m_nesterov(options.nesterov) {
    check_unit_interval(name(), "momentum", momentum, loc);
    m_velocity = add_per_parameter_state("moments");
  }

 private:
  void update(std::size_t i, const Tensor<float>& g) override {
    Tensor<float>& v = m_velocity[i];
    v.assign(v * m_momentum + g);
    param(i) -= lr() * (m_nesterov ? g + v * m_momentum : v);
  }

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
  Adam(std::string name, std::vector<Parameter<float>> params, float lr, AdamOptions options, SourceLoc loc)
      : Optimizer(std::move(name), std::move(params), lr, options.weight_decay, loc), m_options(options) {
    check_unit_interval(this->name(), "beta1", options.beta1, loc);
    check_unit_interval(this->name(), "beta2", options.beta2, loc);
    if (!(options.eps > 0.0f)) throw_value_error(this->name(), loc, "eps must be > 0, got ", options.eps);
    m_moment1 = add_per_parameter_state("moment1");
    m_moment2 = add_per_parameter_state("moment2");
    m_beta1_power = add_state("beta1_power", 1.0f);
    m_beta2_power = add_state("beta2_power", 1.0f);
  }

 public:
  std::string state_problem(std::string_view state, const Tensor<float>& value) const override {
    if (state == "beta1_power" || state == "beta2_power") {
      const float power = value.item();  // beta^t: in [0, 1], 1 before the first step
      if (!(power >= 0.0f && power <= 1.0f)) return xgrad::detail::concat(state, " must be in [0, 1], got ", power);
    }
    if (state.starts_with("moment2.")) {  // running means of g^2
      for (float v : value.to_vector())
        if (!(v >= 0.0f)) return xgrad::detail::concat(state, " holds ", v, "; the second moments must be >= 0");
    }
    return Optimizer::state_problem(state, value);
  }

 private:
  void begin_step() override {
    m_beta1_power *= m_options.beta1;
    m_beta2_power *= m_options.beta2;
  }
  void update(std::size_t i, const Tensor<float>& g) override {
    const auto& [b1, b2, eps, wd] = m_options;
    Tensor<float>&m = m_moment1[i], &v = m_moment2[i];
    if (decoupled_weight_decay() && wd != 0.0f) param(i) -= lr() * wd * param(i);
    m.assign(m * b1 + g * (1.0f - b1));
    v.assign(v * b2 + g * g * (1.0f - b2));
    const Tensor<float> m_hat = m / (1.0f - m_beta1_power), v_hat = v / (1.0f - m_beta2_power);
    param(i) -= lr() * m_hat / (sqrt(v_hat) + eps);
  }

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

}  // namespace xgrad::optim

// Definitions of nn/optim.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>

#include "xgrad/core/factory.hpp"
#include "xgrad/nn/optim.hpp"

namespace xgrad::optim {

XGRAD_API void Optimizer::step(const std::vector<Tensor<float>>& grads, SourceLoc loc) {
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

XGRAD_API void Optimizer::step(SourceLoc loc) {
  std::vector<Tensor<float>> grads;
  for (const auto& p : m_params) grads.push_back(p.grad().defined() ? p.grad() : zeros_like(Tensor<float>(p)));
  step(grads, loc);
}

XGRAD_API void Optimizer::set_learning_rate(float lr, SourceLoc loc) {
  check_learning_rate(lr, loc);
  no_grad off;
  m_lr.assign(scalar<float>(lr));
}

XGRAD_API std::vector<std::pair<std::string, TensorBase>> Optimizer::named_state() const {
  std::vector<std::pair<std::string, TensorBase>> out{{"learning_rate", m_lr}};
  for (const auto& [name, t] : m_state) out.emplace_back(name, t);
  return out;
}

XGRAD_API std::string Optimizer::state_problem(std::string_view state, const Tensor<float>& value) const {
  if (state == "learning_rate" && !valid_learning_rate(value.item()))
    return xgrad::detail::concat("learning_rate must be finite and >= 0, got ", value.item());
  return "";
}

XGRAD_API Optimizer::Optimizer(std::string name, std::vector<Parameter<float>> params, float lr, float weight_decay,
                               SourceLoc loc)
    : m_name(std::move(name)), m_params(std::move(params)), m_weight_decay(weight_decay) {
  if (m_params.empty()) throw_value_error(m_name, loc, "got no parameters to optimize");
  check_learning_rate(lr, loc);
  if (!(weight_decay >= 0.0f)) throw_value_error(m_name, loc, "weight_decay must be >= 0, got ", weight_decay);
  m_lr = scalar<float>(lr);
}

XGRAD_API std::vector<Tensor<float>> Optimizer::add_per_parameter_state(const std::string& kind) {
  std::vector<Tensor<float>> out;
  for (const auto& p : m_params) {
    out.push_back(zeros<float>(p.shape()));
    m_state.emplace_back(kind + "." + p.name(), out.back());
  }
  return out;
}

XGRAD_API Tensor<float> Optimizer::add_state(const std::string& name, float value) {
  Tensor<float> t = scalar<float>(value);
  m_state.emplace_back(name, t);
  return t;
}

XGRAD_API Momentum::Momentum(std::vector<Parameter<float>> params, float lr, float momentum, MomentumOptions options,
                             SourceLoc loc)
    : Optimizer("Momentum", std::move(params), lr, options.weight_decay, loc),
      m_momentum(momentum),
      m_nesterov(options.nesterov) {
  check_unit_interval(name(), "momentum", momentum, loc);
  m_velocity = add_per_parameter_state("moments");
}

XGRAD_API void Momentum::update(std::size_t i, const Tensor<float>& g) {
  Tensor<float>& v = m_velocity[i];
  v.assign(v * m_momentum + g);
  param(i) -= lr() * (m_nesterov ? g + v * m_momentum : v);
}

XGRAD_API Adam::Adam(std::string name, std::vector<Parameter<float>> params, float lr, AdamOptions options,
                     SourceLoc loc)
    : Optimizer(std::move(name), std::move(params), lr, options.weight_decay, loc), m_options(options) {
  check_unit_interval(this->name(), "beta1", options.beta1, loc);
  check_unit_interval(this->name(), "beta2", options.beta2, loc);
  if (!(options.eps > 0.0f)) throw_value_error(this->name(), loc, "eps must be > 0, got ", options.eps);
  m_moment1 = add_per_parameter_state("moment1");
  m_moment2 = add_per_parameter_state("moment2");
  m_beta1_power = add_state("beta1_power", 1.0f);
  m_beta2_power = add_state("beta2_power", 1.0f);
}

XGRAD_API std::string Adam::state_problem(std::string_view state, const Tensor<float>& value) const {
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

XGRAD_API void Adam::begin_step() {
  m_beta1_power *= m_options.beta1;
  m_beta2_power *= m_options.beta2;
}

XGRAD_API void Adam::update(std::size_t i, const Tensor<float>& g) {
  const auto& [b1, b2, eps, wd] = m_options;
  Tensor<float>&m = m_moment1[i], &v = m_moment2[i];
  if (decoupled_weight_decay() && wd != 0.0f) param(i) -= lr() * wd * param(i);
  m.assign(m * b1 + g * (1.0f - b1));
  v.assign(v * b2 + g * g * (1.0f - b2));
  const Tensor<float> m_hat = m / (1.0f - m_beta1_power), v_hat = v / (1.0f - m_beta2_power);
  param(i) -= lr() * m_hat / (sqrt(v_hat) + eps);
}

XGRAD_API LearningRateSchedule warmup_cosine(float base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                                             float min_lr, SourceLoc loc) {
  if (!(base_lr > 0.0f) || !std::isfinite(base_lr) || !(min_lr >= 0.0f) || min_lr > base_lr)
    throw_value_error("warmup_cosine", loc,
                      "need 0 <= min_lr <= base_lr with base_lr positive and finite, got base_lr ", base_lr,
                      " and min_lr ", min_lr);
  if (warmup_steps < 0 || total_steps <= warmup_steps)
    throw_value_error("warmup_cosine", loc, "need 0 <= warmup_steps < total_steps, got ", warmup_steps, " and ",
                      total_steps);
  return [=](std::int64_t step) {
    step = std::max<std::int64_t>(step, 0);
    if (step < warmup_steps) return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    if (step >= total_steps) return min_lr;
    const double done = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return static_cast<float>(min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * done)));
  };
}

XGRAD_API LearningRateSchedule step_decay(float base_lr, std::int64_t step_size, float gamma, SourceLoc loc) {
  if (!(base_lr > 0.0f) || !std::isfinite(base_lr) || step_size <= 0 || !(gamma > 0.0f) || !(gamma <= 1.0f))
    throw_value_error("step_decay", loc, "need base_lr > 0, step_size > 0 and 0 < gamma <= 1, got base_lr ", base_lr,
                      ", step_size ", step_size, " and gamma ", gamma);
  return [=](std::int64_t step) {
    const auto decays = static_cast<double>(std::max<std::int64_t>(step, 0) / step_size);
    return base_lr * static_cast<float>(std::pow(static_cast<double>(gamma), decays));
  };
}

XGRAD_API ClippedGrads clip_by_global_norm(const std::vector<Tensor<float>>& grads, float max_norm, SourceLoc loc) {
  if (!(max_norm > 0.0f) || !std::isfinite(max_norm))
    throw_value_error("clip_by_global_norm", loc, "max_norm must be a positive finite number, got ", max_norm);
  Tensor<float> squares = zeros<float>({});
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined())
      throw_value_error("clip_by_global_norm", loc, "gradient ", i, " of ", grads.size(), " is undefined");
    squares = add(squares, sum(square(grads[i], loc), {}, false, loc), loc);
  }
  const Tensor<float> norm = sqrt(squares, loc);
  // 1 while the norm is within bounds; the small term keeps a zero norm from dividing by zero.
  const Tensor<float> scale = minimum(div(max_norm, add(norm, 1e-6f, loc), loc), 1.0f, loc);
  ClippedGrads out{{}, norm};
  for (const auto& g : grads) out.grads.push_back(mul(g, scale, loc));
  return out;
}

}  // namespace xgrad::optim

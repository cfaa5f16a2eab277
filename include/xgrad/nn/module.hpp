// nn::Module: the base of layers and models. It names its parameters by module path
// ("conv1.weight"), nests modules, and runs forward op by op in Mode::eager or compiled per
// input signature in Mode::graph.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/jit/jit.hpp"

namespace xgrad::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Parameters and children are registered by address: a copy would share or lose them.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The computation. A module overrides the form it takes: one float tensor, or two.
  XGRAD_API virtual Tensor<float> forward(Tensor<float> x);
  XGRAD_API virtual Tensor<float> forward(Tensor<float> x, Tensor<float> y);

  /// Runs forward: op by op in Mode::eager; in Mode::graph compiled once per input signature
  /// (and inline when called while another function is being traced). Nodes traced inside
  /// are scoped by the module path ("LeNet5/conv1").
  /// `loc` is the caller's line: errors that forward raises report it (see call_site()).
  Tensor<float> operator()(const Tensor<float>& x, SourceLoc loc = SourceLoc::current()) {
    CallSite at(loc);
    return call(x);
  }
  Tensor<float> operator()(const Tensor<float>& x, const Tensor<float>& y, SourceLoc loc = SourceLoc::current()) {
    CallSite at(loc);
    return call(x, y);
  }

  /// The name given by the parent module, or the type's name for a module without a parent.
  XGRAD_API std::string name() const;

  /// Registers `p` as this module's parameter `name`. When this module is registered in a
  /// parent, the names of all its parameters get the parent's prefix ("fc1.weight").
  template <FloatingPoint T> void register_parameter(const std::string& name, Parameter<T>& p) {
    auto& meta = p.impl()->autograd;
    meta->name = name;
    m_parameters.emplace_back(name, p);
  }

  /// Registers `t` as state that is not trained but saved with the module (BatchNorm's running
  /// statistics, Dropout's random key): "bn1.running_mean" once registered in a parent.
  template <Element T> void register_buffer(const std::string& name, Tensor<T>& t) { m_buffers.emplace_back(name, t); }

  /// Registers a child module under `name`.
  XGRAD_API void register_module(const std::string& name, Module& child);

  /// Registers children under their names: register_modules({{"conv1", &conv1}, ...}).
  XGRAD_API void register_modules(std::initializer_list<std::pair<std::string, Module*>> children);

  /// Registers children named after their type and position among siblings of that type:
  /// register_modules({&conv1, &conv2, &fc1}) names them conv2d0, conv2d1, dense0.
  XGRAD_API void register_modules(std::initializer_list<Module*> children);

  /// Every parameter of this module and its children, own first, in registration order.
  XGRAD_API std::vector<Parameter<float>> parameters() const;

  /// (full name, tensor) of every parameter, own first, then each child's.
  XGRAD_API std::vector<std::pair<std::string, TensorBase>> named_parameters() const;

  /// (full name, tensor) of every buffer, own first, then each child's.
  XGRAD_API std::vector<std::pair<std::string, TensorBase>> named_buffers() const;

  /// Everything a checkpoint holds: the parameters, then the buffers.
  XGRAD_API std::vector<std::pair<std::string, TensorBase>> named_state() const;

  /// Training (the default) or evaluation behaviour, for this module and its children:
  /// Dropout drops only in training, BatchNorm2d normalizes by batch statistics in training and
  /// by its running statistics otherwise. In Mode::graph each behaviour has its own compiled forward.
  XGRAD_API void set_train(bool on = true);
  bool training() const { return m_training; }

  /// MindSpore's Cell.recompute (JAX's checkpoint for a module): forward keeps nothing for the
  /// backward pass but its inputs, and the backward pass runs it again, trading compute for
  /// memory. The second run sees the state the first saw (Dropout's key, BatchNorm2d's running
  /// statistics are put back for it, then restored), so it computes the same values and the
  /// state is updated once. Holds for this module's calls in every mode, compiled included.
  void recompute(bool on = true) { m_recompute = on; }
  bool recomputes() const { return m_recompute; }

  /// The registered children, in order.
  const std::vector<std::pair<std::string, Module*>>& children() const { return m_children; }

 protected:
  /// The line that called the module whose forward runs now on this thread: the layers' own
  /// checks name it, as ops name theirs.
  static SourceLoc call_site() { return t_call_site; }

 private:
  /// Sets call_site() for the duration of one call, restoring the caller's on the way out.
  class CallSite {
   public:
    explicit CallSite(SourceLoc loc) : m_saved(t_call_site) { t_call_site = loc; }
    ~CallSite() { t_call_site = m_saved; }
    CallSite(const CallSite&) = delete;
    CallSite& operator=(const CallSite&) = delete;

   private:
    SourceLoc m_saved;
  };
  static inline thread_local SourceLoc t_call_site;

  struct Forward {
    Module* self;
    template <class... Xs> Tensor<float> operator()(const Xs&... xs) const {
      tracing::NameScope scope(self->name());
      return self->run(xs...);
    }
  };

  template <class... Xs> Tensor<float> call(const Xs&... xs) {
    if (tracing::Tracer::active()) return Forward{this}(xs...);
    if (get_mode() == Mode::eager) return run(xs...);
    return compiled()(xs...);
  }

  /// forward, checkpointed when recompute() is on.
  template <class... Xs> Tensor<float> run(const Xs&... xs) {
    if (!m_recompute) return forward(xs...);
    std::vector<TensorBase> params;
    for (auto& [name, p] : named_parameters()) params.push_back(std::move(p));
    return xgrad::detail::checkpoint_reading([this](const Xs&... in) { return forward(in...); }, std::move(params),
                                             state_replay(), call_site())(xs...);
  }

  /// What recompute() runs around the second run of forward: puts back the buffers as they are
  /// now (before the first run), and returns what restores them as they will be then. Empty for
  /// a module without buffers.
  XGRAD_API std::function<std::function<void()>()> state_replay() const;

  /// The compiled forward for the current train/eval behaviour (a trace bakes the behaviour in).
  XGRAD_API Jitted<Forward>& compiled();

  XGRAD_API void prefix_parameter_names(const std::string& prefix);

  XGRAD_API void collect(std::vector<std::pair<std::string, TensorBase>>& out) const;

  XGRAD_API void collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, TensorBase>>& out) const;

  std::string m_name;
  Module* m_parent = nullptr;
  std::vector<std::pair<std::string, TensorBase>> m_parameters;
  std::vector<std::pair<std::string, TensorBase>> m_buffers;
  std::vector<std::pair<std::string, Module*>> m_children;
  bool m_training = true;
  bool m_recompute = false;
  std::once_flag m_compile_once[2];  // [0] eval, [1] training
  std::unique_ptr<Jitted<Forward>> m_compiled[2];
};

}  // namespace xgrad::nn

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/module-inl.hpp"
#endif

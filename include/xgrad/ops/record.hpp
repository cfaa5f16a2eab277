// What an op does besides its kernel, with no backend: naming itself in a failed trace's report
// (OpScope), describing its inputs in errors, and recording its gradient rule on the tape. The
// op drivers (ops/dispatch.hpp) use these, and so do the layers above ops that record or check
// like an op: custom_vjp (autograd/functional.hpp), jit's and control flow's tape records, the
// nn layers.
#pragma once

#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/tape.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ir/tracer.hpp"

namespace xgrad::detail {

/// Scope guard at the top of an op that checks shapes: when tracing and the op throws, it
/// tells the tracer which op failed on which inputs, for the failure report.
class OpScope {
 public:
  OpScope(std::string_view op, SourceLoc loc, std::initializer_list<std::reference_wrapper<const TensorBase>> inputs) {
    if (auto* tracer = tracing::Tracer::active()) [[unlikely]] {
      m_tracer = tracer;
      m_op = op;
      m_loc = loc;
      m_inputs.assign(inputs.begin(), inputs.end());
      m_exceptions = std::uncaught_exceptions();
    }
  }
  ~OpScope() {
    if (m_tracer && std::uncaught_exceptions() > m_exceptions) m_tracer->note_failure(m_op, m_loc, std::move(m_inputs));
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  tracing::Tracer* m_tracer = nullptr;
  std::string_view m_op;
  SourceLoc m_loc;
  std::vector<TensorBase> m_inputs;
  int m_exceptions = 0;
};

/// "x: Float32[3, 32], y: Float32[4]": what every shape error lists.
inline std::string describe_inputs(std::initializer_list<std::pair<std::string_view, const TensorBase*>> inputs) {
  std::string out;
  for (auto& [label, t] : inputs) {
    if (!out.empty()) out += ", ";
    out += detail::concat(label, ": ", dtype_name(t->dtype()), t->shape());
  }
  return out;
}

/// True when an op on these inputs must be recorded for autodiff.
template <class... Ts> bool should_record(const Ts&... inputs) {
  return is_grad_enabled() && (inputs.impl()->requires_grad() || ...);
}

using TensorRefs = std::initializer_list<std::reference_wrapper<const TensorBase>>;

/// Links `out` to the inputs in [first, last) on the tape. `saved` are the tensors the rule
/// reads (their versions are checked at backward); `reads_output` keeps out's buffer for it.
template <class It> void record_range(const TensorBase& out, std::string_view op, SourceLoc loc, It first, It last,
                                      TensorRefs saved, bool reads_output,
                                      std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  auto node = std::make_shared<autograd::Node>();
  node->op = op;
  node->loc = loc;
  node->inputs.reserve(static_cast<std::size_t>(std::distance(first, last)));
  for (; first != last; ++first) {
    const TensorBase& in = *first;
    node->inputs.push_back({in.impl()->requires_grad() ? in.impl()->autograd : nullptr, in.shape()});
  }
  node->saved.reserve(saved.size());
  for (const TensorBase& s : saved)
    if (s.defined()) node->saved.push_back(autograd::Node::Saved::of(s));
  if (reads_output) {
    node->out_storage = out.impl()->storage;
    node->out_value = out.impl()->value;
    node->out_version = out.version();
  }
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->rule = std::move(rule);
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = std::move(node);
  out.impl()->autograd = std::move(meta);
}

/// record_range over a braced list of inputs: the common case.
inline void record(const TensorBase& out, std::string_view op, SourceLoc loc, TensorRefs inputs, TensorRefs saved,
                   bool reads_output, std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  record_range(out, op, loc, inputs.begin(), inputs.end(), saved, reads_output, std::move(rule));
}

}  // namespace xgrad::detail

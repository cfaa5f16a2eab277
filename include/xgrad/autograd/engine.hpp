// The backward engine: walks the tape from an output in reverse topological order.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/core/tape.hpp"

namespace xgrad::autograd {

namespace detail {

XGRAD_API TensorBase add_grads(const TensorBase& a, const TensorBase& b);

}  // namespace detail

/// Told that target i's gradient is final (undefined where none reaches it), as soon as the
/// backward pass has added its last contribution: data-parallel training starts reducing a
/// gradient bucket there, while the pass goes on.
using GradientReady = std::function<void(std::size_t target, const TensorBase& grad)>;

/// Backpropagates each seed from its root (roots that need no gradient are skipped). With
/// `targets` empty, gradients accumulate into the grad() of every leaf that requires grad;
/// otherwise the gradients reaching each target are returned (undefined where none does) and
/// nothing accumulates; `ready`, when given, hears of each target's as soon as it is final.
/// With `create_graph` the backward ops are themselves recorded, so the result can be
/// differentiated again.
XGRAD_API std::vector<TensorBase> run_backward(const std::vector<TensorBase>& roots,
                                               const std::vector<TensorBase>& seeds,
                                               const std::vector<std::shared_ptr<AutogradMeta>>& targets,
                                               bool create_graph, const GradientReady& ready = {});

/// Backpropagates `seed` from `root`, which must depend on something that requires grad.
XGRAD_API std::vector<TensorBase> run_backward(const TensorBase& root, const TensorBase& seed,
                                               const std::vector<std::shared_ptr<AutogradMeta>>& targets,
                                               bool create_graph, SourceLoc loc, const GradientReady& ready = {});

}  // namespace xgrad::autograd

namespace xgrad {

template <Element T> void Tensor<T>::backward(SourceLoc loc) const {
  if constexpr (FloatingPoint<T>) {
    autograd::run_backward(*this, ones_like(*this), {}, false, loc);
  } else {
    throw AutogradError(
        detail::concat("backward: ", dtype_name(dtype_of<T>()), " tensors carry no gradient (at ", loc.str(), ")"));
  }
}

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/autograd/engine-inl.hpp"
#endif

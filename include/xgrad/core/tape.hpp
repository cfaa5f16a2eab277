// The eager tape: one Node per recorded op, linking an output to its inputs' autodiff state.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "xgrad/core/tensor.hpp"

namespace xgrad::autograd {

/// Gradients an op's rule returns, one per input, undefined where an input gets none.
using Grads = std::vector<TensorBase>;

struct Node {
  /// One input: its autodiff state (null when it needs no gradient) and its shape, to which
  /// a broadcast gradient is summed back.
  struct Input {
    std::shared_ptr<AutogradMeta> meta;
    Shape shape;
  };
  /// A tensor the rule reads, with the version it had when saved.
  struct Saved {
    std::shared_ptr<Storage> storage;  // null for a symbolic tensor
    std::uint64_t version = 0;
    // While tracing, an in-place update rebinds the tensor to a new value instead of writing
    // its storage (TensorImpl::rebinds): checked like the version.
    std::weak_ptr<const TensorImpl> traced;
    std::uint64_t rebinds = 0;

    static Saved of(const TensorBase& t) {
      const auto& impl = t.impl();
      Saved s{impl->storage, impl->storage ? impl->storage->version() : 0, {}, 0};
      if (is_tracing()) s.traced = impl, s.rebinds = impl->rebinds;
      return s;
    }
  };

  std::string_view op;
  SourceLoc loc;
  std::vector<Input> inputs;
  std::vector<Saved> saved;
  // The output's storage, kept only for rules that read the output (exp, sigmoid, ...). The
  // output's autodiff state is not held here: that would make a cycle through grad_fn.
  std::shared_ptr<Storage> out_storage;
  std::shared_ptr<ir::Value> out_value;  // the same, for a symbolic output while tracing
  std::shared_ptr<TensorImpl> out_physical;  // the same, for a batched output inside vmap (its batch)
  std::uint64_t out_batch_level = 0;
  // The output's tangents in the jvp passes around it, off the tape (a tangent on the tape could
  // lead back here): a rule reading the output inside jvp then moves with the pass.
  std::vector<Tangent> out_tangents;
  std::uint64_t out_version = 0;
  Shape out_shape;
  DType out_dtype = DType::float32;
  std::function<Grads(const TensorBase& out, const TensorBase& grad)> rule;
};

}  // namespace xgrad::autograd

// Shape and data-movement ops: reshape (a view), transpose, broadcast_to, slice, take, concat,
// split, stack, expand_dims, squeeze, flatten, tril, triu, cast (sum_to, broadcast_to's adjoint, is in ops/reduce.hpp).
// Declarations only: the ops' structs and the functions' definitions are in
// ops/manipulation-inl.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// A view of x with a new shape of the same size; one -1 is inferred.
template <Element T>
Tensor<T> reshape(const Tensor<T>& x, const std::vector<std::int64_t>& dims, SourceLoc loc = SourceLoc::current());

/// Permutes the axes (reverses them when perm is empty). Materializes the result.
template <Element T>
Tensor<T> transpose(const Tensor<T>& x, std::vector<std::int64_t> perm = {}, SourceLoc loc = SourceLoc::current());

/// x repeated along broadcast axes to take `shape` (NumPy rules). Materializes the result.
template <Element T>
Tensor<T> broadcast_to(const Tensor<T>& x, const Shape& shape, SourceLoc loc = SourceLoc::current());

/// Inserts a size-1 axis at `axis` (a view).
template <Element T> Tensor<T> expand_dims(const Tensor<T>& x, std::int64_t axis, SourceLoc loc = SourceLoc::current());

/// Removes the given size-1 axes, or every size-1 axis when none are given (a view).
template <Element T>
Tensor<T> squeeze(const Tensor<T>& x, const std::vector<std::int64_t>& axes = {}, SourceLoc loc = SourceLoc::current());

/// Keeps the first axis and flattens the rest: [N, ...] -> [N, -1] (MindSpore's Flatten).
template <Element T> Tensor<T> flatten(const Tensor<T>& x, SourceLoc loc = SourceLoc::current());

/// The block of x starting at `begin` with extent `size` per axis (MindSpore's Slice);
/// a size of -1 runs to the end of that axis.
template <Element T> Tensor<T> slice(const Tensor<T>& x, const std::vector<std::int64_t>& begin,
                                     const std::vector<std::int64_t>& size, SourceLoc loc = SourceLoc::current());

/// Zeros of `in_shape` with g written at `begin`: the adjoint of slice.
template <Numeric T> Tensor<T> slice_backward(const Tensor<T>& g, const Shape& in_shape,
                                              const std::vector<std::int64_t>& begin,
                                              SourceLoc loc = SourceLoc::current());

/// Gathers along `axis` (NumPy's take, PyTorch's index_select for 1-D indices, MindSpore's
/// Gather): out[a..., i..., b...] = x[a..., indices[i...], b...], x's shape with that axis replaced
/// by the indices' shape. Every index must lie in [0, x.shape[axis]); an index may repeat. The
/// gradient adds the slices of g back at their indices (take_backward).
template <Element T> Tensor<T> take(const Tensor<T>& x, const Tensor<std::int32_t>& indices, std::int64_t axis = 0,
                                    SourceLoc loc = SourceLoc::current());

/// Zeros of `x_shape` with g's slices added at `indices` along `axis`: the adjoint of take.
template <Numeric T> Tensor<T> take_backward(const Tensor<T>& g, const Tensor<std::int32_t>& indices,
                                             const Shape& x_shape, std::int64_t axis,
                                             SourceLoc loc = SourceLoc::current());

/// Joins tensors along an existing axis; all other extents must agree.
template <Element T>
Tensor<T> concat(const std::vector<Tensor<T>>& xs, std::int64_t axis = 0, SourceLoc loc = SourceLoc::current());

/// Cuts x along `axis` into consecutive pieces of the given sizes, which must add up to the
/// axis's extent (concat's inverse; each piece's gradient goes back to its place).
template <Element T> std::vector<Tensor<T>> split(const Tensor<T>& x, const std::vector<std::int64_t>& sizes,
                                                  std::int64_t axis = 0, SourceLoc loc = SourceLoc::current());

/// x with the elements above diagonal k of its last two axes set to 0 (k = 0 the main diagonal,
/// k > 0 above it, k < 0 below): the lower triangle, as NumPy's and PyTorch's tril.
template <Element T> Tensor<T> tril(const Tensor<T>& x, std::int64_t k = 0, SourceLoc loc = SourceLoc::current());
/// x with the elements below diagonal k of its last two axes set to 0: the upper triangle.
template <Element T> Tensor<T> triu(const Tensor<T>& x, std::int64_t k = 0, SourceLoc loc = SourceLoc::current());

/// Joins tensors of one shape along a new axis.
template <Element T>
Tensor<T> stack(const std::vector<Tensor<T>>& xs, std::int64_t axis = 0, SourceLoc loc = SourceLoc::current());

/// Converts element type; the gradient converts back.
template <Element U, Element T> Tensor<U> cast(const Tensor<T>& x, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_MANIPULATION_ELEMENT_INSTANCE(T, X)                                                                 \
  X Tensor<T> reshape<T>(const Tensor<T>&, const std::vector<std::int64_t>&, SourceLoc);                          \
  X Tensor<T> transpose<T>(const Tensor<T>&, std::vector<std::int64_t>, SourceLoc);                               \
  X Tensor<T> slice<T>(const Tensor<T>&, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&,      \
                       SourceLoc);                                                                                \
  X Tensor<T> broadcast_to<T>(const Tensor<T>&, const Shape&, SourceLoc);                                         \
  X Tensor<T> take<T>(const Tensor<T>&, const Tensor<std::int32_t>&, std::int64_t, SourceLoc);                    \
  X Tensor<T> expand_dims<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                          \
  X Tensor<T> squeeze<T>(const Tensor<T>&, const std::vector<std::int64_t>&, SourceLoc);                          \
  X Tensor<T> flatten<T>(const Tensor<T>&, SourceLoc);                                                            \
  X Tensor<T> concat<T>(const std::vector<Tensor<T>>&, std::int64_t, SourceLoc);                                  \
  X Tensor<T> stack<T>(const std::vector<Tensor<T>>&, std::int64_t, SourceLoc);                                   \
  X std::vector<Tensor<T>> split<T>(const Tensor<T>&, const std::vector<std::int64_t>&, std::int64_t, SourceLoc); \
  X Tensor<T> tril<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                                 \
  X Tensor<T> triu<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                                 \
  X Tensor<float> cast<float, T>(const Tensor<T>&, SourceLoc);                                                    \
  X Tensor<double> cast<double, T>(const Tensor<T>&, SourceLoc);                                                  \
  X Tensor<std::int32_t> cast<std::int32_t, T>(const Tensor<T>&, SourceLoc);                                      \
  X Tensor<std::int64_t> cast<std::int64_t, T>(const Tensor<T>&, SourceLoc);                                      \
  X Tensor<bool> cast<bool, T>(const Tensor<T>&, SourceLoc);
#define XGRAD_MANIPULATION_NUMERIC_INSTANCE(T, X)                                                             \
  X Tensor<T> slice_backward<T>(const Tensor<T>&, const Shape&, const std::vector<std::int64_t>&, SourceLoc); \
  X Tensor<T> take_backward<T>(const Tensor<T>&, const Tensor<std::int32_t>&, const Shape&, std::int64_t, SourceLoc);
#define XGRAD_MANIPULATION_INSTANCES(X)                          \
  XGRAD_FOR_EACH_Element(XGRAD_MANIPULATION_ELEMENT_INSTANCE, X) \
      XGRAD_FOR_EACH_Numeric(XGRAD_MANIPULATION_NUMERIC_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_MANIPULATION)
XGRAD_MANIPULATION_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/manipulation-inl.hpp"
#endif

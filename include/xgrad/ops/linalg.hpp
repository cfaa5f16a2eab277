// Matrix multiplication: 2-D and batched with broadcast batch axes, on the packed GEMM.
// Declarations only: the op's struct and the functions' definitions are in ops/linalg-inl.hpp.
#pragma once

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// op(a) @ op(b) over the last two axes, where op transposes when asked (MindSpore's
/// MatMul(transpose_a, transpose_b)); leading axes broadcast like NumPy's.
template <FloatingPoint T> Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, bool transpose_a, bool transpose_b,
                                            SourceLoc loc = SourceLoc::current());

/// a @ b over the last two axes; leading axes broadcast like NumPy's.
template <FloatingPoint T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_LINALG_INSTANCE(T, X)                                                 \
  X Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&, bool, bool, SourceLoc); \
  X Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&, SourceLoc);
#define XGRAD_LINALG_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_LINALG_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_LINALG)
XGRAD_LINALG_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/linalg-inl.hpp"
#endif

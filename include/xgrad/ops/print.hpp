// xg::print: shows a tensor when the op runs, in eager mode and inside compiled graphs.
// Declarations only: the op's struct and the function's definition are in ops/print-inl.hpp.
#pragma once

#include <string>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// Writes "label Tensor(...)" to standard output when this op runs: at once in eager mode,
/// and every time the graph runs (not while it is traced) under jit.
template <Element T> void print(const std::string& label, const Tensor<T>& t, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_PRINT_INSTANCE(T, X) X void print<T>(const std::string&, const Tensor<T>&, SourceLoc);
#define XGRAD_PRINT_INSTANCES(X) XGRAD_FOR_EACH_Element(XGRAD_PRINT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_PRINT)
XGRAD_PRINT_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/print-inl.hpp"
#endif

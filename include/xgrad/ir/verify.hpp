// The verifier: checks that a graph is well formed before it is optimized or run. A failure
// is a bug in xgrad (the tracer or a pass), not in user code, so it throws logic_error.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::ir {

XGRAD_API void verify(const Graph& graph);

}  // namespace xgrad::ir

#if !defined(XGRAD_COMPILED)
#include "xgrad/ir/verify-inl.hpp"
#endif

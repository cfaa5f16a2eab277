// Dead code elimination: drops nodes whose outputs nothing reads (print and other effects stay).
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Dead code elimination (above). Returns whether it changed the graph.
XGRAD_API bool dce(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/dce-inl.hpp"
#endif

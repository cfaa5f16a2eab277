// Scheduling: orders a graph's nodes so that cheap independent ones meet, in stages the executor
// runs at once on the thread pool (backend/schedule.hpp). Each node that may run beside others
// moves to the first stage of such nodes after those of its inputs' producers (a layer's bias
// gradient beside the next layer's input gradient, an optimizer's update of a small layer beside
// the backward pass still under way); every other node keeps its order, after all before it.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Scheduling (above). Returns whether it changed the order.
XGRAD_API bool schedule(ir::Graph& g);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/schedule-inl.hpp"
#endif

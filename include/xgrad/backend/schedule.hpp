// Which nodes of a graph run side by side. A stage is a run of consecutive nodes, each cheap
// enough that its kernel would keep to one thread (a small matrix product, a bias gradient, an
// optimizer's update of a small layer), none reading another's output: the executor runs a
// stage's nodes at once, one per thread, and the memory plan keeps their buffers apart. Every
// other node is a stage of its own, its kernel free to use every thread. The schedule pass
// (passes/schedule.hpp) orders a graph so that such nodes meet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::backend {

/// Nodes [begin, end) of a graph, run at once.
struct Stage {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

/// Whether `node` is worth running beside others: free of effects and control flow, with at
/// least a grain of elementwise work (about what starting a parallel region costs), and small
/// enough that its kernel would keep to one thread or split its work in two at most: every
/// input and output at most two grains, a contraction below the multiply-adds a matrix product
/// splits from. A contraction's multiply-adds are taken as sqrt(|a| |b| |out|) of its first two
/// operands: exact for a matrix product, below a convolution's count by at most its window's size.
XGRAD_API bool runs_beside_others(const ir::Node& node);

/// The graph's nodes in order, cut into stages: each node that runs beside others joins the
/// stage before it when that stage's nodes do too and it reads none of their outputs.
XGRAD_API std::vector<Stage> stages(const ir::Graph& g);

/// Per node: whether it runs in the background. Such a node runs beside others and no node
/// reads its results (an optimizer's update of a small layer, whose results only update the
/// graph's inputs): on the cpu it starts on a worker at its stage and the caller goes on with the
/// stages after it, waiting for it only before the call's effects. The memory plan keeps its
/// buffers for it to the call's end.
XGRAD_API std::vector<bool> background_nodes(const ir::Graph& g);

}  // namespace xgrad::backend

#if !defined(XGRAD_COMPILED)
#include "xgrad/backend/schedule-inl.hpp"
#endif

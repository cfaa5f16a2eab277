// Graph printers: MindIR-like text (`%3 : f32[3, 8] = MatMul(%1, %2)  # model.cpp:19`) and
// Graphviz dot.
#pragma once

#include <functional>
#include <string>

#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::ir {

/// "f32[3, 8]"; an input read by reference prints as "Ref[f32[32, 8]]".
XGRAD_API std::string type_str(DType dtype, const Shape& shape);
XGRAD_API std::string type_str(const Value& v);

/// One node as a line of text (without indentation or newline).
XGRAD_API std::string node_str(const Node& node);

/// A node that could not be added, printed after the graph traced so far.
struct FailedNode {
  std::string op;
  std::vector<Value*> inputs;  // may be empty when the op's inputs are unknown
  SourceLoc loc;
  std::string scope;
};

/// Extra text after a node's line (the memory plan's decisions).
using NodeNote = std::function<std::string(const Node&)>;

/// The graph as text, subgraphs after it; `failed` is marked where tracing stopped.
XGRAD_API std::string to_text(const Graph& graph, const FailedNode* failed = nullptr, const NodeNote& note = {});

/// The graph in Graphviz dot: inputs as ellipses, nodes as boxes labelled with op, output
/// types and source line; subgraphs as clusters.
XGRAD_API std::string to_dot(const Graph& graph);

}  // namespace xgrad::ir

#if !defined(XGRAD_COMPILED)
#include "xgrad/ir/printer-inl.hpp"
#endif

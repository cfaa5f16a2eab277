// Graph edits the passes share, and what a pass is.
//
// A pass may rely on one rule of the IR: a node's kernel is determined by its op name, its
// attributes and the types of its inputs and outputs (Const nodes: by their value). So two
// nodes that agree on those compute the same thing, and a node may be rewired to another
// input of the same type.
#pragma once

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::passes {

/// What every pass may consult.
struct PassContext {
  /// Keep every floating-point operation as eager mode does it: no rewrite that can change a
  /// result's bits (x + 0 turns -0 into +0; exp(log x) rounds).
  bool strict = false;
};

/// A pass changes the graph in place and says whether it changed anything.
using PassFn = bool (*)(ir::Graph&, const PassContext&);

struct Pass {
  std::string_view name;
  PassFn run;
};

/// Makes every reader of `from` (nodes, outputs, effects) read `to` instead.
XGRAD_API void replace_uses(ir::Graph& g, const ir::Value* from, ir::Value* to);

/// The node making `v`, when it is a Const; null otherwise.
XGRAD_API const ir::Node* constant_node(const ir::Value* v);

/// True when every element of the Const `v` equals `x`.
XGRAD_API bool is_constant(const ir::Value* v, double x);

/// True when `v` is a Const whose elements are all +0 (not -0).
XGRAD_API bool is_positive_zero(const ir::Value* v);

/// How many node inputs, outputs and effects read `v`.
XGRAD_API std::size_t readers(const ir::Graph& g, const ir::Value* v);

/// Where `node` is in g's program order.
XGRAD_API std::size_t position_of(const ir::Graph& g, const ir::Node* node);

/// Drops the values no node, input or output refers to and numbers the rest in order, so
/// the printed graph reads %0, %1, ... again after nodes were removed.
XGRAD_API void renumber(ir::Graph& g);

/// Removes the nodes `dead` marks.
XGRAD_API void erase_nodes(ir::Graph& g, const std::unordered_set<const ir::Node*>& dead);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/rewrite-inl.hpp"
#endif

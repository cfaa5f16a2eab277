// The typed graph jit traces a function into: Values (each with dtype and shape) made by
// Nodes kept in program order, graph inputs (arguments, then tensors read by reference) and
// effects (writes into inputs when a call finishes).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ir/primitive.hpp"

namespace xgrad {

/// An elementwise op over one contiguous block of n elements: input k is read at in[k] + i *
/// stride[k] (stride 0 for a broadcast scalar, else 1), the result written to out[0..n).
using BlockKernel = void (*)(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n);

/// A reduction of each of `rows` contiguous rows of `length` elements to one value, as the op's
/// own kernel reduces a row (a row group's reduction step, backend/cpu/fused.hpp).
using RowsKernel = void (*)(const void* in, void* out, std::int64_t rows, std::int64_t length);

/// A unary op's block kernels merged with one cheap neighbour in a fused group, so the value
/// between them stays in a register (backend/cpu/fused.hpp).
struct MergedBlockKernels {
  /// How many ops the unary op may read the result of in registers (op::MergeFeeders), and
  /// how many may read its result (op::MergeConsumers), both in ops/elementwise-inl.hpp.
  static constexpr std::size_t num_feeders = 4, num_consumers = 3;
  /// after[p]: Op(P(...)), reading P's operands, for P the p-th feeder.
  std::array<BlockKernel, num_feeders> after{};
  /// into[e][j]: E(...) with Op(x) as operand j, reading x and then E's other operands, for
  /// E the e-th consumer (null past E's arity).
  std::array<std::array<BlockKernel, 3>, num_consumers> into{};
};

/// Properties of an op that graph passes match on.
struct OpTraits {
  bool elementwise = false;
  bool commutative = false;
  bool linear = false;                         // f(a x + b y) = a f(x) + b f(y) in each input
  bool view = false;                           // the output may share its first input's buffer (Reshape)
  bool contraction = false;                    // sums products along axes (MatMul, Conv2D): work outgrows data
  BlockKernel block = nullptr;                 // elementwise ops that fusion can put in a group
  const MergedBlockKernels* merged = nullptr;  // float unary ops with a batch body
};

namespace ir {

/// `t` where the host can read it: itself, or a copy of a device tensor. Passes and printers
/// read constants' elements.
XGRAD_API TensorBase on_host(const TensorBase& t);

/// A short text of a small constant's values for the IR: "2", "[1, 0.5]".
XGRAD_API std::string constant_text(const TensorBase& t);

}  // namespace ir

namespace op {

/// A value made while tracing (a scalar, a gradient seed) or folded from constants; printed
/// when it has at most 8 elements. Two are equal when they hold the same bytes (up to 256) or
/// are one tensor.
struct Const {
  static constexpr std::string_view name = "Const";
  TensorBase value;

  XGRAD_API std::vector<ir::Attr> attrs() const;
  XGRAD_API bool operator==(const Const& other) const;
};

/// A group of elementwise ops (and the op whose epilogue they may run as) made one node by the
/// fuse pass; `body` names its subgraph, `ops` lists what it runs, `merged` the neighbours whose
/// kernels were merged.
struct Fused {
  static constexpr std::string_view name = "Fused";
  std::string body, ops, merged;
  std::vector<ir::Attr> attrs() const {
    std::vector<ir::Attr> out{{"body", body}, {"ops", '"' + ops + '"'}};
    if (!merged.empty()) out.push_back({"merged", '"' + merged + '"'});
    return out;
  }
  bool operator==(const Fused&) const = default;
};

}  // namespace op

namespace ir {

struct Node;
struct Graph;

struct Value {
  int id = 0;  // printed as %id, unique within its graph
  DType dtype = DType::float32;
  Shape shape;
  Node* producer = nullptr;  // null for a graph input
  const Graph* graph = nullptr;
  std::string name;           // an input's argument or Parameter name
  bool by_reference = false;  // an input bound to a tensor that exists outside the graph
};

/// Runs a node on concrete tensors: reads `in`, sets every element of `out`.
using Kernel = std::function<void(std::span<const TensorBase> in, std::span<TensorBase> out)>;

/// Told that elements [begin, end) of an output (row-major) are final.
using BlockDone = std::function<void(std::int64_t begin, std::int64_t end)>;

/// A kernel that writes its one output into `dest` (defined) and calls `done` on each part of
/// it as it is finished, while the part is still in cache: what lets fusion run elementwise
/// work as a GEMM's epilogue.
using EpilogueKernel =
    std::function<void(std::span<const TensorBase> in, const TensorBase& dest, const BlockDone& done)>;

struct Node {
  std::shared_ptr<const Primitive> primitive;
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  SourceLoc loc;
  std::string scope;  // the Module path, e.g. "LeNet5/conv1"
  OpTraits traits;
  bool has_effect = false;  // must run even when no output is used (print)
  // Nonzero for a checkpoint's recomputation in the backward pass (its own number): CSE never
  // merges it with the forward pass's nodes, which would keep their results alive instead.
  std::uint64_t recompute = 0;
  std::vector<std::shared_ptr<const Graph>> subgraphs;
  Kernel kernel;
  EpilogueKernel epilogue_kernel;  // ops whose output can be finished part by part (MatMul)
  // A fused group: per output, the inputs whose buffer it may take when this node reads them
  // last (every element read before the same element is written).
  std::vector<std::vector<int>> in_place;

  std::string_view op() const { return primitive->name(); }
  std::vector<Attr> attrs() const { return primitive->attrs(); }
  template <PrimitiveDefinition P> bool is() const { return primitive->is<P>(); }
  template <PrimitiveDefinition P> const P& params() const { return primitive->params<P>(); }
};

struct Graph {
  /// A write into input `input` of the value `value`, applied when a call finishes (an
  /// optimizer's assignment to a Parameter).
  struct Effect {
    std::size_t input;
    Value* value;
    SourceLoc loc;
  };

  std::string name;
  std::vector<std::shared_ptr<Value>> values;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<Value*> inputs;  // the arguments first, then tensors read by reference
  std::size_t num_args = 0;
  std::vector<Value*> outputs;
  std::vector<Effect> effects;

  XGRAD_API Value* new_value(DType dtype, const Shape& shape, Node* producer);

  /// Shares ownership of `v` with a symbolic tensor that stands for it.
  std::shared_ptr<Value> share(const Value* v) const { return values[static_cast<std::size_t>(v->id)]; }

  Node* append(std::unique_ptr<Node> node) {
    nodes.push_back(std::move(node));
    return nodes.back().get();
  }
};

}  // namespace ir
}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ir/graph-inl.hpp"
#endif

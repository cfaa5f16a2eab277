// The typed graph jit traces a function into: Values (each with dtype and shape) made by
// Nodes kept in program order, graph inputs (arguments, then tensors read by reference) and
// effects (writes into inputs when a call finishes).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// An elementwise op over one contiguous block of n elements: input k is read at in[k] + i *
/// stride[k] (stride 0 for a broadcast scalar, else 1), the result written to out[0..n).
using BlockKernel = void (*)(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n);

/// A unary op's block kernels merged with one cheap neighbour in a fused group, so the value
/// between them stays in a register (backend/cpu/fused.hpp).
struct MergedBlockKernels {
  /// The ops whose result the unary op may read in registers, and the ops that may read its.
  static constexpr std::array<std::string_view, 4> feeders{"Add", "Sub", "Mul", "Fma"};
  static constexpr std::array<std::string_view, 3> consumers{"Add", "Mul", "Fma"};
  /// after[p]: Op(P(...)), reading P's operands, for P = feeders[p].
  std::array<BlockKernel, feeders.size()> after{};
  /// into[e][j]: E(...) with Op(x) as operand j, reading x and then E's other operands, for
  /// E = consumers[e] (null past E's arity).
  std::array<std::array<BlockKernel, 3>, consumers.size()> into{};
};

/// Properties of an op that graph passes match on.
struct OpTraits {
  bool elementwise = false;
  bool commutative = false;
  bool linear = false;                         // f(a x + b y) = a f(x) + b f(y) in each input
  bool view = false;                           // the output may share its first input's buffer (Reshape)
  BlockKernel block = nullptr;                 // elementwise ops that fusion can put in a group
  const MergedBlockKernels* merged = nullptr;  // unary ops with a batch body
};

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

/// An op attribute as printed ("transpose_a", "false"); passes compare them as text.
struct Attr {
  std::string name;
  std::string value;
  bool operator==(const Attr&) const = default;
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
  std::string op;
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  std::vector<Attr> attrs;
  SourceLoc loc;
  std::string scope;  // the Module path, e.g. "LeNet5/conv1"
  OpTraits traits;
  bool has_effect = false;  // must run even when no output is used (print)
  std::vector<std::shared_ptr<const Graph>> subgraphs;
  Kernel kernel;
  EpilogueKernel epilogue_kernel;  // ops whose output can be finished part by part (MatMul)
  TensorBase constant;             // the value of a Const node
  // A fused group: per output, the inputs whose buffer it may take when this node reads them
  // last (every element read before the same element is written).
  std::vector<std::vector<int>> in_place;
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

  Value* new_value(DType dtype, const Shape& shape, Node* producer) {
    auto v = std::make_shared<Value>();
    v->id = static_cast<int>(values.size());
    v->dtype = dtype;
    v->shape = shape;
    v->producer = producer;
    v->graph = this;
    values.push_back(v);
    return v.get();
  }

  /// Shares ownership of `v` with a symbolic tensor that stands for it.
  std::shared_ptr<Value> share(const Value* v) const { return values[static_cast<std::size_t>(v->id)]; }

  Node* append(std::unique_ptr<Node> node) {
    nodes.push_back(std::move(node));
    return nodes.back().get();
  }
};

}  // namespace ir
}  // namespace xgrad

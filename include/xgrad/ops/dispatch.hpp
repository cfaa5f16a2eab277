// The one path every op call takes: shape rule, kernel, and (when asked) a tape record.
// Elementwise ops only describe themselves (ops/elementwise-inl.hpp); these drivers run them.
// They reach the backend (backend/map.hpp): only the ops' definitions (ops/*-inl.hpp) include
// this header. What needs no backend (OpScope, the tape records) is in ops/record.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "xgrad/backend/map.hpp"
#include "xgrad/core/tape.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ir/tracer.hpp"
#include "xgrad/ops/record.hpp"

namespace xgrad {

namespace op {
/// Which inputs of a primitive its gradient rule covers, or reads, by position.
template <std::size_t N> using Needs = std::array<bool, N>;
}  // namespace op

namespace detail {

/// A shape seen around one of its axes: the product of the extents before it, its extent, and the
/// product of those after it (a kernel over [outer, extent, inner]).
struct AroundAxis {
  std::int64_t outer = 1, extent = 1, inner = 1;
  AroundAxis(const Shape& shape, int axis) : extent(shape[axis]) {
    for (int d = 0; d < axis; ++d) outer *= shape[d];
    for (int d = axis + 1; d < shape.ndim(); ++d) inner *= shape[d];
  }
};

/// The first of int32 `values` (labels, indices) outside [0, extent): its position, or -1, and
/// its value. Values on a device are read through a copy.
struct OutOfRange {
  std::int64_t position = -1;
  std::int32_t value = 0;
};
inline OutOfRange first_outside(const TensorBase& values, std::int64_t extent) {
  std::vector<std::int32_t> host;
  if (values.device() != Device::cpu) host = Tensor<std::int32_t>(values).to_vector();
  const std::int32_t* v = host.empty() ? Tensor<std::int32_t>(values).data() : host.data();
  for (std::int64_t k = 0; k < values.numel(); ++k)
    if (v[k] < 0 || v[k] >= extent) return {k, v[k]};
  return {};
}

/// The tensor a kernel writes its result into: `dest` when the graph executor planned a
/// buffer for it (of the result's dtype and shape), else a new one on `device`.
template <class T> Tensor<T> output(const TensorBase& dest, const Shape& shape, Device device = Device::cpu) {
  return dest.defined() ? Tensor<T>(dest) : Tensor<T>::empty(shape, device);
}

/// The device a kernel runs on: that of its inputs (one-element cpu tensors, scalars, go with
/// any device; primitive() has checked that the others agree).
inline Device device_of(std::span<const TensorBase> inputs) {
  for (const TensorBase& t : inputs)
    if (t.device() != Device::cpu) return t.device();
  return Device::cpu;
}

/// The device an op on `inputs` runs on, or a ValueError naming the op when they are on
/// different devices (a one-element cpu tensor goes with any). Every op has a kernel on each.
inline Device check_devices(std::string_view op, SourceLoc loc, std::span<const TensorBase> inputs) {
  const TensorBase* first = nullptr;
  for (const TensorBase& t : inputs) {
    if (t.is_symbolic() || (t.device() == Device::cpu && t.numel() == 1)) continue;
    if (!first) {
      first = &t;
    } else if (t.device() != first->device()) {
      std::string where;
      for (std::size_t i = 0; i < inputs.size(); ++i)
        where += concat(i ? ", " : "", "input ", i, " on ", device_name(inputs[i].device()));
      throw_value_error(op, loc, "inputs on different devices (", where,
                        "); xgrad never copies between devices silently: move them with .to(device)");
    }
  }
  return device_of(inputs);
}

/// A batch (on axis 0) with axes of 1 after the batch axis so that each value has `rank` axes:
/// how a batch meets unbatched operands under broadcasting, which aligns trailing axes.
template <class T> Tensor<T> align_batch(const Tensor<T>& physical, int rank) {
  const int value_rank = physical.ndim() - 1;
  if (value_rank >= rank) return physical;
  std::vector<std::int64_t> dims{physical.shape()[0]};
  dims.insert(dims.end(), static_cast<std::size_t>(rank - value_rank), 1);
  for (int i = 1; i < physical.ndim(); ++i) dims.push_back(physical.shape()[i]);
  return reshape(physical, dims);
}

/// A batch's values one after the other along their first axis ([size, n, ...] as
/// [size * n, ...]), for ops whose rows are independent; an unbatched tensor is repeated first.
template <class T> Tensor<T> fold_batch(const Tensor<T>& t, bool is_batched, std::int64_t size, SourceLoc loc) {
  const Tensor<T> batch = is_batched ? t : broadcast_to(t, with_batch(size, t.shape()), loc);
  std::vector<std::int64_t> dims{size * batch.shape()[1]};
  for (int i = 2; i < batch.ndim(); ++i) dims.push_back(batch.shape()[i]);
  return reshape(batch, dims, loc);
}

template <class R, class Def, class... In> Tensor<R> apply(const Def& def, SourceLoc loc, const Tensor<In>&... inputs);

/// The size of a batching rule's batch: axis 0 of its batched inputs.
template <class... In> std::int64_t batch_size(std::span<const bool> batched, const Tensor<In>&... inputs) {
  std::int64_t size = 0;
  std::size_t k = 0;
  ((size = batched[k++] ? inputs.shape()[0] : size), ...);
  return size;
}

/// The batching rule of last resort, for inputs a definition's own rule cannot take (a
/// convolution's batched weights): def on each value of the batch in turn, the results
/// stacked. Counted and said (count_vmap_loop), never silent.
template <class R, class Def, class... In>
Tensor<R> batch_by_loop(const Def& def, std::span<const bool> batched, SourceLoc loc, const Tensor<In>&... inputs) {
  count_vmap_loop(Def::name);
  const std::int64_t size = batch_size(batched, inputs...);
  std::vector<Tensor<R>> values;
  for (std::int64_t b = 0; b < size; ++b)
    values.push_back([&]<std::size_t... K>(std::index_sequence<K...>) {
      return apply<R>(def, loc, (batched[K] ? value_of_batch(inputs, b, loc) : inputs)...);
    }(std::index_sequence_for<In...>{}));
  return stack(values, 0, loc);
}

/// align_batch of t's batch where t is batched at `level`, else t.
template <class T> Tensor<T> batch_aligned(const Tensor<T>& t, std::uint64_t level, int rank) {
  return batched_at(t, level) ? align_batch(batch_of(t, level), rank) : t;
}

/// Runs primitive `def` (its definition with parameters, ir/primitive.hpp): `compute(inputs,
/// dest)` maps concrete inputs to the output, written into `dest` when that is defined (see
/// output()). Eagerly it runs now; while tracing, a node holding `def` joins the graph and its
/// kernel runs `compute` when the graph does.
template <ir::PrimitiveDefinition P, class Compute>
TensorBase primitive(const P& def, SourceLoc loc, std::span<const TensorBase> inputs, DType dtype, const Shape& shape,
                     Compute compute, OpTraits traits = {}) {
  checked_numel(P::name, loc, shape);  // every output shape, traced or not, is one a tensor can have
  if (auto* tracer = tracing::Tracer::active()) [[unlikely]] {
    // A definition with `static constexpr bool has_effect = true` (a collective) must run
    // even when nothing reads its output, once per call, in program order.
    constexpr bool has_effect = requires { requires P::has_effect; };
    return tracer->emit(
        ir::make_primitive(def), loc, inputs, {{dtype, shape}},
        [compute](std::span<const TensorBase> in, std::span<TensorBase> out) { out[0] = compute(in, out[0]); }, traits,
        {}, has_effect)[0];
  }
  check_devices(P::name, loc, inputs);
  return naming_allocations(P::name, loc, [&] { return compute(inputs, TensorBase()); });
}
template <ir::PrimitiveDefinition P, class Compute>
TensorBase primitive(const P& def, SourceLoc loc, std::initializer_list<TensorBase> inputs, DType dtype,
                     const Shape& shape, Compute compute, OpTraits traits = {}) {
  return primitive(def, loc, std::span<const TensorBase>(inputs.begin(), inputs.size()), dtype, shape,
                   std::move(compute), traits);
}

/// As primitive(), for an op whose kernel can say when parts of its output are final:
/// `compute(inputs, dest, done)`, `done` null when nothing listens. While tracing, the node
/// also gets that form as its epilogue kernel, which fusion uses to run elementwise work on
/// each finished part while it is in cache.
template <ir::PrimitiveDefinition P, class Compute>
TensorBase primitive_with_epilogue(const P& def, SourceLoc loc, std::initializer_list<TensorBase> inputs, DType dtype,
                                   const Shape& shape, Compute compute, OpTraits traits = {}) {
  auto plain = [compute](std::span<const TensorBase> in, const TensorBase& dest) { return compute(in, dest, nullptr); };
  TensorBase out = primitive(def, loc, inputs, dtype, shape, plain, traits);
  if (auto* tracer = tracing::Tracer::active(); tracer && !out.impl()->storage)
    tracer->graph().nodes.back()->epilogue_kernel =  // the node primitive() just appended
        [compute](std::span<const TensorBase> in, const TensorBase& dest, const ir::BlockDone& done) {
          compute(in, dest, &done);
        };
  return out;
}

/// True when Op is in op::Fusible, the ops a fused group runs on Device::thrust (defined with
/// that list, in ops/elementwise-inl.hpp).
template <class Op> consteval bool is_fusible();

/// Runs primitive `def`, a definition with a kernel of its own (ops/nn-inl.hpp, ops/reduce-inl.hpp,
/// ops/manipulation-inl.hpp, ops/linalg-inl.hpp, ops/random-inl.hpp), on typed inputs whose shapes the
/// caller has checked. Def provides:
///   Shape output_shape() const;                                (or of the inputs' shapes)
///   void run(Device, const Tensor<In>&... inputs, Tensor<R>& out) const;
///                                                              the kernel call per device
///     (with `static constexpr bool epilogue = true`, a last `const ir::BlockDone*` argument:
///     fusion may then run elementwise work on each finished part of the output);
/// optionally
///   void check(std::span<const TensorBase> in, SourceLoc) const;  checks of values, made when
///                                                              the kernel runs
///   Device output_device(Device inputs) const;                 where the output is made
///   template <class R> static OpTraits traits();               traits other than the default
/// and, when differentiable,
///   static constexpr Needs<N> differentiable;                  the inputs gradients flow to
///   static constexpr Needs<N> saved;                           the inputs the rule reads
///   autograd::Grads grad(const Tensor<R>& g, Needs<N> needs, SourceLoc,
///                        const Tensor<In>&... inputs) const;   written with xgrad ops; unsaved
///                                                              inputs come as empty tensors
///     (with `static constexpr bool reads_output = true`, the output follows g);
/// and, for forward mode (jvp), either
///   static constexpr bool multilinear = true;                  linear in each differentiable input
///   Tensor<R> jvp(std::span<const TensorBase> tangents, SourceLoc, const Tensor<R>& out,
///                 const Tensor<In>&... inputs) const;          written with xgrad ops; tangents
///                                                              undefined where an input has none
/// (record_derivatives). A batching rule for vmap will sit beside these.
/// Here: the device check, output allocation, eager run or trace, the tape record and the
/// output's tangents.
// What a definition offers apply() (named concepts: nvcc's front end misjudges requires-expressions
// written inside the driver's lambdas).
template <class Def, class... In>
concept ShapeFromInputs = requires(const Def& def, const Tensor<In>&... x) {
  def.output_shape(x.shape()...);
};
template <class Def>
concept ChecksValues = requires(const Def& def, std::span<const TensorBase> in, SourceLoc loc) {
  def.check(in, loc);
};
template <class Def>
concept PlacesOutput = requires(const Def& def, Device device) {
  { def.output_device(device) } -> std::same_as<Device>;
};
template <class Def, class R>
concept HasTraits = requires {
  { Def::template traits<R>() } -> std::same_as<OpTraits>;
};
template <class Def>
concept RunsWithEpilogue = requires {
  Def::epilogue;
};
template <class Def>
concept HasGradient = requires {
  Def::differentiable;
};
template <class Def>
concept GradReadsOutput = requires {
  requires Def::reads_output;
};
template <class Def>
concept Multilinear = requires {
  requires Def::multilinear;
};
template <class Def, class R, class... In>
concept HasBatchRule = requires(const Def& def, std::span<const bool> batched, SourceLoc loc,
                                const Tensor<In>&... inputs) {
  { def.template batch<R>(batched, loc, inputs...) } -> std::convertible_to<TensorBase>;
};
template <class Def, class R, class... In>
concept HasTangentRule = requires(const Def& def, std::span<const TensorBase> tangents, SourceLoc loc,
                                  const Tensor<R>& out, const Tensor<In>&... inputs) {
  { def.jvp(tangents, loc, out, inputs...) } -> std::convertible_to<TensorBase>;
};

template <class Def, class... In> Shape output_shape_of(const Def& def, const Tensor<In>&... inputs) {
  if constexpr (ShapeFromInputs<Def, In...>)
    return def.output_shape(inputs.shape()...);
  else
    return def.output_shape();
}

/// Calls def's kernel on `in` (tensors of the types In) writing `out`.
template <class Def, class R, class... In, std::size_t... I>
void run_definition(const Def& def, Device device, std::span<const TensorBase> in, Tensor<R>& out,
                    const ir::BlockDone* done, std::index_sequence<I...>) {
  if constexpr (RunsWithEpilogue<Def>)
    def.run(device, Tensor<In>(in[I])..., out, done);
  else
    def.run(device, Tensor<In>(in[I])..., out);
}

/// Records def's gradient rule for `out` = def(inputs...) when an input it differentiates
/// needs a gradient; the tape keeps only the inputs the rule reads.
template <class Def, class R, class... In>
void record_gradient(const Def& def, const Tensor<R>& out, SourceLoc loc, const Tensor<In>&... inputs) {
  constexpr std::size_t n = sizeof...(In);
  constexpr auto each = std::index_sequence_for<In...>{};
  const bool enabled = is_grad_enabled();
  const op::Needs<n> needs = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return op::Needs<n>{(Def::differentiable[I] && enabled && inputs.impl()->requires_grad())...};
  }
  (each);
  if (std::find(needs.begin(), needs.end(), true) == needs.end()) return;
  const auto kept = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<Tensor<In>...>{(Def::saved[I] ? inputs : Tensor<In>())...};
  }
  (each);
  std::apply(
      [&](const auto&... k) {
        record(out, Def::name, loc, {inputs...}, {k...}, GradReadsOutput<Def>,
               [def, kept, needs, loc](const TensorBase& y, const TensorBase& g) {
                 return std::apply(
                     [&](const auto&... k) {
                       if constexpr (GradReadsOutput<Def>)
                         return def.grad(Tensor<R>(g), Tensor<R>(y), needs, loc, k...);
                       else
                         return def.grad(Tensor<R>(g), needs, loc, k...);
                     },
                     kept);
               });
      },
      kept);
}

/// The tangent of a definition linear in each differentiable input (`static constexpr bool
/// multilinear = true`: matmul, conv2d, the shape ops, pooling's adjoints): the sum over those
/// inputs of def applied with that input replaced by its tangent.
template <class R, class Def, class... In, std::size_t... I>
TensorBase multilinear_tangent(const Def& def, SourceLoc loc, std::span<const TensorBase> tangents,
                               std::index_sequence<I...>, const Tensor<In>&... inputs) {
  Tensor<R> sum;
  auto term = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
    if (!Def::differentiable[K] || !tangents[K].defined()) return;
    const Tensor<R> part = apply<R>(def, loc, (I == K ? Tensor<In>(tangents[I]) : inputs)...);
    sum = sum.defined() ? sum + part : part;
  };
  (term(std::integral_constant<std::size_t, I>{}), ...);
  return sum;
}

/// Records the derivatives of `out` = def(inputs...): its gradient rule on the tape, and in
/// forward mode its tangent: by def's rule `jvp(tangents, loc, out, inputs...)` (the inputs'
/// tangents, undefined where one has none), or, for a multilinear definition, by
/// multilinear_tangent. A definition with neither is an error naming it when a tangent
/// reaches it.
template <class Def, class R, class... In>
void record_derivatives(const Def& def, const Tensor<R>& out, SourceLoc loc, const Tensor<In>&... inputs) {
  if constexpr (FloatingPoint<R>) {
    if constexpr (HasGradient<Def>) record_gradient(def, out, loc, inputs...);
    if constexpr (HasTangentRule<Def, R, In...>)
      push_tangents(out, {inputs...}, [&](std::span<const TensorBase> tangents, const TensorBase& output) {
        return TensorBase(def.jvp(tangents, loc, Tensor<R>(output), inputs...));
      });
    else if constexpr (Multilinear<Def>)
      push_tangents(out, {inputs...}, [&](std::span<const TensorBase> tangents) {
        return multilinear_tangent<R>(def, loc, tangents, std::index_sequence_for<In...>{}, inputs...);
      });
    else
      push_tangents(out, {inputs...}, no_tangent_rule(Def::name, loc));
  }
}

template <class R, class Def, class... In> Tensor<R> apply(const Def& def, SourceLoc loc, const Tensor<In>&... inputs) {
  const Shape shape = output_shape_of(def, inputs...);
  auto compute = [def, shape, loc](std::span<const TensorBase> in, const TensorBase& dest, const ir::BlockDone* done) {
    if constexpr (ChecksValues<Def>)
      def.check(in, loc);
    else
      (void)loc;  // captured for the ops that check values
    Device device = device_of(in);
    if constexpr (PlacesOutput<Def>) device = def.output_device(device);
    auto out = output<R>(dest, shape, device);
    run_definition<Def, R, In...>(def, device, in, out, done, std::index_sequence_for<In...>{});
    return TensorBase(out);
  };
  OpTraits traits;
  if constexpr (HasTraits<Def, R>) traits = Def::template traits<R>();
  Tensor<R> out;
  if (const std::uint64_t level = batch_level_of(Def::name, loc, {inputs...})) [[unlikely]] {
    if constexpr (HasBatchRule<Def, R, In...>) {
      const std::array<bool, sizeof...(In)> which{batched_at(inputs, level)...};
      out = Tensor<R>(batched(def.template batch<R>(which, loc, batch_of(inputs, level)...), level));
    } else {
      throw_value_error(Def::name, loc, "no batching rule for vmap yet");
    }
  } else if constexpr (RunsWithEpilogue<Def>)
    out = Tensor<R>(primitive_with_epilogue(def, loc, {inputs...}, dtype_of<R>(), shape, compute, traits));
  else
    out = Tensor<R>(primitive(
        def, loc, {inputs...}, dtype_of<R>(), shape,
        [compute](std::span<const TensorBase> in, const TensorBase& dest) { return compute(in, dest, nullptr); },
        traits));
  record_derivatives(def, out, loc, inputs...);
  return out;
}

/// Op's traits, with the block kernel fusion runs it through (and, for a unary op, the
/// kernels merging it with a neighbour).
template <class Op> OpTraits with_block(BlockKernel block, const MergedBlockKernels* merged = nullptr) {
  static_assert(is_fusible<Op>(), "an op fusion may put in a group must be listed in op::Fusible");
  OpTraits traits = Op::traits;
  traits.block = block;
  traits.merged = merged;
  return traits;
}

/// Unary op Op's merged block kernels at T, or null: for a dtype other than float, or without a
/// batch body (ops/elementwise-inl.hpp, where the ops it merges with are).
template <class Op, class T> const MergedBlockKernels* merged_block_kernels();

/// An elementwise op's output tangent from its gradient rule: each input's part of the
/// Jacobian is diagonal (at the broadcast shape), so `part(g, k)`, the rule's gradient for input
/// k given g, is the image of input k's tangent g, broadcast to `shape`; the parts add up.
template <class T, class Part>
TensorBase elementwise_tangent(std::span<const TensorBase> tangents, const Shape& shape, Part part) {
  TensorBase sum;
  for (std::size_t k = 0; k < tangents.size(); ++k) {
    if (!tangents[k].defined() || tangents[k].dtype() != dtype_of<T>()) continue;
    const Tensor<T> g(tangents[k]);
    const TensorBase image = part(g.shape() == shape ? g : broadcast_to(g, shape), k);
    if (image.defined()) sum = sum.defined() ? TensorBase(Tensor<T>(sum) + Tensor<T>(image)) : image;
  }
  return sum;
}

/// Runs unary elementwise op Op: out[i] = Op::apply(x[i]).
template <class Op, class T> Tensor<T> unary(const Tensor<T>& x, SourceLoc loc) {
  const std::uint64_t level = batch_level_of(Op::name, loc, {x});
  Tensor<T> out(level ? batched(unary<Op>(batch_of(x, level), loc), level)
                      : primitive(
                            Op{}, loc, {x}, dtype_of<T>(), x.shape(),
                            [](std::span<const TensorBase> in, const TensorBase& dest) {
                              Tensor<T> v(in[0]);
                              auto out = output<T>(dest, v.shape(), v.device());
                              kernels::map<Op>(v.device(), out, v);
                              return TensorBase(out);
                            },
                            with_block<Op>(&cpu::unary_block<Op, T, T>, merged_block_kernels<Op, T>())));
  if constexpr (FloatingPoint<T>) {
    if (should_record(x)) {
      // Keep the input alive only for rules that read it.
      Tensor<T> kept = Op::reads_inputs ? x : Tensor<T>();
      record(out, Op::name, loc, {x}, Op::reads_inputs ? TensorRefs{x} : TensorRefs{}, Op::reads_output,
             [kept](const TensorBase& y, const TensorBase& g) {
               return autograd::Grads{Op::grad(kept, Tensor<T>(y), Tensor<T>(g))};
             });
    }
    // The Jacobian is diagonal, so the gradient rule applied to a tangent is the tangent's image.
    push_tangents(out, {x}, [&x](std::span<const TensorBase> t, const TensorBase& y) {
      return TensorBase(Op::grad(x, Tensor<T>(y), Tensor<T>(t[0])));
    });
  }
  return out;
}

/// The broadcast shape of a and b, or a ShapeError naming op, both inputs and the caller.
inline Shape broadcast_or_throw(std::string_view op, const TensorBase& a, const TensorBase& b, SourceLoc loc) {
  Shape out;
  if (!try_broadcast(a.shape(), b.shape(), out))
    throw_shape_error(op, loc, "shapes ", a.shape(), " and ", b.shape(), " cannot be broadcast together (inputs ",
                      describe_inputs({{"x", &a}, {"y", &b}}), ")");
  return out;
}

/// Runs binary elementwise op Op with NumPy broadcasting: out = Op::apply(a, b).
template <class Op, class T>
Tensor<typename Op::template result<T>> binary(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc) {
  using R = typename Op::template result<T>;
  OpScope scope(Op::name, loc, {a, b});
  Shape shape = broadcast_or_throw(Op::name, a, b, loc);
  const std::uint64_t level = batch_level_of(Op::name, loc, {a, b});
  Tensor<R> out(
      level ? batched(binary<Op>(batch_aligned(a, level, shape.ndim()), batch_aligned(b, level, shape.ndim()), loc),
                      level)
            : primitive(
                  Op{}, loc, {a, b}, dtype_of<R>(), shape,
                  [shape](std::span<const TensorBase> in, const TensorBase& dest) {
                    Tensor<T> x(in[0]), y(in[1]);
                    const Device device = device_of(in);
                    auto out = output<R>(dest, shape, device);
                    kernels::map<Op>(device, out, x, y);
                    return TensorBase(out);
                  },
                  with_block<Op>(&cpu::binary_block<Op, T, R>)));
  if constexpr (FloatingPoint<T> && FloatingPoint<R>) {
    if (should_record(a, b)) {
      Tensor<T> ka = Op::reads_inputs ? a : Tensor<T>(), kb = Op::reads_inputs ? b : Tensor<T>();
      record(out, Op::name, loc, {a, b}, Op::reads_inputs ? TensorRefs{a, b} : TensorRefs{}, Op::reads_output,
             [ka, kb](const TensorBase& y, const TensorBase& g) {
               auto [ga, gb] = Op::grad(ka, kb, Tensor<T>(y), Tensor<T>(g));
               return autograd::Grads{ga, gb};
             });
    }
    push_tangents(out, {a, b}, [&](std::span<const TensorBase> t, const TensorBase& y) {
      return elementwise_tangent<T>(t, shape, [&](const Tensor<T>& g, std::size_t k) {
        if constexpr (requires { Op::tangent(k, a, b, Tensor<R>(y), g); }) {
          return TensorBase(Op::tangent(k, a, b, Tensor<R>(y), g));
        } else {
          auto grads = Op::grad(a, b, Tensor<R>(y), g);
          return TensorBase(k == 0 ? std::get<0>(grads) : std::get<1>(grads));
        }
      });
    });
  }
  return out;
}

/// Runs ternary elementwise op Op (where, fma) with broadcasting over all three inputs:
/// out = Op::apply(a, b, c). Op names its inputs for shape errors (`inputs`), says which its
/// gradient rule reads (`saved`) and gives grad(a, b, c, g) -> the three gradients.
template <class Op, class A, class T>
Tensor<T> ternary(const Tensor<A>& a, const Tensor<T>& b, const Tensor<T>& c, SourceLoc loc) {
  OpScope scope(Op::name, loc, {a, b, c});
  Shape ab;
  Shape shape;
  if (!try_broadcast(a.shape(), b.shape(), ab) || !try_broadcast(ab, c.shape(), shape))
    throw_shape_error(Op::name, loc, "shapes cannot be broadcast together (inputs ",
                      describe_inputs({{Op::inputs[0], &a}, {Op::inputs[1], &b}, {Op::inputs[2], &c}}), ")");
  const std::uint64_t level = batch_level_of(Op::name, loc, {a, b, c});
  const int rank = shape.ndim();
  Tensor<T> out(level ? batched(ternary<Op>(batch_aligned(a, level, rank), batch_aligned(b, level, rank),
                                            batch_aligned(c, level, rank), loc),
                                level)
                      : primitive(
                            Op{}, loc, {a, b, c}, dtype_of<T>(), shape,
                            [shape](std::span<const TensorBase> in, const TensorBase& dest) {
                              Tensor<A> x(in[0]);
                              Tensor<T> y(in[1]), z(in[2]);
                              const Device device = device_of(in);
                              auto out = output<T>(dest, shape, device);
                              kernels::map<Op>(device, out, x, y, z);
                              return TensorBase(out);
                            },
                            with_block<Op>(&cpu::ternary_block<Op, A, T>)));
  if constexpr (FloatingPoint<T>) {
    if (should_record(a, b, c)) {
      const Tensor<A> ka = Op::saved[0] ? a : Tensor<A>();
      const Tensor<T> kb = Op::saved[1] ? b : Tensor<T>(), kc = Op::saved[2] ? c : Tensor<T>();
      record(out, Op::name, loc, {a, b, c}, {ka, kb, kc}, false, [ka, kb, kc](const TensorBase&, const TensorBase& g) {
        return Op::grad(ka, kb, kc, Tensor<T>(g));  // the engine sums each to its input's shape
      });
    }
    push_tangents(out, {a, b, c}, [&](std::span<const TensorBase> t) {
      return elementwise_tangent<T>(
          t, shape, [&](const Tensor<T>& g, std::size_t k) { return TensorBase(Op::grad(a, b, c, g)[k]); });
    });
  }
  return out;
}

}  // namespace detail
}  // namespace xgrad

// A fused group of elementwise ops (passes/fuse.hpp) on Device::thrust: one thrust::for_each
// over the output's elements, each reading the group's inputs once, running every op's own
// scalar body (Op::apply) on values held in registers, and writing the group's live outputs.
// No intermediate buffers. On a GPU each element is a thread; on a host system (OpenMP, serial)
// each call takes a block of elements through the steps one at a time, which pays the
// interpretation (index arithmetic, type branches, finding the op) once per block. Groups whose values are float, double or bool run this way; others
// (integer arithmetic) run op by op through the eager kernels (backend::detail::run_body).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "xgrad/core/tensor.hpp"

namespace xgrad::thrust_backend {

/// One value of a group, in registers.
union FusedValue {
  float f32;
  double f64;
  bool b;
};

template <class T> XGRAD_HD T fused_get(const FusedValue& v) {
  if constexpr (std::is_same_v<T, float>)
    return v.f32;
  else if constexpr (std::is_same_v<T, double>)
    return v.f64;
  else
    return v.b;
}

template <class T> XGRAD_HD void fused_put(FusedValue& v, T x) {
  if constexpr (std::is_same_v<T, float>)
    v.f32 = x;
  else if constexpr (std::is_same_v<T, double>)
    v.f64 = x;
  else
    v.b = x;
}

/// The ops of a group: slots number the group's inputs first, then the steps' results.
struct FusedStep {
  std::int8_t op = -1;  // index into the op list; -1: a copy (BroadcastTo: inputs are read broadcast)
  bool f64 = false;     // the operands' type: double, else float (a Select's condition is bool)
  std::int8_t args[3] = {};
  std::int8_t result = 0;
};

struct FusedInput {
  const void* data = nullptr;  // null: `scalar`, a one-element cpu tensor's value
  FusedValue scalar{};
  DType dtype = DType::float32;
  bool read = false;  // false for an anchor's input that only the anchor reads (its shape is not the group's)
  std::int64_t strides[kMaxRank] = {};  // element strides along the output's axes, 0 where broadcast
};

struct FusedOutput {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::int8_t slot = 0;
};

/// The functor thrust runs per output element. `Ops` is a std::tuple of the op types a step
/// may name (op::Fusible).
template <class Ops> struct FusedFn {
  static constexpr int kMaxSlots = 64, kMaxSteps = 48, kMaxInputs = 16, kMaxOutputs = 8;

  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
  int num_inputs = 0, num_steps = 0, num_outputs = 0;
  FusedInput inputs[kMaxInputs];
  FusedStep steps[kMaxSteps];
  FusedOutput outputs[kMaxOutputs];

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
  /// Elements a host thread evaluates a step at a time (FusedBlockFn).
  static constexpr int kBlock = 64;

  /// Elements [first, first + n) of the output, n <= kBlock, step by step: each input is walked
  /// along the output's axes once (no division per element), each step's op is found once, and
  /// its body runs over the block in a loop of its own.
  void run_block(std::int64_t first, int n) const {
    FusedValue r[kMaxSlots][kBlock];
    for (int k = 0; k < num_inputs; ++k) load_block(inputs[k], first, n, r[k]);
    for (int s = 0; s < num_steps; ++s)
      run_block_step(steps[s], r, n, std::make_index_sequence<std::tuple_size_v<Ops>>{});
    for (int o = 0; o < num_outputs; ++o) store_block(outputs[o], first, n, r[outputs[o].slot]);
  }
#endif

  XGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t flat = i;
    std::int64_t index[kMaxRank];
    for (int d = rank - 1; d > 0; --d) {
      index[d] = i % dims[d];
      i /= dims[d];
    }
    index[0] = i;
    FusedValue r[kMaxSlots];
    for (int k = 0; k < num_inputs; ++k) r[k] = load(inputs[k], index);
    for (int s = 0; s < num_steps; ++s) run(steps[s], r, std::make_index_sequence<std::tuple_size_v<Ops>>{});
    for (int o = 0; o < num_outputs; ++o) store(outputs[o], flat, r[outputs[o].slot]);
  }

 private:
  XGRAD_HD FusedValue load(const FusedInput& in, const std::int64_t* index) const {
    if (!in.data) return in.scalar;
    std::int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[d] * in.strides[d];
    FusedValue v{};
    if (in.dtype == DType::float32)
      v.f32 = static_cast<const float*>(in.data)[offset];
    else if (in.dtype == DType::float64)
      v.f64 = static_cast<const double*>(in.data)[offset];
    else
      v.b = static_cast<const bool*>(in.data)[offset];
    return v;
  }

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
  template <class T> void load_typed(const FusedInput& in, std::int64_t first, int n, FusedValue* out) const {
    const T* data = static_cast<const T*>(in.data);
    std::int64_t index[kMaxRank];
    std::int64_t rest = first, offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      index[d] = d == 0 ? rest : rest % dims[d];
      rest = d == 0 ? 0 : rest / dims[d];
      offset += index[d] * in.strides[d];
    }
    const int last = rank - 1;
    for (int j = 0; j < n; ++j) {
      fused_put(out[j], data[offset]);
      offset += in.strides[last];
      if (++index[last] < dims[last]) continue;
      // Carry into the axes before the last, and start the offset over.
      for (int d = last; d > 0 && index[d] == dims[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
      offset = 0;
      for (int d = 0; d < rank; ++d) offset += index[d] * in.strides[d];
    }
  }

  void load_block(const FusedInput& in, std::int64_t first, int n, FusedValue* out) const {
    if (!in.data || rank == 0) {
      const FusedValue v = in.data ? load(in, nullptr) : in.scalar;
      for (int j = 0; j < n; ++j) out[j] = v;
    } else if (in.dtype == DType::float32) {
      load_typed<float>(in, first, n, out);
    } else if (in.dtype == DType::float64) {
      load_typed<double>(in, first, n, out);
    } else {
      load_typed<bool>(in, first, n, out);
    }
  }

  static void store_block(const FusedOutput& out, std::int64_t first, int n, const FusedValue* v) {
    if (out.dtype == DType::float32)
      for (int j = 0; j < n; ++j) static_cast<float*>(out.data)[first + j] = v[j].f32;
    else if (out.dtype == DType::float64)
      for (int j = 0; j < n; ++j) static_cast<double*>(out.data)[first + j] = v[j].f64;
    else
      for (int j = 0; j < n; ++j) static_cast<bool*>(out.data)[first + j] = v[j].b;
  }

  template <std::size_t... I>
  static void run_block_step(const FusedStep& s, FusedValue (*r)[kBlock], int n, std::index_sequence<I...>) {
    if (s.op < 0) {
      for (int j = 0; j < n; ++j) r[s.result][j] = r[s.args[0]][j];
      return;
    }
    auto over_block = [&]<class Op>(std::type_identity<Op>) {
      if (s.f64)
        apply_block<Op, double>(s, r, n);
      else
        apply_block<Op, float>(s, r, n);
    };
    (void)((s.op == static_cast<int>(I) && (over_block(std::type_identity<std::tuple_element_t<I, Ops>>{}), true)) ||
           ...);
  }

  /// apply over a block: the same body, element by element.
  template <class Op, class T> static void apply_block(const FusedStep& s, FusedValue (*r)[kBlock], int n) {
    const FusedValue *a = r[s.args[0]], *b = r[s.args[1]], *c = r[s.args[2]];
    FusedValue* out = r[s.result];
    if constexpr (requires(bool cond, T x) { Op::apply(cond, x, x); })
      for (int j = 0; j < n; ++j) fused_put(out[j], Op::apply(a[j].b, fused_get<T>(b[j]), fused_get<T>(c[j])));
    else if constexpr (requires(T x) { Op::apply(x); })
      for (int j = 0; j < n; ++j) fused_put(out[j], Op::apply(fused_get<T>(a[j])));
    else if constexpr (requires(T x) { Op::apply(x, x); })
      for (int j = 0; j < n; ++j) fused_put(out[j], Op::apply(fused_get<T>(a[j]), fused_get<T>(b[j])));
    else
      for (int j = 0; j < n; ++j)
        fused_put(out[j], Op::apply(fused_get<T>(a[j]), fused_get<T>(b[j]), fused_get<T>(c[j])));
  }
#endif

  XGRAD_HD static void store(const FusedOutput& out, std::int64_t flat, const FusedValue& v) {
    if (out.dtype == DType::float32)
      static_cast<float*>(out.data)[flat] = v.f32;
    else if (out.dtype == DType::float64)
      static_cast<double*>(out.data)[flat] = v.f64;
    else
      static_cast<bool*>(out.data)[flat] = v.b;
  }

  template <std::size_t... I> XGRAD_HD static void run(const FusedStep& s, FusedValue* r, std::index_sequence<I...>) {
    if (s.op < 0) {
      r[s.result] = r[s.args[0]];
      return;
    }
    (void)((s.op == static_cast<int>(I) && (run_as<std::tuple_element_t<I, Ops>>(s, r), true)) || ...);
  }

  template <class Op> XGRAD_HD static void run_as(const FusedStep& s, FusedValue* r) {
    if (s.f64)
      apply<Op, double>(s, r);
    else
      apply<Op, float>(s, r);
  }

  /// Op's body on the step's operands, by its arity; a (bool, T, T) body is Select's.
  template <class Op, class T> XGRAD_HD static void apply(const FusedStep& s, FusedValue* r) {
    auto at = [&](int j) { return fused_get<T>(r[s.args[j]]); };
    FusedValue& out = r[s.result];
    if constexpr (requires(bool c, T x) { Op::apply(c, x, x); })
      fused_put(out, Op::apply(fused_get<bool>(r[s.args[0]]), at(1), at(2)));
    else if constexpr (requires(T x) { Op::apply(x); })
      fused_put(out, Op::apply(at(0)));
    else if constexpr (requires(T x) { Op::apply(x, x); })
      fused_put(out, Op::apply(at(0), at(1)));
    else
      fused_put(out, Op::apply(at(0), at(1), at(2)));
  }
};

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
/// A host system's functor: one call per block of kBlock elements (the last one shorter).
template <class Ops> struct FusedBlockFn {
  FusedFn<Ops> fn;
  std::int64_t numel;
  void operator()(std::int64_t block) const {
    const std::int64_t first = block * FusedFn<Ops>::kBlock;
    fn.run_block(first, static_cast<int>(std::min<std::int64_t>(FusedFn<Ops>::kBlock, numel - first)));
  }
};
#endif

/// A group as the functor runs it, built once when the group is fused; empty (nullopt) when
/// a value is not float, double or bool or the group is too large.
template <class Ops> class FusedGroup {
 public:
  struct Step {
    int op;                 // the op's place in Ops; -1 for a broadcast input gathered per block
    std::vector<int> args;  // slots
    DType dtype;            // of the result
    int result;             // slot
  };

  static std::optional<FusedGroup> make(const Shape& shape, const std::vector<std::pair<DType, Shape>>& inputs,
                                        const std::vector<Step>& steps, const std::vector<int>& outputs) {
    using Fn = FusedFn<Ops>;
    auto held = [](DType t) { return t == DType::float32 || t == DType::float64 || t == DType::boolean; };
    if (inputs.size() > Fn::kMaxInputs || steps.size() > Fn::kMaxSteps || outputs.size() > Fn::kMaxOutputs)
      return std::nullopt;
    FusedGroup group;
    group.m_shape = shape;
    Fn& fn = group.m_fn;
    fn.rank = shape.ndim();
    for (int d = 0; d < shape.ndim(); ++d) fn.dims[d] = shape[d];
    std::vector<DType> slot_dtype;
    for (const auto& [dtype, in_shape] : inputs) {
      if (!held(dtype)) return std::nullopt;
      slot_dtype.push_back(dtype);
      FusedInput& in = fn.inputs[fn.num_inputs++];
      in.dtype = dtype;
      std::int64_t step = 1;
      for (int d = shape.ndim() - 1, e = in_shape.ndim() - 1; d >= 0; --d, --e) {
        const std::int64_t size = e >= 0 ? in_shape[e] : 1;
        in.strides[d] = size == 1 ? 0 : step;
        step *= size;
      }
    }
    // Axes every input walks as one (each input's stride along an axis is the next axis's
    // times its size, or both 0) merge: an all-contiguous group indexes flat, a broadcast row
    // with one division, instead of a division per axis per element.
    int merged = 0;
    for (int d = 1; d < fn.rank; ++d) {
      bool joins = true;
      for (int k = 0; k < fn.num_inputs; ++k)
        joins = joins && fn.inputs[k].strides[merged] == fn.inputs[k].strides[d] * fn.dims[d];
      if (joins) {
        fn.dims[merged] *= fn.dims[d];
        for (int k = 0; k < fn.num_inputs; ++k) fn.inputs[k].strides[merged] = fn.inputs[k].strides[d];
      } else {
        ++merged;
        fn.dims[merged] = fn.dims[d];
        for (int k = 0; k < fn.num_inputs; ++k) fn.inputs[k].strides[merged] = fn.inputs[k].strides[d];
      }
    }
    if (fn.rank > 0) fn.rank = merged + 1;
    for (const Step& step : steps) {
      if (!held(step.dtype) || step.args.empty() || step.args.size() > 3 || step.result >= Fn::kMaxSlots)
        return std::nullopt;
      for (int a : step.args)
        if (a < fn.num_inputs) fn.inputs[a].read = true;
      FusedStep& s = fn.steps[fn.num_steps++];
      s.op = static_cast<std::int8_t>(step.op);
      // The type the body computes in: its (last) operand's; a Select's condition is bool.
      const DType operand = slot_dtype.at(static_cast<std::size_t>(step.args.back()));
      if (operand == DType::boolean && s.op >= 0) return std::nullopt;
      s.f64 = operand == DType::float64;
      for (std::size_t j = 0; j < step.args.size(); ++j) s.args[j] = static_cast<std::int8_t>(step.args[j]);
      s.result = static_cast<std::int8_t>(step.result);
      if (slot_dtype.size() <= static_cast<std::size_t>(step.result))
        slot_dtype.resize(static_cast<std::size_t>(step.result) + 1);
      slot_dtype[static_cast<std::size_t>(step.result)] = step.dtype;
    }
    for (int slot : outputs) {
      FusedOutput& out = fn.outputs[fn.num_outputs++];
      out.slot = static_cast<std::int8_t>(slot);
      out.dtype = slot_dtype.at(static_cast<std::size_t>(slot));
    }
    return group;
  }

  /// Reads `in` (one tensor per input slot, on the device or one-element cpu tensors) and writes
  /// out[j] (made on the device when undefined).
  void operator()(std::span<const TensorBase> in, std::span<TensorBase> out) const {
    FusedFn<Ops> fn = m_fn;
    for (int k = 0; k < fn.num_inputs; ++k) {
      FusedInput& input = fn.inputs[k];
      const TensorBase& t = in[static_cast<std::size_t>(k)];
      if (!input.read) continue;  // stays a (zero) scalar: never loaded
      if (t.device() == Device::cpu) {
        input.data = nullptr;
        const void* p = t.impl()->storage->data();
        if (input.dtype == DType::float32)
          input.scalar.f32 = *static_cast<const float*>(p);
        else if (input.dtype == DType::float64)
          input.scalar.f64 = *static_cast<const double*>(p);
        else
          input.scalar.b = *static_cast<const bool*>(p);
      } else {
        input.data = t.impl()->storage->data();
      }
    }
    for (int o = 0; o < fn.num_outputs; ++o) {
      TensorBase& t = out[static_cast<std::size_t>(o)];
      if (!t.defined()) t = TensorBase(TensorImpl::allocate(m_shape, fn.outputs[o].dtype, Device::thrust));
      fn.outputs[o].data = t.impl()->storage->data();
    }
    thrust::counting_iterator<std::int64_t> first(0);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    thrust::for_each(thrust::device, first, first + m_shape.numel(), fn);
#else
    // On the host a block at a time: the per-element interpretation (index arithmetic, a type
    // branch per load, the op found per step) costs more than most ops' bodies.
    const std::int64_t blocks = (m_shape.numel() + FusedFn<Ops>::kBlock - 1) / FusedFn<Ops>::kBlock;
    thrust::for_each(thrust::device, first, first + blocks, FusedBlockFn<Ops>{fn, m_shape.numel()});
#endif
  }

 private:
  Shape m_shape;
  FusedFn<Ops> m_fn;
};

}  // namespace xgrad::thrust_backend

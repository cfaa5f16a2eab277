// Definitions of distributed/collectives.hpp: included by it when header-only, compiled once
// into the library (src/distributed.cpp) otherwise.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "xgrad/core/factory.hpp"
#include "xgrad/distributed/collectives.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"

namespace xgrad {

namespace distributed::detail {

/// How a collective's exchange uses its buffers: in place on the result (all_reduce, broadcast:
/// out starts as a copy of x), or reading x and writing out (all_gather, reduce_scatter).
enum class Buffers { in_place, separate };

/// Runs body(in, out, started, sig), the raw collective, on buffers it may exchange: x's and
/// out's on the cpu, or on the device where NCCL exchanges them (exchanges_on_device), else
/// copies staged through the host. With `start` (a started collective, its result in out's
/// buffer, registered under it for wait()) `started` is given and owns the buffers until the
/// exchange is done; `in` is then a copy of x's elements, since x's buffer may be reused at
/// once. Staged through the host, the exchange happens now and is registered as finished.
template <Buffers B, class T, class Body> void exchange(const Tensor<T>& x, Tensor<T>& out, bool start, Signature sig,
                                                        std::optional<ReduceOp> reduce, Body body) {
  const std::size_t in_bytes = static_cast<std::size_t>(x.numel()) * sizeof(T);
  const std::size_t out_bytes = static_cast<std::size_t>(out.numel()) * sizeof(T);
  sig.on_device = x.device() != Device::cpu && exchanges_on_device(reduce);
  if (x.device() != Device::cpu && !sig.on_device) {
    std::vector<std::byte> in(B == Buffers::in_place ? 0 : in_bytes), result(out_bytes);
    xgrad::detail::copy_bytes(B == Buffers::in_place ? result.data() : in.data(), Device::cpu, x.data(), x.device(),
                              in_bytes);
    T* host_out = reinterpret_cast<T*>(result.data());
    body(B == Buffers::in_place ? host_out : reinterpret_cast<const T*>(in.data()), host_out, nullptr, sig);
    xgrad::detail::copy_bytes(out.data(), out.device(), result.data(), Device::cpu, out_bytes);
    if (start) finished(out.data());
    return;
  }
  const T* in = x.data();
  std::shared_ptr<Storage> sent;  // a started exchange's copy of x
  if (B == Buffers::in_place) {
    if (in != out.data()) xgrad::detail::copy_bytes(out.data(), out.device(), in, x.device(), in_bytes);
    in = out.data();
  } else if (start) {
    sent = std::make_shared<Storage>(in_bytes, x.device());
    xgrad::detail::copy_bytes(sent->data(), x.device(), in, x.device(), in_bytes);
    in = static_cast<const T*>(sent->data());
  }
  if (!start) return body(in, out.data(), nullptr, sig);
  const Started started{out.data(), std::make_shared<std::pair<std::shared_ptr<Storage>, std::shared_ptr<Storage>>>(
                                        sent, out.impl()->storage)};
  body(in, out.data(), &started, sig);
}

inline Signature signature_of(std::string_view op, const TensorBase& x, std::int64_t parameter, SourceLoc loc) {
  return {.op = op, .dtype = x.dtype(), .shape = x.shape(), .parameter = parameter, .loc = loc};
}

/// 1 where x holds the result of a max or min over the ranks, else 0, divided by how many ranks
/// hold it there: the share of the gradient each rank's x gets.
template <class T> Tensor<T> extreme_share(const Tensor<T>& x, const Tensor<T>& result, SourceLoc loc) {
  const Tensor<T> holds = cast<T>(equal(x, result, loc), loc);  // none where the result is NaN: a NaN gradient
  return holds / all_reduce(holds, ReduceOp::sum, loc);
}

}  // namespace distributed::detail

namespace op {

// Batching rules (vmap): the whole batch is exchanged in one collective, each value reduced,
// gathered or scattered with the same value of the other ranks (every rank maps over a batch of
// the same size; a rank that does not is told the ranks disagree).

/// The collectives' nodes: effects (never folded, merged or removed, and run in program order),
/// since each is a message every rank must send. `loc` is the caller's line, for the errors the
/// exchange itself finds (ranks that disagree, MPI failing); it is not a parameter.
struct AllReduce {
  static constexpr std::string_view name = "AllReduce";
  static constexpr bool has_effect = true;
  distributed::ReduceOp reduce = distributed::ReduceOp::sum;
  std::vector<ir::Attr> attrs() const { return {{"reduce", std::string(distributed::reduce_op_name(reduce))}}; }
  SourceLoc loc;
  bool operator==(const AllReduce& o) const { return reduce == o.reduce; }
  Shape output_shape(const Shape& x) const { return x; }
  /// `start`: all_reduce_start's, registered for wait() instead of waited for.
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out, bool start = false) const {
    const auto sig =
        distributed::detail::signature_of(start ? "all_reduce_start" : "all_reduce", x, static_cast<int>(reduce), loc);
    using distributed::detail::Signature, distributed::detail::Started;
    distributed::detail::exchange<distributed::detail::Buffers::in_place>(
        x, out, start, sig, reduce, [&](const T*, T* result, const Started* started, const Signature& s) {
          distributed::detail::all_reduce(result, x.numel(), reduce, s, started);
        });
  }

  static constexpr Needs<1> differentiable{true}, saved{true};
  static constexpr bool reads_output = true;
  template <class T>
  autograd::Grads grad(const Tensor<T>& g, const Tensor<T>& y, Needs<1>, SourceLoc loc, const Tensor<T>& x) const {
    using distributed::ReduceOp;
    if (reduce == ReduceOp::sum || reduce == ReduceOp::mean) return {distributed::all_reduce(g, reduce, loc)};
    return {distributed::all_reduce(g, ReduceOp::sum, loc) * distributed::detail::extreme_share(x, y, loc)};
  }
  /// The same collective of the tangents (max and min: of each holder's share of its tangent).
  template <class T>
  Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& y, const Tensor<T>& x) const {
    using distributed::ReduceOp;
    if (reduce == ReduceOp::sum || reduce == ReduceOp::mean)
      return distributed::all_reduce(Tensor<T>(t[0]), reduce, loc);
    return distributed::all_reduce(Tensor<T>(t[0]) * distributed::detail::extreme_share(x, y, loc), ReduceOp::sum, loc);
  }
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return distributed::all_reduce(x, reduce, loc);
  }
};

struct AllGather {
  static constexpr std::string_view name = "AllGather";
  static constexpr bool has_effect = true;
  int world = 1;
  std::vector<ir::Attr> attrs() const { return {{"world", std::to_string(world)}}; }
  SourceLoc loc;
  bool operator==(const AllGather& o) const { return world == o.world; }
  Shape output_shape(const Shape& x) const {
    Shape out{world};
    for (std::int64_t d : x) out.push_back(d);
    return out;
  }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out, bool start = false) const {
    const auto sig = distributed::detail::signature_of(start ? "all_gather_start" : "all_gather", x, 0, loc);
    using distributed::detail::Signature, distributed::detail::Started;
    distributed::detail::exchange<distributed::detail::Buffers::separate>(
        x, out, start, sig, std::nullopt, [&](const T* in, T* result, const Started* started, const Signature& s) {
          distributed::detail::all_gather(in, result, x.numel() * static_cast<std::int64_t>(sizeof(T)), s, started);
        });
  }

  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {distributed::reduce_scatter(g, distributed::ReduceOp::sum, loc)};
  }
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    // [world, batch, ...] -> [batch, world, ...]
    return xgrad::detail::move_axis(distributed::all_gather(x, loc), 1, 0, loc);
  }
};

struct ReduceScatter {
  static constexpr std::string_view name = "ReduceScatter";
  static constexpr bool has_effect = true;
  distributed::ReduceOp reduce = distributed::ReduceOp::sum;
  std::vector<ir::Attr> attrs() const { return {{"reduce", std::string(distributed::reduce_op_name(reduce))}}; }
  SourceLoc loc;
  bool operator==(const ReduceScatter& o) const { return reduce == o.reduce; }
  Shape output_shape(const Shape& x) const { return Shape(x.begin() + 1, x.end()); }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out, bool start = false) const {
    const auto sig = distributed::detail::signature_of(start ? "reduce_scatter_start" : "reduce_scatter", x,
                                                       static_cast<int>(reduce), loc);
    using distributed::detail::Signature, distributed::detail::Started;
    distributed::detail::exchange<distributed::detail::Buffers::separate>(
        x, out, start, sig, reduce, [&](const T* in, T* result, const Started* started, const Signature& s) {
          distributed::detail::reduce_scatter(in, result, out.numel(), reduce, s, started);
        });
  }

  static constexpr Needs<1> differentiable{true}, saved{true};
  static constexpr bool reads_output = true;
  template <class T>
  autograd::Grads grad(const Tensor<T>& g, const Tensor<T>& y, Needs<1>, SourceLoc loc, const Tensor<T>& x) const {
    using distributed::ReduceOp;
    const Tensor<T> every = distributed::all_gather(g, loc);
    if (reduce == ReduceOp::sum) return {every};
    if (reduce == ReduceOp::mean) return {every / static_cast<T>(x.shape()[0])};
    return {every * distributed::detail::extreme_share(x, distributed::all_gather(y, loc), loc)};
  }
  template <class T>
  Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& y, const Tensor<T>& x) const {
    using distributed::ReduceOp;
    const Tensor<T> tangent(t[0]);
    if (reduce == ReduceOp::sum || reduce == ReduceOp::mean) return distributed::reduce_scatter(tangent, reduce, loc);
    return distributed::reduce_scatter(
        tangent * distributed::detail::extreme_share(x, distributed::all_gather(y, loc), loc), ReduceOp::sum, loc);
  }
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    // The ranks' axis, after the batch in each value, leads for the scatter.
    return distributed::reduce_scatter(xgrad::detail::move_axis(x, 1, 0, loc), reduce, loc);
  }
};

struct Broadcast {
  static constexpr std::string_view name = "Broadcast";
  static constexpr bool has_effect = true;
  int root = 0;
  bool is_root = false;  // this process is root: its gradient is the ranks' sum, the others' zero
  std::vector<ir::Attr> attrs() const { return {{"root", std::to_string(root)}}; }
  SourceLoc loc;
  bool operator==(const Broadcast& o) const { return root == o.root && is_root == o.is_root; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out, bool start = false) const {
    const auto sig = distributed::detail::signature_of(start ? "broadcast_start" : "broadcast", x, root, loc);
    using distributed::detail::Signature, distributed::detail::Started;
    distributed::detail::exchange<distributed::detail::Buffers::in_place>(
        x, out, start, sig, std::nullopt, [&](const T*, T* result, const Started* started, const Signature& s) {
          distributed::detail::broadcast(result, x.numel() * static_cast<std::int64_t>(sizeof(T)), root, s, started);
        });
  }

  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    const Tensor<T> sum = distributed::all_reduce(g, distributed::ReduceOp::sum, loc);
    return {is_root ? sum : zeros_like(sum, loc)};
  }
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return distributed::broadcast(x, root, loc);
  }
};

/// The started collectives' nodes: the exchange runs on the communication thread from the start
/// node to the CollectiveWait that reads its output, whose buffer it writes meanwhile (what it
/// sends was copied or read at the start, so the input's buffer is free at once). A device
/// tensor's exchange goes through the host at the start.
struct AllReduceStart {
  static constexpr std::string_view name = "AllReduceStart";
  static constexpr bool has_effect = true;
  distributed::ReduceOp reduce = distributed::ReduceOp::sum;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {{"reduce", std::string(distributed::reduce_op_name(reduce))}}; }
  bool operator==(const AllReduceStart& o) const { return reduce == o.reduce; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    AllReduce{reduce, loc}.run(d, x, out, true);
  }
};

struct AllGatherStart {
  static constexpr std::string_view name = "AllGatherStart";
  static constexpr bool has_effect = true;
  int world = 1;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {{"world", std::to_string(world)}}; }
  bool operator==(const AllGatherStart& o) const { return world == o.world; }
  Shape output_shape(const Shape& x) const { return AllGather{world, loc}.output_shape(x); }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    AllGather{world, loc}.run(d, x, out, true);
  }
};

struct ReduceScatterStart {
  static constexpr std::string_view name = "ReduceScatterStart";
  static constexpr bool has_effect = true;
  distributed::ReduceOp reduce = distributed::ReduceOp::sum;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {{"reduce", std::string(distributed::reduce_op_name(reduce))}}; }
  bool operator==(const ReduceScatterStart& o) const { return reduce == o.reduce; }
  Shape output_shape(const Shape& x) const { return ReduceScatter{reduce, loc}.output_shape(x); }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    ReduceScatter{reduce, loc}.run(d, x, out, true);
  }
};

struct BroadcastStart {
  static constexpr std::string_view name = "BroadcastStart";
  static constexpr bool has_effect = true;
  int root = 0;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {{"root", std::to_string(root)}}; }
  bool operator==(const BroadcastStart& o) const { return root == o.root; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    Broadcast{root, false, loc}.run(d, x, out, true);
  }
};

/// distributed::wait's node: its output is the buffer the started collective wrote (a view of
/// it when the graph's memory plan holds it, so nothing is copied).
struct CollectiveWait {
  static constexpr std::string_view name = "CollectiveWait";
  static constexpr bool has_effect = true;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {}; }
  bool operator==(const CollectiveWait&) const { return true; }
  template <class R> static OpTraits traits() { return {.view = true}; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::wait(x.data(), "distributed::wait", loc);
    if (out.data() != x.data())
      xgrad::detail::copy_bytes(out.data(), out.device(), x.data(), x.device(),
                                static_cast<std::size_t>(x.numel()) * sizeof(T));
  }
};

}  // namespace op

namespace distributed {

namespace detail {
// The checks an op and its start form share; each names `op`.
template <class T> void check_mean(std::string_view op, const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  joined_size(op, loc);
  if (reduce == ReduceOp::mean && !FloatingPoint<T>)
    throw_value_error(op, loc, "mean of an ", dtype_name(x.dtype()),
                      " tensor would round; reduce with sum and divide in floating point");
}
inline int check_gather(std::string_view op, const TensorBase& x, SourceLoc loc) {
  if (x.ndim() + 1 > kMaxRank)
    throw_shape_error(op, loc, "x has ", x.ndim(), " axes, and the result adds one: at most ", kMaxRank,
                      " axes in all (x: ", dtype_name(x.dtype()), x.shape(), ")");
  return joined_size(op, loc);
}
template <class T> void check_scatter(std::string_view op, const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  const int world = joined_size(op, loc);
  if (x.ndim() == 0 || x.shape()[0] != world)
    throw_shape_error(op, loc, "x's leading axis must be the world size ", world, " (one slice per rank), x is ",
                      dtype_name(x.dtype()), x.shape());
  check_mean(op, x, reduce, loc);
}
inline void check_root(std::string_view op, int root, SourceLoc loc) {
  const int world = joined_size(op, loc);
  if (root < 0 || root >= world) throw_value_error(op, loc, "root ", root, " is not a rank of this group of ", world);
}
}  // namespace detail

template <Numeric T> Tensor<T> all_reduce_start(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_reduce_start", loc, {x});
  detail::check_mean("all_reduce_start", x, reduce, loc);
  return xgrad::detail::apply<T>(op::AllReduceStart{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> all_gather_start(const Tensor<T>& x, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_gather_start", loc, {x});
  return xgrad::detail::apply<T>(op::AllGatherStart{detail::check_gather("all_gather_start", x, loc), loc}, loc, x);
}

template <Numeric T> Tensor<T> reduce_scatter_start(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("reduce_scatter_start", loc, {x});
  detail::check_scatter("reduce_scatter_start", x, reduce, loc);
  return xgrad::detail::apply<T>(op::ReduceScatterStart{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> broadcast_start(const Tensor<T>& x, int root, SourceLoc loc) {
  xgrad::detail::OpScope scope("broadcast_start", loc, {x});
  detail::check_root("broadcast_start", root, loc);
  return xgrad::detail::apply<T>(op::BroadcastStart{root, loc}, loc, x);
}

template <Element T> Tensor<T> wait(const Tensor<T>& started, SourceLoc loc) {
  xgrad::detail::OpScope scope("distributed::wait", loc, {started});
  detail::joined_size("distributed::wait", loc);
  return xgrad::detail::apply<T>(op::CollectiveWait{loc}, loc, started);
}

template <Numeric T> Tensor<T> all_reduce(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_reduce", loc, {x});
  detail::check_mean("all_reduce", x, reduce, loc);
  return xgrad::detail::apply<T>(op::AllReduce{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> all_gather(const Tensor<T>& x, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_gather", loc, {x});
  return xgrad::detail::apply<T>(op::AllGather{detail::check_gather("all_gather", x, loc), loc}, loc, x);
}

template <Numeric T> Tensor<T> reduce_scatter(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("reduce_scatter", loc, {x});
  detail::check_scatter("reduce_scatter", x, reduce, loc);
  return xgrad::detail::apply<T>(op::ReduceScatter{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> broadcast(const Tensor<T>& x, int root, SourceLoc loc) {
  xgrad::detail::OpScope scope("broadcast", loc, {x});
  detail::check_root("broadcast", root, loc);
  return xgrad::detail::apply<T>(op::Broadcast{root, rank(loc) == root, loc}, loc, x);
}

XGRAD_API void broadcast_into(const TensorBase& t, int root, SourceLoc loc) {
  if (tracing::Tracer::active())
    throw_value_error("broadcast_into", loc, "writes a tensor in place now: call it outside jit (broadcast is the op)");
  detail::check_root("broadcast_into", root, loc);
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
  void* data = t.impl()->storage->data();
  detail::Signature sig = detail::signature_of("broadcast_into", t, root, loc);
  sig.on_device = t.device() != Device::cpu && detail::exchanges_on_device();
  if (t.device() == Device::cpu || sig.on_device)
    return detail::broadcast(data, static_cast<std::int64_t>(bytes), root, sig);
  std::vector<std::byte> host(bytes);
  xgrad::detail::copy_bytes(host.data(), Device::cpu, data, t.device(), bytes);
  detail::broadcast(host.data(), static_cast<std::int64_t>(bytes), root, sig);
  xgrad::detail::copy_bytes(data, t.device(), host.data(), Device::cpu, bytes);
}

XGRAD_API std::vector<std::pair<std::size_t, std::size_t>> detail::bucket_ranges(const std::vector<std::int64_t>& bytes,
                                                                                 std::int64_t bucket_bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t end = bytes.size(); end > 0;) {
    std::size_t begin = end - 1;
    for (std::int64_t size = bytes[begin]; begin > 0 && size + bytes[begin - 1] <= bucket_bytes;)
      size += bytes[--begin];
    out.emplace_back(begin, end);
    end = begin;
  }
  return out;
}

namespace detail {
/// The tensors xs[begin, end) flattened and joined, the last first: a bucket's message.
template <class T> Tensor<T> pack(const std::vector<Tensor<T>>& xs, std::size_t begin, std::size_t end, SourceLoc loc) {
  std::vector<Tensor<T>> flat;
  for (std::size_t i = end; i-- > begin;) flat.push_back(reshape(xs[i], {-1}, loc));
  return flat.size() == 1 ? flat[0] : concat(flat, 0, loc);
}
/// pack's inverse: out[i] for i in [begin, end), shaped like shapes[i].
template <class T> void unpack(const Tensor<T>& packed, const std::vector<Shape>& shapes, std::size_t begin,
                               std::size_t end, std::vector<Tensor<T>>& out, SourceLoc loc) {
  std::int64_t at = 0;
  for (std::size_t i = end; i-- > begin;) {
    out[i] = reshape(slice(packed, {at}, {shapes[i].numel()}, loc), shapes[i].to_vector(), loc);
    at += shapes[i].numel();
  }
}
}  // namespace detail

template <FloatingPoint T> std::vector<Tensor<T>> all_reduce_bucketed(const std::vector<Tensor<T>>& xs, ReduceOp reduce,
                                                                      std::int64_t bucket_bytes, SourceLoc loc) {
  if (bucket_bytes < 1) throw_value_error("all_reduce_bucketed", loc, "bucket_bytes must be >= 1, got ", bucket_bytes);
  std::vector<std::int64_t> bytes;
  std::vector<Shape> shapes;
  for (const auto& x : xs) {
    bytes.push_back(x.numel() * static_cast<std::int64_t>(sizeof(T)));
    shapes.push_back(x.shape());
  }
  std::vector<Tensor<T>> out(xs.size());
  for (const auto& [begin, end] : detail::bucket_ranges(bytes, bucket_bytes))
    detail::unpack(all_reduce(detail::pack(xs, begin, end, loc), reduce, loc), shapes, begin, end, out, loc);
  return out;
}

XGRAD_API GradientMean::GradientMean(const std::vector<Shape>& shapes, std::int64_t bucket_bytes, SourceLoc loc)
    : m_shapes(shapes), m_grads(shapes.size()), m_loc(loc) {
  if (bucket_bytes < 1) throw_value_error("GradientMean", loc, "bucket_bytes must be >= 1, got ", bucket_bytes);
  std::vector<std::int64_t> bytes;
  for (const Shape& s : shapes) bytes.push_back(s.numel() * static_cast<std::int64_t>(sizeof(float)));
  m_buckets = detail::bucket_ranges(bytes, bucket_bytes);
  m_bucket_of.resize(shapes.size());
  for (std::size_t k = 0; k < m_buckets.size(); ++k) {
    m_missing.push_back(m_buckets[k].second - m_buckets[k].first);
    for (std::size_t i = m_buckets[k].first; i < m_buckets[k].second; ++i) m_bucket_of[i] = k;
  }
  m_started.resize(m_buckets.size());
}

XGRAD_API void GradientMean::ready(std::size_t i, const Tensor<float>& grad) {
  if (i >= m_grads.size() || m_grads[i].defined())
    throw std::logic_error("xgrad internal error: GradientMean told of a gradient twice or out of range");
  m_grads[i] = grad;
  --m_missing[m_bucket_of[i]];
  start_complete_buckets();
}

XGRAD_API void GradientMean::start_complete_buckets() {
  // In bucket order, so that every rank starts the same exchanges in the same order.
  for (; m_next < m_buckets.size() && m_missing[m_next] == 0; ++m_next) {
    const auto [begin, end] = m_buckets[m_next];
    m_started[m_next] = all_reduce_start(detail::pack(m_grads, begin, end, m_loc), ReduceOp::mean, m_loc);
  }
}

XGRAD_API std::vector<Tensor<float>> GradientMean::finish() {
  if (m_next < m_buckets.size())
    throw std::logic_error("xgrad internal error: GradientMean finished before every gradient was ready");
  std::vector<Tensor<float>> out(m_grads.size());
  for (std::size_t k = 0; k < m_buckets.size(); ++k)
    detail::unpack(wait(m_started[k], m_loc), m_shapes, m_buckets[k].first, m_buckets[k].second, out, m_loc);
  return out;
}

}  // namespace distributed

}  // namespace xgrad

// Definitions of distributed/collectives.hpp: included by it when header-only, compiled once
// into the library (src/distributed.cpp) otherwise.
#pragma once

#include <cstddef>
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

/// Runs `body(in, out)` on host pointers to x's and out's elements: theirs on the cpu, else
/// copies staged through the host (MPI reads and writes host memory).
template <class T, class Body> void on_host(const Tensor<T>& x, Tensor<T>& out, Body body) {
  if (x.device() == Device::cpu && out.device() == Device::cpu) {
    body(x.data(), out.data());
    return;
  }
  const std::size_t in_bytes = static_cast<std::size_t>(x.numel()) * sizeof(T);
  const std::size_t out_bytes = static_cast<std::size_t>(out.numel()) * sizeof(T);
  std::vector<std::byte> in(in_bytes), result(out_bytes);
  xgrad::detail::copy_bytes(in.data(), Device::cpu, x.data(), x.device(), in_bytes);
  body(reinterpret_cast<const T*>(in.data()), reinterpret_cast<T*>(result.data()));
  xgrad::detail::copy_bytes(out.data(), out.device(), result.data(), Device::cpu, out_bytes);
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
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::on_host(x, out, [&](const T* in, T* result) {
      if (in != result) std::copy(in, in + x.numel(), result);
      distributed::detail::all_reduce(
          result, x.numel(), reduce, distributed::detail::signature_of("all_reduce", x, static_cast<int>(reduce), loc));
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
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::on_host(x, out, [&](const T* in, T* result) {
      distributed::detail::all_gather(in, result, x.numel() * static_cast<std::int64_t>(sizeof(T)),
                                      distributed::detail::signature_of("all_gather", x, 0, loc));
    });
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {distributed::reduce_scatter(g, distributed::ReduceOp::sum, loc)};
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
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::on_host(x, out, [&](const T* in, T* result) {
      distributed::detail::reduce_scatter(
          in, result, out.numel(), reduce,
          distributed::detail::signature_of("reduce_scatter", x, static_cast<int>(reduce), loc));
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
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::on_host(x, out, [&](const T* in, T* result) {
      if (in != result) std::copy(in, in + x.numel(), result);
      distributed::detail::broadcast(result, x.numel() * static_cast<std::int64_t>(sizeof(T)), root,
                                     distributed::detail::signature_of("broadcast", x, root, loc));
    });
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    const Tensor<T> sum = distributed::all_reduce(g, distributed::ReduceOp::sum, loc);
    return {is_root ? sum : zeros_like(sum, loc)};
  }
};

/// all_reduce_start's node: the exchange runs on the worker from here to the AllReduceWait that
/// reads this node's output, whose buffer it writes meanwhile.
struct AllReduceStart {
  static constexpr std::string_view name = "AllReduceStart";
  static constexpr bool has_effect = true;
  distributed::ReduceOp reduce = distributed::ReduceOp::sum;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {{"reduce", std::string(distributed::reduce_op_name(reduce))}}; }
  bool operator==(const AllReduceStart& o) const { return reduce == o.reduce; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    const auto sig = distributed::detail::signature_of("all_reduce_start", x, static_cast<int>(reduce), loc);
    if (x.device() != Device::cpu || out.device() != Device::cpu) {
      distributed::detail::on_host(x, out, [&](const T* in, T* result) {
        std::copy(in, in + x.numel(), result);
        distributed::detail::all_reduce(result, x.numel(), reduce, sig);
      });
      distributed::detail::finished_all_reduce(out.data());
      return;
    }
    if (x.data() != out.data()) std::copy(x.data(), x.data() + x.numel(), out.data());
    distributed::detail::start_all_reduce(out.data(), x.numel(), reduce, sig, out.impl()->storage);
  }
};

/// all_reduce_wait's node: its output is the buffer AllReduceStart's exchange wrote (a view of
/// it when the graph's memory plan holds it, so nothing is copied).
struct AllReduceWait {
  static constexpr std::string_view name = "AllReduceWait";
  static constexpr bool has_effect = true;
  SourceLoc loc;
  std::vector<ir::Attr> attrs() const { return {}; }
  bool operator==(const AllReduceWait&) const { return true; }
  template <class R> static OpTraits traits() { return {.view = true}; }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    distributed::detail::wait_all_reduce(const_cast<T*>(x.data()), "all_reduce_wait", loc);
    if (out.data() != x.data())
      xgrad::detail::copy_bytes(out.data(), out.device(), x.data(), x.device(),
                                static_cast<std::size_t>(x.numel()) * sizeof(T));
  }
};

}  // namespace op

namespace distributed {

template <FloatingPoint T> Tensor<T> all_reduce_start(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_reduce_start", loc, {x});
  detail::joined_size("all_reduce_start", loc);
  return xgrad::detail::apply<T>(op::AllReduceStart{reduce, loc}, loc, x);
}

template <FloatingPoint T> Tensor<T> all_reduce_wait(const Tensor<T>& started, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_reduce_wait", loc, {started});
  detail::joined_size("all_reduce_wait", loc);
  return xgrad::detail::apply<T>(op::AllReduceWait{loc}, loc, started);
}

template <Numeric T> Tensor<T> all_reduce(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_reduce", loc, {x});
  detail::joined_size("all_reduce", loc);
  if (reduce == ReduceOp::mean && !FloatingPoint<T>)
    throw_value_error("all_reduce", loc, "mean of an ", dtype_name(x.dtype()),
                      " tensor would round; reduce with sum and divide in floating point");
  return xgrad::detail::apply<T>(op::AllReduce{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> all_gather(const Tensor<T>& x, SourceLoc loc) {
  xgrad::detail::OpScope scope("all_gather", loc, {x});
  if (x.ndim() + 1 > kMaxRank)
    throw_shape_error("all_gather", loc, "x has ", x.ndim(), " axes, and the result adds one: at most ", kMaxRank,
                      " axes in all (x: ", dtype_name(x.dtype()), x.shape(), ")");
  return xgrad::detail::apply<T>(op::AllGather{detail::joined_size("all_gather", loc), loc}, loc, x);
}

template <Numeric T> Tensor<T> reduce_scatter(const Tensor<T>& x, ReduceOp reduce, SourceLoc loc) {
  xgrad::detail::OpScope scope("reduce_scatter", loc, {x});
  const int world = detail::joined_size("reduce_scatter", loc);
  if (x.ndim() == 0 || x.shape()[0] != world)
    throw_shape_error("reduce_scatter", loc, "x's leading axis must be the world size ", world,
                      " (one slice per rank), x is ", dtype_name(x.dtype()), x.shape());
  if (reduce == ReduceOp::mean && !FloatingPoint<T>)
    throw_value_error("reduce_scatter", loc, "mean of an ", dtype_name(x.dtype()),
                      " tensor would round; reduce with sum and divide in floating point");
  return xgrad::detail::apply<T>(op::ReduceScatter{reduce, loc}, loc, x);
}

template <Element T> Tensor<T> broadcast(const Tensor<T>& x, int root, SourceLoc loc) {
  xgrad::detail::OpScope scope("broadcast", loc, {x});
  const int world = detail::joined_size("broadcast", loc);
  if (root < 0 || root >= world)
    throw_value_error("broadcast", loc, "root ", root, " is not a rank of this group of ", world);
  return xgrad::detail::apply<T>(op::Broadcast{root, rank(loc) == root, loc}, loc, x);
}

XGRAD_API void broadcast_into(const TensorBase& t, int root, SourceLoc loc) {
  if (tracing::Tracer::active())
    throw_value_error("broadcast_into", loc, "writes a tensor in place now: call it outside jit (broadcast is the op)");
  const int world = detail::joined_size("broadcast_into", loc);
  if (root < 0 || root >= world)
    throw_value_error("broadcast_into", loc, "root ", root, " is not a rank of this group of ", world);
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
  void* data = t.impl()->storage->data();
  std::vector<std::byte> host;
  if (t.device() != Device::cpu) {
    host.resize(bytes);
    xgrad::detail::copy_bytes(host.data(), Device::cpu, data, t.device(), bytes);
  }
  detail::broadcast(host.empty() ? data : host.data(), static_cast<std::int64_t>(bytes), root,
                    detail::signature_of("broadcast_into", t, root, loc));
  if (!host.empty()) xgrad::detail::copy_bytes(data, t.device(), host.data(), Device::cpu, bytes);
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
    detail::unpack(all_reduce_wait(m_started[k], m_loc), m_shapes, m_buckets[k].first, m_buckets[k].second, out, m_loc);
  return out;
}

}  // namespace distributed

}  // namespace xgrad

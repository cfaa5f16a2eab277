// Device::thrust elementwise kernels: one thrust::transform over the output's indices whose
// functor calls the op's own scalar body (Op::apply, as the CPU backend's tails do), reading
// each input through the same broadcast plan as the CPU backend.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad::thrust_backend {

/// One input of an elementwise op: device memory read through the plan, or the value of a
/// one-element cpu tensor (a scalar may meet tensors of any device).
template <class T> struct Operand {
  const T* data = nullptr;  // null: read `value`
  T value{};
};

template <class T> Operand<T> operand(const Tensor<T>& t) {
  if (t.device() == Device::cpu) return {nullptr, t.item()};
  return {t.data(), T{}};
}

template <class Op, class R, class... T> struct ElementwiseFn {
  static constexpr int N = sizeof...(T);
  cpu::BroadcastPlan<N> plan;
  std::tuple<Operand<T>...> in;

  XGRAD_HD R operator()(std::int64_t i) const {
    const std::int64_t inner = plan.inner(), row = i / inner, col = i % inner;
    return [&]<std::size_t... k>(std::index_sequence<k...>) { return static_cast<R>(Op::apply(load<k>(row, col)...)); }
    (std::index_sequence_for<T...>{});
  }

 private:
  template <std::size_t k> XGRAD_HD auto load(std::int64_t row, std::int64_t col) const {
    const auto& x = std::get<k>(in);
    if (!x.data) return x.value;
    const int input = static_cast<int>(k);
    return x.data[plan.row_offset(input, row) + col * plan.inner_stride(input)];
  }
};

/// out = Op::apply(inputs...) elementwise with NumPy broadcasting; out has the broadcast shape.
template <class Op, class R, class... T> void map(Tensor<R>& out, const Tensor<T>&... inputs) {
  constexpr int N = sizeof...(T);
  ElementwiseFn<Op, R, T...> fn{cpu::BroadcastPlan<N>(out.shape(), std::array<const Shape*, N>{&inputs.shape()...}),
                                {operand(inputs)...}};
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + out.numel(), thrust::device_ptr<R>(out.data()), fn);
}

}  // namespace xgrad::thrust_backend

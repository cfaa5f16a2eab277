// Device::thrust matrix products: a batch of C = op(A) @ op(B) over broadcast batch axes, one
// thrust::transform over C's elements, each a dot product along k read through the operands'
// strides (so transposes are never materialized). Per element, not blocked: correct on every
// Thrust system, but not a fast GEMM (cuBLAS under CUDA is the plan for speed).
#pragma once

#include <cmath>
#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/elementwise.hpp"

namespace xgrad::thrust_backend {

namespace detail {

template <class T> struct GemmFn {
  cpu::BroadcastPlan<2> plan;  // over the batch axes; its strides count matrices
  std::int64_t m, n, k;
  const T* a;
  std::int64_t a_rs, a_cs;
  const T* b;
  std::int64_t b_rs, b_cs;

  T operator()(std::int64_t index) const {
    const std::int64_t i = index / (m * n), row = index % (m * n) / n, col = index % n;
    const std::int64_t outer = i / plan.inner(), inner = i % plan.inner();
    const T* pa = a + (plan.row_offset(0, outer) + inner * plan.inner_stride(0)) * m * k + row * a_rs;
    const T* pb = b + (plan.row_offset(1, outer) + inner * plan.inner_stride(1)) * k * n + col * b_cs;
    T acc(0);
    for (std::int64_t p = 0; p < k; ++p) acc = std::fma(pa[p * a_cs], pb[p * b_rs], acc);
    return acc;
  }
};

}  // namespace detail

/// c[i] = op(a[i]) @ op(b[i]) for the `count` matrices of the batch `plan` walks; element (r, p)
/// of op(a) is at a_rs * r + a_cs * p within its m x k matrix (likewise b, k x n).
template <class T> void batched_gemm(const cpu::BroadcastPlan<2>& plan, std::int64_t count, std::int64_t m,
                                     std::int64_t n, std::int64_t k, const T* a, std::int64_t a_rs, std::int64_t a_cs,
                                     const T* b, std::int64_t b_rs, std::int64_t b_cs, T* c) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + count * m * n, thrust::device_ptr<T>(c),
                    detail::GemmFn<T>{plan, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs});
}

}  // namespace xgrad::thrust_backend

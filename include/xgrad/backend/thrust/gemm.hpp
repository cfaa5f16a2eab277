// Device::thrust matrix products: a batch of C = op(A) @ op(B) over broadcast batch axes. On a
// GPU (THRUST_DEVICE_SYSTEM_CUDA) cuBLAS computes them. Elsewhere, and for layouts cuBLAS does not
// take, one thrust::for_each over 4 x 4 tiles of C, each accumulated in registers along k from
// the operands' strides (so transposes are never materialized): every element of A and B read
// serves four products, and each element of C is one fma chain along k.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cublas_v2.h>
#endif

#include "xgrad/backend/cpu/elementwise.hpp"

namespace xgrad::thrust_backend {

namespace detail {

inline constexpr std::int64_t kGemmTile = 4;

/// Computes tile `index` of the batch: rows r0.. and columns c0.. of matrix i of C.
template <class T> struct GemmTileFn {
  cpu::BroadcastPlan<2> plan;  // over the batch axes; its strides count matrices
  std::int64_t m, n, k;
  const T* a;
  std::int64_t a_rs, a_cs;
  const T* b;
  std::int64_t b_rs, b_cs;
  T* c;
  std::int64_t tiles_m, tiles_n;

  XGRAD_HD void operator()(std::int64_t index) const {
    const std::int64_t i = index / (tiles_m * tiles_n), tile = index % (tiles_m * tiles_n);
    const std::int64_t r0 = tile / tiles_n * kGemmTile, c0 = tile % tiles_n * kGemmTile;
    const std::int64_t rows = m - r0 < kGemmTile ? m - r0 : kGemmTile, cols = n - c0 < kGemmTile ? n - c0 : kGemmTile;
    const std::int64_t outer = i / plan.inner(), inner = i % plan.inner();
    const T* pa = a + (plan.row_offset(0, outer) + inner * plan.inner_stride(0)) * m * k + r0 * a_rs;
    const T* pb = b + (plan.row_offset(1, outer) + inner * plan.inner_stride(1)) * k * n + c0 * b_cs;
    T acc[kGemmTile][kGemmTile] = {};
    for (std::int64_t p = 0; p < k; ++p) {
      T av[kGemmTile], bv[kGemmTile];
      for (std::int64_t r = 0; r < kGemmTile; ++r) av[r] = r < rows ? pa[r * a_rs + p * a_cs] : T(0);
      for (std::int64_t q = 0; q < kGemmTile; ++q) bv[q] = q < cols ? pb[p * b_rs + q * b_cs] : T(0);
      for (std::int64_t r = 0; r < kGemmTile; ++r)
        for (std::int64_t q = 0; q < kGemmTile; ++q) acc[r][q] = std::fma(av[r], bv[q], acc[r][q]);
    }
    T* pc = c + i * m * n + r0 * n + c0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t q = 0; q < cols; ++q) pc[r * n + q] = acc[r][q];
  }
};

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
inline void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("xgrad: MatMul on Device::thrust: ") + call +
                             " failed: " + cublasGetStatusString(status));
}

/// This thread's cuBLAS handle (a handle must not be used by two threads at once).
inline cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() { check_cublas(cublasCreate(&h), "cublasCreate"); }
    ~Handle() { cublasDestroy(h); }
  };
  thread_local Handle handle;
  return handle.h;
}

/// How cuBLAS reads the matrix M whose element (r, c) is at r * rs + c * cs: as a column-major
/// matrix with leading dimension ld (rs == 1), or as the transpose of one (cs == 1). False when
/// neither fits.
struct CublasOperand {
  cublasOperation_t op;
  std::int64_t ld;
};
inline bool cublas_operand(std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t cols, CublasOperand& out) {
  if (rs == 1 && cs >= std::max<std::int64_t>(1, rows)) {
    out = {CUBLAS_OP_N, cs};
    return true;
  }
  if (cs == 1 && rs >= std::max<std::int64_t>(1, cols)) {
    out = {CUBLAS_OP_T, rs};
    return true;
  }
  return false;
}

/// The batch through cublas<t>gemmStridedBatched, one call per outer row of the batch plan; false
/// (nothing done) when a layout or a size is one cuBLAS does not take. Row-major C = op(A) op(B)
/// is column-major C^T = op(B)^T op(A)^T, so B goes first.
template <class T> bool cublas_batched_gemm(const cpu::BroadcastPlan<2>& plan, std::int64_t count, std::int64_t m,
                                            std::int64_t n, std::int64_t k, const T* a, std::int64_t a_rs,
                                            std::int64_t a_cs, const T* b, std::int64_t b_rs, std::int64_t b_cs, T* c) {
  CublasOperand ob{}, oa{};
  // op(B)^T is n x k with element (j, p) at p * b_rs + j * b_cs; op(A)^T is k x m likewise.
  if (!cublas_operand(b_cs, b_rs, n, k, ob) || !cublas_operand(a_cs, a_rs, k, m, oa)) return false;
  const std::int64_t inner = plan.inner();
  for (std::int64_t v : {m, n, k, ob.ld, oa.ld, inner})
    if (v > INT_MAX) return false;
  if (count == 0 || m == 0 || n == 0) return true;
  const T one(1), zero(0);
  for (std::int64_t outer = 0; outer < count / inner; ++outer) {
    const T* pa = a + plan.row_offset(0, outer) * m * k;
    const T* pb = b + plan.row_offset(1, outer) * k * n;
    T* pc = c + outer * inner * m * n;
    const long long sa = plan.inner_stride(0) * m * k, sb = plan.inner_stride(1) * k * n, sc = m * n;
    const auto im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    if constexpr (std::is_same_v<T, float>)
      check_cublas(
          cublasSgemmStridedBatched(cublas_handle(), ob.op, oa.op, in, im, ik, &one, pb, static_cast<int>(ob.ld), sb,
                                    pa, static_cast<int>(oa.ld), sa, &zero, pc, in, sc, static_cast<int>(inner)),
          "cublasSgemmStridedBatched");
    else
      check_cublas(
          cublasDgemmStridedBatched(cublas_handle(), ob.op, oa.op, in, im, ik, &one, pb, static_cast<int>(ob.ld), sb,
                                    pa, static_cast<int>(oa.ld), sa, &zero, pc, in, sc, static_cast<int>(inner)),
          "cublasDgemmStridedBatched");
  }
  return true;
}
#endif

}  // namespace detail

/// c[i] = op(a[i]) @ op(b[i]) for the `count` matrices of the batch `plan` walks; element (r, p)
/// of op(a) is at a_rs * r + a_cs * p within its m x k matrix (likewise b, k x n).
template <class T> void batched_gemm(const cpu::BroadcastPlan<2>& plan, std::int64_t count, std::int64_t m,
                                     std::int64_t n, std::int64_t k, const T* a, std::int64_t a_rs, std::int64_t a_cs,
                                     const T* b, std::int64_t b_rs, std::int64_t b_cs, T* c) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  if (detail::cublas_batched_gemm(plan, count, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c)) return;
#endif
  const std::int64_t tiles_m = (m + detail::kGemmTile - 1) / detail::kGemmTile,
                     tiles_n = (n + detail::kGemmTile - 1) / detail::kGemmTile;
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + count * tiles_m * tiles_n,
                   detail::GemmTileFn<T>{plan, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, tiles_m, tiles_n});
}

}  // namespace xgrad::thrust_backend

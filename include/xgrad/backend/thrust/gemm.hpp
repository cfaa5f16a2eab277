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

/// Where matrix i of a batch starts in A, B and C, in elements: walked by a broadcast plan over
/// contiguous matrices (PlanOffsets), or a fixed step apart (StridedOffsets).
struct PlanOffsets {
  cpu::BroadcastPlan<2> plan;  // over the batch axes; its strides count matrices
  std::int64_t a_size, b_size, c_size;
  XGRAD_HD std::int64_t a(std::int64_t i) const {
    return (plan.row_offset(0, i / plan.inner()) + i % plan.inner() * plan.inner_stride(0)) * a_size;
  }
  XGRAD_HD std::int64_t b(std::int64_t i) const {
    return (plan.row_offset(1, i / plan.inner()) + i % plan.inner() * plan.inner_stride(1)) * b_size;
  }
  XGRAD_HD std::int64_t c(std::int64_t i) const { return i * c_size; }
};
struct StridedOffsets {
  std::int64_t a_step, b_step, c_step;
  XGRAD_HD std::int64_t a(std::int64_t i) const { return i * a_step; }
  XGRAD_HD std::int64_t b(std::int64_t i) const { return i * b_step; }
  XGRAD_HD std::int64_t c(std::int64_t i) const { return i * c_step; }
};

/// Computes tile `index` of the batch: rows r0.. and columns c0.. of matrix i of C, as
/// alpha * op(A) op(B) + beta * C (C not read when beta is 0).
template <class T, class Offsets> struct GemmTileFn {
  Offsets at;
  std::int64_t m, n, k;
  T alpha, beta;
  const T* a;
  std::int64_t a_rs, a_cs;
  const T* b;
  std::int64_t b_rs, b_cs;
  T* c;
  std::int64_t ldc;
  std::int64_t tiles_m, tiles_n;

  XGRAD_HD void operator()(std::int64_t index) const {
    const std::int64_t i = index / (tiles_m * tiles_n), tile = index % (tiles_m * tiles_n);
    const std::int64_t r0 = tile / tiles_n * kGemmTile, c0 = tile % tiles_n * kGemmTile;
    const std::int64_t rows = m - r0 < kGemmTile ? m - r0 : kGemmTile, cols = n - c0 < kGemmTile ? n - c0 : kGemmTile;
    const T* pa = a + at.a(i) + r0 * a_rs;
    const T* pb = b + at.b(i) + c0 * b_cs;
    T acc[kGemmTile][kGemmTile] = {};
    for (std::int64_t p = 0; p < k; ++p) {
      T av[kGemmTile], bv[kGemmTile];
      for (std::int64_t r = 0; r < kGemmTile; ++r) av[r] = r < rows ? pa[r * a_rs + p * a_cs] : T(0);
      for (std::int64_t q = 0; q < kGemmTile; ++q) bv[q] = q < cols ? pb[p * b_rs + q * b_cs] : T(0);
      for (std::int64_t r = 0; r < kGemmTile; ++r)
        for (std::int64_t q = 0; q < kGemmTile; ++q) acc[r][q] = std::fma(av[r], bv[q], acc[r][q]);
    }
    T* pc = c + at.c(i) + r0 * ldc + c0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t q = 0; q < cols; ++q) {
        T& out = pc[r * ldc + q];
        out = beta == T(0) ? alpha * acc[r][q] : alpha * acc[r][q] + beta * out;
      }
  }
};

template <class T, class Offsets> void gemm_tiles(const Offsets& at, std::int64_t count, std::int64_t m, std::int64_t n,
                                                  std::int64_t k, T alpha, const T* a, std::int64_t a_rs,
                                                  std::int64_t a_cs, const T* b, std::int64_t b_rs, std::int64_t b_cs,
                                                  T beta, T* c, std::int64_t ldc) {
  const std::int64_t tiles_m = (m + kGemmTile - 1) / kGemmTile, tiles_n = (n + kGemmTile - 1) / kGemmTile;
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(
      thrust::device, first, first + count * tiles_m * tiles_n,
      GemmTileFn<T, Offsets>{at, m, n, k, alpha, beta, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, tiles_m, tiles_n});
}

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

/// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count through cublas<t>gemmStridedBatched,
/// the matrices a fixed step apart (see strided_gemm); false (nothing done) when a layout or a
/// size is one cuBLAS does not take. Row-major C = op(A) op(B) is column-major C^T = op(B)^T
/// op(A)^T, so B goes first.
template <class T> bool cublas_strided_gemm(std::int64_t count, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                                            const T* a, std::int64_t a_rs, std::int64_t a_cs, std::int64_t a_step,
                                            const T* b, std::int64_t b_rs, std::int64_t b_cs, std::int64_t b_step,
                                            T beta, T* c, std::int64_t ldc, std::int64_t c_step) {
  CublasOperand ob{}, oa{};
  // op(B)^T is n x k with element (j, p) at p * b_rs + j * b_cs; op(A)^T is k x m likewise.
  if (!cublas_operand(b_cs, b_rs, n, k, ob) || !cublas_operand(a_cs, a_rs, k, m, oa) || ldc < n) return false;
  for (std::int64_t v : {m, n, k, ob.ld, oa.ld, ldc, count})
    if (v > INT_MAX) return false;
  if (count == 0 || m == 0 || n == 0) return true;
  if (k == 0) return false;  // the tiles write beta * C
  const auto im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const auto lda = static_cast<int>(oa.ld), ldb = static_cast<int>(ob.ld), ic = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>)
    check_cublas(cublasSgemmStridedBatched(cublas_handle(), ob.op, oa.op, in, im, ik, &alpha, b, ldb, b_step, a, lda,
                                           a_step, &beta, c, ic, c_step, static_cast<int>(count)),
                 "cublasSgemmStridedBatched");
  else
    check_cublas(cublasDgemmStridedBatched(cublas_handle(), ob.op, oa.op, in, im, ik, &alpha, b, ldb, b_step, a, lda,
                                           a_step, &beta, c, ic, c_step, static_cast<int>(count)),
                 "cublasDgemmStridedBatched");
  return true;
}

/// The broadcast batch as one strided batch per outer row of its plan.
template <class T> bool cublas_batched_gemm(const cpu::BroadcastPlan<2>& plan, std::int64_t count, std::int64_t m,
                                            std::int64_t n, std::int64_t k, const T* a, std::int64_t a_rs,
                                            std::int64_t a_cs, const T* b, std::int64_t b_rs, std::int64_t b_cs, T* c) {
  if (count == 0 || m == 0 || n == 0) return true;
  const std::int64_t inner = plan.inner();
  for (std::int64_t outer = 0; outer < count / inner; ++outer)
    if (!cublas_strided_gemm<T>(inner, m, n, k, T(1), a + plan.row_offset(0, outer) * m * k, a_rs, a_cs,
                                plan.inner_stride(0) * m * k, b + plan.row_offset(1, outer) * k * n, b_rs, b_cs,
                                plan.inner_stride(1) * k * n, T(0), c + outer * inner * m * n, n, m * n))
      return false;  // only the first call can refuse: every call has the same sizes and layouts
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
  detail::gemm_tiles(detail::PlanOffsets{plan, m * k, k * n, m * n}, count, m, n, k, T(1), a, a_rs, a_cs, b, b_rs, b_cs,
                     T(0), c, n);
}

/// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, matrix i of each operand `step`
/// elements after matrix i - 1 (steps may interleave matrices, as heads do in one buffer): element
/// (r, p) of op(A_i) at a + i * a_step + r * a_rs + p * a_cs (likewise B_i, k x n), element (r, j)
/// of C_i at c + i * c_step + r * ldc + j. beta == 0 never reads C.
template <class T> void strided_gemm(std::int64_t count, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                                     const T* a, std::int64_t a_rs, std::int64_t a_cs, std::int64_t a_step, const T* b,
                                     std::int64_t b_rs, std::int64_t b_cs, std::int64_t b_step, T beta, T* c,
                                     std::int64_t ldc, std::int64_t c_step) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  if (detail::cublas_strided_gemm(count, m, n, k, alpha, a, a_rs, a_cs, a_step, b, b_rs, b_cs, b_step, beta, c, ldc,
                                  c_step))
    return;
#endif
  detail::gemm_tiles(detail::StridedOffsets{a_step, b_step, c_step}, count, m, n, k, alpha, a, a_rs, a_cs, b, b_rs,
                     b_cs, beta, c, ldc);
}

}  // namespace xgrad::thrust_backend

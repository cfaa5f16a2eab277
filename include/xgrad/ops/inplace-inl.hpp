// Definitions of ops/inplace.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include <algorithm>
#include <string_view>

#include "xgrad/backend/cpu/copy.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/manipulation.hpp"

namespace xgrad {

namespace detail {

/// In-place writes are not recorded on the tape, so while autodiff records, a write may
/// neither change a tensor it tracks (optimizers update under no_grad) nor bring in a value it
/// tracks: the target would hold that value without its gradient, a silent wrong result.
inline void check_writable(std::string_view op, const TensorBase& dst, const TensorBase& src, SourceLoc loc) {
  if (!is_grad_enabled()) return;
  if (dst.requires_grad())
    throw AutogradError(detail::op_message(op, loc,
                                           "in-place update of a tensor that requires grad; do it inside "
                                           "an xg::no_grad scope (as optimizers do)"));
  if (src.requires_grad())
    throw AutogradError(detail::op_message(
        op, loc,
        "in-place update with a value that requires grad: autodiff does not record in-place writes, so the "
        "target would hold the value without its gradient. Compute out of place (y = y + x), or update inside "
        "an xg::no_grad scope when no gradient should flow"));
}

/// Writes src into dst's storage (src broadcast to dst's shape) and bumps its version.
template <class T> void write_into(std::string_view op, Tensor<T>& dst, const Tensor<T>& src, SourceLoc loc) {
  check_writable(op, dst, src, loc);
  Shape check;
  if (!try_broadcast(dst.shape(), src.shape(), check) || !(check == dst.shape()))
    throw_shape_error(op, loc, "the value ", dtype_name(src.dtype()), src.shape(), " does not broadcast to the target ",
                      dtype_name(dst.dtype()), dst.shape());
  if (auto* tracer = tracing::Tracer::active()) {
    // Traced graphs are functional: dst stands for the new value from here on, and a write
    // into an input becomes an effect applied when the call finishes.
    tracer->rebind(dst, src.shape() == dst.shape() ? src : broadcast_to(src, dst.shape(), loc), loc);
    return;
  }
  const TensorBase both[] = {dst, src};
  const Device device = check_devices(op, loc, both);
  if (src.device() != dst.device()) {  // a cpu scalar into a device tensor
    kernels::fill(device, dst.data(), dst.numel(), src.item());
  } else if (src.shape() == dst.shape()) {
    if (src.impl()->storage != dst.impl()->storage)
      copy_bytes(dst.data(), device, src.data(), device, static_cast<std::size_t>(src.numel()) * sizeof(T));
  } else {
    kernels::strided_copy(device, dst.shape(), src.data(), cpu::broadcast_strides(src.shape(), dst.shape()), dst.data(),
                          dst.shape().strides());
  }
  dst.impl()->storage->bump_version();
}

}  // namespace detail

template <Element T> Tensor<T>& Tensor<T>::assign(const Tensor<T>& src, SourceLoc loc) {
  detail::write_into("Assign", *this, src, loc);
  return *this;
}

// Compound assignments compute out of place, then write back: simple, and the version bump
// makes any stale use on the tape fail loudly.
template <Element T> Tensor<T>& Tensor<T>::operator+=(Located<Tensor<T>> rhs) {
  detail::write_into("AssignAdd", *this, add(*this, rhs.value, rhs.loc), rhs.loc);
  return *this;
}
template <Element T> Tensor<T>& Tensor<T>::operator-=(Located<Tensor<T>> rhs) {
  detail::write_into("AssignSub", *this, sub(*this, rhs.value, rhs.loc), rhs.loc);
  return *this;
}
template <Element T> Tensor<T>& Tensor<T>::operator*=(Located<Tensor<T>> rhs) {
  detail::write_into("AssignMul", *this, mul(*this, rhs.value, rhs.loc), rhs.loc);
  return *this;
}
template <Element T> Tensor<T>& Tensor<T>::operator/=(Located<Tensor<T>> rhs) {
  detail::write_into("AssignDiv", *this, div(*this, rhs.value, rhs.loc), rhs.loc);
  return *this;
}
template <Element T> Tensor<T>& Tensor<T>::operator+=(Located<T> rhs) {
  return *this += Located<Tensor<T>>(scalar_like(*this, rhs.value), rhs.loc);
}
template <Element T> Tensor<T>& Tensor<T>::operator-=(Located<T> rhs) {
  return *this -= Located<Tensor<T>>(scalar_like(*this, rhs.value), rhs.loc);
}
template <Element T> Tensor<T>& Tensor<T>::operator*=(Located<T> rhs) {
  return *this *= Located<Tensor<T>>(scalar_like(*this, rhs.value), rhs.loc);
}
template <Element T> Tensor<T>& Tensor<T>::operator/=(Located<T> rhs) {
  return *this /= Located<Tensor<T>>(scalar_like(*this, rhs.value), rhs.loc);
}

}  // namespace xgrad

// In-place updates of a tensor's storage: assign and the compound assignment operators, members
// of Tensor (core/tensor.hpp declares them). This header lists their instances; the definitions
// are in ops/inplace-inl.hpp.
#pragma once

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_INPLACE_ELEMENT_INSTANCE(T, X) X Tensor<T>& Tensor<T>::assign(const Tensor<T>&, SourceLoc);
#define XGRAD_INPLACE_NUMERIC_INSTANCE(T, X)              \
  X Tensor<T>& Tensor<T>::operator+=(Located<Tensor<T>>); \
  X Tensor<T>& Tensor<T>::operator-=(Located<Tensor<T>>); \
  X Tensor<T>& Tensor<T>::operator*=(Located<Tensor<T>>); \
  X Tensor<T>& Tensor<T>::operator/=(Located<Tensor<T>>); \
  X Tensor<T>& Tensor<T>::operator+=(Located<T>);         \
  X Tensor<T>& Tensor<T>::operator-=(Located<T>);         \
  X Tensor<T>& Tensor<T>::operator*=(Located<T>);         \
  X Tensor<T>& Tensor<T>::operator/=(Located<T>);
#define XGRAD_INPLACE_INSTANCES(X) \
  XGRAD_FOR_EACH_Element(XGRAD_INPLACE_ELEMENT_INSTANCE, X) XGRAD_FOR_EACH_Numeric(XGRAD_INPLACE_NUMERIC_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_INPLACE)
XGRAD_INPLACE_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/inplace-inl.hpp"
#endif

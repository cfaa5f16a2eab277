// Conversion between Tensor<T> and xtensor's xarray.
#pragma once

#include <algorithm>

#include <xtensor/xarray.hpp>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// A tensor holding a copy of an xarray's elements (row-major).
template <Element T> Tensor<T> from_xarray(const xt::xarray<T>& a) {
  Shape shape(a.shape().begin(), a.shape().end());
  auto out = Tensor<T>::empty(shape);
  std::copy(a.begin(), a.end(), out.data());
  return out;
}

template <Element T> template <class U> auto Tensor<T>::to_xarray() const {
  std::vector<std::size_t> dims(shape().begin(), shape().end());
  xt::xarray<U> out(dims);
  std::copy_n(data(), numel(), out.data());
  return out;
}

}  // namespace xgrad

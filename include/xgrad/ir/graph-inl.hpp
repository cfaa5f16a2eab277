// Definitions of ir/graph.hpp: included by it when header-only, compiled once into the library
// (src/ir.cpp) otherwise.
#pragma once

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "xgrad/ir/graph.hpp"

namespace xgrad {

namespace ir {

XGRAD_API TensorBase on_host(const TensorBase& t) {
  return t.device() == Device::cpu ? t : xgrad::detail::copy_to(t, Device::cpu);
}

XGRAD_API std::string constant_text(const TensorBase& t) {
  std::ostringstream out;
  auto emit = [&](const auto* p) {
    if (t.ndim() > 0) out << "[";
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (i) out << ", ";
      if constexpr (std::is_same_v<std::decay_t<decltype(*p)>, bool>)
        out << (p[i] ? "true" : "false");
      else
        out << +p[i];
    }
    if (t.ndim() > 0) out << "]";
  };
  const TensorBase host = on_host(t);
  const void* data = host.impl()->storage->data();
  switch (t.dtype()) {
    case DType::float32:
      emit(static_cast<const float*>(data));
      break;
    case DType::float64:
      emit(static_cast<const double*>(data));
      break;
    case DType::int32:
      emit(static_cast<const std::int32_t*>(data));
      break;
    case DType::int64:
      emit(static_cast<const std::int64_t*>(data));
      break;
    case DType::boolean:
      emit(static_cast<const bool*>(data));
      break;
  }
  return out.str();
}

}  // namespace ir

namespace op {

XGRAD_API std::vector<ir::Attr> Const::attrs() const {
  if (value.numel() > 8) return {};
  return {{"value", ir::constant_text(value)}};
}

XGRAD_API bool Const::operator==(const Const& other) const {
  const TensorBase &a = value, &b = other.value;
  if (a.impl() == b.impl()) return true;
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  const std::size_t bytes = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype());
  if (bytes > 256) return false;
  const TensorBase ha = ir::on_host(a), hb = ir::on_host(b);
  return std::memcmp(ha.impl()->storage->data(), hb.impl()->storage->data(), bytes) == 0;
}

}  // namespace op

namespace ir {

XGRAD_API Value* Graph::new_value(DType dtype, const Shape& shape, Node* producer) {
  auto v = std::make_shared<Value>();
  v->id = static_cast<int>(values.size());
  v->dtype = dtype;
  v->shape = shape;
  v->producer = producer;
  v->graph = this;
  values.push_back(v);
  return v.get();
}

}  // namespace ir
}  // namespace xgrad

// Definitions of ops/print.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "xgrad/core/print.hpp"
#include "xgrad/ir/tracer.hpp"
#include "xgrad/ops/print.hpp"

namespace xgrad {

namespace op {
/// An effect with no output, so print() emits its node itself rather than through
/// detail::apply, which makes an output.
struct Print {
  static constexpr std::string_view name = "Print";
  std::string label;
  std::vector<ir::Attr> attrs() const { return {{"label", '"' + label + '"'}}; }
  bool operator==(const Print&) const = default;
};
}  // namespace op

template <Element T> void print(const std::string& label, const Tensor<T>& t, SourceLoc loc) {
  if (const auto& batch = t.impl()->physical) {  // inside vmap: every value, one after the other on axis 0
    print(label + " (vmap: the batch, along axis 0)", Tensor<T>(TensorBase(batch)), loc);
    return;
  }
  auto show = [label](const Tensor<T>& value) { std::cout << label << ' ' << value << std::endl; };
  if (auto* tracer = tracing::Tracer::active()) {
    const TensorBase inputs[] = {t};
    tracer->emit(
        ir::make_primitive(op::Print{label}), loc, inputs, {},
        [show](std::span<const TensorBase> in, std::span<TensorBase>) { show(Tensor<T>(in[0])); }, {}, {},
        /*has_effect=*/true);
    return;
  }
  show(t);
}

}  // namespace xgrad

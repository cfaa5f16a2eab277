// xg::print: shows a tensor when the op runs, in eager mode and inside compiled graphs.
#pragma once

#include <iostream>
#include <string>

#include "xgrad/core/print.hpp"
#include "xgrad/ir/tracer.hpp"

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

/// Writes "label Tensor(...)" to standard output when this op runs: at once in eager mode,
/// and every time the graph runs (not while it is traced) under jit.
template <Element T> void print(const std::string& label, const Tensor<T>& t, SourceLoc loc = SourceLoc::current()) {
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

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_PRINT_INSTANCE(T, X) X void print<T>(const std::string&, const Tensor<T>&, SourceLoc);
#define XGRAD_PRINT_INSTANCES(X) XGRAD_FOR_EACH_Element(XGRAD_PRINT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_PRINT)
XGRAD_PRINT_INSTANCES(extern template)
#endif

}  // namespace xgrad

// The heads layout of scaled dot-product attention (backend/attention_geometry.hpp), which only
// the jit's layout pass makes (passes/layout.hpp): against the standard layout with its head
// split and merge written out, for values, gradients, tangents, batching and the second
// derivative, on each device. White-box: the op is reached through its definition.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <xgrad/ops/nn-inl.hpp>
#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

namespace {

double difference(const xg::Tensor<double>& a, const xg::Tensor<double>& b) {
  REQUIRE(a.shape() == b.shape());
  return xg::max(xg::abs(a - b)).item();
}

}  // namespace

TEST_CASE("attention: the heads layout (the jit's layout pass) computes what the standard one does") {
  // Two sequences of 70 tokens (past a 64-query block), three heads; the buffer holds v's
  // columns, then q's, then k's, then two no operand reads (their gradient is 0).
  const std::int64_t b = 2, h = 3, t = 70, d = 4, dv = 5;
  const std::int64_t v_column = 0, q_column = h * dv, k_column = q_column + h * d, width = k_column + h * d + 2;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const xg::cpu::AttentionGeometry geometry{b * h, t, t, d, dv, 0.5, causal, h, width, q_column, k_column, v_column};
    auto heads = [&](const xg::Tensor<double>& x) {
      return xg::detail::apply<double>(xg::op::Attention{geometry}, xg::SourceLoc::current(), x, x, x);
    };
    auto standard = [&](const xg::Tensor<double>& x) {
      auto items = [&](std::int64_t column, std::int64_t size) {
        const auto part = xg::slice(x, {0, 0, column}, {b, t, h * size});
        return xg::transpose(xg::reshape(part, {b, t, h, size}), {0, 2, 1, 3});
      };
      const auto out = xg::scaled_dot_product_attention(items(q_column, d), items(k_column, d), items(v_column, dv),
                                                        {.causal = causal, .scale = 0.5});
      return xg::reshape(xg::transpose(out, {0, 2, 1, 3}), {b, t, h * dv});
    };
    const auto x = xg::randn<double>({b, t, width}, 5);
    const auto w = xg::randn<double>({b, t, h * dv}, 6);
    CHECK(difference(heads(x), standard(x)) < 1e-12);
    // The gradient writes each operand's columns and zeros the rest: the heads layout's own
    // gradient op (which the pass makes) and its rule (the standard one's, placed) alike.
    auto loss = [&](auto f) { return [&, f](const xg::Tensor<double>& y) { return xg::sum(f(y) * w); }; };
    const auto grad = xg::grad(loss(heads))(x);
    CHECK(difference(grad, xg::grad(loss(standard))(x)) < 1e-11);
    CHECK(xg::max(xg::abs(xg::slice(grad, {0, 0, width - 2}, {b, t, 2}))).item() == 0.0);
    auto fused_grad = [&](const xg::Tensor<double>& y, const xg::Tensor<double>& gy) {
      const auto out = heads(y);
      // NaN in the memory the result most likely takes next: the op must write every element.
      (void)xg::full<double>({b, t, width}, std::nan("")).to(y.device());
      return xg::detail::apply<double>(xg::op::AttentionGrad{geometry}, xg::SourceLoc::current(), y, y, y, out, gy);
    };
    CHECK(difference(fused_grad(x, w), grad) < 1e-11);
    // Tangents, batching, and the second derivative (the composite's, through the standard form).
    const auto tangent = xg::randn<double>({b, t, width}, 7);
    CHECK(difference(xg::jvp(heads, x, tangent).second, xg::jvp(standard, x, tangent).second) < 1e-11);
    const auto stacked = xg::stack(std::vector<xg::Tensor<double>>{x, tangent});
    CHECK(difference(xg::vmap(heads)(stacked), xg::vmap(standard)(stacked)) < 1e-12);
    auto curvature = [&](auto f) {
      return [&, f](const xg::Tensor<double>& y) { return xg::sum(xg::square(xg::grad(loss(f))(y))); };
    };
    CHECK(difference(xg::grad(curvature(heads))(x), xg::grad(curvature(standard))(x)) < 1e-9);
    if constexpr (xg::thrust_available()) {
      const auto on_device = x.to(xg::Device::thrust);
      CHECK(difference(heads(on_device).to(xg::Device::cpu), heads(x)) < 1e-12);
      const auto w_on_device = w.to(xg::Device::thrust);
      auto device_loss = [&](const xg::Tensor<double>& y) { return xg::sum(heads(y) * w_on_device); };
      CHECK(difference(xg::grad(device_loss)(on_device).to(xg::Device::cpu), grad) < 1e-11);
      CHECK(difference(fused_grad(on_device, w_on_device).to(xg::Device::cpu), grad) < 1e-11);
    }
  }
}

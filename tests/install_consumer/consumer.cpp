// Checks that an installed xgrad compiles, links and computes: the seeds' Add example, and the
// data layer, whose gzip reader needs the zlib the exported target brings, and Device::thrust
// when xgrad was built with it. It prints the bits of a jitted function's value and gradient:
// scripts/test.sh builds it header-only and against xgrad::compiled and compares the two.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <xgrad/data/mnist.hpp>
#include <xgrad/xgrad.hpp>

int main() {
  namespace xg = xgrad;
  auto sum = xg::tensor<float>({1, 2, 3}) + xg::tensor<float>({4, 5, 6});
  if (sum.to_vector() != std::vector<float>{5, 7, 9}) return 1;
  if constexpr (xg::thrust_available()) {  // the exported target brings Thrust and OpenMP too
    auto on_device = xg::tensor<float>({1, 2, 3}).to(xg::Device::thrust) * 2.0f;
    if (on_device.to_vector() != std::vector<float>{2, 4, 6}) return 1;
  }
  try {
    xg::data::read_idx("/nonexistent/images.idx.gz");
    return 1;
  } catch (const xg::ValueError&) {
  }
  // Every pass of O2 runs on this graph and its gradient's.
  auto f = xg::jit([](const xg::Tensor<float>& x) {
    return xg::sum(xg::tanh(x * 1.5f + 0.25f) * xg::sigmoid(x) + x * x + xg::zeros_like(x));
  });
  auto x = xg::randn<float>({64, 33}, 7);
  std::uint64_t digest = 14695981039346656037ull;  // FNV-1a over the value's and gradient's bits
  auto mix = [&](float v) { digest = (digest ^ std::bit_cast<std::uint32_t>(v)) * 1099511628211ull; };
  mix(f(x).item());
  for (float g : xg::grad(f)(x).to_vector()) mix(g);
  std::printf("%016llx\n", static_cast<unsigned long long>(digest));
  return 0;
}

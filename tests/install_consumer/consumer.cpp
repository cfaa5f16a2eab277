// Checks that an installed xgrad compiles, links and computes: the seeds' Add example, and the
// data layer, whose gzip reader needs the zlib the exported target brings, and Device::thrust
// when xgrad was built with it.
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
  return 0;
}

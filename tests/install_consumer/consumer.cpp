// Checks that an installed xgrad compiles, links and computes: the seeds' Add example.
#include <xgrad/xgrad.hpp>

int main() {
  namespace xg = xgrad;
  auto sum = xg::tensor<float>({1, 2, 3}) + xg::tensor<float>({4, 5, 6});
  return sum.to_vector() == std::vector<float>{5, 7, 9} ? 0 : 1;
}

// The compile-time benchmark's hello program: jit one function, take one gradient, print them.
#include <iostream>
#include <xgrad/xgrad.hpp>

int main() {
  namespace xg = xgrad;
  auto f = xg::jit([](const xg::Tensor<float>& x) { return xg::sum(xg::tanh(x) * x); });
  auto x = xg::randn<float>({4, 3}, 42);
  std::cout << f(x) << '\n' << xg::grad(f)(x) << '\n';
}

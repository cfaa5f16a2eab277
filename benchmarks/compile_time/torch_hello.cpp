// The compile-time benchmark's peer: hello.cpp's program in LibTorch, with <torch/torch.h>.
#include <torch/torch.h>
#include <iostream>

int main() {
  auto f = [](const torch::Tensor& x) { return (torch::tanh(x) * x).sum(); };
  torch::manual_seed(42);
  auto x = torch::randn({4, 3}).requires_grad_();
  auto y = f(x);
  std::cout << y << '\n' << torch::autograd::grad({y}, {x})[0] << '\n';
}

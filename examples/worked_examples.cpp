// The seeds' worked examples in C++, then a small classifier trained with value_and_grad.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

namespace {

void seed_examples() {
  auto x = xg::tensor<float>({1.0, 2.0, 3.0});
  auto y = xg::tensor<float>({4.0, 5.0, 6.0});
  std::cout << "Add: " << x + y << "\n";
  std::cout << "Mul: " << x * y << "\n";

  // GradNetWrtX: d/dx of matmul(x * z, y), z a Parameter.
  xg::Parameter<float> z(xg::tensor<float>({1.0}), "z");
  auto net = [&](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::matmul(a * z, b); };
  auto gx = xg::grad(net)(xg::tensor<float>({{0.8, 0.6, 0.2}, {1.8, 1.3, 1.1}}),
                          xg::tensor<float>({{0.11, 3.3, 1.1}, {1.1, 0.2, 1.4}, {1.1, 2.2, 0.3}}));
  std::cout << "GradNetWrtX: " << gx << "\n";

  // Control flow in eager mode: a C++ loop simply runs.
  auto loop_net = [&](xg::Tensor<float> a) {
    for (int i = 0; i < 3; ++i) a = a + z;
    return a;
  };
  std::cout << "For-loop net: " << loop_net(x) << "\n";
}

// Two interleaved noisy spirals: a problem a linear model cannot solve.
void make_spirals(int per_class, xg::Tensor<float>& points, xg::Tensor<std::int32_t>& labels) {
  std::vector<float> xy;
  std::vector<std::int32_t> cls;
  auto noise = xg::randn<float>({2 * per_class, 2}, 7).to_vector();
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < per_class; ++i) {
      float r = 0.2f + 0.8f * static_cast<float>(i) / static_cast<float>(per_class);
      float t = 10.0f * r + 3.14159265f * static_cast<float>(c);
      int k = c * per_class + i;
      xy.push_back(r * std::cos(t) + 0.03f * noise[2 * k]);
      xy.push_back(r * std::sin(t) + 0.03f * noise[2 * k + 1]);
      cls.push_back(c);
    }
  points = xg::tensor<float>(xy, {2 * per_class, 2});
  labels = xg::tensor<std::int32_t>(cls);
}

void train_classifier() {
  xg::Tensor<float> points;
  xg::Tensor<std::int32_t> labels;
  make_spirals(200, points, labels);

  std::vector<xg::Parameter<float>> params{xg::Parameter<float>(xg::randn<float>({2, 64}, 1) * 0.7f, "w1"),
                                           xg::Parameter<float>(xg::zeros<float>({64}), "b1"),
                                           xg::Parameter<float>(xg::randn<float>({64, 64}, 2) * 0.15f, "w2"),
                                           xg::Parameter<float>(xg::zeros<float>({64}), "b2"),
                                           xg::Parameter<float>(xg::randn<float>({64, 2}, 3) * 0.15f, "w3"),
                                           xg::Parameter<float>(xg::zeros<float>({2}), "b3")};
  auto logits_of = [&](const xg::Tensor<float>& x) {
    auto h = xg::tanh(xg::bias_add(xg::matmul(x, params[0]), params[1]));
    h = xg::tanh(xg::bias_add(xg::matmul(h, params[2]), params[3]));
    return xg::bias_add(xg::matmul(h, params[4]), params[5]);
  };
  auto loss_fn = [&](const xg::Tensor<float>& x, const xg::Tensor<std::int32_t>& y) {
    return xg::softmax_cross_entropy(logits_of(x), y, xg::Reduction::mean);
  };
  auto step = xg::value_and_grad(loss_fn, params);

  // Momentum SGD, written out: updates are in-place writes under no_grad.
  std::vector<xg::Tensor<float>> velocity;
  for (auto& p : params) velocity.push_back(xg::zeros_like(xg::Tensor<float>(p)));
  const float lr = 0.05f, momentum = 0.9f;
  std::printf("Training a 2-64-64-2 tanh MLP on two spirals (400 points), momentum SGD, 600 steps:\n");
  for (int it = 0; it <= 600; ++it) {
    auto [loss, grads] = step(points, labels);
    if (it % 50 == 0) {
      xg::no_grad eval;
      auto hit = xg::equal(xg::argmax(logits_of(points), -1), labels);
      float accuracy = xg::mean(xg::cast<float>(hit)).item();
      std::printf("  step %3d  loss %.4f  accuracy %.3f\n", it, loss.item(), accuracy);
    }
    xg::no_grad update;
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity[i].assign(velocity[i] * momentum + grads[i]);
      params[i] -= velocity[i] * lr;
    }
  }
}

}  // namespace

int main() {
  seed_examples();
  train_classifier();
}

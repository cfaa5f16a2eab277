// The seeds' mode-switch examples in C++: the same Modules run op by op (Mode::eager, like
// PyNative) or compiled into a graph (Mode::graph, like GRAPH_MODE) by changing one line;
// then a whole train step compiled with xg::jit, and the BiasAdd shape error with the report
// jit writes for it (the seeds' analyze_fail.dat).
#include <iostream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

namespace {

struct MyNet : xg::nn::Module {  // "MyNet": construct(x, y) = add(x, y)
  xg::Tensor<float> forward(xg::Tensor<float> x, xg::Tensor<float> y) override { return x + y; }
};

struct MulNet : xg::nn::Module {
  xg::Tensor<float> forward(xg::Tensor<float> x, xg::Tensor<float> y) override { return x * y; }
};

struct MatMulNet : xg::nn::Module {  // GradNetWrtX differentiates this with respect to x
  xg::Parameter<float> z{xg::tensor<float>({1.0}), "z"};
  MatMulNet() { register_parameter("z", z); }
  xg::Tensor<float> forward(xg::Tensor<float> x, xg::Tensor<float> y) override { return xg::matmul(x * z, y); }
};

struct LoopNet : xg::nn::Module {  // a C++ loop: unrolled when traced
  xg::Tensor<float> forward(xg::Tensor<float> x) override {
    for (int i = 0; i < 3; ++i) x = x + 1.0f;
    return x;
  }
};

struct PrintNet : xg::nn::Module {  // print in forward: at once eagerly, when the graph runs under jit
  xg::Tensor<float> forward(xg::Tensor<float> x) override {
    auto y = x * 2.0f;
    xg::print("  doubled:", y);
    return y + 1.0f;
  }
};

void run_all(const char* mode) {
  std::cout << "--- " << mode << " ---\n";
  auto x = xg::tensor<float>({1.0, 2.0, 3.0});
  auto y = xg::tensor<float>({4.0, 5.0, 6.0});
  MyNet add;
  MulNet mul;
  std::cout << "MyNet (add): " << add(x, y) << "\n";
  std::cout << "Mul: " << mul(x, y) << "\n";

  MatMulNet net;
  auto grad_wrt_x = [&net](xg::Tensor<float> a, xg::Tensor<float> b) {
    return xg::grad([&net](xg::Tensor<float> u, xg::Tensor<float> v) { return net(u, v); })(a, b);
  };
  auto gx = xg::tensor<float>({{0.8, 0.6, 0.2}, {1.8, 1.3, 1.1}});
  auto gy = xg::tensor<float>({{0.11, 3.3, 1.1}, {1.1, 0.2, 1.4}, {1.1, 2.2, 0.3}});
  std::cout << "GradNetWrtX: " << grad_wrt_x(gx, gy) << "\n";

  LoopNet loop;
  std::cout << "For-loop net: " << loop(x) << "\n";
  PrintNet printer;
  std::cout << "Print net:\n";
  auto printed = printer(x);
  std::cout << "  result: " << printed << "\n";
}

void whole_train_step() {
  std::cout << "--- whole-graph compilation of a train step (forward, backward, update) ---\n";
  xg::Parameter<float> w(xg::randn<float>({3, 1}, 1) * 0.1f, "w");
  xg::Parameter<float> b(xg::zeros<float>({1}), "b");
  auto x = xg::randn<float>({16, 3}, 2);
  auto target = xg::matmul(x, xg::tensor<float>({3.0f, -1.0f, 2.0f}, {3, 1})) + 0.5f;
  auto train_step = xg::jit(
      [&](xg::Tensor<float> inputs, xg::Tensor<float> labels) {
        auto loss_fn = [&] { return xg::mean(xg::square(xg::matmul(inputs, w) + b - labels)); };
        auto [loss, grads] = xg::value_and_grad(loss_fn, std::vector<xg::Tensor<float>>{w, b})();
        xg::no_grad off;
        w -= grads[0] * 0.1f;
        b -= grads[1] * 0.1f;
        return loss;
      },
      {.name = "train_step"});
  for (int step = 0; step <= 100; ++step) {
    auto loss = train_step(x, target);
    if (step % 25 == 0) std::cout << "  step " << step << "  loss " << loss.item() << "\n";
  }
  std::cout << "  learned w = " << xg::format_values(w) << ", b = " << xg::format_values(b)
            << " (true: [[3], [-1], [2]], 0.5)\n";
  std::cout << "  the graph has " << train_step.lower(x, target).num_nodes() << " nodes, compiled "
            << train_step.cache_size() << " time(s)\n";
}

struct BiasNet : xg::nn::Module {  // the seeds' shape error: a bias of 4 for 8 channels
  xg::Parameter<float> weight{xg::randn<float>({32, 8}, 1), "weight"};
  xg::Parameter<float> bias{xg::zeros<float>({4}), "bias"};
  BiasNet() {
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
  xg::Tensor<float> forward(xg::Tensor<float> x1) override {
    auto x = xg::matmul(x1, weight);
    return xg::bias_add(x, bias);
  }
};

void bias_add_failure() {
  auto x = xg::reshape(xg::arange<float>(3 * 32), {3, 32});
  BiasNet net;
  std::cout << "--- the BiasAdd shape error, eagerly ---\n";
  xg::set_mode(xg::Mode::eager);
  try {
    net(x);
  } catch (const xg::ShapeError& e) {
    std::cout << e.what() << "\n";
  }
  std::cout << "--- the same in graph mode: the report of jit (also saved by set_save_graphs) ---\n";
  xg::set_mode(xg::Mode::graph);
  xg::set_save_graphs("graphs", 1);
  try {
    net(x);
  } catch (const xg::TraceError& e) {
    std::cout << e.what() << "\n";
  }
  xg::set_save_graphs("", 0);
  xg::set_mode(xg::Mode::eager);
}

}  // namespace

int main() {
  xg::set_mode(xg::Mode::eager);  // PyNative: every op runs at once
  run_all("Mode::eager");
  xg::set_mode(xg::Mode::graph);  // GRAPH_MODE: Modules compile their forward
  run_all("Mode::graph");
  xg::set_mode(xg::Mode::eager);
  whole_train_step();
  bias_add_failure();
}

// Hostile sizes and resources: every size computed from user input is checked (ValueError naming
// the op and the numbers), allocations that cannot succeed are ValueErrors, the thread pool
// survives a system that refuses threads, and losses, metrics, layers and checkpoints refuse
// input they would otherwise take silently.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <xgrad/backend/cpu/thread_pool.hpp>
#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::contains;
using xgrad::testing::here;
using xgrad::testing::message_of;

namespace limits_test {

using Dims = std::vector<std::int64_t>;
constexpr std::int64_t kHuge = std::int64_t{1} << 40;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

const xg::JitLevel kLevels[] = {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2};

/// Runs `body` in a forked child (which may lower its own limits) and returns its exit status.
template <class Body> int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Caps this process's address space at what it maps now plus `extra` bytes (for a child of
/// in_child): a kernel that overcommits would otherwise grant any mapping up to the bound.
inline bool cap_address_space(rlim_t extra) {
  std::ifstream statm("/proc/self/statm");
  unsigned long pages = 0;
  statm >> pages;
  const rlim_t limit = pages * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + extra;
  const rlimit rl{limit, limit};
  return ::setrlimit(RLIMIT_AS, &rl) == 0;
}

}  // namespace limits_test

using namespace limits_test;

TEST_CASE("limits: a shape whose element count overflows int64 is refused, naming the op and the extents") {
  const auto what = message_of<xg::ValueError>([] { xg::zeros<float>({kHuge, kHuge}); });
  CHECK(contains(what, "zeros"));
  CHECK(contains(what, "1099511627776"));
  CHECK(contains(what, here(__LINE__ - 3)));
  // An empty axis does not excuse the others: their strides would overflow.
  CHECK_THROWS_AS(xg::ones<float>({0, kHuge, kHuge}), xg::ValueError);
  CHECK_THROWS_AS(xg::eye<float>(std::int64_t{1} << 32), xg::ValueError);
  CHECK_THROWS_AS(xg::randn<float>({kHuge, kHuge, 2}), xg::ValueError);
  CHECK_THROWS_AS(xg::uniform<float>({kHuge, kHuge}, 0.0f, 1.0f), xg::ValueError);
  CHECK_THROWS_AS(xg::full<std::int32_t>({kMax, 2}, 1), xg::ValueError);
  CHECK_THROWS_AS(xg::tensor<float>(std::vector<float>{}, xg::Shape{kHuge, kHuge, 0}), xg::ValueError);

  // A huge extent beside a zero one is an empty tensor, and it prints.
  auto empty = xg::zeros<float>({kHuge, 0});
  CHECK(empty.numel() == 0);
  std::ostringstream text;
  text << empty;
  CHECK(contains(text.str(), "1099511627776"));
}

TEST_CASE("limits: ops refuse output shapes that overflow, eagerly and while tracing at every level") {
  const auto x = xg::ones<float>({1, 1});
  auto broadcast = [](const xg::Tensor<float>& t) { return xg::broadcast_to(t, xg::Shape{kHuge, kHuge}); };
  const auto what = message_of<xg::ValueError>([&] { broadcast(x); });
  CHECK(contains(what, "BroadcastTo"));
  CHECK(contains(what, "1099511627776"));
  for (auto level : kLevels) {
    CAPTURE(static_cast<int>(level));
    auto f = xg::jit(broadcast, {.level = level});
    CHECK_THROWS_AS(f(x), xg::ValueError);
  }
  const auto reshape_what = message_of<xg::ValueError>([&] { xg::reshape(x, {kHuge, kHuge, -1}); });
  CHECK(contains(reshape_what, "Reshape"));
  CHECK_THROWS_AS(xg::broadcast_to(x, xg::Shape{2, -3}), xg::ValueError);
  // Concatenating empty tensors whose extents add up past int64.
  const auto a = xg::zeros<float>({0, kMax / 2 + 1});
  CHECK(contains(message_of<xg::ValueError>([&] { xg::concat<float>({a, a}, 1); }), "Concat"));
  // one_hot: [2, 2^62] has too many elements; [2, 2^61] too many bytes.
  const auto labels = xg::tensor<std::int32_t>({0, 1});
  CHECK(contains(message_of<xg::ValueError>([&] { xg::one_hot<float>(labels, std::int64_t{1} << 62); }), "OneHot"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::one_hot<double>(labels, std::int64_t{1} << 61); }), "OneHot"));
}

TEST_CASE("limits: slice bounds are checked without overflow") {
  const auto x = xg::arange<float>(6);
  CHECK(contains(message_of<xg::ShapeError>([&] { xg::slice(x, {kMax - 1}, {5}); }), "Slice"));
  CHECK_THROWS_AS(xg::slice(x, {kMax}, {-1}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice(x, {std::numeric_limits<std::int64_t>::min()}, {-1}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice(x, {2}, {kMax}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice(x, {7}, {-1}), xg::ShapeError);
  CHECK(xg::slice(x, {2}, {-1}).to_vector() == std::vector<float>{2, 3, 4, 5});
  CHECK(xg::slice(x, {6}, {-1}).numel() == 0);
  CHECK(xg::slice(x, {6}, {0}).numel() == 0);
}

TEST_CASE("limits: arange counts are finite and bounded, and integer ranges never overflow") {
  const auto what = message_of<xg::ValueError>([] { xg::arange<float>(0.0f, 1e30f, 1.0f); });
  CHECK(contains(what, "arange"));
  CHECK(contains(what, here(__LINE__ - 2)));
  CHECK_THROWS_AS(xg::arange<float>(0.0f, std::nanf(""), 1.0f), xg::ValueError);
  CHECK_THROWS_AS(xg::arange<double>(0.0, INFINITY, 1.0), xg::ValueError);
  CHECK_THROWS_AS(xg::arange<double>(0.0, 1.0, 1e-300), xg::ValueError);
  CHECK(xg::arange<float>(5.0f, 0.0f, 1.0f).numel() == 0);
  // Steps that would overflow int32 if the values were computed in int32.
  constexpr std::int32_t lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  CHECK(xg::arange<std::int32_t>(lo, hi, 1 << 30).to_vector() == std::vector<std::int32_t>{lo, -(1 << 30), 0, 1 << 30});
  CHECK(xg::arange<std::int32_t>(hi, lo, -(1 << 30)).to_vector() ==
        std::vector<std::int32_t>{hi, 1073741823, -1, -1073741825});
}

TEST_CASE("limits: convolution and pooling geometry is computed without overflow") {
  const auto x = xg::ones<float>({1, 1, 4, 4});
  const auto w = xg::ones<float>({1, 1, 3, 3});
  const auto padded = message_of<xg::ValueError>([&] { xg::conv2d(x, w, {.padding = kMax / 2}); });
  CHECK(contains(padded, "Conv2D"));
  CHECK(contains(padded, "padded"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::conv2d(x, w, {.dilation = kMax / 2 + 1}); }), "dilation"));
  // Large but representable padding: the output shape is checked before anything is allocated.
  CHECK_THROWS_AS(xg::conv2d(x, w, {.padding = std::int64_t{1} << 31}), xg::ValueError);
  CHECK_THROWS_AS(xg::max_pool2d(x, kMax, 1), xg::ShapeError);
  CHECK(xg::max_pool2d(x, 2, kMax, xg::PadMode::same).shape() == xg::Shape{1, 1, 1, 1});
  CHECK_THROWS_AS(xg::avg_pool2d(x, kMax, kMax, xg::PadMode::same), xg::ValueError);
  // Max pooling keeps each window's argmax as an int32 offset in its plane: a plane of 2^32
  // elements (an empty batch, so nothing is allocated) is refused, one of 2^31 - 1 is not.
  const auto wide = message_of<xg::ShapeError>([] { xg::max_pool2d(xg::zeros<float>({0, 1, 65536, 65536}), 2); });
  CHECK(contains(wide, "MaxPool"));
  CHECK(contains(wide, "int32"));
  CHECK(xg::max_pool2d(xg::zeros<float>({0, 1, 1, 2147483647}), 1).shape() == xg::Shape{0, 1, 1, 2147483647});
}

TEST_CASE("limits: layers refuse sizes whose weights cannot exist") {
  CHECK(contains(message_of<xg::ValueError>([] { xg::nn::Dense(kHuge, kHuge); }), "Dense"));
  CHECK(contains(message_of<xg::ValueError>([] { xg::nn::Conv2d(1, 1, std::int64_t{1} << 32); }), "Conv2d"));
  CHECK(contains(message_of<xg::ValueError>([] { xg::nn::Conv2d(kHuge, kHuge, 3); }), "Conv2d"));
}

TEST_CASE("limits: an allocation that cannot succeed is a ValueError naming the op and the bytes") {
  // Beyond the 2^47 bytes xgrad allocates at once: refused before asking the allocator.
  const auto factory = message_of<xg::AllocationError>([] { xg::zeros<double>({std::int64_t{1} << 45}); });
  CHECK(contains(factory, "zeros"));
  CHECK(contains(factory, std::to_string(std::int64_t{1} << 48)));
  CHECK(contains(factory, here(__LINE__ - 3)));
  const auto x = xg::ones<float>({1});
  const auto op = message_of<xg::ValueError>([&] { xg::broadcast_to(x, xg::Shape{std::int64_t{1} << 46}); });
  CHECK(contains(op, "BroadcastTo"));
  CHECK(contains(op, "bytes"));
  // Below that bound, but more than the process may map: the allocator says no (32 TiB, in a
  // child whose address space is capped; with overcommit a machine may grant the mapping).
  const int status = in_child([] {
    if (!cap_address_space(rlim_t{256} << 20)) return 10;
    try {
      xg::Tensor<float>::empty(xg::Shape{std::int64_t{1} << 43});
      return 11;
    } catch (const xg::AllocationError& e) {
      const std::string what = e.what();
      if (!contains(what, "out of memory") || !contains(what, std::to_string(std::int64_t{1} << 45))) return 12;
    }
    // The process goes on allocating normally afterwards.
    return xg::ones<float>({1000}).to_vector().size() == 1000 ? 0 : 13;
  });
  CHECK(status == 0);
}

TEST_CASE("limits: set_num_threads refuses more than kMaxThreads and keeps the count") {
  const int before = xg::cpu::num_threads();
  const auto what = message_of<xg::ValueError>([] { xg::cpu::set_num_threads(3000); });
  CHECK(contains(what, "set_num_threads"));
  CHECK(contains(what, "3000"));
  CHECK(contains(what, std::to_string(xg::cpu::kMaxThreads)));
  CHECK(xg::cpu::num_threads() == before);
}

TEST_CASE(
    "limits: when the system refuses threads, the pool runs with those that started, and "
    "set_num_threads says so") {
  // The child lowers its address-space limit so that only a few thread stacks fit.
  const int status = in_child([] {
    if (!cap_address_space(rlim_t{64} << 20)) return 10;
    {
      xg::cpu::detail::ThreadPool pool(256);
      if (pool.size() >= 256 || pool.size() < 1) return 11;
      if (pool.start_failure().empty()) return 12;
      // The threads that started still run regions.
      std::vector<int> hits(1000, 0);
      xg::cpu::detail::Job job;
      auto body = [&](std::int64_t lo, std::int64_t hi) {
        for (auto i = lo; i < hi; ++i) ++hits[static_cast<std::size_t>(i)];
      };
      job.m_invoke = [](void* ctx, std::int64_t lo, std::int64_t hi) { (*static_cast<decltype(body)*>(ctx))(lo, hi); };
      job.m_ctx = &body;
      job.m_size = 1000;
      job.plan(16, pool.size());
      if (!pool.try_run(job)) return 13;
      for (int h : hits)
        if (h != 1) return 14;
    }
    const int before = xg::cpu::num_threads();
    try {
      xg::cpu::set_num_threads(256);
      return 15;
    } catch (const xg::ValueError& e) {
      const std::string what = e.what();
      if (!contains(what, "set_num_threads") || !contains(what, "could start")) return 16;
    }
    return xg::cpu::num_threads() == before ? 0 : 17;
  });
  CHECK(status == 0);
}

TEST_CASE("limits: losses and metrics refuse labels that would broadcast against the output") {
  const auto out = xg::ones<float>({4, 1});
  const auto labels = xg::ones<float>({4});
  const auto what = message_of<xg::ShapeError>([&] { xg::nn::MSELoss()(out, labels); });
  CHECK(contains(what, "MSELoss"));
  CHECK(contains(what, "[4, 1]"));
  CHECK(xg::nn::MSELoss()(out, xg::ones<float>({4, 1})).item() == 0.0f);

  xg::metrics::Accuracy accuracy;
  const auto logits = xg::tensor<float>({{0, 1, 0}, {1, 0, 0}});
  CHECK_THROWS_AS(accuracy.update(logits, xg::tensor<float>({{0, 1}, {1, 0}}), 0.0f), xg::ShapeError);
  CHECK_THROWS_AS(accuracy.update(logits, xg::tensor<std::int32_t>({1, 0, 2}), 0.0f), xg::ShapeError);
  CHECK_THROWS_AS(
      accuracy.update(logits, xg::tensor<std::int32_t>(std::vector<std::int32_t>{1, 0}, xg::Shape{2, 1}), 0.0f),
      xg::ShapeError);
  accuracy.update(logits, xg::tensor<std::int32_t>({1, 2}), 0.0f);
  CHECK(accuracy.value() == doctest::Approx(0.5));
  accuracy.update(logits, xg::tensor<float>({{0, 1, 0}, {1, 0, 0}}), 0.0f);
  CHECK(accuracy.value() == doctest::Approx(0.75));
}

TEST_CASE("limits: BatchNorm2d refuses one value per channel in training, not in evaluation") {
  xg::nn::BatchNorm2d bn(3);
  const auto one = xg::ones<float>({1, 3, 1, 1});
  CHECK(contains(message_of<xg::ValueError>([&] { bn(one); }), "BatchNorm2d"));
  bn.set_train(false);
  CHECK(bn(one).shape() == xg::Shape{1, 3, 1, 1});
  bn.set_train(true);
  CHECK(bn(xg::ones<float>({2, 3, 1, 1})).shape() == xg::Shape{2, 3, 1, 1});
}

TEST_CASE("limits: a checkpoint cannot load optimizer state that the constructor refuses") {
  xg::testing::TempDir dir;
  xg::nn::Dense net(2, 1);
  xg::optim::Adam adam(net.parameters(), 0.01f);
  for (auto& [name, t] : adam.named_state())  // state no constructor would make
    if (name == "learning_rate") xg::Tensor<float>(t).assign(xg::scalar<float>(-1.0f));
  xg::save_checkpoint(net, adam, dir.file("bad.ckpt"));

  xg::nn::Dense fresh(2, 1);
  xg::optim::Adam target(fresh.parameters(), 0.5f);
  const auto weights = fresh.weight.to_vector();
  const auto what = message_of<xg::ValueError>([&] { xg::load_checkpoint(fresh, target, dir.file("bad.ckpt")); });
  CHECK(contains(what, "learning_rate"));
  CHECK(contains(what, "-1"));
  // All or nothing: neither the optimizer nor the module changed.
  CHECK(target.learning_rate() == 0.5f);
  CHECK(fresh.weight.to_vector() == weights);

  for (auto& [name, t] : adam.named_state()) {
    if (name == "learning_rate") xg::Tensor<float>(t).assign(xg::scalar<float>(0.01f));
    if (name == "beta1_power") xg::Tensor<float>(t).assign(xg::scalar<float>(2.0f));
  }
  xg::save_checkpoint(net, adam, dir.file("bad_power.ckpt"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_checkpoint(fresh, target, dir.file("bad_power.ckpt")); }),
                 "beta1_power"));
  CHECK_THROWS_AS(xg::optim::SGD(net.parameters(), INFINITY), xg::ValueError);
}

TEST_CASE("limits: errors of item(), dtype views, softmax and stack name the call and the caller's line") {
  const auto x = xg::ones<float>({2, 3});
  const auto item = message_of<xg::ShapeError>([&] { x.item(); });
  CHECK(contains(item, "item"));
  CHECK(contains(item, here(__LINE__ - 2)));
  const xg::TensorBase base = x;
  const auto view = message_of<xg::ShapeError>([&] { xg::Tensor<std::int32_t>{base}; });
  CHECK(contains(view, here(__LINE__ - 1)));
  CHECK(contains(view, std::string(xg::dtype_name(xg::DType::int32))));
  const auto softmax = message_of<xg::ShapeError>([&] { xg::softmax(x, 5); });
  CHECK(contains(softmax, "Softmax"));
  CHECK(!contains(softmax, "LogSoftmax"));
  const auto stack = message_of<xg::ShapeError>([&] { xg::stack<float>({x, x}, 4); });
  CHECK(contains(stack, "Stack"));
  CHECK(!contains(stack, "ExpandDims"));
}

TEST_CASE("limits: a layer's errors name the line that called it, eagerly and in graph mode") {
  xg::nn::Dense fc(3, 2);
  const auto x = xg::ones<float>({2, 4});
  const auto eager = message_of<xg::ShapeError>([&] { fc(x); });
  CHECK(contains(eager, "Dense"));
  CHECK(contains(eager, here(__LINE__ - 2)));

  xg::mode_scope graph(xg::Mode::graph);
  const auto traced = message_of<xg::ShapeError>([&] { fc(x); });
  CHECK(contains(traced, "stopped tracing at Dense (" + here(__LINE__ - 1) + ")"));

  // Inside a Sequential, the Sequential's caller.
  xg::nn::Sequential seq;
  seq.emplace<xg::nn::Dense>(4, 3);
  seq.emplace<xg::nn::BatchNorm2d>(3);
  xg::mode_scope eager_mode(xg::Mode::eager);
  CHECK(contains(message_of<xg::ShapeError>([&] { seq(x); }), here(__LINE__)));
  // Inside LeNet5, the network's caller.
  xg::models::LeNet5 lenet;
  const auto rgb = xg::ones<float>({1, 3, 32, 32});
  CHECK(contains(message_of<xg::ShapeError>([&] { lenet(rgb); }), here(__LINE__)));
}

TEST_CASE("limits: losses and Model name the line that called them, eagerly and in graph mode") {
  xg::nn::MSELoss mse;
  const auto out = xg::ones<float>({4, 1});
  const auto labels = xg::ones<float>({4});
  const auto eager = message_of<xg::ShapeError>([&] { mse(out, labels); });
  CHECK(contains(eager, "MSELoss"));
  CHECK(contains(eager, here(__LINE__ - 2)));
  xg::nn::SoftmaxCrossEntropy xent({.sparse = true});
  const auto dtype = message_of<xg::ShapeError>([&] { xent(out, labels); });
  CHECK(contains(dtype, "SoftmaxCrossEntropy: labels must be Int32"));
  CHECK(contains(dtype, here(__LINE__ - 2)));
  {
    xg::mode_scope graph(xg::Mode::graph);
    auto traced = xg::jit([&](const xg::Tensor<float>& o, const xg::Tensor<float>& l) { return mse(o, l); });
    CHECK(contains(message_of<xg::ShapeError>([&] { traced(out, labels); }),
                   "stopped tracing at MSELoss (" + here(__LINE__ - 2) + ")"));
  }

  // A Model reports the line that called train_step / train / eval, in both modes.
  xg::nn::Dense net(3, 2);
  xg::optim::SGD sgd(net.parameters(), 0.1f);
  xg::Model model(net, xent, sgd, {{"Accuracy", xg::metrics::accuracy()}});
  const auto images = xg::ones<float>({2, 4});  // the Dense layer takes 3 features
  const auto classes = xg::zeros<std::int32_t>({2});
  for (auto mode : {xg::Mode::eager, xg::Mode::graph}) {
    xg::mode_scope scope(mode);
    CHECK(contains(message_of<xg::ShapeError>([&] { model.train_step(images, classes); }), here(__LINE__)));
    struct Batch {
      xg::Tensor<float> images;
      xg::Tensor<std::int32_t> labels;
    };
    const std::vector<Batch> data{{images, classes}};
    CHECK(contains(message_of<xg::ShapeError>([&] { model.eval(data); }), here(__LINE__)));
    CHECK(contains(message_of<xg::ShapeError>([&] { model.train(1, data); }), here(__LINE__)));
  }
}

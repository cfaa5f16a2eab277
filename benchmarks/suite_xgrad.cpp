// The suite's xgrad rows, each workload eagerly and jitted at O0, O1 and O2, and the references
// that run in this executable: hand-written xsimd loops (`hand`), OpenBLAS (`openblas`), and for
// the transforms a loop of gradients (`loop`), one forward call (`forward`) and a finite
// difference (`fd_pair`).
// Workloads, shapes and thread counts: benchmarks/workloads.py.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <xgrad/backend/cpu/peak.hpp>
#include <xgrad/data/mnist.hpp>
#include <xgrad/models/lenet5.hpp>
#include <xgrad/nn/model.hpp>
#include <xgrad/xgrad.hpp>

#include "suite.hpp"
#include "workloads.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;

xg::Tensor<float> random_vector(std::int64_t n, std::uint64_t seed) { return xg::randn<float>(xg::Shape{n}, seed); }

// ---- implementations ---------------------------------------------------------------------------

enum class Impl { eager, jit_O0, jit_O1, jit_O2 };
constexpr std::array kEagerAndJit{Impl::eager, Impl::jit_O0, Impl::jit_O1, Impl::jit_O2};
constexpr std::array kJitLevels{Impl::jit_O0, Impl::jit_O1, Impl::jit_O2};

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::eager:
      return "eager";
    case Impl::jit_O0:
      return "jit_O0";
    case Impl::jit_O1:
      return "jit_O1";
    case Impl::jit_O2:
      return "jit_O2";
  }
  return "?";
}

xg::JitLevel jit_level(Impl impl) {
  return impl == Impl::jit_O0 ? xg::JitLevel::O0 : impl == Impl::jit_O1 ? xg::JitLevel::O1 : xg::JitLevel::O2;
}

/// Registers an xgrad workload once per implementation in `impls`; prepare(impl) makes its
/// inputs (on the --device) and returns the call.
template <class Impls> void register_xgrad(const std::string& suite, const std::string& workload, int threads,
                                           const Impls& impls, std::function<Call(Impl)> prepare) {
  for (Impl impl : impls)
    register_row(
        suite, workload, impl_name(impl), threads, [prepare, impl] { return prepare(impl); }, /*on_bench_device=*/true);
}

/// The call of a function of tensors: f(inputs...) eagerly, or through xg::jit at the level
/// (traced here; a retrace in the loop throws).
template <class F, class... Inputs> Call tensor_call(Impl impl, const std::string& name, F f, Inputs... inputs) {
  if (impl == Impl::eager) return [f, inputs...] { benchmark::DoNotOptimize(f(inputs...)); };
  auto compiled = xg::jit(f, {.level = jit_level(impl), .name = name});
  compiled(inputs...);
  return [compiled, inputs...] {
    xg::expect_cache_hit hit;
    benchmark::DoNotOptimize(compiled(inputs...));
  };
}

// ---- hand-written references: one pass over xsimd batches into a buffer made once --------------

/// y[i] = body(a[i], b[i]...) over n floats, the main loop on xsimd batches and the tail on
/// floats (body is generic over both).
template <class Body, class... In> void hand_map(Body body, std::int64_t n, float* y, const In*... in) {
  using B = xsimd::batch<float>;
  constexpr auto lanes = static_cast<std::int64_t>(B::size);
  const std::int64_t whole = n - n % lanes;
  for (std::int64_t i = 0; i < whole; i += lanes) body(B::load_unaligned(in + i)...).store_unaligned(y + i);
  // Counted from `whole`, the tail's bound (under a batch) is plain to g++, which otherwise warns
  // of an overflow on this loop where hand_map is inlined into parallel_for.
  for (std::int64_t j = 0; j < n % lanes; ++j) y[whole + j] = body(in[whole + j]...);
}

/// A hand reference row for an elementwise workload of n floats and one or two inputs.
template <int Arity, class Body> Call hand_call(std::int64_t n, Body body) {
  auto a = random_vector(n, 1), b = random_vector(n, 2);
  auto y = xg::Tensor<float>::empty(xg::Shape{n});
  return [a, b, y, n, body]() mutable {
    if constexpr (Arity == 1)
      hand_map(body, n, y.data(), a.data());
    else
      hand_map(body, n, y.data(), a.data(), b.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  };
}

// ---- dispatch, cache_hit, elementwise ------------------------------------------------------------

void register_elementwise() {
  const auto add = [](const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return a + b; };
  const auto exp = [](const xg::Tensor<float>& a) { return xg::exp(a); };
  const auto chain = [](const xg::Tensor<float>& x) { return chain7(x); };

  for (std::int64_t n : {1, 1000})
    register_xgrad("dispatch", "add_" + std::to_string(n), 1, kEagerAndJit,
                   [=](Impl impl) { return tensor_call(impl, "add", add, random_vector(n, 1), random_vector(n, 2)); });
  // With a requiring grad every call records its tape node (eagerly one, jitted the graph's).
  register_xgrad("dispatch", "add_grad_1", 1, kEagerAndJit, [=](Impl impl) {
    auto a = random_vector(1, 1);
    a.set_requires_grad(true);
    return tensor_call(impl, "add", add, a, random_vector(1, 2));
  });
  register_xgrad("cache_hit", "chain7_1", 1, kEagerAndJit,
                 [=](Impl impl) { return tensor_call(impl, "chain7", chain, random_vector(1, 3)); });

  const std::int64_t million = 1000000;
  register_xgrad("elementwise", "add_1e6", 1, kEagerAndJit, [=](Impl impl) {
    return tensor_call(impl, "add", add, random_vector(million, 1), random_vector(million, 2));
  });
  register_row("elementwise", "add_1e6", "hand", 1,
               [=] { return hand_call<2>(million, [](const auto& a, const auto& b) { return a + b; }); });
  register_xgrad("elementwise", "exp_1e6", 1, kEagerAndJit,
                 [=](Impl impl) { return tensor_call(impl, "exp", exp, random_vector(million, 1)); });
  register_row("elementwise", "exp_1e6", "hand", 1,
               [=] { return hand_call<1>(million, [](const auto& a) { return xsimd::exp(a); }); });
  for (std::int64_t n : {million, 10 * million}) {
    const std::string name = n == million ? "chain7_1e6" : "chain7_1e7";
    register_xgrad("elementwise", name, 1, kEagerAndJit,
                   [=](Impl impl) { return tensor_call(impl, "chain7", chain, random_vector(n, 1)); });
    register_row("elementwise", name, "hand", 1,
                 [=] { return hand_call<1>(n, [](const auto& x) { return chain7_body(x); }); });
  }
}

// ---- reductions ----------------------------------------------------------------------------------

void register_reductions() {
  register_xgrad("reductions", "sum_1e7", 1, kEagerAndJit, [](Impl impl) {
    return tensor_call(
        impl, "sum", [](const xg::Tensor<float>& x) { return xg::sum(x); }, random_vector(10000000, 1));
  });
  for (int axis : {0, 1})
    register_xgrad("reductions", "sum_axis" + std::to_string(axis) + "_1024x1024", 1, kEagerAndJit, [axis](Impl impl) {
      return tensor_call(
          impl, "sum", [axis](const xg::Tensor<float>& x) { return xg::sum(x, {axis}); },
          xg::randn<float>({1024, 1024}, 1));
    });
  register_xgrad("reductions", "softmax_256x1000", 1, kEagerAndJit, [](Impl impl) {
    return tensor_call(
        impl, "softmax", [](const xg::Tensor<float>& x) { return xg::softmax(x, -1); },
        xg::randn<float>({256, 1000}, 1));
  });
}

// ---- gemm ----------------------------------------------------------------------------------------

void register_gemm() {
  for (const auto& [n, threads] : {std::pair<std::int64_t, int>{64, 1}, {256, 1}, {1024, 1}, {1024, 2}}) {
    const std::string name = "matmul_" + std::to_string(n) + (threads > 1 ? "_t" + std::to_string(threads) : "");
    register_xgrad("gemm", name, threads, kEagerAndJit, [n = n](Impl impl) {
      return tensor_call(
          impl, "matmul", [](const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return xg::matmul(a, b); },
          xg::uniform<float>({n, n}, -1.f, 1.f, 1), xg::uniform<float>({n, n}, -1.f, 1.f, 2));
    });
    register_row("gemm", name, "openblas", threads, [n = n]() -> Call {
      auto a = xg::uniform<float>({n, n}, -1.f, 1.f, 1), b = xg::uniform<float>({n, n}, -1.f, 1.f, 2);
      auto c = xg::zeros<float>({n, n});
      const auto ni = static_cast<blasint>(n);
      return [a, b, c, ni]() mutable {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a.data(), ni, b.data(), ni, 0.0f,
                    c.data(), ni);
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
      };
    });
  }
}

// ---- conv: forward, and the gradient of sum(conv2d(x, w)) ----------------------------------------

void register_conv() {
  for (const ConvCase& c : {kConv1, kConv2}) {
    auto inputs = [c] {
      return std::pair{xg::randn<float>({c.batch, c.in_channels, c.height, c.width}, 5),
                       xg::randn<float>({c.out_channels, c.in_channels, c.kernel, c.kernel}, 6)};
    };
    const auto conv = [](const xg::Tensor<float>& x, const xg::Tensor<float>& w) {
      return xg::conv2d(x, w, {.pad_mode = xg::PadMode::valid});
    };
    register_xgrad("conv", std::string(c.name) + "_fwd", 1, kEagerAndJit, [=](Impl impl) {
      auto [x, w] = inputs();
      return tensor_call(impl, "conv2d", conv, x, w);
    });
    // dw for conv1 (its input is the image), dx and dw for conv2.
    register_xgrad("conv", std::string(c.name) + "_grad", 1, kEagerAndJit, [=](Impl impl) {
      auto [x, w] = inputs();
      const auto loss = [conv](const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return xg::sum(conv(a, b)); };
      if (c.input_grad) return tensor_call(impl, "conv2d_grad", xg::grad(loss, xg::argnums<0, 1>), x, w);
      return tensor_call(impl, "conv2d_grad", xg::grad(loss, xg::argnums<1>), x, w);
    });
  }
}

// ---- train steps, and their compile time ---------------------------------------------------------

const MlpSize kMlpSmall{{784, 128, 10}, 32};
const MlpSize kMlpDeep{{784, 256, 256, 10}, 64};

/// LeNet5 (models/lenet5.hpp) with SoftmaxCrossEntropy (sparse, mean) and Momentum (lr 0.01,
/// momentum 0.9) in a Model, on lenet_batch().
struct LeNetRun {
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss{{.sparse = true, .reduction = xg::Reduction::mean}};
  xg::optim::Momentum opt{net.parameters(), 0.01f, 0.9f};
  xg::Model model{net, loss, opt};
  xg::Tensor<float> images = xg::tensor<float>(lenet_batch().images, {kLeNetBatch, 1, 32, 32});
  xg::Tensor<std::int32_t> labels = xg::tensor<std::int32_t>(lenet_batch().labels);
};

std::shared_ptr<LeNetRun> make_lenet(Impl impl) {
  xg::init::set_seed(1);
  auto run = std::make_shared<LeNetRun>();
  if (impl != Impl::eager) run->model.set_jit_config({.level = jit_level(impl), .name = "lenet5_step"});
  return run;
}

void register_training() {
  for (const MlpSize& s : {kMlpSmall, kMlpDeep})
    register_xgrad("mlp_step", s.name(), 1, kEagerAndJit, [s](Impl impl) -> Call {
      auto mlp = std::make_shared<Mlp>(s, 1);
      MlpBatch batch(s);
      return tensor_call(
          impl, "mlp_step",
          [mlp](const xg::Tensor<float>& x, const xg::Tensor<std::int32_t>& y) { return mlp->step(x, y); }, batch.x,
          batch.labels);
    });

  for (int threads : {1, 2})
    register_xgrad("lenet5_step", "b32_t" + std::to_string(threads), threads, kEagerAndJit, [](Impl impl) -> Call {
      auto run = make_lenet(impl);
      const xg::Mode mode = impl == Impl::eager ? xg::Mode::eager : xg::Mode::graph;
      return [run, mode] {
        xg::mode_scope scope(mode);
        benchmark::DoNotOptimize(run->model.train_step(run->images, run->labels));
      };
    });

  // A fresh jit per call, lowered: trace, verify, the passes, the program (then freed).
  register_xgrad("compile", "mlp_" + kMlpDeep.name(), 1, kJitLevels, [](Impl impl) -> Call {
    auto mlp = std::make_shared<Mlp>(kMlpDeep, 1);
    auto batch = std::make_shared<MlpBatch>(kMlpDeep);
    return [mlp, batch, impl] {
      auto step =
          xg::jit([mlp](const xg::Tensor<float>& x, const xg::Tensor<std::int32_t>& y) { return mlp->step(x, y); },
                  {.level = jit_level(impl), .name = "mlp_step"});
      benchmark::DoNotOptimize(step.lower(batch->x, batch->labels).num_nodes());
    };
  });
  register_xgrad("compile", "lenet5_step_b32", 1, kJitLevels, [](Impl impl) -> Call {
    auto run = make_lenet(impl);
    return [run, impl] {
      run->model.set_jit_config({.level = jit_level(impl), .name = "lenet5_step"});  // drops the compiled step
      benchmark::DoNotOptimize(run->model.lower_train_step(run->images, run->labels).num_nodes());
    };
  });
}

// ---- roofline: the machine's measured limits, which the report reads the other rows against ------

void register_roofline() {
  for (int threads : {1, 2}) {
    const std::string suffix = threads == 1 ? "" : "_t2";
    // The FMA peak as the library measures it (backend/cpu/peak.hpp).
    register_row("roofline", "fma_peak" + suffix, "hand", threads, [threads]() -> Call {
      return [threads] { benchmark::DoNotOptimize(xg::cpu::fma_chains_on(threads)); };
    });
    // STREAM's triad, a = b + s c, over arrays far larger than the caches (3 x 64 MiB).
    register_row("roofline", "triad_2p24" + suffix, "hand", threads, [] {
      constexpr std::int64_t n = std::int64_t{1} << 24;
      auto a = xg::Tensor<float>::empty(xg::Shape{n});
      auto b = random_vector(n, 1), c = random_vector(n, 2);
      return Call([a, b, c]() mutable {
        float* out = a.data();
        const float *x = b.data(), *y = c.data();
        xg::cpu::parallel_for(0, n, 1 << 16, [=](std::int64_t lo, std::int64_t hi) {
          hand_map([](const auto& u, const auto& v) { return u + 3.0f * v; }, hi - lo, out + lo, x + lo, y + lo);
        });
        benchmark::DoNotOptimize(out);
        benchmark::ClobberMemory();
      });
    });
  }
}

// ---- transforms: per-example gradients, a Hessian, forward mode ----------------------------------

/// The deep MLP's loss on one example (x [1, 784] and its label [1]: a batch of one) as a function of every weight and
/// bias, whose gradient per_example_grads maps over the batch.
xg::Tensor<float> example_loss(const xg::Tensor<float>& w1, const xg::Tensor<float>& b1, const xg::Tensor<float>& w2,
                               const xg::Tensor<float>& b2, const xg::Tensor<float>& w3, const xg::Tensor<float>& b3,
                               const xg::Tensor<float>& x, const xg::Tensor<std::int32_t>& label) {
  return xg::softmax_cross_entropy(mlp_logits(x, {w1, b1, w2, b2, w3, b3}), label);
}

void register_transforms() {
  const auto example_grads = xg::grad(example_loss, xg::argnums<0, 1, 2, 3, 4, 5>);
  const std::int64_t batch = kMlpDeep.batch, features = kMlpDeep.widths.front();
  register_xgrad("transforms", "per_example_grads_mlp_b64", 1, kEagerAndJit, [=](Impl impl) {
    const auto p = Mlp(kMlpDeep, 1).params();
    const MlpBatch data(kMlpDeep);
    const auto per_example =
        xg::vmap(example_grads, xg::in_axes{xg::none, xg::none, xg::none, xg::none, xg::none, xg::none, 0, 0});
    return tensor_call(impl, "per_example_grads", per_example, p[0], p[1], p[2], p[3], p[4], p[5],
                       xg::reshape(data.x, {batch, 1, features}), xg::reshape(data.labels, {batch, 1}));
  });
  // The reference: one gradient per example, the examples sliced before the timing. It keeps
  // its 64 results, as per-example gradients are kept to be used (clipped, inspected), each
  // apart where vmap stacks them.
  register_row("transforms", "per_example_grads_mlp_b64", "loop", 1, [=]() -> Call {
    const MlpBatch data(kMlpDeep);
    std::vector<std::pair<xg::Tensor<float>, xg::Tensor<std::int32_t>>> examples;
    for (std::int64_t i = 0; i < batch; ++i)
      examples.emplace_back(xg::slice(data.x, {i, 0}, {1, features}), xg::slice(data.labels, {i}, {1}));
    return [p = Mlp(kMlpDeep, 1).params(), examples, example_grads] {
      std::vector<decltype(example_grads(p[0], p[1], p[2], p[3], p[4], p[5], examples[0].first, examples[0].second))>
          grads;
      grads.reserve(examples.size());
      for (const auto& [x, label] : examples)
        grads.push_back(example_grads(p[0], p[1], p[2], p[3], p[4], p[5], x, label));
      benchmark::DoNotOptimize(grads.data());
    };
  });

  // f(x) = sum(tanh(W x)) + 0.5 sum(x * x) sum(sin(x)): every second derivative is nonzero.
  register_xgrad("transforms", "hessian_100", 1, kEagerAndJit, [](Impl impl) {
    const auto w = xg::randn<float>({100, 100}, 7) * 0.1f;
    const auto f = [w](const xg::Tensor<float>& x) {
      return xg::sum(xg::tanh(xg::matmul(w, xg::reshape(x, {100, 1})))) + 0.5f * xg::sum(x * x) * xg::sum(xg::sin(x));
    };
    return tensor_call(impl, "hessian", xg::hessian(f), random_vector(100, 8));
  });

  // The deep MLP's logits for a batch of 64 as a function of the input, differentiated along a
  // direction t, against one forward call and the two of a finite difference.
  const auto logits_of_input = [] {
    return [params = Mlp(kMlpDeep, 1).params()](const xg::Tensor<float>& x) { return mlp_logits(x, params); };
  };
  const auto direction = [=] { return xg::randn<float>({batch, features}, 43); };
  register_xgrad("transforms", "jvp_mlp_b64", 1, kEagerAndJit, [=](Impl impl) {
    const auto jvp = [f = logits_of_input()](const xg::Tensor<float>& x, const xg::Tensor<float>& t) {
      return xg::jvp(f, x, t);
    };
    return tensor_call(impl, "jvp", jvp, MlpBatch(kMlpDeep).x, direction());
  });
  register_row("transforms", "jvp_mlp_b64", "forward", 1,
               [=] { return tensor_call(Impl::eager, "forward", logits_of_input(), MlpBatch(kMlpDeep).x); });
  register_row("transforms", "jvp_mlp_b64", "fd_pair", 1, [=] {
    const auto fd_pair = [f = logits_of_input()](const xg::Tensor<float>& x, const xg::Tensor<float>& t) {
      const float h = 1e-3f;
      return (f(x + h * t) - f(x)) / h;
    };
    return tensor_call(Impl::eager, "fd_pair", fd_pair, MlpBatch(kMlpDeep).x, direction());
  });
}

// ---- attention: causal scaled dot-product attention, forward and gradient -------------------------

struct AttentionCase {
  std::int64_t batch, heads, length, dim;  // q, k, v [batch, heads, length, dim]
  int threads;
};
// workloads.py, ATTENTION: the longest on 2 threads too, as gemm's largest.
constexpr std::array kAttention{AttentionCase{8, 4, 128, 32, 1}, AttentionCase{2, 4, 512, 32, 1},
                                AttentionCase{1, 4, 2048, 32, 1}, AttentionCase{1, 4, 2048, 32, 2}};

void register_attention() {
  const auto attention = [](const xg::Tensor<float>& q, const xg::Tensor<float>& k, const xg::Tensor<float>& v) {
    return xg::scaled_dot_product_attention(q, k, v, {.causal = true, .scale = std::nullopt});  // 1 / sqrt(D)
  };
  // w weighs every output, so the gradient flowing back is not the same for all of them.
  const auto loss = [attention](const xg::Tensor<float>& q, const xg::Tensor<float>& k, const xg::Tensor<float>& v,
                                const xg::Tensor<float>& w) { return xg::sum(attention(q, k, v) * w); };
  for (const AttentionCase& c : kAttention) {
    const std::string name = "seq" + std::to_string(c.length), suffix = c.threads > 1 ? "_t2" : "";
    const auto input = [c](std::uint64_t seed) { return xg::randn<float>({c.batch, c.heads, c.length, c.dim}, seed); };
    register_xgrad("attention", name + "_fwd" + suffix, c.threads, kEagerAndJit,
                   [=](Impl impl) { return tensor_call(impl, "attention", attention, input(1), input(2), input(3)); });
    register_xgrad("attention", name + "_grad" + suffix, c.threads, kEagerAndJit, [=](Impl impl) {
      return tensor_call(impl, "attention_grad", xg::grad(loss, xg::argnums<0, 1, 2>), input(1), input(2), input(3),
                         input(4));
    });
  }
}

// ---- seq_step: the character-level transformer's train step ---------------------------------------

void register_seq_step() {
  // examples/char_transformer.cpp's step (workloads.hpp, CharTransformerStep) on one fixed batch
  // of random ids: eagerly, and the whole step under xg::jit.
  register_xgrad("seq_step", "char_transformer_b32", 1, kEagerAndJit, [](Impl impl) -> Call {
    auto step = std::make_shared<CharTransformerStep>(1);
    return tensor_call(
        impl, "char_transformer_step",
        [step](const xg::Tensor<std::int32_t>& inputs, const xg::Tensor<std::int32_t>& targets) {
          return (*step)(inputs, targets);
        },
        char_ids(1), char_ids(2));
  });
}

}  // namespace

const xgrad::bench::LeNetBatch& xgrad::bench::lenet_batch() {
  static const LeNetBatch batch = [] {
    const char* dir = std::getenv("XGRAD_FASHION_MNIST");
    const auto batches = xg::data::MnistDataset(dir ? dir : "/usr/share/datasets/fashion-mnist", xg::data::Split::train)
                             .map(xg::data::Resize(32), xg::data::Rescale(1.0 / 255.0),
                                  xg::data::Normalize(0.1307, 0.3081), xg::data::HWC2CHW())
                             .batch(kLeNetBatch, /*drop_remainder=*/true);
    const xg::data::Batch first = *batches.begin();
    return LeNetBatch{first.images.to_vector(), first.labels.to_vector()};
  }();
  return batch;
}

namespace {

const bool kSuiteRegistered = [] {
  register_roofline();
  register_elementwise();
  register_reductions();
  register_gemm();
  register_conv();
  register_training();
  register_transforms();
  register_attention();
  register_seq_step();
  return true;
}();

}  // namespace

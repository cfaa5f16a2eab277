// jit diagnostics: the seeds' BiasAdd report (golden), saved graphs, print at run time,
// and the errors for reading or keeping traced values.
#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;

TEST_CASE("jit: the seeds' BiasAdd failure reads like analyze_fail.dat (golden)") {
  xg::Parameter<float> weight(xg::randn<float>({32, 8}, 1), "weight");
  xg::Parameter<float> bias(xg::zeros<float>({4}), "bias");
  auto net = xg::jit(
      [&](xg::Tensor<float> x1) {
        auto x = xg::matmul(x1, weight);
        return xg::bias_add(x, bias);
      },
      {.name = "Net"});
  const int line = __LINE__ - 4;  // the matmul; bias_add is on the next line
  auto x = xg::reshape(xg::arange<float>(3 * 32), {3, 32});
  std::string file = "test_jit_diagnostics.cpp:";
  auto at = [&](int l) { return file + std::to_string(l); };
  std::string expected =
      "BiasAdd: bias must have shape [C] where C is axis 1 of x, which needs at least 2 axes (inputs x: Float32[3, 8], "
      "bias: Float32[4]) (at " +
      at(line + 1) +
      ")\n"
      "\n"
      "jit 'Net' stopped tracing at BiasAdd (" +
      at(line + 1) +
      "). The graph traced so far, the failing node marked:\n"
      "\n"
      "graph Net(\n"
      "    %0 : f32[3, 32]  # arg0\n"
      "    %1 : Ref[f32[32, 8]]  # weight\n"
      "    %3 : Ref[f32[4]]  # bias\n"
      ") {\n"
      "  %2 : f32[3, 8] = MatMul(%0, %1) {transpose_a=false, transpose_b=false}  # " +
      at(line) +
      "\n"
      "#------------------------> failed here\n"
      "  BiasAdd(%2, %3)  # (f32[3, 8], Ref[f32[4]])  # " +
      at(line + 1) +
      "\n"
      "}\n"
      "\n"
      "The failing node's inputs:\n"
      "  %2 : f32[3, 8]  made by MatMul at " +
      at(line) +
      "\n"
      "  %3 : Ref[f32[4]]  a tensor read by reference 'bias'\n";
  auto msg = message_of<xg::TraceError>([&] { net(x); });
  CHECK(msg == expected);
  // A TraceError is a ShapeError, so code that catches shape errors in eager mode still works.
  CHECK_THROWS_AS(net(x), xg::ShapeError);
}

TEST_CASE("jit: set_save_graphs writes the failure report (text and JSON) and the IR at each stage") {
  auto dir = std::filesystem::temp_directory_path() / ("xgrad_graphs_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  xg::set_save_graphs(dir.string(), 2);
  auto bad = xg::jit([](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::matmul(a, b); }, {.name = "bad mm"});
  CHECK_THROWS_AS(bad(xg::ones<float>({2, 3}), xg::ones<float>({2, 3})), xg::TraceError);
  auto good = xg::jit([](xg::Tensor<float> a) { return a * 2.0f; }, {.name = "good"});
  good(xg::ones<float>({2}));
  xg::set_save_graphs("", 0);

  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto report = read(dir / "bad_mm.analyze_fail.ir");
  CHECK(report.find("failed here") != std::string::npos);
  auto json = read(dir / "bad_mm.analyze_fail.json");
  CHECK(json.find("\"failing_node\": {\"op\": \"MatMul\"") != std::string::npos);
  CHECK(json.find("\"shape\": [2, 3]") != std::string::npos);
  int stages = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.rfind("good_", 0) == 0) {
      ++stages;
      if (entry.path().extension() == ".dot") CHECK(read(entry.path()).rfind("digraph", 0) == 0);
    }
    CHECK(name.find(".tmp") == std::string::npos);  // written through a rename: nothing half-written
  }
  CHECK(stages == 4);  // the traced graph and its memory plan, each as text and as dot
  std::filesystem::remove_all(dir);
}

TEST_CASE("jit: print runs when the graph runs, not while it is traced") {
  auto f = xg::jit([](xg::Tensor<float> v) {
    auto y = v * 2.0f;
    xg::print("doubled:", y);
    return y + 1.0f;
  });
  auto x = xg::tensor<float>({1, 2});
  {
    CoutCapture out;
    f.lower(x);  // traces only
    CHECK(out.text.str().empty());
  }
  CoutCapture out;
  f(x);
  f(x);
  CHECK(out.text.str() ==
        "doubled: Tensor(shape=[2], dtype=Float32, value=[2, 4])\n"
        "doubled: Tensor(shape=[2], dtype=Float32, value=[2, 4])\n");
}

TEST_CASE("jit: reading a traced value, or keeping a traced tensor past its function, is a clear error") {
  auto read = xg::jit([](xg::Tensor<float> v) { return v * v.item(); });
  auto msg = message_of<xg::ValueError>([&] { read(xg::ones<float>({1})); });
  CHECK(msg.find("not known while jit traces") != std::string::npos);
  CHECK(msg.find("xg::cond") != std::string::npos);

  xg::Tensor<float> kept;
  auto keep = xg::jit([&kept](xg::Tensor<float> v) {
    kept = v * 2.0f;
    return v;
  });
  keep(xg::ones<float>({2}));
  auto use = xg::jit([&kept](xg::Tensor<float> v) { return v + kept; });
  auto escaped = message_of<xg::ValueError>([&] { use(xg::ones<float>({2})); });
  CHECK(escaped.find("escaped") != std::string::npos);
}

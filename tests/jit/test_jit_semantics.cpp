// What jit promises beyond "same values as eager": first-order gradients through jitted
// functions with traced loops, arguments that share memory, what a traced function captures
// (docs/JIT.md, "What a trace captures"), config validation, escaped tensors, and the mode
// being process-wide.
#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;

namespace jit_semantics_test {

using TD = xg::Tensor<double>;
using xgrad::testing::contains;
using xgrad::testing::message_of;
namespace xgt = xgrad::testing;

/// A fori_loop whose body reads w and p from outside (by reference, as users write it), then
/// a while_loop bounded for reverse mode.
TD loops(const TD& x, const TD& w, const TD& p) {
  auto z = xg::fori_loop(
      0, 4, [&w, &p](xg::Tensor<std::int32_t> i, const TD& c) { return xg::tanh(c * w + p * xg::cast<double>(i)); }, x);
  return xg::sum(xg::while_loop([](const TD& c) { return xg::sum(c * c) < 30.0; }, [](const TD& c) { return c * 1.5; },
                                z, {.max_iters = 40}));
}

}  // namespace jit_semantics_test

using namespace jit_semantics_test;

TEST_CASE("jit: grad(jit(f)) and value_and_grad(jit(f)) through fori_loop and a bounded while_loop match eager") {
  auto x = xg::tensor<double>({0.3, -0.1, 0.5}), w = xg::tensor<double>({1.5, 0.5, -0.7});
  xg::Parameter<double> p(xg::tensor<double>({0.2, -0.3, 0.1}), "p");
  auto f = [&p](const TD& a, const TD& b) { return loops(a, b, p); };
  auto jf = xg::jit(f);

  auto [ex, ew] = xg::grad(f, xg::argnums<0, 1>)(x, w);
  for (int call = 0; call < 2; ++call) {  // the second call runs the cached gradient graph
    CAPTURE(call);
    auto [jx, jw] = xg::grad(jf, xg::argnums<0, 1>)(x, w);
    xgt::check_close(jx, ex, 1e-12);
    xgt::check_close(jw, ew, 1e-12);
  }
  xgt::check_close(ex, xgt::numeric_grad([&](const TD& v) { return f(v, w); }, x), 1e-6);
  xgt::check_close(ew, xgt::numeric_grad([&](const TD& v) { return f(x, v); }, w), 1e-6);

  // Gradients reach the Parameter the loop body reads by reference.
  std::vector<xg::Parameter<double>> params{p};
  auto [value, grads] = xg::value_and_grad(jf, params)(x, w);
  auto [eager_value, eager_grads] = xg::value_and_grad(f, params)(x, w);
  xgt::check_close(value, eager_value, 1e-12);
  xgt::check_close(grads[0], eager_grads[0], 1e-12);
  xgt::check_close(grads[0], xgt::numeric_grad([&](const TD& v) { return loops(x, w, v); }, p), 1e-6);

  // backward() after a jitted call, too.
  auto leaf = x.detach().set_requires_grad(true);
  jf(leaf, w).backward();
  xgt::check_close(leaf.grad(), ex, 1e-12);

  // A second order differentiates f op by op (the loops are C++ loops then), as eagerly.
  xgt::check_close(xg::grad(xg::grad(jf))(x, w), xg::grad(xg::grad(f))(x, w), 1e-10);
  // A second order traced whole still needs a traced loop's gradient differentiated: refused.
  auto msg = message_of<xg::AutogradError>([&] { xg::jit(xg::grad(xg::grad(f)))(x, w); });
  CHECK(contains(msg, "gradients of gradients through a traced loop are not supported"));
}

TEST_CASE("jit: the gradient of a function that writes into its inputs sees what the call read; writes apply once") {
  for (auto level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    const xg::JitConfig config{.level = level};
    // A running statistic read by reference and updated under no_grad (as BatchNorm does),
    // then read: eagerly and compiled, one update per call, the same gradient.
    auto stat = xg::tensor<double>({1.0, 2.0});
    auto f = [&stat](const TD& x) {
      {
        xg::no_grad off;
        stat.assign(stat * 0.5 + x);
      }
      return xg::sum(x * x * stat);
    };
    auto x = xg::tensor<double>({0.5, -1.5});
    const auto eager = xg::grad(f)(x);
    const auto eager_stat = stat.to_vector();
    stat.assign(xg::tensor<double>({1.0, 2.0}));
    auto jf = xg::jit(f, config);
    for (int call = 0; call < 2; ++call) {  // traced, then a cache hit
      CAPTURE(call);
      stat.assign(xg::tensor<double>({1.0, 2.0}));
      xgt::check_close(xg::grad(jf)(x), eager, 1e-12);
      CHECK(stat.to_vector() == eager_stat);  // updated once, not again by the backward pass
    }
    stat.assign(xg::tensor<double>({1.0, 2.0}));
    auto leaf = x.detach().set_requires_grad(true);
    jf(leaf).backward();
    xgt::check_close(leaf.grad(), eager, 1e-12);
    CHECK(stat.to_vector() == eager_stat);

    // An argument written under no_grad and read after the write.
    auto g = [](const TD& x, TD s) {
      {
        xg::no_grad off;
        s += 1.0;
      }
      return xg::sum(x * s);
    };
    auto s = xg::tensor<double>({10.0, 20.0}), js = xg::tensor<double>({10.0, 20.0});
    auto jg = xg::jit(g, config);
    for (int call = 0; call < 2; ++call) {
      CAPTURE(call);
      const auto expected = xg::grad(g)(x, s);
      CHECK(xg::grad(jg)(x, js).to_vector() == expected.to_vector());
      CHECK(js.to_vector() == s.to_vector());
    }
    CHECK(js.to_vector() == std::vector<double>{12.0, 22.0});

    // Read before and after the write: eagerly the saved tensor was changed, and so it is
    // under jit: both refuse the gradient.
    auto h = [](const TD& x, TD s) {
      auto y = x * s;
      {
        xg::no_grad off;
        s += 1.0;
      }
      return xg::sum(y + x * s);
    };
    auto eager_msg = message_of<xg::AutogradError>([&] { xg::grad(h)(x, xg::tensor<double>({1.0, 2.0})); });
    auto jit_msg = message_of<xg::AutogradError>([&] {
      xg::grad(xg::jit(h, config))(x, xg::tensor<double>({1.0, 2.0}));
    });
    CHECK(contains(eager_msg, "saved for its gradient was modified in place"));
    CHECK(contains(jit_msg, "saved for its gradient was modified in place"));

    // A write that brings in a value autodiff tracks would drop its gradient: refused.
    auto k = [](const TD& x, TD s) {
      s += x;
      return xg::sum(x * s);
    };
    CHECK(contains(message_of<xg::AutogradError>([&] {
                     xg::grad(k)(x, xg::tensor<double>({1.0, 2.0}));
                   }),
                   "in-place update with a value that requires grad"));
    CHECK(contains(message_of<xg::AutogradError>([&] {
                     xg::grad(xg::jit(k, config))(x, xg::tensor<double>({1.0, 2.0}));
                   }),
                   "in-place update with a value that requires grad"));
    // Written into an argument that requires grad: refused as eagerly, naming the argument.
    auto tracked = xg::tensor<double>({1.0, 2.0}).set_requires_grad(true);
    CHECK(contains(message_of<xg::AutogradError>([&] { jg(x, tracked); }),
                   "writes in place into argument 1, which requires grad"));
    // The gradient graph leaves the inputs alone, so it cannot be differentiated again.
    auto second_order = xg::grad([&jf](const TD& v) { return xg::sum(xg::grad(jf)(v)); });
    CHECK(contains(message_of<xg::AutogradError>([&] { second_order(x); }), "cannot itself be differentiated"));
  }
}

TEST_CASE("jit: one tensor passed as two arguments and written through one behaves as eagerly") {
  // Eagerly a and b are one tensor: the write shows through b, and x ends up written.
  auto bump = [](TD a, TD b) {
    {
      xg::no_grad off;
      a += 1.0;
    }
    return a * b;
  };
  auto jbump = xg::jit(bump);
  xgrad::testing::LogCapture log;  // the retraces below log why
  auto eager_x = xg::tensor<double>({1.0, 2.0}), x = xg::tensor<double>({1.0, 2.0});
  for (int call = 0; call < 2; ++call) {  // traced, then a cache hit
    CAPTURE(call);
    auto expected = bump(eager_x, eager_x);
    CHECK(jbump(x, x).to_vector() == expected.to_vector());
    CHECK(x.to_vector() == eager_x.to_vector());
  }
  CHECK(x.to_vector() == std::vector<double>{3, 4});
  // Separate tensors are another signature: the write does not reach b.
  auto y = xg::tensor<double>({1.0, 2.0}), z = xg::tensor<double>({1.0, 2.0});
  CHECK(jbump(y, z).to_vector() == std::vector<double>{2, 6});
  CHECK(jbump.cache_size() == 2);
  // Two handles on one storage alias as much as one handle passed twice.
  auto u = xg::tensor<double>({1.0, 2.0});
  CHECK(jbump(u, u.detach()).to_vector() == std::vector<double>{4, 9});

  // A view with another shape cannot follow a write inside the graph: refused, naming both.
  auto v = xg::tensor<double>({1.0, 2.0});
  auto msg = message_of<xg::ValueError>([&] { jbump(v, xg::reshape(v, {2, 1})); });
  CHECK(contains(msg, "argument 0 and argument 1 share memory"));
  CHECK(contains(msg, "writes into argument 0 in place"));
  CHECK(v.to_vector() == std::vector<double>{1, 2});  // nothing ran
  // Without a write, sharing memory is harmless.
  auto read_only = xg::jit([](const TD& a, const TD& b) { return xg::sum(a) + xg::sum(b); });
  CHECK(read_only(v, xg::reshape(v, {2, 1})).item() == 6.0);

  // An argument that is also a tensor the function reads by reference and writes.
  auto state = xg::tensor<double>({5.0, 6.0});
  auto step = xg::jit([&state](const TD& a) {
    state.assign(state + a);
    return a * 2.0;
  });
  auto capture_msg = message_of<xg::ValueError>([&] { step(state); });
  CHECK(contains(capture_msg, "the tensor (f64[2]) that the function reads by reference and argument 0 share memory"));
  // Traced with another tensor first, the same call is caught on the cache hit.
  auto other = xg::tensor<double>({1.0, 1.0});
  CHECK(step(other).to_vector() == std::vector<double>{2, 2});
  CHECK(state.to_vector() == std::vector<double>{6, 7});
  capture_msg = message_of<xg::ValueError>([&] { step(state); });
  CHECK(contains(capture_msg, "the function writes into the tensor (f64[2]) that the function reads by reference"));
  CHECK(state.to_vector() == std::vector<double>{6, 7});
}

TEST_CASE("JitConfig and WhileOptions: values that would be misread throw ValueError naming the field") {
  auto f = [](const TD& a) { return a * 2.0; };
  auto msg = message_of<xg::ValueError>([&] { xg::jit(f, {.max_retraces = -5}); });
  CHECK(contains(msg, "JitConfig::max_retraces"));
  CHECK(contains(msg, "got -5"));
  msg = message_of<xg::ValueError>([&] { xg::jit(f, {.level = static_cast<xg::JitLevel>(7)}); });
  CHECK(contains(msg, "JitConfig::level"));
  msg = message_of<xg::ValueError>([&] { xg::jit(f, {.disabled_passes = {"fusion"}}); });
  CHECK(contains(msg, "JitConfig::disabled_passes: unknown pass 'fusion'"));
  msg = message_of<xg::ValueError>([&] {
    xg::while_loop([](const TD& c) { return xg::sum(c) < 3.0; }, [](const TD& c) { return c + 1.0; },
                   xg::zeros<double>({1}), {.max_iters = -2});
  });
  CHECK(contains(msg, "WhileOptions::max_iters"));

  // -1 stays "no limit": every new shape traces.
  xgrad::testing::LogCapture log;
  auto unlimited = xg::jit(f, {.max_retraces = -1});
  for (int n = 1; n <= 4; ++n) unlimited(xg::ones<double>({n}));
  CHECK(unlimited.cache_size() == 4);
  auto none = xg::jit(f, {.max_retraces = 0});
  none(xg::ones<double>({1}));
  CHECK_THROWS_AS(none(xg::ones<double>({2})), xg::RetraceError);

  // fori_loop's index is an int32 tensor: bounds outside int32 are refused, not wrapped (and
  // hi - lo cannot overflow).
  auto body = [](xg::Tensor<std::int32_t>, const TD& c) { return c + 1.0; };
  const auto x = xg::ones<double>({1});
  auto wide = message_of<xg::ValueError>([&] { xg::fori_loop(std::int64_t{1} << 40, 0, body, x); });
  CHECK(contains(wide, "ForiLoop"));
  CHECK(contains(wide, "must fit int32"));
  CHECK_THROWS_AS(xg::fori_loop(INT64_MIN, INT64_MAX, body, x), xg::ValueError);
  CHECK(xg::fori_loop(3, -5, body, x).item() == 1.0);  // an empty range runs no iteration
}

TEST_CASE("jit: a tensor kept from a trace and used after it ended says so") {
  TD kept;
  auto leak = xg::jit([&kept](const TD& a) {
    kept = a * 2.0;  // symbolic: it stands for a value of this trace's graph
    return a;
  });
  leak(xg::ones<double>({3}));
  auto msg = message_of<xg::ValueError>([&] { xg::jit([](const TD& a) { return a + 1.0; })(kept); });
  CHECK(contains(msg, "argument 0 (Float64[3]) is a tensor made inside a jit trace and kept after that trace ended"));
  CHECK(contains(msg, "Return it from the jitted function"));
  // Used inside another trace, the tracer says the same.
  msg = message_of<xg::ValueError>([&] { xg::jit([&kept](const TD& a) { return a + kept; })(xg::ones<double>({3})); });
  CHECK(contains(msg, "escaped the function that made it"));
  // Read eagerly, with no trace running: the same explanation, not "while jit traces".
  msg = message_of<xg::ValueError>([&] { kept.to_vector(); });
  CHECK(contains(msg, "was made inside a jit trace and kept after the trace ended"));
  CHECK(!contains(msg, "while jit traces"));
  CHECK_THROWS_WITH_AS(kept + 1.0, doctest::Contains("Return it from the jitted function"), xg::ValueError);
}

TEST_CASE("jit captures: a float is baked in at trace time; the cache keeps it until a retrace") {
  double scale = 2.0;
  auto f = xg::jit([&scale](const TD& a) { return a * scale; });
  auto three = xg::ones<double>({3});
  CHECK(f(three).to_vector() == std::vector<double>{2, 2, 2});
  scale = 10.0;
  CHECK(f(three).to_vector() == std::vector<double>{2, 2, 2});  // the cached graph holds 2
  xgrad::testing::LogCapture log;
  CHECK(f(xg::ones<double>({2})).to_vector() == std::vector<double>{10, 10});  // a new shape traces: 10
  CHECK(f(three).to_vector() == std::vector<double>{2, 2, 2});                 // the old graph still holds 2
  // Passed as an argument, a float is part of the signature: a new value traces again.
  auto g = xg::jit([](const TD& a, double s) { return a * s; });
  CHECK(g(three, 2.0).to_vector() == std::vector<double>{2, 2, 2});
  CHECK(g(three, 10.0).to_vector() == std::vector<double>{10, 10, 10});
  CHECK(g.cache_size() == 2);
}

TEST_CASE("jit captures: a captured tensor is read by reference; reassigning the variable is not seen") {
  auto w = xg::tensor<double>({1.0, 2.0});
  auto f = xg::jit([&w](const TD& a) { return a * w; });
  auto a = xg::ones<double>({2});
  CHECK(f(a).to_vector() == std::vector<double>{1, 2});
  w.assign(xg::tensor<double>({3.0, 4.0}));  // in place: the graph reads the new value
  CHECK(f(a).to_vector() == std::vector<double>{3, 4});
  {
    xg::no_grad off;
    w *= 2.0;
  }
  CHECK(f(a).to_vector() == std::vector<double>{6, 8});
  w = xg::tensor<double>({100.0, 100.0});  // another tensor: the graph keeps reading the old one
  CHECK(f(a).to_vector() == std::vector<double>{6, 8});
  CHECK(f.cache_size() == 1);
}

TEST_CASE("jit captures: a captured std::vector is read as it was at trace time; as an argument its size retraces") {
  std::vector<TD> terms{xg::ones<double>({2})};
  auto total = xg::jit([&terms](const TD& a) {
    TD out = a;
    for (const auto& t : terms) out = out + t;  // unrolled over the size at trace time
    return out;
  });
  auto zero = xg::zeros<double>({2});
  CHECK(total(zero).to_vector() == std::vector<double>{1, 1});
  terms.push_back(xg::full<double>({2}, 5.0));
  CHECK(total(zero).to_vector() == std::vector<double>{1, 1});  // the second term is not seen
  terms[0].assign(xg::full<double>({2}, 3.0));                  // but the first is read by reference
  CHECK(total(zero).to_vector() == std::vector<double>{3, 3});

  auto sum_all = xg::jit([](const std::vector<TD>& ts) {
    TD out = ts[0];
    for (std::size_t i = 1; i < ts.size(); ++i) out = out + ts[i];
    return out;
  });
  xgrad::testing::LogCapture log;
  CHECK(sum_all(terms).to_vector() == std::vector<double>{8, 8});
  terms.push_back(xg::ones<double>({2}));
  CHECK(sum_all(terms).to_vector() == std::vector<double>{9, 9});
  CHECK(sum_all.cache_size() == 2);
  REQUIRE(log.lines.size() == 1);
  CHECK(contains(log.lines[0], "a container's size"));
}

TEST_CASE("jit captures: C++ side effects run once per trace; xg::print runs on every call") {
  int calls = 0;
  std::vector<int> seen;
  auto f = xg::jit([&](const TD& a) {
    ++calls;
    seen.push_back(static_cast<int>(a.numel()));
    xg::print("a", a);
    return a + 1.0;
  });
  xgrad::testing::CoutCapture out;
  for (int i = 0; i < 3; ++i) f(xg::ones<double>({2}));
  CHECK(calls == 1);
  CHECK(seen == std::vector<int>{2});
  const std::string text = out.text.str();
  int prints = 0;
  for (std::size_t at = text.find("a Tensor("); at != std::string::npos; at = text.find("a Tensor(", at + 1)) ++prints;
  CHECK(prints == 3);

  // Inside vmap, print shows the whole batch, eagerly and compiled.
  xgrad::testing::CoutCapture batch_out;
  auto show = [](const TD& v) {
    xg::print("v", v);
    return v * 2.0;
  };
  const auto batch = xg::tensor<double>({1, 2, 3, 4}, {2, 2});
  CHECK(xg::vmap(show)(batch).to_vector() == std::vector<double>{2, 4, 6, 8});
  CHECK(xg::jit(xg::vmap(show))(batch).to_vector() == std::vector<double>{2, 4, 6, 8});
  const std::string shown = batch_out.text.str();
  CHECK(contains(shown, "v (vmap: the batch, along axis 0) Tensor("));
  CHECK(shown.find("v (vmap", shown.find("v (vmap") + 1) != std::string::npos);  // both calls printed
}

TEST_CASE("set_mode is process-wide; mode_scope is per thread") {
  struct Restore {
    ~Restore() { xg::set_mode(xg::Mode::eager); }
  } restore;
  xg::set_mode(xg::Mode::graph);
  xg::Mode seen_by_worker = xg::Mode::eager, worker_in_scope = xg::Mode::graph;
  std::thread([&] {
    seen_by_worker = xg::get_mode();
    xg::mode_scope scope(xg::Mode::eager);
    worker_in_scope = xg::get_mode();
  }).join();
  CHECK(seen_by_worker == xg::Mode::graph);
  CHECK(worker_in_scope == xg::Mode::eager);
  CHECK(xg::get_mode() == xg::Mode::graph);  // the worker's scope did not change this thread

  {
    xg::mode_scope scope(xg::Mode::eager);  // this thread only
    xg::Mode other = xg::Mode::eager;
    std::thread([&] { other = xg::get_mode(); }).join();
    CHECK(xg::get_mode() == xg::Mode::eager);
    CHECK(other == xg::Mode::graph);
  }
  std::thread([] { xg::set_mode(xg::Mode::eager); }).join();  // set from another thread
  CHECK(xg::get_mode() == xg::Mode::eager);
  {
    xg::mode_scope scope(xg::Mode::graph);
    xg::set_mode(xg::Mode::eager);  // inside a scope set_mode is seen at once on this thread too
    CHECK(xg::get_mode() == xg::Mode::eager);
  }
}

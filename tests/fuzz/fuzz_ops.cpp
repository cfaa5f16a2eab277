// Fuzz target: every public op and factory (ops/*.hpp, core/factory.hpp, the Tensor methods)
// called with fuzzer-chosen dtypes, shapes (rank 0-4, dims 0, 1, small, negative, huge), axes in
// and out of range, sizes, strides and values (NaN, inf, huge, denormal, INT_MIN, ...). Each call
// runs eagerly, eagerly with backward(), or eagerly and then under xg::jit (strict, so the two
// must agree bitwise). Clean outcomes: a result, or one of xgrad's exceptions with a message.
// Findings (the run aborts): a sanitizer report, any other exception (std::bad_alloc included:
// an allocation that cannot succeed must be a ValueError), a result whose shape or dtype is not
// the op's, a gradient whose shape is not its input's, eager and jit disagreeing (one throws,
// or different shapes or values).
//
// Input: [op] then the op's choices, read as its row asks for them (see In). The table below
// has one row per op: ROW(name, dtypes the op takes, body); in the body T is the chosen dtype.
#include <cstdio>
#include <cstdlib>

#include "fuzz_ops.hpp"

namespace xgrad::fuzz::ops {

// clang-format off
const std::vector<Row> kRowsValues = {
    // Factories (core/factory.hpp), eager and jitted (a constant in the graph).
    ROW("tensor(values, shape)", kAll, auto s = in.sizes(); std::vector<T> v(in.pick(70), in.value<T>()); in.run([=] { return xg::tensor<T>(v, xg::Shape(s)); })),
    ROW("tensor(values)", kAll, std::vector<T> v(in.pick(70), in.value<T>()); in.run([=] { return xg::tensor<T>(v); })),
    ROW("tensor(nested)", kAll, T a = in.value<T>(), b = in.value<T>(); bool ragged = in.flag(); in.run([=] { return ragged ? xg::tensor<T>({{a, b}, {b}}) : xg::tensor<T>({{a, b}, {b, a}}); })),
    ROW("scalar", kAll, T v = in.value<T>(); in.run([=] { return xg::scalar<T>(v); })),
    ROW("full", kAll, auto s = in.sizes(); T v = in.value<T>(); in.run([=] { return xg::full<T>(xg::Shape(s), v); })),
    ROW("zeros", kAll, auto s = in.sizes(); in.run([=] { return xg::zeros<T>(xg::Shape(s)); })),
    ROW("ones", kAll, auto s = in.sizes(); in.run([=] { return xg::ones<T>(xg::Shape(s)); })),
    ROW("full_like", kAll, T v = in.value<T>(); in.run([=](const Tn<T>& x) { return xg::full_like(x, v); }, in.tensor<T>())),
    ROW("zeros_like", kAll, in.run([](const Tn<T>& x) { return xg::zeros_like(x); }, in.tensor<T>())),
    ROW("ones_like", kAll, in.run([](const Tn<T>& x) { return xg::ones_like(x); }, in.tensor<T>())),
    ROW("arange(start, stop, step)", kNum, T a = in.value<T>(), b = in.value<T>(), c = in.value<T>(); in.run([=] { return xg::arange<T>(a, b, c); })),
    ROW("arange(n)", kNum, I64 n = in.any_int(); in.run([=] { return xg::arange<T>(n); })),
    ROW("eye", kNum, I64 n = in.any_int(); in.run([=] { return xg::eye<T>(n); })),
    ROW("randn", kFloat, auto s = in.sizes(); auto seed = in.u64(); in.run([=] { return xg::randn<T>(xg::Shape(s), seed); })),
    ROW("uniform", kFloat, auto s = in.sizes(); T lo = in.value<T>(), hi = in.value<T>(); in.run([=] { return xg::uniform<T>(xg::Shape(s), lo, hi, 3); })),
    ROW("random_uniform", kFloat, auto s = in.sizes(); in.run([=](const Tn<I64>& key) { return xg::random_uniform<T>(key, xg::Shape(s)); }, in.tensor<I64>())),
    ROW("from_xarray(to_xarray)", kAll, in.run_eager([](const Tn<T>& x) { return xg::from_xarray(x.to_xarray()); }, in.tensor<T>())),
    ROW("cast", kAll, with_type<kAll>(in, [&](auto to) { using U = typename decltype(to)::type; in.run([](const Tn<T>& x) { return xg::cast<U>(x); }, in.tensor<T>()); })),

    // Tensor methods.
    ROW("item", kAll, in.run_eager([](const Tn<T>& x) { return xg::scalar<T>(x.item()); }, in.tensor<T>())),
    ROW("detach", kAll, in.run([](const Tn<T>& x) { return x.detach(); }, in.tensor<T>())),
    ROW("to(thrust)", kAll, in.run_eager([](const Tn<T>& x) { return x.to(xg::Device::thrust).to(xg::Device::cpu); }, in.tensor<T>())),
    ROW("operator<<", kAll, in.run_eager([](const Tn<T>& x) { std::ostringstream os; os << x; return xg::scalar<I64>(static_cast<I64>(os.str().size())); }, in.tensor<T>())),
    ROW("print", kAll, in.run([](const Tn<T>& x) { xg::print("fuzz", x); return x; }, in.tensor<T>())),
    ROW("backward", kFloat, in.run_eager([](const Tn<T>& x) { auto y = x.detach(); y.set_requires_grad(true); auto z = xg::square(y); z.backward(); return y.grad(); }, in.tensor<T>())),
    ROW("assign", kAll, in.run_eager([](Tn<T> a, const Tn<T>& b) { return a.assign(b); }, in.tensor<T>(), in.tensor<T>())),
    INPLACE(+, kNum), INPLACE(-, kNum), INPLACE(*, kNum), INPLACE(/, kNum),

    // Elementwise (ops/elementwise.hpp).
    UNARY(neg, kNum), UNARY(exp, kFloat), UNARY(log, kFloat), UNARY(sqrt, kFloat), UNARY(rsqrt, kFloat),
    UNARY(tanh, kFloat), UNARY(sigmoid, kFloat), UNARY(relu, kNum), UNARY(sign, kNum), UNARY(abs, kNum),
    UNARY(square, kNum), UNARY(sin, kFloat), UNARY(cos, kFloat), UNARY(erf, kFloat),
    ROW("unary -", kNum, in.run([](const Tn<T>& x) { return -x; }, in.tensor<T>())),
    BINARY(add, kNum), BINARY(sub, kNum), BINARY(mul, kNum), BINARY(div, kNum), BINARY(pow, kNum),
    BINARY(maximum, kNum), BINARY(minimum, kNum), BINARY(equal, kAll), BINARY(less, kNum), BINARY(greater, kNum),
    OPERATOR(+, kNum, true), OPERATOR(-, kNum, true), OPERATOR(*, kNum, true), OPERATOR(/, kNum, true),
    OPERATOR(<, kNum, false), OPERATOR(>, kNum, false),  // no scalar < tensor operator
    ROW("where", kAll, in.run([](const Tn<bool>& c, const Tn<T>& a, const Tn<T>& b) { return xg::where(c, a, b); }, in.tensor<bool>(), in.tensor<T>(), in.tensor<T>())),
    ROW("where(c, a, scalar)", kAll, T s = in.value<T>(); in.run([s](const Tn<bool>& c, const Tn<T>& a) { return xg::where(c, a, s); }, in.tensor<bool>(), in.tensor<T>())),
    ROW("where(c, scalar, b)", kAll, T s = in.value<T>(); in.run([s](const Tn<bool>& c, const Tn<T>& b) { return xg::where(c, s, b); }, in.tensor<bool>(), in.tensor<T>())),
    ROW("fma", kFloat, in.run([](const Tn<T>& a, const Tn<T>& b, const Tn<T>& c) { return xg::fma(a, b, c); }, in.tensor<T>(), in.tensor<T>(), in.tensor<T>())),
    ROW("clip", kNum, T lo = in.value<T>(), hi = in.value<T>(); in.run([=](const Tn<T>& x) { return xg::clip(x, lo, hi); }, in.tensor<T>())),
};
// clang-format on

/// The table's parts, in order: an input's first byte picks a row.
const std::vector<const Row*>& rows() {
  static const std::vector<const Row*> all = [] {
    std::vector<const Row*> out;
    for (const auto* part : {&kRowsValues, &kRowsShapes, &kRowsNn})
      for (const Row& r : *part) out.push_back(&r);
    return out;
  }();
  return all;
}

}  // namespace xgrad::fuzz::ops

using xgrad::fuzz::ops::rows;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Two seeds per row: its index, then a filler of small choices (ranks, dims, values, the way
  // to run) that the row reads as it reads any bytes.
  xf::write_seeds_if_asked([](const std::string& dir) {
    const std::vector<std::uint8_t> fillers[] = {{2, 3, 2, 1, 3, 7}, {3, 2, 3, 2, 1, 2, 5}};
    for (std::size_t row = 0; row < rows().size(); ++row)
      for (std::size_t k = 0; k < 2; ++k) {
        std::vector<std::uint8_t> seed{static_cast<std::uint8_t>(row)};
        for (std::size_t i = 0; i < 20; ++i) seed.push_back(fillers[k][i % fillers[k].size()]);
        char name[32];
        std::snprintf(name, sizeof name, "row%03zu_%zu", row, k);
        xf::write_seed(dir, name, seed);
      }
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  xgrad::fuzz::ops::In in(data, size);
  const auto& row = *rows()[in.pick(rows().size())];
  if (const char* trace = std::getenv("XGRAD_FUZZ_TRACE"); trace && *trace) std::fprintf(stderr, "op: %s\n", row.name);
  xf::refuses_cleanly([&] { row.run(in); });
  return 0;
}

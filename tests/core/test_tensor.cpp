// Tests for Tensor<T>: factories, accessors, printing, xtensor interop, cast, Parameter, views, errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::here;
using xgrad::testing::message_of;

namespace {

using Dims = std::vector<std::int64_t>;

template <class T> std::string to_string(const xg::Tensor<T>& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

}  // namespace

TEST_CASE("tensor: nested lists of rank 1 to 4 give row-major data and the right shape") {
  auto r1 = xg::tensor<float>({1, 2, 3});
  CHECK(r1.shape() == Dims{3});
  CHECK(r1.ndim() == 1);
  CHECK(r1.numel() == 3);
  CHECK(r1.to_vector() == std::vector<float>{1, 2, 3});

  auto r2 = xg::tensor<float>({{0.8, 0.6, 0.2}, {1.8, 1.3, 1.1}});
  CHECK(r2.shape() == Dims{2, 3});
  CHECK(r2.ndim() == 2);
  CHECK(r2.numel() == 6);
  CHECK(r2.to_vector() == std::vector<float>{0.8f, 0.6f, 0.2f, 1.8f, 1.3f, 1.1f});

  auto r3 = xg::tensor<int>({{{1, 2}, {3, 4}, {5, 6}}, {{7, 8}, {9, 10}, {11, 12}}});
  CHECK(r3.shape() == Dims{2, 3, 2});
  CHECK(r3.ndim() == 3);
  CHECK(r3.numel() == 12);
  std::vector<int> expected3(12);
  for (int i = 0; i < 12; ++i) expected3[i] = i + 1;
  CHECK(r3.to_vector() == expected3);

  auto r4 = xg::tensor<double>({{{{1, 2, 3}}, {{4, 5, 6}}}});
  CHECK(r4.shape() == Dims{1, 2, 1, 3});
  CHECK(r4.ndim() == 4);
  CHECK(r4.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});

  auto b = xg::tensor<bool>({{true, false}, {false, true}});
  CHECK(b.shape() == Dims{2, 2});
  CHECK(b.to_vector() == std::vector<bool>{true, false, false, true});

  auto i64 = xg::tensor<std::int64_t>({-5, 0, 7});
  CHECK(i64.dtype() == xg::DType::int64);
  CHECK(i64.to_vector() == std::vector<std::int64_t>{-5, 0, 7});
}

TEST_CASE("tensor: from a vector, from a vector and a shape, and scalars") {
  auto v = xg::tensor<float>(std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(v.shape() == Dims{6});
  CHECK(v.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

  auto m = xg::tensor<float>(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(m.shape() == Dims{2, 3});
  CHECK(m.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

  auto m3 = xg::tensor<std::int32_t>(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  CHECK(m3.shape() == Dims{2, 2, 2});
  CHECK(m3.dtype() == xg::DType::int32);

  auto s = xg::scalar<float>(2.0f);
  CHECK(s.ndim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.shape() == Dims{});
  CHECK(s.item() == 2.0f);

  // A data-free shape [0] still makes a valid, empty tensor.
  auto e = xg::tensor<float>(std::vector<float>{}, xg::Shape{0, 3});
  CHECK(e.numel() == 0);
  CHECK(e.shape() == Dims{0, 3});
}

TEST_CASE("tensor: dtype() matches the element type") {
  CHECK(xg::zeros<float>({1}).dtype() == xg::DType::float32);
  CHECK(xg::zeros<double>({1}).dtype() == xg::DType::float64);
  CHECK(xg::zeros<std::int32_t>({1}).dtype() == xg::DType::int32);
  CHECK(xg::zeros<std::int64_t>({1}).dtype() == xg::DType::int64);
  CHECK(xg::zeros<bool>({1}).dtype() == xg::DType::boolean);
}

TEST_CASE("tensor: zeros, ones, full") {
  auto z = xg::zeros<float>({2, 3});
  CHECK(z.shape() == Dims{2, 3});
  CHECK(z.to_vector() == std::vector<float>(6, 0.0f));

  auto o = xg::ones<std::int64_t>({4});
  CHECK(o.to_vector() == std::vector<std::int64_t>(4, 1));

  auto f = xg::full<double>({3, 1, 2}, 2.5);
  CHECK(f.shape() == Dims{3, 1, 2});
  CHECK(f.to_vector() == std::vector<double>(6, 2.5));

  auto fb = xg::full<bool>({2}, true);
  CHECK(fb.to_vector() == std::vector<bool>{true, true});

  // Rank 0 through the shape-based factories.
  auto z0 = xg::zeros<float>({});
  CHECK(z0.ndim() == 0);
  CHECK(z0.item() == 0.0f);
}

TEST_CASE("tensor: arange and eye") {
  CHECK(xg::arange<float>(5).to_vector() == std::vector<float>{0, 1, 2, 3, 4});
  CHECK(xg::arange<std::int32_t>(4).to_vector() == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(xg::arange<std::int64_t>(0).numel() == 0);
  CHECK(xg::arange<float>(0.0f, 1.0f, 0.25f).to_vector() == std::vector<float>{0.0f, 0.25f, 0.5f, 0.75f});
  CHECK(xg::arange<std::int32_t>(5, 0, -2).to_vector() == std::vector<std::int32_t>{5, 3, 1});
  CHECK(xg::arange<std::int32_t>(1, 8, 3).to_vector() == std::vector<std::int32_t>{1, 4, 7});

  auto i3 = xg::eye<float>(3);
  CHECK(i3.shape() == Dims{3, 3});
  std::vector<float> expected(9, 0.0f);
  for (int i = 0; i < 3; ++i) expected[i * 3 + i] = 1.0f;
  CHECK(i3.to_vector() == expected);
  CHECK(xg::eye<std::int64_t>(1).to_vector() == std::vector<std::int64_t>{1});
}

TEST_CASE("tensor: randn is deterministic per seed and roughly standard normal") {
  auto a = xg::randn<float>({5, 3}, 42);
  auto b = xg::randn<float>({5, 3}, 42);
  auto c = xg::randn<float>({5, 3}, 43);
  CHECK(a.shape() == Dims{5, 3});
  CHECK(a.to_vector() == b.to_vector());
  CHECK(a.to_vector() != c.to_vector());

  const int n = 20000;
  auto r = xg::randn<double>({n}, 7).to_vector();
  double mean = 0, sq = 0;
  int within_one = 0;
  for (double x : r) {
    mean += x;
    within_one += std::abs(x) < 1.0;
  }
  mean /= n;
  for (double x : r) sq += (x - mean) * (x - mean);
  double stddev = std::sqrt(sq / (n - 1));
  // Standard errors are about 0.007 for both; 0.05 is a wide margin.
  CHECK(std::abs(mean) < 0.05);
  CHECK(std::abs(stddev - 1.0) < 0.05);
  // About 68.3% of a normal lies within one standard deviation.
  CHECK(std::abs(within_one / double(n) - 0.683) < 0.02);
}

TEST_CASE("tensor: uniform is deterministic per seed, stays in [lo, hi) and is roughly flat") {
  auto a = xg::uniform<float>({4, 4}, -2.0f, 3.0f, 5);
  auto b = xg::uniform<float>({4, 4}, -2.0f, 3.0f, 5);
  auto c = xg::uniform<float>({4, 4}, -2.0f, 3.0f, 6);
  CHECK(a.to_vector() == b.to_vector());
  CHECK(a.to_vector() != c.to_vector());

  const int n = 20000;
  const double lo = -2.0, hi = 3.0;
  auto r = xg::uniform<double>({n}, lo, hi, 11).to_vector();
  double mean = 0, sq = 0;
  int below_middle = 0;
  bool in_range = true;
  for (double x : r) {
    in_range = in_range && x >= lo && x < hi;
    mean += x;
    below_middle += x < (lo + hi) / 2;
  }
  mean /= n;
  for (double x : r) sq += (x - mean) * (x - mean);
  double var = sq / (n - 1);
  CHECK(in_range);
  CHECK(std::abs(mean - (lo + hi) / 2) < 0.05);
  CHECK(std::abs(var - (hi - lo) * (hi - lo) / 12) < 0.1);
  CHECK(std::abs(below_middle / double(n) - 0.5) < 0.02);
}

TEST_CASE("tensor: zeros_like, ones_like, full_like keep shape and dtype") {
  auto x = xg::tensor<double>({{1, 2, 3}, {4, 5, 6}});
  auto z = xg::zeros_like(x);
  auto o = xg::ones_like(x);
  auto f = xg::full_like(x, -1.5);
  for (const auto& t : {z, o, f}) {
    CHECK(t.shape() == x.shape());
    CHECK(t.dtype() == xg::DType::float64);
  }
  CHECK(z.to_vector() == std::vector<double>(6, 0.0));
  CHECK(o.to_vector() == std::vector<double>(6, 1.0));
  CHECK(f.to_vector() == std::vector<double>(6, -1.5));
  // A fresh buffer, not a view of x.
  CHECK(z.impl()->storage != x.impl()->storage);
  CHECK(x.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});

  auto zi = xg::zeros_like(xg::tensor<std::int32_t>({{1, 2}}));
  CHECK(zi.shape() == Dims{1, 2});
  CHECK(zi.dtype() == xg::DType::int32);
}

TEST_CASE("tensor: item works on one element of any rank and throws otherwise") {
  CHECK(xg::tensor<float>({3.5f}).item() == 3.5f);
  CHECK(xg::tensor<std::int32_t>(std::vector<std::int32_t>{-4}, {1, 1, 1}).item() == -4);
  CHECK(xg::scalar<double>(0.25).item() == 0.25);
  CHECK(xg::scalar<bool>(true).item() == true);
  CHECK_THROWS_AS((void)xg::tensor<float>({1, 2}).item(), xg::ShapeError);
  CHECK_THROWS_AS((void)xg::zeros<float>({0}).item(), xg::ShapeError);
  auto msg = message_of<xg::ShapeError>([] { (void)xg::zeros<float>({2, 2}).item(); });
  CHECK(msg.find("item") != std::string::npos);
  CHECK(msg.find("[2, 2]") != std::string::npos);
}

TEST_CASE("tensor: Shape compares with vectors and prints as a list") {
  xg::Shape s{2, 3, 4};
  CHECK(s == Dims{2, 3, 4});
  CHECK_FALSE(s == Dims{2, 3});
  CHECK_FALSE(s == Dims{2, 3, 5});
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(xg::Shape{}.str() == "[]");
  CHECK(xg::Shape{}.numel() == 1);
  auto strides = s.strides();
  CHECK(strides[0] == 12);
  CHECK(strides[1] == 4);
  CHECK(strides[2] == 1);
}

TEST_CASE("tensor: printing a rank-1 float tensor") {
  auto x = xg::tensor<float>({1, 2, 3}) + xg::tensor<float>({4, 5, 6});
  CHECK(to_string(x) == "Tensor(shape=[3], dtype=Float32, value=[5, 7, 9])");
  CHECK(to_string(xg::tensor<float>({0.5f, -1.25f})) == "Tensor(shape=[2], dtype=Float32, value=[0.5, -1.25])");
}

TEST_CASE("tensor: printing rank 0, 2 and 3 tensors") {
  CHECK(to_string(xg::scalar<float>(2.5f)) == "Tensor(shape=[], dtype=Float32, value=2.5)");
  // Rank 2 and above start the values on a new line, one row per line, NumPy-aligned.
  CHECK(to_string(xg::tensor<float>({{1, 2, 3}, {4, 5, 6}})) ==
        "Tensor(shape=[2, 3], dtype=Float32, value=\n[[1, 2, 3],\n [4, 5, 6]])");
  // Between blocks of rank 3, a blank line, as NumPy prints.
  CHECK(to_string(xg::tensor<double>({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}})) ==
        "Tensor(shape=[2, 2, 2], dtype=Float64, value=\n[[[1, 2],\n  [3, 4]],\n\n [[5, 6],\n  [7, 8]]])");
}

TEST_CASE("tensor: printing bool, int and undefined tensors") {
  CHECK(to_string(xg::tensor<bool>({true, false, true})) == "Tensor(shape=[3], dtype=Bool, value=[True, False, True])");
  CHECK(to_string(xg::tensor<std::int32_t>({-1, 0, 42})) == "Tensor(shape=[3], dtype=Int32, value=[-1, 0, 42])");
  CHECK(to_string(xg::tensor<std::int64_t>(std::vector<std::int64_t>{10000000000, -3}, {2, 1})) ==
        "Tensor(shape=[2, 1], dtype=Int64, value=\n[[10000000000],\n [-3]])");
  CHECK(to_string(xg::Tensor<float>()) == "Tensor(undefined)");
}

TEST_CASE("tensor: printing a large tensor shows only the edges of each axis") {
  // Past 1000 elements, the first and last three entries of an axis are kept.
  auto s = to_string(xg::arange<std::int32_t>(1001));
  CHECK(s == "Tensor(shape=[1001], dtype=Int32, value=[0, 1, 2, ..., 998, 999, 1000])");
  // At the threshold everything is printed.
  auto full = to_string(xg::arange<std::int32_t>(1000));
  CHECK(full.find("...") == std::string::npos);
  CHECK(full.find(", 500, ") != std::string::npos);
}

TEST_CASE("tensor: xtensor round trip for float and int") {
  xt::xarray<double> a{{1.5, 2.5, 3.5}, {4.5, 5.5, 6.5}};
  auto t = xg::from_xarray(a);
  CHECK(t.dtype() == xg::DType::float64);
  CHECK(t.shape() == Dims{2, 3});
  CHECK(t.to_vector() == std::vector<double>{1.5, 2.5, 3.5, 4.5, 5.5, 6.5});
  xt::xarray<double> back = t.to_xarray();
  CHECK(back.shape().size() == 2);
  CHECK(back.shape()[0] == 2);
  CHECK(back.shape()[1] == 3);
  CHECK(back == a);

  xt::xarray<float> af{{{1, 2}}, {{3, 4}}, {{5, 6}}};
  auto tf = xg::from_xarray(af);
  CHECK(tf.dtype() == xg::DType::float32);
  CHECK(tf.shape() == Dims{3, 1, 2});
  CHECK(tf.to_xarray() == af);

  xt::xarray<std::int32_t> ai{{1, -2}, {3, -4}};
  auto ti = xg::from_xarray(ai);
  CHECK(ti.dtype() == xg::DType::int32);
  CHECK(ti.to_vector() == std::vector<std::int32_t>{1, -2, 3, -4});
  CHECK(ti.to_xarray() == ai);

  xt::xarray<std::int64_t> al{7, 8, 9};
  auto tl = xg::from_xarray(al);
  CHECK(tl.dtype() == xg::DType::int64);
  CHECK(tl.to_xarray() == al);

  // to_xarray copies: changing the array leaves the tensor alone.
  auto copy = t.to_xarray();
  copy(0, 0) = -100.0;
  CHECK(t.to_vector()[0] == 1.5);
}

TEST_CASE("tensor: cast between dtypes") {
  auto x = xg::tensor<float>({-2.7f, -0.5f, 0.0f, 1.5f, 3.9f});
  auto d = xg::cast<double>(x);
  CHECK(d.dtype() == xg::DType::float64);
  CHECK(d.shape() == x.shape());
  CHECK(d.to_vector() == std::vector<double>{-2.7f, -0.5f, 0.0f, 1.5f, 3.9f});

  // Float to int truncates toward zero, as static_cast does.
  auto i = xg::cast<std::int32_t>(x);
  CHECK(i.dtype() == xg::DType::int32);
  CHECK(i.to_vector() == std::vector<std::int32_t>{-2, 0, 0, 1, 3});

  auto b = xg::cast<bool>(x);
  CHECK(b.to_vector() == std::vector<bool>{true, true, false, true, true});

  auto back = xg::cast<float>(xg::tensor<std::int64_t>({{1, 2}, {3, 4}}));
  CHECK(back.dtype() == xg::DType::float32);
  CHECK(back.shape() == Dims{2, 2});
  CHECK(back.to_vector() == std::vector<float>{1, 2, 3, 4});

  auto from_bool = xg::cast<std::int32_t>(xg::tensor<bool>({true, false}));
  CHECK(from_bool.to_vector() == std::vector<std::int32_t>{1, 0});
}

TEST_CASE("tensor: comparisons give Tensor<bool>") {
  auto a = xg::tensor<float>({1, 5, 3});
  auto b = xg::tensor<float>({2, 5, 1});
  xg::Tensor<bool> gt = a > b;
  xg::Tensor<bool> lt = a < b;
  xg::Tensor<bool> eq = xg::equal(a, b);
  CHECK(gt.dtype() == xg::DType::boolean);
  CHECK(gt.to_vector() == std::vector<bool>{false, false, true});
  CHECK(lt.to_vector() == std::vector<bool>{true, false, false});
  CHECK(eq.to_vector() == std::vector<bool>{false, true, false});
  CHECK((a > 2.0f).to_vector() == std::vector<bool>{false, true, true});
  CHECK((a < 2.0f).to_vector() == std::vector<bool>{true, false, false});

  // Broadcasting applies to comparisons too.
  auto m = xg::greater(xg::tensor<std::int32_t>(std::vector<std::int32_t>{1, 4}, {2, 1}),
                       xg::tensor<std::int32_t>({0, 2, 4}));
  CHECK(m.shape() == Dims{2, 3});
  CHECK(m.to_vector() == std::vector<bool>{true, false, false, true, true, false});
}

TEST_CASE("tensor: Parameter has a name, requires grad and shares identity on copy") {
  auto init = xg::tensor<float>({1, 2, 3});
  xg::Parameter<float> w(init, "w");
  CHECK(w.name() == "w");
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK(w.to_vector() == std::vector<float>{1, 2, 3});
  // The initial value is not turned into a Parameter itself.
  CHECK_FALSE(init.requires_grad());
  CHECK(init.name() == "");

  xg::Parameter<float> copy = w;
  CHECK(copy.impl() == w.impl());
  CHECK(copy.name() == "w");
  {
    xg::no_grad guard;
    copy += 10.0f;
  }
  CHECK(w.to_vector() == std::vector<float>{11, 12, 13});

  // As a Tensor<float> (how functions take it) it is still the same tensor.
  xg::Tensor<float> as_tensor = w;
  CHECK(as_tensor.impl() == w.impl());
  CHECK(as_tensor.requires_grad());

  xg::Parameter<double> d(xg::zeros<double>({2, 2}), "bias");
  CHECK(d.name() == "bias");
  CHECK(d.dtype() == xg::DType::float64);
  CHECK(d.shape() == Dims{2, 2});

  // Plain tensors have no name and do not require grad.
  CHECK(xg::ones<float>({2}).name() == "");
  CHECK_FALSE(xg::ones<float>({2}).requires_grad());
}

TEST_CASE("tensor: copies are handles to one tensor; detach shares the storage") {
  auto x = xg::tensor<float>({1, 2, 3});
  auto y = x;
  y += 1.0f;
  CHECK(x.to_vector() == std::vector<float>{2, 3, 4});

  auto d = x.detach();
  CHECK(d.impl() != x.impl());
  CHECK(d.impl()->storage == x.impl()->storage);
  d *= 2.0f;
  CHECK(x.to_vector() == std::vector<float>{4, 6, 8});
}

namespace {

/// The flags of the mapping that holds `address`, from /proc/self/smaps ("" when none holds it).
std::string mapping_flags(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("tensor: a buffer of 2 MiB or more starts a 2 MiB page and is advised onto huge pages") {
  constexpr std::uintptr_t huge_page = std::uintptr_t{2} << 20;
  xg::release_cached_memory();
  const void* first = nullptr;
  {
    auto big = xg::zeros<float>({768, 1024});  // 3 MiB: a buffer of 4
    first = big.data();
    CHECK(reinterpret_cast<std::uintptr_t>(first) % huge_page == 0);
#if defined(__linux__)
    if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
      const std::string flags = mapping_flags(first);
      INFO(flags);
      CHECK(flags.find(" hg") != std::string::npos);  // MADV_HUGEPAGE
    } else {
      MESSAGE("this kernel has no transparent huge pages: only the alignment is checked");
    }
#endif
  }
  // The freed buffer is kept and given to the next tensor whose size rounds to the same pages.
  CHECK(xg::cached_memory_bytes() == (std::size_t{4} << 20));
  auto next = xg::zeros<float>({1000, 1024});
  CHECK(next.data() == first);
  CHECK(xg::cached_memory_bytes() == 0);
}

TEST_CASE("tensor: reshape is a view sharing storage") {
  auto x = xg::arange<float>(6);
  auto m = xg::reshape(x, Dims{2, 3});
  CHECK(m.shape() == Dims{2, 3});
  CHECK(m.to_vector() == x.to_vector());
  CHECK(m.impl()->storage == x.impl()->storage);
  CHECK(m.data() == x.data());

  // A write through the view is seen by the original, and the reverse.
  m += 10.0f;
  CHECK(x.to_vector() == std::vector<float>{10, 11, 12, 13, 14, 15});
  x.data()[0] = -1.0f;
  CHECK(m.to_vector()[0] == -1.0f);

  // The shared version counter moves for every view.
  auto before = x.version();
  m *= 2.0f;
  CHECK(x.version() > before);
  CHECK(m.version() == x.version());

  auto inferred = xg::reshape(x, Dims{3, -1});
  CHECK(inferred.shape() == Dims{3, 2});
  auto leading = xg::reshape(x, Dims{-1, 1, 2});
  CHECK(leading.shape() == Dims{3, 1, 2});
  CHECK(xg::reshape(x, xg::Shape{6}).shape() == Dims{6});
  // The braced form the API documents.
  CHECK(xg::reshape(x, {3, -1}).shape() == Dims{3, 2});
}

TEST_CASE("tensor: grad() before any backward is undefined, and using it throws") {
  auto x = xg::ones<float>({2});
  x.set_requires_grad(true);
  CHECK(x.requires_grad());
  CHECK_FALSE(x.grad().defined());
  CHECK_THROWS_AS((void)x.grad().shape(), xg::AutogradError);
  x.set_requires_grad(false);
  CHECK_FALSE(x.requires_grad());
}

TEST_CASE("tensor errors: a ragged nested list") {
  const int line = __LINE__ + 1;  // the factory call is on the next line
  auto msg = message_of<xg::ValueError>([] { (void)xg::tensor<float>({{1, 2, 3}, {4, 5}}); });
  CHECK(msg.find("tensor") != std::string::npos);
  CHECK(msg.find("ragged") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);

  // The first sub-list sets the shape; a longer later one is ragged too.
  CHECK_THROWS_AS((void)xg::tensor<float>({{1}, {2, 3}}), xg::ValueError);
  CHECK_THROWS_AS((void)xg::tensor<float>({{{1, 2}, {3, 4}}, {{5, 6}}}), xg::ValueError);
  CHECK_THROWS_AS((void)xg::tensor<int>({{{{1, 2}}, {{3, 4}, {5, 6}}}}), xg::ValueError);
  // ValueError is an invalid_argument, so generic handlers catch it.
  CHECK_THROWS_AS((void)xg::tensor<float>({{1}, {2, 3}}), std::invalid_argument);
}

TEST_CASE("tensor errors: negative sizes") {
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::randn<float>({3, -2}, 1); });
    CHECK(msg.find("randn") != std::string::npos);
    CHECK(msg.find("-2") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::uniform<float>({-1}, 0.0f, 1.0f, 1); });
    CHECK(msg.find("uniform") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::full<float>({2, -3}, 1.0f); });
    CHECK(msg.find("full") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::tensor<float>(std::vector<float>{}, {-1, 0}); });
    CHECK(msg.find("tensor") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::arange<std::int32_t>(-4); });
    CHECK(msg.find("arange") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  // zeros and ones report their caller's line as well.
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::zeros<float>({-5}); });
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  CHECK_THROWS_AS((void)xg::ones<double>({1, -1}), xg::ValueError);
  CHECK_THROWS_AS((void)xg::eye<float>(-2), xg::ValueError);
}

TEST_CASE("tensor errors: bad factory arguments other than sizes") {
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::arange<float>(0.0f, 1.0f, 0.0f); });
    CHECK(msg.find("arange") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ValueError>([] { (void)xg::uniform<double>({2}, 1.0, 1.0, 0); });
    CHECK(msg.find("uniform") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
}

TEST_CASE("tensor errors: a vector whose length does not fit the shape") {
  const int line = __LINE__ + 1;
  auto msg = message_of<xg::ValueError>([] { (void)xg::tensor<float>(std::vector<float>{1, 2, 3, 4, 5}, {2, 3}); });
  CHECK(msg.find("tensor") != std::string::npos);
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("5") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);

  CHECK_THROWS_AS((void)xg::tensor<std::int32_t>(std::vector<std::int32_t>{1, 2, 3}, {2}), xg::ValueError);
  // A rank-0 shape holds exactly one value.
  CHECK_THROWS_AS((void)xg::tensor<float>(std::vector<float>{1, 2}, xg::Shape{}), xg::ValueError);
  CHECK(xg::tensor<float>(std::vector<float>{7}, xg::Shape{}).item() == 7.0f);
}

TEST_CASE("tensor errors: bad reshapes") {
  auto x = xg::arange<float>(6);
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ShapeError>([&] { (void)xg::reshape(x, Dims{-1, -1}); });
    CHECK(msg.find("Reshape") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ShapeError>([&] { (void)xg::reshape(x, Dims{4, 2}); });
    CHECK(msg.find("Reshape") != std::string::npos);
    CHECK(msg.find("[6]") != std::string::npos);
    CHECK(msg.find("[4, 2]") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::ShapeError>([&] { (void)xg::reshape(x, Dims{4, -1}); });
    CHECK(msg.find("Reshape") != std::string::npos);
    CHECK(msg.find(here(line)) != std::string::npos);
  }
  CHECK_THROWS_AS((void)xg::reshape(x, Dims{-2, -3}), xg::ShapeError);
  CHECK_THROWS_AS((void)xg::reshape(x, Dims{0, -1}), xg::ShapeError);
  // A failed reshape leaves the input as it was.
  CHECK(x.shape() == Dims{6});
}

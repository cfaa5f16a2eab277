// Device::thrust's fused groups from the inside: which groups one functor can run. A white-box
// test (it includes the op structs and the Thrust kernels); test_thrust.cpp runs fused graphs
// on the device from the outside.
#include <doctest/doctest.h>

#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/fused.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/device.hpp"
#include "xgrad/ops/elementwise-inl.hpp"  // op::Fusible and the op structs

namespace xg = xgrad;

TEST_CASE("thrust: float, double and bool values fuse into one functor; integer arithmetic does not") {
  using Group = xg::thrust_backend::FusedGroup<xg::op::Fusible>;
  using xg::detail::fusible_index;
  const xg::Shape shape{3, 4};
  CHECK(Group::make(shape, {{xg::DType::float32, shape}}, {{fusible_index<xg::op::Tanh>(), {0}, xg::DType::float32, 1}},
                    {1})
            .has_value());
  CHECK(Group::make(shape, {{xg::DType::float64, shape}, {xg::DType::float64, xg::Shape{4}}},
                    {{fusible_index<xg::op::Greater>(), {0, 1}, xg::DType::boolean, 2},
                     {fusible_index<xg::op::Where>(), {2, 0, 1}, xg::DType::float64, 3}},
                    {3})
            .has_value());
  CHECK_FALSE(Group::make(shape, {{xg::DType::int32, shape}},
                          {{fusible_index<xg::op::Add>(), {0, 0}, xg::DType::int32, 1}}, {1})
                  .has_value());
}

TEST_CASE("thrust: a group's axes merge where every input walks them as one; broadcasts stay exact") {
  // (a + r) * c + s over [2, 3, 4]: a full; r [3, 1] (broadcast along the last axis, so the
  // first two axes merge for every input but the last does not); c [4] (broadcast along the
  // first two); s a one-element cpu scalar. Then the same with every input full: one axis.
  using Group = xg::thrust_backend::FusedGroup<xg::op::Fusible>;
  using xg::detail::fusible_index;
  const xg::Shape shape{2, 3, 4};
  std::vector<float> a(24), r{1, 2, 3}, c{10, 20, 30, 40};
  for (int i = 0; i < 24; ++i) a[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const auto steps = std::vector<Group::Step>{{fusible_index<xg::op::Add>(), {0, 1}, xg::DType::float32, 4},
                                              {fusible_index<xg::op::Mul>(), {4, 2}, xg::DType::float32, 5},
                                              {fusible_index<xg::op::Add>(), {5, 3}, xg::DType::float32, 6}};
  const auto group = Group::make(shape,
                                 {{xg::DType::float32, shape},
                                  {xg::DType::float32, xg::Shape{3, 1}},
                                  {xg::DType::float32, xg::Shape{4}},
                                  {xg::DType::float32, xg::Shape{}}},
                                 steps, {6});
  REQUIRE(group.has_value());
  const std::vector<xg::TensorBase> in{xg::tensor<float>(a, {2, 3, 4}).to(xg::Device::thrust),
                                       xg::tensor<float>(r, {3, 1}).to(xg::Device::thrust),
                                       xg::tensor<float>(c, {4}).to(xg::Device::thrust), xg::full<float>({}, 0.5f)};
  std::vector<xg::TensorBase> out(1);
  (*group)(in, out);
  const auto got = xg::Tensor<float>(out[0]).to(xg::Device::cpu).to_vector();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        const int at = (i * 3 + j) * 4 + k;
        CAPTURE(at);
        CHECK(got[static_cast<std::size_t>(at)] ==
              (a[static_cast<std::size_t>(at)] + r[static_cast<std::size_t>(j)]) * c[static_cast<std::size_t>(k)] +
                  0.5f);
      }
  const auto full = Group::make(shape, {{xg::DType::float32, shape}, {xg::DType::float32, shape}},
                                {{fusible_index<xg::op::Mul>(), {0, 1}, xg::DType::float32, 2}}, {2});
  REQUIRE(full.has_value());
  const auto on = xg::tensor<float>(a, {2, 3, 4}).to(xg::Device::thrust);
  std::vector<xg::TensorBase> squared(1);
  (*full)(std::vector<xg::TensorBase>{on, on}, squared);
  const auto sq = xg::Tensor<float>(squared[0]).to(xg::Device::cpu).to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(sq[i] == a[i] * a[i]);
}

TEST_CASE("thrust: a group's blocks cross rows, carry into every axis and end mid-block") {
  // where(a > r, a * c, r) and the mask itself over [3, 7, 9] (189 elements: on a host system
  // three blocks of 64, the last one short), r [7, 1] and c [9] broadcast: each block starts
  // and ends inside a row, and walking it carries into both leading axes.
  using Group = xg::thrust_backend::FusedGroup<xg::op::Fusible>;
  using xg::detail::fusible_index;
  const xg::Shape shape{3, 7, 9};
  std::vector<double> a(189), r(7), c(9);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>((i * 37) % 23) - 11.0;
  for (std::size_t j = 0; j < r.size(); ++j) r[j] = static_cast<double>(j) - 3.0;
  for (std::size_t k = 0; k < c.size(); ++k) c[k] = 0.5 * static_cast<double>(k) + 1.0;
  const auto group = Group::make(
      shape, {{xg::DType::float64, shape}, {xg::DType::float64, xg::Shape{7, 1}}, {xg::DType::float64, xg::Shape{9}}},
      {{fusible_index<xg::op::Greater>(), {0, 1}, xg::DType::boolean, 3},
       {fusible_index<xg::op::Mul>(), {0, 2}, xg::DType::float64, 4},
       {fusible_index<xg::op::Where>(), {3, 4, 1}, xg::DType::float64, 5}},
      {5, 3});
  REQUIRE(group.has_value());
  const std::vector<xg::TensorBase> in{xg::tensor<double>(a, {3, 7, 9}).to(xg::Device::thrust),
                                       xg::tensor<double>(r, {7, 1}).to(xg::Device::thrust),
                                       xg::tensor<double>(c, {9}).to(xg::Device::thrust)};
  std::vector<xg::TensorBase> out(2);
  (*group)(in, out);
  const auto got = xg::Tensor<double>(out[0]).to(xg::Device::cpu).to_vector();
  const auto mask = xg::Tensor<bool>(out[1]).to(xg::Device::cpu).to_vector();
  REQUIRE(got.size() == a.size());
  REQUIRE(mask.size() == a.size());
  int wrong = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::size_t j = i / 9 % 7, k = i % 9;
    const bool above = a[i] > r[j];
    wrong += (mask[i] != above) + (got[i] != (above ? a[i] * c[k] : r[j]));
  }
  CHECK(wrong == 0);
}

#endif  // XGRAD_WITH_THRUST

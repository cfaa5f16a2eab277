// Device::thrust's fused groups from the inside: which groups one functor can run. A white-box
// test (it includes the op structs and the Thrust kernels); test_thrust.cpp runs fused graphs
// on the device from the outside.
#include <doctest/doctest.h>

#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/fused.hpp"
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

#endif  // XGRAD_WITH_THRUST

// xgrad::compiled: the elementwise ops (include/xgrad/ops/elementwise.hpp) in every dtype.
#define XGRAD_INSTANTIATE_ELEMENTWISE
#include "xgrad/ops/elementwise-inl.hpp"

namespace xgrad {
XGRAD_ELEMENTWISE_INSTANCES(template)
}  // namespace xgrad

// xgrad::compiled: the factories, reductions, shape ops, in-place updates, device moves, print
// and random numbers (include/xgrad/core/factory.hpp, include/xgrad/ops/).
#define XGRAD_INSTANTIATE_FACTORY
#define XGRAD_INSTANTIATE_REDUCE
#define XGRAD_INSTANTIATE_MANIPULATION
#define XGRAD_INSTANTIATE_INPLACE
#define XGRAD_INSTANTIATE_DEVICE
#define XGRAD_INSTANTIATE_PRINT
#define XGRAD_INSTANTIATE_RANDOM
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/device-inl.hpp"
#include "xgrad/ops/inplace-inl.hpp"
#include "xgrad/ops/manipulation-inl.hpp"
#include "xgrad/ops/print-inl.hpp"
#include "xgrad/ops/random-inl.hpp"
#include "xgrad/ops/reduce-inl.hpp"

namespace xgrad {
XGRAD_FACTORY_INSTANCES(template)
XGRAD_REDUCE_INSTANCES(template)
XGRAD_MANIPULATION_INSTANCES(template)
XGRAD_INPLACE_INSTANCES(template)
XGRAD_DEVICE_INSTANCES(template)
XGRAD_PRINT_INSTANCES(template)
XGRAD_RANDOM_INSTANCES(template)
}  // namespace xgrad

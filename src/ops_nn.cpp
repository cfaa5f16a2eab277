// xgrad::compiled: the neural-network ops and matmul (include/xgrad/ops/nn.hpp, linalg.hpp).
#define XGRAD_INSTANTIATE_NN
#define XGRAD_INSTANTIATE_LINALG
#include "xgrad/ops/linalg-inl.hpp"
#include "xgrad/ops/nn-inl.hpp"

namespace xgrad {
XGRAD_NN_INSTANCES(template)
XGRAD_LINALG_INSTANCES(template)
}  // namespace xgrad

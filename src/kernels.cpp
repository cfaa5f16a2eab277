// xgrad::compiled: the kernels that ops and compiled graphs share (include/xgrad/backend/kernels.hpp
// and the cpu backend's entry points below it), compiled once rather than in each source that
// calls them.
#define XGRAD_INSTANTIATE_KERNELS
#define XGRAD_INSTANTIATE_GEMM
#define XGRAD_INSTANTIATE_CONV
#define XGRAD_INSTANTIATE_CONV_POOLED
#define XGRAD_INSTANTIATE_ATTENTION
#include "xgrad/backend/kernels.hpp"

namespace xgrad::cpu {
XGRAD_GEMM_INSTANCES(template)
XGRAD_CONV_INSTANCES(template)
XGRAD_CONV_POOLED_INSTANCES(template)
XGRAD_ATTENTION_INSTANCES(template)
}  // namespace xgrad::cpu

namespace xgrad::kernels {
XGRAD_KERNELS_INSTANCES(template)
}  // namespace xgrad::kernels

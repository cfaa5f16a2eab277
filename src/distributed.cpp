// xgrad::compiled: the process group and the collectives (include/xgrad/distributed), compiled
// once.
#define XGRAD_INSTANTIATE_COLLECTIVES
#include "xgrad/distributed/collectives-inl.hpp"
#include "xgrad/distributed/process_group-inl.hpp"

namespace xgrad::distributed {
XGRAD_COLLECTIVES_INSTANCES(template)
}  // namespace xgrad::distributed

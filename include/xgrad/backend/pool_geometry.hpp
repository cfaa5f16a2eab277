// The geometry of a 2-D pooling, apart from its kernels: the ops' declarations name it
// (ops/nn.hpp), the CPU and Thrust kernels read it.
#pragma once

#include <cstdint>

namespace xgrad::cpu {

/// Geometry of one 2-D pooling. x is [n, c, h, w] and y is [n, c, out_h, out_w]. Bottom/right
/// padding is implied by out_h/out_w, which the caller computes.
struct Pool2dGeometry {
  std::int64_t n, c, h, w, kh, kw, stride_h, stride_w, pad_top, pad_left, out_h, out_w;
  bool operator==(const Pool2dGeometry&) const = default;
};

}  // namespace xgrad::cpu

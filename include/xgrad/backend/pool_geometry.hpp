// The geometry of a 2-D pooling, apart from its kernels: the ops' declarations name it
// (ops/nn.hpp), the CPU and Thrust kernels read it.
#pragma once

#include <cstdint>

#include "xgrad/core/device.hpp"

namespace xgrad::cpu {

/// Geometry of one 2-D pooling. x is [n, c, h, w] and y is [n, c, out_h, out_w]. Bottom/right
/// padding is implied by out_h/out_w, which the caller computes.
struct Pool2dGeometry {
  std::int64_t n, c, h, w, kh, kw, stride_h, stride_w, pad_top, pad_left, out_h, out_w;
  bool operator==(const Pool2dGeometry&) const = default;
};

/// Output o's argmax kept where its window's maximum x[idx[o]] is above 0, else -1 (NaN
/// included): max_pool2d_argmax's drop_nonpositive, applied after the argmax, on any backend.
template <class T> struct DropNonpositive {
  const T* x;
  const std::int32_t* idx;
  std::int64_t in_plane, out_plane;
  XGRAD_HD std::int32_t operator()(std::int64_t o) const {
    return idx[o] >= 0 && x[o / out_plane * in_plane + idx[o]] > T(0) ? idx[o] : -1;
  }
};

}  // namespace xgrad::cpu

// Definitions of data/transforms.hpp: included by it when header-only, compiled once into the
// library (src/data.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <string_view>

#include "xgrad/backend/cpu/resize.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/data/transforms.hpp"

namespace xgrad::data {

namespace detail {

inline Hwc image_dims(const ImageSpec& s, std::string_view op, SourceLoc loc) {
  const Shape& x = s.shape;
  if (x.ndim() == 2) return {x[0], x[1], 1};
  if (x.ndim() == 3) return s.layout == Layout::hwc ? Hwc{x[0], x[1], x[2]} : Hwc{x[1], x[2], x[0]};
  throw_value_error(op, loc, "expected an image [H, W, C], [C, H, W] or [H, W], got shape ", x);
}

inline Shape image_shape(const ImageSpec& s, Hwc d) {
  if (s.shape.ndim() == 2) return Shape{d.h, d.w};
  return s.layout == Layout::hwc ? Shape{d.h, d.w, d.c} : Shape{d.c, d.h, d.w};
}

/// out[c][i] = in[i][c] for an interleaved [pixels, channels] buffer.
inline void deinterleave(const float* in, std::int64_t pixels, std::int64_t channels, float* out) {
  for (std::int64_t i = 0; i < pixels; ++i)
    for (std::int64_t c = 0; c < channels; ++c) out[c * pixels + i] = in[i * channels + c];
}

}  // namespace detail

XGRAD_API Resize::Resize(std::int64_t size, SourceLoc loc) : Transform(loc), m_h(size), m_w(0) {
  if (size < 1) throw_value_error("Resize", loc, "size must be >= 1, got ", size);
}

XGRAD_API Resize::Resize(std::int64_t height, std::int64_t width, SourceLoc loc)
    : Transform(loc), m_h(height), m_w(width) {
  if (height < 1 || width < 1)
    throw_value_error("Resize", loc, "height and width must be >= 1, got ", height, " x ", width);
}

XGRAD_API ImageSpec Resize::output(const ImageSpec& in) const {
  const auto d = detail::image_dims(in, "Resize", m_loc);
  if (d.h < 1 || d.w < 1 || d.c < 1) throw_value_error("Resize", m_loc, "the image ", in.shape, " is empty");
  const auto [oh, ow] = out_size(d);
  return {detail::image_shape(in, {oh, ow, d.c}), in.layout};
}

XGRAD_API void Resize::apply(Image& image) const {
  const auto d = detail::image_dims(image.spec, "Resize", m_loc);
  const auto [oh, ow] = out_size(d);
  std::vector<float> out(static_cast<std::size_t>(oh * ow * d.c));
  const bool planar = d.c == 1 || image.spec.layout == Layout::chw || image.spec.shape.ndim() == 2;
  if (planar) {
    cpu::resize_bilinear_forward<float>(1, d.c, d.h, d.w, oh, ow, false, image.pixels.data(), out.data());
  } else {
    // The kernel resizes planes: take the channels apart, resize, interleave again.
    std::vector<float> in_planes(image.pixels.size());
    std::vector<float> out_planes(out.size());
    detail::deinterleave(image.pixels.data(), d.h * d.w, d.c, in_planes.data());
    cpu::resize_bilinear_forward<float>(1, d.c, d.h, d.w, oh, ow, false, in_planes.data(), out_planes.data());
    detail::deinterleave(out_planes.data(), d.c, oh * ow, out.data());
  }
  image.spec = output(image.spec);
  image.pixels = std::move(out);
}

XGRAD_API std::pair<std::int64_t, std::int64_t> Resize::out_size(detail::Hwc d) const {
  if (m_w != 0) return {m_h, m_w};
  if (d.h <= d.w) return {m_h, std::max<std::int64_t>(1, d.w * m_h / d.h)};
  return {std::max<std::int64_t>(1, d.h * m_h / d.w), m_h};
}

XGRAD_API Rescale::Rescale(double scale, double shift, SourceLoc loc)
    : Transform(loc), m_scale(static_cast<float>(scale)), m_shift(static_cast<float>(shift)) {
  if (!std::isfinite(m_scale) || !std::isfinite(m_shift))
    throw_value_error("Rescale", loc, "scale and shift must be finite floats, got ", scale, " and ", shift);
}

XGRAD_API Normalize::Normalize(const std::vector<double>& mean, const std::vector<double>& std, SourceLoc loc)
    : Transform(loc) {
  if (mean.empty() || mean.size() != std.size())
    throw_value_error("Normalize", loc, "mean and std need the same number (>= 1) of values, got ", mean.size(),
                      " and ", std.size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    if (!std::isfinite(mean[i])) throw_value_error("Normalize", loc, "mean[", i, "] must be finite, got ", mean[i]);
    if (!(std[i] > 0.0) || !std::isfinite(std[i]))
      throw_value_error("Normalize", loc, "std[", i, "] must be finite and > 0, got ", std[i]);
    m_mean.push_back(static_cast<float>(mean[i]));
    m_std.push_back(static_cast<float>(std[i]));
  }
}

XGRAD_API ImageSpec Normalize::output(const ImageSpec& in) const {
  const auto d = detail::image_dims(in, "Normalize", m_loc);
  if (m_mean.size() != 1 && static_cast<std::int64_t>(m_mean.size()) != d.c)
    throw_value_error("Normalize", m_loc, "got ", m_mean.size(), " means and stds for an image ", in.shape, " with ",
                      d.c, " channels, expected 1 or ", d.c);
  return in;
}

XGRAD_API void Normalize::apply(Image& image) const {
  const auto d = detail::image_dims(image.spec, "Normalize", m_loc);
  const bool interleaved = image.spec.shape.ndim() == 3 && image.spec.layout == Layout::hwc;
  const std::int64_t plane = d.h * d.w;
  for (std::int64_t i = 0; i < plane * d.c; ++i) {
    const std::int64_t c = m_mean.size() == 1 ? 0 : interleaved ? i % d.c : i / plane;
    float& p = image.pixels[static_cast<std::size_t>(i)];
    p = (p - m_mean[static_cast<std::size_t>(c)]) / m_std[static_cast<std::size_t>(c)];
  }
}

XGRAD_API ImageSpec HWC2CHW::output(const ImageSpec& in) const {
  if (in.shape.ndim() != 3 || in.layout != Layout::hwc)
    throw_value_error("HWC2CHW", m_loc, "expected an image [H, W, C], got ",
                      in.layout == Layout::chw ? "one already in [C, H, W] layout, shape " : "shape ", in.shape);
  return {Shape{in.shape[2], in.shape[0], in.shape[1]}, Layout::chw};
}

XGRAD_API void HWC2CHW::apply(Image& image) const {
  const Shape& s = image.spec.shape;
  if (s[2] != 1) {
    std::vector<float> out(image.pixels.size());
    detail::deinterleave(image.pixels.data(), s[0] * s[1], s[2], out.data());
    image.pixels = std::move(out);
  }
  image.spec = output(image.spec);
}

XGRAD_API TypeCast::TypeCast(DType target, SourceLoc loc) : Transform(loc), m_target(target) {
  if (target != DType::float32 && target != DType::int32)
    throw_value_error("TypeCast", loc, "images are Float32 and labels Int32 in a Dataset, got target ",
                      dtype_name(target));
}

}  // namespace xgrad::data

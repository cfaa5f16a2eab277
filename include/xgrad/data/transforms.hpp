// Image transforms for Dataset::map: Resize, Rescale, Normalize, HWC2CHW, TypeCast.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/source_loc.hpp"

namespace xgrad::data {

/// Where the channel axis of an image is: last ([H, W, C], as read) or first ([C, H, W]).
enum class Layout { hwc, chw };

/// The shape and layout of the images a pipeline stage produces. A rank-2 image [H, W] has one
/// channel; other ranks are feature vectors that image transforms refuse.
struct ImageSpec {
  Shape shape;
  Layout layout = Layout::hwc;
};

/// One image travelling through the pipeline: float pixels, row-major in spec.layout.
struct Image {
  ImageSpec spec;
  std::vector<float> pixels;
};

/// A step of Dataset::map. Transforms are immutable and run on the prefetch thread, so they
/// work on plain buffers: no ops, no tape, no tracing, no global mode state.
class Transform {
 public:
  explicit Transform(SourceLoc loc) : m_loc(loc) {}
  virtual ~Transform() = default;

  /// What the transform makes of images described by `in`; throws ValueError naming the
  /// transform and the caller's line when it cannot take them. Dataset::map calls it once.
  virtual ImageSpec output(const ImageSpec& in) const = 0;
  /// Transforms one image that matches a spec output() accepted.
  virtual void apply(Image& image) const = 0;
  /// True for transforms that change labels rather than images (TypeCast to int32).
  virtual bool on_labels() const { return false; }

  SourceLoc loc() const { return m_loc; }

 protected:
  SourceLoc m_loc;
};

namespace detail {

/// Height, width and channels of an image of rank 2 or 3; throws naming `op` otherwise.
struct Hwc {
  std::int64_t h, w, c;
};

}  // namespace detail

/// Bilinear resize with OpenCV's convention (cv::INTER_LINEAR, which MindSpore's Resize uses):
/// pixel centres at half-integers, source coordinates clamped to the image. Resize(size) scales
/// the shorter side to `size` and keeps the aspect ratio (the longer side is rounded down);
/// Resize(h, w) gives exactly h x w. Values stay float (no rounding to 0..255 as OpenCV does
/// for 8-bit images).
class Resize : public Transform {
 public:
  XGRAD_API explicit Resize(std::int64_t size, SourceLoc loc = SourceLoc::current());
  XGRAD_API Resize(std::int64_t height, std::int64_t width, SourceLoc loc = SourceLoc::current());

  XGRAD_API ImageSpec output(const ImageSpec& in) const override;

  XGRAD_API void apply(Image& image) const override;

 private:
  XGRAD_API std::pair<std::int64_t, std::int64_t> out_size(detail::Hwc d) const;

  std::int64_t m_h, m_w;  // m_w == 0: m_h is the shorter side
};

/// pixel * scale + shift, on every pixel (MindSpore's Rescale).
class Rescale : public Transform {
 public:
  XGRAD_API explicit Rescale(double scale, double shift = 0.0, SourceLoc loc = SourceLoc::current());
  ImageSpec output(const ImageSpec& in) const override { return in; }
  void apply(Image& image) const override {
    for (float& p : image.pixels) p = p * m_scale + m_shift;
  }

 private:
  float m_scale, m_shift;
};

/// (pixel - mean[c]) / std[c] per channel c (MindSpore's Normalize). One mean and one std
/// apply to every channel; lists must have one value per channel of the image.
class Normalize : public Transform {
 public:
  Normalize(double mean, double std, SourceLoc loc = SourceLoc::current())
      : Normalize(std::vector<double>{mean}, std::vector<double>{std}, loc) {}
  XGRAD_API Normalize(const std::vector<double>& mean, const std::vector<double>& std,
                      SourceLoc loc = SourceLoc::current());

  XGRAD_API ImageSpec output(const ImageSpec& in) const override;

  XGRAD_API void apply(Image& image) const override;

 private:
  std::vector<float> m_mean, m_std;
};

/// [H, W, C] -> [C, H, W]: batches then come out as [N, C, H, W], what conv2d takes.
class HWC2CHW : public Transform {
 public:
  explicit HWC2CHW(SourceLoc loc = SourceLoc::current()) : Transform(loc) {}

  XGRAD_API ImageSpec output(const ImageSpec& in) const override;
  XGRAD_API void apply(Image& image) const override;
};

/// MindSpore pipelines cast images to float32 and labels to int32. Here images are float32
/// and labels int32 from the start, so TypeCast(DType::float32) (images) and
/// TypeCast(DType::int32) (labels) change nothing and exist so such pipelines port line by
/// line; any other target throws ValueError, since the pipeline cannot produce it.
class TypeCast : public Transform {
 public:
  XGRAD_API explicit TypeCast(DType target, SourceLoc loc = SourceLoc::current());
  ImageSpec output(const ImageSpec& in) const override { return in; }
  void apply(Image&) const override {}
  bool on_labels() const override { return m_target == DType::int32; }

 private:
  DType m_target;
};

}  // namespace xgrad::data

#if !defined(XGRAD_COMPILED)
#include "xgrad/data/transforms-inl.hpp"
#endif

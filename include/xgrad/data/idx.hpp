// IDX (MNIST-format) files, plain or gzip-compressed: read_idx and the IdxArray it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad::data {

/// The element types an IDX file can hold (its third magic byte).
enum class IdxType : std::uint8_t {
  ubyte = 0x08,
  sbyte = 0x09,
  int16 = 0x0B,
  int32 = 0x0C,
  float32 = 0x0D,
  float64 = 0x0E
};

/// "ubyte", "float32", ...
XGRAD_API std::string_view idx_type_name(IdxType type);

/// Bytes per element of an IDX type.
XGRAD_API std::size_t idx_type_size(IdxType type);

/// The contents of an IDX file: its element type, its dimensions and its elements (row-major,
/// already in the host's byte order).
struct IdxArray {
  IdxType type = IdxType::ubyte;
  Shape shape;
  std::vector<unsigned char> bytes;

  std::int64_t numel() const { return shape.numel(); }

  /// Elements [first, first + count) converted to T with static_cast.
  template <class T> void copy_to(std::int64_t first, std::int64_t count, T* out) const {
    switch (type) {
      case IdxType::ubyte:
        return convert<std::uint8_t>(first, count, out);
      case IdxType::sbyte:
        return convert<std::int8_t>(first, count, out);
      case IdxType::int16:
        return convert<std::int16_t>(first, count, out);
      case IdxType::int32:
        return convert<std::int32_t>(first, count, out);
      case IdxType::float32:
        return convert<float>(first, count, out);
      case IdxType::float64:
        return convert<double>(first, count, out);
    }
  }

  /// The whole array as a tensor of the file's shape, each element converted with static_cast.
  template <Element T> Tensor<T> to_tensor() const {
    auto out = Tensor<T>::empty(shape);
    copy_to(0, numel(), out.data());
    return out;
  }

 private:
  template <class Stored, class T> void convert(std::int64_t first, std::int64_t count, T* out) const {
    const unsigned char* src = bytes.data() + static_cast<std::size_t>(first) * sizeof(Stored);
    for (std::int64_t i = 0; i < count; ++i) {
      Stored v;
      std::memcpy(&v, src + static_cast<std::size_t>(i) * sizeof(Stored), sizeof(Stored));
      out[i] = static_cast<T>(v);
    }
  }
};

/// Reads an IDX file: the magic 0x00 0x00 <type> <ndims>, ndims big-endian uint32 dimensions,
/// then the elements big-endian. A file starting with the gzip magic 0x1f 0x8b is inflated
/// first, whatever its name. Every field is checked; a missing, malformed, truncated or
/// over-long file throws ValueError naming the path, the field, what was expected and what
/// was found. Nothing larger than the payload the header claims is ever allocated, and for
/// plain files the claim is checked against the file size before allocating.
XGRAD_API IdxArray read_idx(const std::string& path);

}  // namespace xgrad::data

#if !defined(XGRAD_COMPILED)
#include "xgrad/data/idx-inl.hpp"
#endif

// Definitions of data/mnist.hpp: included by it when header-only, compiled once into the library
// (src/data.cpp) otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

#include "xgrad/core/error.hpp"
#include "xgrad/data/mnist.hpp"

namespace xgrad::data {

namespace detail {

/// dir/name, or dir/name.gz when only that exists.
inline std::string find_idx_file(const std::filesystem::path& dir, const std::string& name, SourceLoc loc) {
  std::error_code ec;
  const auto plain = dir / name;
  if (std::filesystem::exists(plain, ec)) return plain.string();
  const auto gz = dir / (name + ".gz");
  if (std::filesystem::exists(gz, ec)) return gz.string();
  throw_value_error("MnistDataset", loc, "directory '", dir.string(), "' has neither ", name, " nor ", name, ".gz");
}

}  // namespace detail

XGRAD_API std::shared_ptr<const detail::SampleSource> MnistDataset::load(const std::filesystem::path& dir, Split split,
                                                                         SourceLoc loc) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string image_path = detail::find_idx_file(dir, prefix + "-images-idx3-ubyte", loc);
  const std::string label_path = detail::find_idx_file(dir, prefix + "-labels-idx1-ubyte", loc);

  auto source = std::make_shared<detail::SampleSource>();
  source->name = xgrad::detail::concat("MnistDataset('", dir.string(), "', ", prefix, ")");
  source->images = read_idx(image_path);
  const Shape& s = source->images.shape;
  if (s.ndim() != 3)
    throw_value_error("MnistDataset", loc, "'", image_path, "' holds ", s, ", expected images [N, H, W]");
  source->images.shape = Shape{s[0], s[1], s[2], 1};

  const IdxArray labels = read_idx(label_path);
  if (labels.shape.ndim() != 1)
    throw_value_error("MnistDataset", loc, "'", label_path, "' holds ", labels.shape, ", expected labels [N]");
  if (labels.type == IdxType::float32 || labels.type == IdxType::float64)
    throw_value_error("MnistDataset", loc, "'", label_path, "' holds ", idx_type_name(labels.type),
                      " values, expected integer labels");
  if (labels.shape[0] != s[0])
    throw_value_error("MnistDataset", loc, "'", image_path, "' has ", s[0], " images but '", label_path, "' has ",
                      labels.shape[0], " labels, expected as many of each");
  source->labels.resize(static_cast<std::size_t>(labels.numel()));
  labels.copy_to(0, labels.numel(), source->labels.data());
  for (std::size_t i = 0; i < source->labels.size(); ++i)
    if (source->labels[i] < 0 || source->labels[i] > 9)
      throw_value_error("MnistDataset", loc, "'", label_path, "': label ", i, " is ", source->labels[i],
                        ", expected 0 to 9");
  return source;
}

}  // namespace xgrad::data

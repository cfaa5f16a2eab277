// MnistDataset: MNIST and Fashion-MNIST from their four IDX files, plain or gzip-compressed.
#pragma once

#include <filesystem>
#include <memory>

#include "xgrad/core/config.hpp"
#include "xgrad/data/dataset.hpp"
#include "xgrad/data/idx.hpp"

namespace xgrad::data {

/// The samples of an MNIST-format data set (MNIST, Fashion-MNIST: Debian's dataset-fashion-mnist
/// installs it in /usr/share/datasets/fashion-mnist): train-images-idx3-ubyte and
/// train-labels-idx1-ubyte for Split::train, t10k-* for Split::test, each plain or with a .gz
/// suffix. Images are float [H, W, 1] with the raw values 0..255, labels int32 in 0..9. The
/// files must agree on the sample count, images must be [N, H, W] and labels [N] integers
/// in 0..9; anything else throws ValueError naming the file.
class MnistDataset : public Dataset {
 public:
  MnistDataset(const std::filesystem::path& dir, Split split, SourceLoc loc = SourceLoc::current())
      : Dataset(load(dir, split, loc)) {}

 private:
  XGRAD_API static std::shared_ptr<const detail::SampleSource> load(const std::filesystem::path& dir, Split split,
                                                                    SourceLoc loc);
};

}  // namespace xgrad::data

#if !defined(XGRAD_COMPILED)
#include "xgrad/data/mnist-inl.hpp"
#endif

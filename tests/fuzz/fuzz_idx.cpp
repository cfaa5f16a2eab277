// Fuzz target: the IDX reader (data/idx.hpp) on raw file bytes, plain or gzip (the reader sniffs
// the gzip magic), and MnistDataset on an images file and a labels file cut from the same input.
// Every input must either read (and convert to tensors) or throw xgrad::ValueError.
//
// Input: byte 0 picks the mode; mode 0: the rest is one IDX file, for read_idx; mode 1: the next
// two bytes give the length of the images file, the rest is the labels file, for MnistDataset.
#include <cstdint>
#include <cstring>
#include <string>

#include <xgrad/data/idx.hpp>
#include <xgrad/data/mnist.hpp>

#include "fuzz_support.hpp"

namespace xf = xgrad::fuzz;
namespace xd = xgrad::data;

namespace {

/// Reads one IDX file and checks what the reader promises of an array it returns.
void read_one(const std::string& path) {
  const xd::IdxArray a = xd::read_idx(path);
  if (a.shape.ndim() < 1) xf::finding("read_idx returned a rank-0 array");
  for (std::int64_t d : a.shape)
    if (d <= 0) xf::finding("read_idx returned a dimension <= 0");
  if (a.bytes.size() != static_cast<std::size_t>(a.numel()) * xd::idx_type_size(a.type))
    xf::finding("read_idx returned a payload whose size does not match its shape and type");
  auto f = a.to_tensor<float>();
  if (!(f.shape() == a.shape)) xf::finding("IdxArray::to_tensor changed the shape");
  (void)f.to_vector();
  // Integer files also convert to integers (MnistDataset's labels).
  if (a.type != xd::IdxType::float32 && a.type != xd::IdxType::float64) (void)a.to_tensor<std::int32_t>().to_vector();
}

void read_dataset(const std::uint8_t* data, std::size_t size) {
  const auto dir = xf::scratch().path() / "mnist";
  std::filesystem::create_directories(dir);
  std::size_t split = size >= 2 ? (data[0] | (data[1] << 8)) : 0;
  data += std::min<std::size_t>(size, 2);
  size -= std::min<std::size_t>(size, 2);
  split = std::min(split, size);
  xf::write_file((dir / "train-images-idx3-ubyte").string(), data, split);
  xf::write_file((dir / "train-labels-idx1-ubyte").string(), data + split, size - split);
  xd::MnistDataset ds(dir, xd::Split::train);
  int batches = 0;
  for (const auto& batch : ds.batch(2).take(2)) {
    if (batch.images.ndim() != 4 || batch.labels.ndim() != 1 || batch.images.shape()[0] != batch.labels.shape()[0])
      xf::finding("MnistDataset produced a batch whose images and labels disagree");
    for (std::int32_t label : batch.labels.to_vector())
      if (label < 0 || label > 9) xf::finding("MnistDataset produced a label outside 0..9");
    (void)batch.images.to_vector();
    ++batches;
  }
  (void)batches;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xf::write_seeds_if_asked([](const std::string& dir) {
    auto with = [](std::vector<std::uint8_t> head, const std::vector<std::uint8_t>& content) {
      head.insert(head.end(), content.begin(), content.end());
      return head;
    };
    const auto ubyte = xf::idx_file(0x08, {2, 3}, {0, 1, 2, 253, 254, 255});
    xf::write_seed(dir, "ubyte_2x3", with({0}, ubyte));
    xf::write_seed(dir, "ubyte_2x3_gz", with({0}, xf::gzip_member(ubyte)));
    // 1.5f, NaN, -inf as big-endian float32.
    xf::write_seed(dir, "float32_3", with({0}, xf::idx_file(0x0D, {3}, {0x3f, 0xc0, 0, 0, 0x7f, 0xc0, 0, 0, 0xff, 0x80, 0, 0})));
    xf::write_seed(dir, "int16_2x1x1", with({0}, xf::idx_file(0x0B, {2, 1, 1}, {0x80, 0x00, 0x7f, 0xff})));
    xf::write_seed(dir, "float64_1", with({0}, xf::idx_file(0x0E, {1}, {0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18})));
    // MnistDataset: two 2 x 2 images and their labels.
    const auto images = xf::idx_file(0x08, {2, 2, 2}, {0, 64, 128, 255, 255, 128, 64, 0});
    const auto labels = xf::idx_file(0x08, {2}, {3, 9});
    auto mnist = with({1, static_cast<std::uint8_t>(images.size()), 0}, images);
    mnist.insert(mnist.end(), labels.begin(), labels.end());
    xf::write_seed(dir, "mnist_2_images", mnist);
    auto mnist_gz = xf::gzip_member(images);
    const auto labels_gz = xf::gzip_member(labels);
    mnist_gz.insert(mnist_gz.begin(), {1, static_cast<std::uint8_t>(mnist_gz.size()), 0});
    mnist_gz.insert(mnist_gz.end(), labels_gz.begin(), labels_gz.end());
    xf::write_seed(dir, "mnist_2_images_gz", mnist_gz);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0] % 2;
  ++data;
  --size;
  xf::refuses_cleanly([&] {
    if (mode == 0) {
      const std::string path = xf::scratch().file("input.idx");
      xf::write_file(path, data, size);
      read_one(path);
    } else {
      read_dataset(data, size);
    }
  });
  return 0;
}

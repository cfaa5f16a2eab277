// Tests of data/: the IDX reader (plain, gzip, every malformed form), MnistDataset, the
// Dataset pipeline and the transforms.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/data/dataset.hpp"
#include "xgrad/data/idx.hpp"
#include "xgrad/data/mnist.hpp"
#include "xgrad/data/transforms.hpp"

namespace xg = xgrad;
namespace fs = std::filesystem;
using namespace xgrad::testing;  // Bytes, TempDir, read_bytes, write_bytes, message_of

namespace {

void put_be(Bytes& out, std::uint64_t v, int width) {
  for (int i = width - 1; i >= 0; --i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// An IDX file's bytes: magic, dims, then `payload` as given (already big-endian).
Bytes idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes out = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims) put_be(out, d, 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes ubyte_idx(const std::vector<std::uint32_t>& dims, const std::vector<int>& values) {
  Bytes payload;
  for (int v : values) payload.push_back(static_cast<unsigned char>(v));
  return idx_bytes(0x08, dims, payload);
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string idx_error(const std::string& path) {
  return message_of<xg::ValueError>([&] { xg::data::read_idx(path); });
}

/// A tiny MNIST-format directory: n images [h, w] with pixel (i, r, c) = i * 10 + r * w + c
/// and label i % 10.
void write_mnist(const TempDir& dir, const std::string& prefix, std::uint32_t n, std::uint32_t h, std::uint32_t w,
                 bool gzip) {
  std::vector<int> pixels, labels;
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::uint32_t p = 0; p < h * w; ++p) pixels.push_back(static_cast<int>((i * 10 + p) % 256));
    labels.push_back(static_cast<int>(i % 10));
  }
  const auto write = gzip ? write_gz : write_bytes;
  const std::string gz = gzip ? ".gz" : "";
  write(dir.file(prefix + "-images-idx3-ubyte" + gz), ubyte_idx({n, h, w}, pixels));
  write(dir.file(prefix + "-labels-idx1-ubyte" + gz), ubyte_idx({n}, labels));
}

/// n samples [2, 2, 1] whose pixels are all i and whose label is i.
xg::data::TensorDataset counting_dataset(int n) {
  std::vector<float> pixels;
  std::vector<std::int32_t> labels;
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < 4; ++p) pixels.push_back(static_cast<float>(i));
    labels.push_back(i);
  }
  return xg::data::TensorDataset(xg::tensor<float>(pixels, {n, 2, 2, 1}), xg::tensor<std::int32_t>(labels));
}

/// The labels of every element of one epoch, in order.
std::vector<std::int32_t> epoch_labels(const xg::data::Epoch& epoch) {
  std::vector<std::int32_t> out;
  for (const auto& b : epoch)
    for (auto l : b.labels.to_vector()) out.push_back(l);
  return out;
}

/// One image of the given shape, row-major, after the transforms (run through a one-sample dataset).
xg::Tensor<float> transformed(const std::vector<float>& pixels, xg::Shape shape, const auto&... transforms) {
  xg::Shape batched{1};
  for (auto d : shape) batched.push_back(d);
  auto ds = xg::data::TensorDataset(xg::tensor<float>(pixels, batched), xg::tensor<std::int32_t>({0}))
                .map(transforms...)
                .prefetch(0);
  return (*ds.begin()).images;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

}  // namespace

TEST_CASE("data: read_idx reads every element type, plain and gzip, detecting gzip by its magic") {
  TempDir dir;
  const std::vector<int> values = {0, 1, 127, 128, 200, 255};
  const Bytes ubyte = ubyte_idx({2, 3}, values);
  write_bytes(dir.file("u.idx"), ubyte);
  write_gz(dir.file("u.idx.gz"), ubyte);
  write_gz(dir.file("compressed_without_suffix"), ubyte);
  write_bytes(dir.file("plain_with_suffix.gz"), ubyte);
  for (const char* name : {"u.idx", "u.idx.gz", "compressed_without_suffix", "plain_with_suffix.gz"}) {
    CAPTURE(name);
    const auto a = xg::data::read_idx(dir.file(name));
    CHECK(a.type == xg::data::IdxType::ubyte);
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    CHECK(a.to_tensor<std::int32_t>().to_vector() == std::vector<std::int32_t>(values.begin(), values.end()));
  }

  Bytes p;  // big-endian payloads of each wider type
  put_be(p, 0xFF, 1);
  put_be(p, 0x05, 1);
  write_bytes(dir.file("s8"), idx_bytes(0x09, {2}, p));
  CHECK(xg::data::read_idx(dir.file("s8")).to_tensor<std::int32_t>().to_vector() == std::vector<std::int32_t>{-1, 5});
  p.clear();
  put_be(p, 0xFFFE, 2);
  put_be(p, 0x0102, 2);
  write_bytes(dir.file("s16"), idx_bytes(0x0B, {2}, p));
  CHECK(xg::data::read_idx(dir.file("s16")).to_tensor<std::int32_t>().to_vector() ==
        std::vector<std::int32_t>{-2, 258});
  p.clear();
  put_be(p, 0x80000000u, 4);
  put_be(p, 70000, 4);
  write_gz(dir.file("s32.gz"), idx_bytes(0x0C, {2, 1}, p));
  const auto s32 = xg::data::read_idx(dir.file("s32.gz"));
  CHECK(s32.shape == std::vector<std::int64_t>{2, 1});
  CHECK(s32.to_tensor<std::int64_t>().to_vector() == std::vector<std::int64_t>{-2147483648LL, 70000});
  p.clear();
  put_be(p, std::bit_cast<std::uint32_t>(1.5f), 4);
  put_be(p, std::bit_cast<std::uint32_t>(-0.25f), 4);
  write_bytes(dir.file("f32"), idx_bytes(0x0D, {2}, p));
  CHECK(xg::data::read_idx(dir.file("f32")).to_tensor<float>().to_vector() == std::vector<float>{1.5f, -0.25f});
  p.clear();
  put_be(p, std::bit_cast<std::uint64_t>(3.25), 8);
  write_bytes(dir.file("f64"), idx_bytes(0x0E, {1, 1, 1, 1}, p));
  const auto f64 = xg::data::read_idx(dir.file("f64"));
  CHECK(f64.shape == std::vector<std::int64_t>{1, 1, 1, 1});
  CHECK(f64.to_tensor<double>().item() == 3.25);

  // A payload larger than the first growth step of the gzip reader, several gzip members.
  std::vector<int> big(3 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int>(i * 7 % 251);
  const Bytes big_file = ubyte_idx({3, 1024, 1024}, big);
  write_gz(dir.file("big.gz"), big_file);
  const auto b = xg::data::read_idx(dir.file("big.gz"));
  CHECK(b.numel() == 3 << 20);
  CHECK(std::equal(b.bytes.begin(), b.bytes.end(), big_file.begin() + 16));
  write_gz(dir.file("part1.gz"), Bytes(big_file.begin(), big_file.begin() + 1000));
  write_gz(dir.file("part2.gz"), Bytes(big_file.begin() + 1000, big_file.end()));
  Bytes joined = read_bytes(dir.file("part1.gz"));
  const Bytes second = read_bytes(dir.file("part2.gz"));
  joined.insert(joined.end(), second.begin(), second.end());
  write_bytes(dir.file("members.gz"), joined);
  CHECK(xg::data::read_idx(dir.file("members.gz")).bytes == b.bytes);
}

TEST_CASE("data: read_idx names the file, the field, the expected and the actual value of a bad header") {
  TempDir dir;
  auto check = [&](const Bytes& bytes, const std::vector<std::string>& parts) {
    for (bool gzip : {false, true}) {
      const std::string path = dir.file(gzip ? "bad.gz" : "bad");
      (gzip ? write_gz : write_bytes)(path, bytes);
      const std::string msg = idx_error(path);
      CAPTURE(msg);
      CHECK(msg.find("IDX file '" + path + "'") != std::string::npos);
      for (const auto& part : parts) CHECK(msg.find(part) != std::string::npos);
    }
  };
  const Bytes good = ubyte_idx({2, 2}, {1, 2, 3, 4});
  Bytes b = good;
  b[0] = 0x12;
  check(b, {"magic: expected 0x00 0x00 <type> <ndims>, got 0x12 0x00 0x08 0x02"});
  b = good;
  b[2] = 0x0A;
  check(b, {"type byte", "got 0x0A"});
  b = good;
  b[3] = 0;
  check(b, {"ndims: expected 1 to 8, got 0"});
  b = good;
  b[3] = 9;
  check(b, {"ndims: expected 1 to 8, got 9"});
  check(idx_bytes(0x08, {2, 0}, {}), {"dimension 1 is 0, expected > 0"});
  check(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}),
        {"dimension 1 is 4294967295, which makes the payload larger than"});
  check(idx_bytes(0x0E, {1u << 20, 1u << 20}, {}), {"dimension 1", "larger than"});
  // Dimensions claiming more than the file holds: refused before any allocation.
  check(idx_bytes(0x08, {60000, 28, 28}, {1, 2, 3}),
        {"payload ([60000, 28, 28] ubyte): expected 47040000 bytes", "has 3 bytes"});
  check(idx_bytes(0x0D, {2}, {0, 0, 0, 0}), {"payload ([2] float32): expected 8 bytes"});
  Bytes trailing = good;
  trailing.push_back(9);
  trailing.push_back(9);
  check(trailing, {"payload ([2, 2] ubyte): expected", "end after 4 bytes, it has 2 bytes more"});

  // A gzip stream followed by bytes that are not another member.
  write_gz(dir.file("good.gz"), good);
  Bytes junk = read_bytes(dir.file("good.gz"));
  junk.push_back(0);
  write_bytes(dir.file("junk.gz"), junk);
  CHECK(idx_error(dir.file("junk.gz")).find("not another gzip member") != std::string::npos);

  const std::string missing = dir.file("missing");
  CHECK(idx_error(missing) == "IDX file '" + missing + "': cannot open it (No such file or directory)");
  CHECK(idx_error(dir.path.string()).find("is a directory") != std::string::npos);
}

TEST_CASE("data: read_idx rejects a file truncated at every byte offset, plain and gzip") {
  TempDir dir;
  std::vector<int> values(2 * 3 * 5);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int>(i * 9);
  const Bytes file = ubyte_idx({2, 3, 5}, values);
  const std::string path = dir.file("t.idx");
  for (std::size_t n = 0; n < file.size(); ++n) {
    CAPTURE(n);
    write_bytes(path, Bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(n)));
    const std::string msg = idx_error(path);
    CHECK(msg.find("IDX file '" + path + "': ") == 0);
  }
  write_gz(dir.file("full.gz"), file);
  const Bytes gz = read_bytes(dir.file("full.gz"));
  const std::string gz_path = dir.file("t.idx.gz");
  for (std::size_t n = 0; n < gz.size(); ++n) {
    CAPTURE(n);
    write_bytes(gz_path, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(n)));
    CHECK(idx_error(gz_path).find("IDX file '" + gz_path + "': ") == 0);
  }
  // Also compressed but complete files whose content is cut short.
  for (std::size_t n = 0; n < file.size(); ++n) {
    CAPTURE(n);
    write_gz(gz_path, Bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(n)));
    CHECK(idx_error(gz_path).find("IDX file '" + gz_path + "': ") == 0);
  }
  write_bytes(gz_path, gz);
  CHECK(xg::data::read_idx(gz_path).bytes == Bytes(file.begin() + 16, file.end()));
}

TEST_CASE("data: read_idx on a gzip file with any one byte changed reads it right or throws ValueError") {
  TempDir dir;
  std::vector<int> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int>(i * 37 % 256);
  const Bytes file = ubyte_idx({4, 16}, values);
  write_gz(dir.file("full.gz"), file);
  const Bytes gz = read_bytes(dir.file("full.gz"));
  const std::string path = dir.file("flipped.gz");
  int errors = 0;
  for (std::size_t i = 0; i < gz.size(); ++i) {
    CAPTURE(i);
    Bytes changed = gz;
    changed[i] ^= 0x55;
    write_bytes(path, changed);
    try {
      const auto a = xg::data::read_idx(path);
      // Only gzip header fields zlib ignores (time stamp, OS) may change without an error.
      CHECK(a.bytes == Bytes(file.begin() + 12, file.end()));
    } catch (const xg::ValueError& e) {
      CHECK(std::string(e.what()).find("IDX file '" + path + "': ") == 0);
      ++errors;
    }
  }
  CHECK(errors > static_cast<int>(gz.size()) / 2);
}

TEST_CASE("data: MnistDataset reads a directory of plain or gzip files and checks they agree") {
  TempDir dir;
  write_mnist(dir, "train", 5, 3, 4, false);
  write_mnist(dir, "t10k", 3, 3, 4, true);
  auto train = xg::data::MnistDataset(dir.path, xg::data::Split::train).prefetch(0);
  CHECK(train.size() == 5);
  CHECK(train.image_shape() == std::vector<std::int64_t>{3, 4, 1});
  std::vector<float> first_image;
  for (int i = 0; i < 12; ++i) first_image.push_back(static_cast<float>(20 + i));
  int i = 0;
  for (const auto& sample : train) {
    CHECK(sample.images.shape() == std::vector<std::int64_t>{3, 4, 1});
    CHECK(sample.labels.shape() == std::vector<std::int64_t>{});
    CHECK(sample.labels.item() == i);
    if (i == 2) CHECK(sample.images.to_vector() == first_image);
    ++i;
  }
  CHECK(i == 5);
  auto test = xg::data::MnistDataset(dir.path, xg::data::Split::test).batch(2);
  CHECK(test.size() == 2);
  CHECK(epoch_labels(test.epoch(0)) == std::vector<std::int32_t>{0, 1, 2});

  auto error = [&](const TempDir& d) {
    return message_of<xg::ValueError>([&] { xg::data::MnistDataset(d.path, xg::data::Split::train); });
  };
  TempDir empty;
  CHECK(error(empty).find("directory '" + empty.path.string() +
                          "' has neither train-images-idx3-ubyte nor "
                          "train-images-idx3-ubyte.gz") != std::string::npos);
  TempDir uneven;
  write_mnist(uneven, "train", 5, 3, 4, false);
  write_bytes(uneven.file("train-labels-idx1-ubyte"), ubyte_idx({4}, {0, 1, 2, 3}));
  CHECK(error(uneven).find("has 5 images but '" + uneven.file("train-labels-idx1-ubyte") + "' has 4 labels") !=
        std::string::npos);
  write_bytes(uneven.file("train-labels-idx1-ubyte"), ubyte_idx({5}, {0, 1, 10, 3, 4}));
  CHECK(error(uneven).find("label 2 is 10, expected 0 to 9") != std::string::npos);
  write_bytes(uneven.file("train-labels-idx1-ubyte"), ubyte_idx({5, 1}, {0, 1, 2, 3, 4}));
  CHECK(error(uneven).find("holds [5, 1], expected labels [N]") != std::string::npos);
  write_bytes(uneven.file("train-images-idx3-ubyte"), ubyte_idx({5, 12}, std::vector<int>(60)));
  CHECK(error(uneven).find("holds [5, 12], expected images [N, H, W]") != std::string::npos);
  write_bytes(uneven.file("train-images-idx3-ubyte"), ubyte_idx({5, 3, 4}, std::vector<int>(59)));
  CHECK(error(uneven).find("IDX file '" + uneven.file("train-images-idx3-ubyte") + "': payload") == 0);
}

// scripts/test.sh installs Debian's dataset-fashion-mnist, so this runs wherever the suite does.
TEST_CASE("data: the installed Fashion-MNIST test split reads as 10000 images of 28 x 28, 1000 per class") {
  auto test = xg::data::MnistDataset("/usr/share/datasets/fashion-mnist", xg::data::Split::test).batch(1000);
  CHECK(test.size() == 10);
  CHECK(test.image_shape() == std::vector<std::int64_t>{28, 28, 1});
  std::vector<int> per_class(10);
  float lo = 255, hi = 0;
  for (const auto& b : test) {
    for (auto l : b.labels.to_vector()) ++per_class[static_cast<std::size_t>(l)];
    for (float v : b.images.to_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  CHECK(per_class == std::vector<int>(10, 1000));
  CHECK(lo == 0.0f);
  CHECK(hi == 255.0f);
}

TEST_CASE("data: shuffle is deterministic per seed and epoch, and each epoch is a permutation") {
  const auto ds = counting_dataset(50).shuffle(7);
  const auto e0 = epoch_labels(ds.epoch(0));
  const auto e1 = epoch_labels(ds.epoch(1));
  CHECK(e0 == epoch_labels(ds.epoch(0)));
  CHECK(e0 == epoch_labels(counting_dataset(50).shuffle(7).epoch(0)));
  CHECK(e0 != e1);
  CHECK(e0 != epoch_labels(counting_dataset(50).shuffle(8).epoch(0)));
  std::vector<std::int32_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  for (auto e : {e0, e1}) {
    CHECK(e != all);
    std::sort(e.begin(), e.end());
    CHECK(e == all);
  }
  // Range-for over the dataset itself walks epochs 0, 1, ... of this object.
  std::vector<std::vector<std::int32_t>> walked;
  for (int epoch = 0; epoch < 2; ++epoch) {
    walked.emplace_back();
    for (const auto& s : ds) walked.back().push_back(s.labels.item());
  }
  CHECK(walked[0] == e0);
  CHECK(walked[1] == e1);
  // Without shuffle the order is the file's, and the images follow their labels.
  CHECK(epoch_labels(counting_dataset(5).epoch(3)) == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  for (const auto& b : ds.batch(8).epoch(0))
    for (std::int64_t i = 0; i < b.labels.numel(); ++i)
      CHECK(b.images.data()[i * 4] == static_cast<float>(b.labels.data()[i]));
}

TEST_CASE("data: shard splits each epoch into disjoint parts that cover it, the same on every process") {
  const auto ds = counting_dataset(11).shuffle(3);
  for (std::int64_t count : {1, 2, 3, 4}) {
    CAPTURE(count);
    for (std::int64_t epoch : {0, 1}) {
      const auto whole = epoch_labels(ds.epoch(epoch));
      std::vector<std::int32_t> seen;
      for (std::int64_t index = 0; index < count; ++index) {
        const auto part = ds.shard(index, count);
        const auto labels = epoch_labels(part.epoch(epoch));
        // Every count-th sample of the shuffled order, from `index`: sizes differ by at most one.
        std::vector<std::int32_t> expected;
        for (auto i = static_cast<std::size_t>(index); i < whole.size(); i += static_cast<std::size_t>(count))
          expected.push_back(whole[i]);
        CHECK(labels == expected);
        CHECK(part.size() == static_cast<std::int64_t>(expected.size()));
        CHECK(labels == epoch_labels(counting_dataset(11).shuffle(3).shard(index, count).epoch(epoch)));
        seen.insert(seen.end(), labels.begin(), labels.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<std::int32_t> all(11);
      std::iota(all.begin(), all.end(), 0);
      CHECK(seen == all);  // disjoint and covering
    }
  }
  // Two shards batched by 2 hold, batch for batch, the samples of the whole batched by 4.
  const auto whole = ds.batch(4, true);
  std::vector<std::vector<std::int32_t>> halves[2];
  for (int r = 0; r < 2; ++r)
    for (const auto& b : ds.shard(r, 2).batch(2, true).epoch(0)) halves[r].push_back(b.labels.to_vector());
  std::size_t k = 0;
  for (const auto& b : whole.epoch(0)) {
    auto both = halves[0].at(k);
    both.insert(both.end(), halves[1].at(k).begin(), halves[1].at(k).end());
    auto want = b.labels.to_vector();
    std::sort(both.begin(), both.end());
    std::sort(want.begin(), want.end());
    CHECK(both == want);
    ++k;
  }
  CHECK(k == 2);
}

TEST_CASE("data: batch shapes, drop_remainder, take and size") {
  const auto ds = counting_dataset(10);
  CHECK(ds.size() == 10);
  CHECK(ds.batch_size() == 0);
  const auto b3 = ds.batch(3);
  CHECK(b3.size() == 4);
  CHECK(b3.batch_size() == 3);
  std::vector<std::int64_t> sizes;
  for (const auto& b : b3) {
    CHECK(b.images.shape() == std::vector<std::int64_t>{b.labels.numel(), 2, 2, 1});
    sizes.push_back(b.labels.numel());
  }
  CHECK(sizes == std::vector<std::int64_t>{3, 3, 3, 1});
  const auto dropped = ds.batch(3, /*drop_remainder=*/true);
  CHECK(dropped.size() == 3);
  CHECK(epoch_labels(dropped.epoch(0)) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(ds.batch(10, true).size() == 1);
  CHECK(ds.batch(11, true).size() == 0);
  CHECK(epoch_labels(ds.batch(11, true).epoch(0)).empty());
  CHECK(ds.batch(11).size() == 1);

  CHECK(b3.take(2).size() == 2);
  CHECK(epoch_labels(b3.take(2).epoch(0)) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
  CHECK(b3.take(100).size() == 4);
  CHECK(ds.take(7).size() == 7);
  CHECK(ds.take(7).batch(3).size() == 3);
  CHECK(ds.take(7).batch(3, true).size() == 2);
  CHECK(ds.take(7).take(4).size() == 4);
  // take after shuffle takes from the shuffled order, a different subset each epoch.
  const auto shuffled = epoch_labels(ds.shuffle(3).epoch(1));
  CHECK(epoch_labels(ds.shuffle(3).take(4).epoch(1)) ==
        std::vector<std::int32_t>(shuffled.begin(), shuffled.begin() + 4));
}

TEST_CASE("data: prefetch gives the same batches as no prefetch, and stops cleanly mid-epoch") {
  const auto ds = counting_dataset(37).shuffle(11).map(xg::data::Rescale(2.0, 1.0)).batch(4);
  for (std::int64_t depth : {1, 2, 8}) {
    CAPTURE(depth);
    auto a = ds.prefetch(0).epoch(2);
    auto b = ds.prefetch(depth).epoch(2);
    auto ia = a.begin();
    auto ib = b.begin();
    int n = 0;
    for (; ia != std::default_sentinel && ib != std::default_sentinel; ++ia, ++ib, ++n) {
      CHECK(ia->images.to_vector() == ib->images.to_vector());
      CHECK(ia->images.shape() == ib->images.shape());
      CHECK(ia->labels.to_vector() == ib->labels.to_vector());
    }
    CHECK(ia == std::default_sentinel);
    CHECK(ib == std::default_sentinel);
    CHECK(n == 10);
  }
  for (int i = 0; i < 20; ++i) {  // leaving early joins the producer thread, whatever it is doing
    for (const auto& b : ds.prefetch(3)) {
      CHECK(b.labels.numel() == 4);
      break;
    }
  }
  // An error on the prefetch thread reaches the loop at the element where it happened.
  struct FailsOnSix : xg::data::Transform {
    FailsOnSix() : Transform(xg::SourceLoc::current()) {}
    xg::data::ImageSpec output(const xg::data::ImageSpec& in) const override { return in; }
    void apply(xg::data::Image& image) const override {
      if (image.pixels[0] == 6.0f) throw xg::ValueError("sample 6 is bad");
    }
  };
  for (std::int64_t depth : {0, 1, 3}) {
    CAPTURE(depth);
    std::vector<std::int32_t> seen;
    const auto failing = counting_dataset(10).map(FailsOnSix()).batch(2).prefetch(depth);
    CHECK(message_of<xg::ValueError>([&] {
            for (const auto& b : failing)
              for (auto l : b.labels.to_vector()) seen.push_back(l);
          }) == "sample 6 is bad");
    CHECK(seen == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
  }
  // Copies share the samples and keep working after the original is gone.
  xg::data::Dataset copy = counting_dataset(3);
  { copy = copy.batch(2); }
  CHECK(epoch_labels(copy.epoch(0)) == std::vector<std::int32_t>{0, 1, 2});
}

TEST_CASE("data: Resize is OpenCV's half-pixel bilinear: a 2 x 2 image to 4 x 4 by hand") {
  // Along each axis 2 -> 4 samples the source at -0.25 (clamped to 0), 0.25, 0.75 and 1.25
  // (clamped to 1): weights (1, 0), (0.75, 0.25), (0.25, 0.75), (0, 1).
  const auto y = transformed({0, 4, 8, 12}, {2, 2, 1}, xg::data::Resize(4));
  CHECK(y.shape() == std::vector<std::int64_t>{4, 4, 1});
  check_close(y.to_vector(), {0, 1, 3, 4, 2, 3, 5, 6, 6, 7, 9, 10, 8, 9, 11, 12});
  // Two interleaved channels resize independently: the second is ten times the first.
  const auto two = transformed({0, 0, 4, 40, 8, 80, 12, 120}, {2, 2, 2}, xg::data::Resize(4, 4));
  CHECK(two.shape() == std::vector<std::int64_t>{4, 4, 2});
  const auto v = two.to_vector();
  for (int p = 0; p < 16; ++p) CHECK(v[2 * p + 1] == doctest::Approx(10 * v[2 * p]));
  check_close({v[2], v[6], v[8]}, {1, 4, 2});
  // Halving averages pixel pairs (sources at 0.5 and 2.5).
  check_close(transformed({0, 2, 4, 6}, {1, 4}, xg::data::Resize(1, 2)).to_vector(), {1, 5});
  // Resize(size) scales the shorter side to size, keeping the aspect ratio (rounded down).
  CHECK(transformed(std::vector<float>(6 * 9), {6, 9, 1}, xg::data::Resize(4)).shape() ==
        std::vector<std::int64_t>{4, 6, 1});
  CHECK(transformed(std::vector<float>(9 * 6), {9, 6, 1}, xg::data::Resize(5)).shape() ==
        std::vector<std::int64_t>{7, 5, 1});
  // After HWC2CHW it resizes [C, H, W] images.
  const auto chw = transformed({0, 0, 4, 40, 8, 80, 12, 120}, {2, 2, 2}, xg::data::HWC2CHW(), xg::data::Resize(4));
  CHECK(chw.shape() == std::vector<std::int64_t>{2, 4, 4});
  check_close(std::vector<float>(chw.data(), chw.data() + 16), {0, 1, 3, 4, 2, 3, 5, 6, 6, 7, 9, 10, 8, 9, 11, 12});
}

TEST_CASE("data: Rescale, Normalize, HWC2CHW and TypeCast against hand-computed values") {
  check_close(transformed({0, 51, 255}, {1, 3, 1}, xg::data::Rescale(1.0 / 255)).to_vector(), {0, 0.2f, 1});
  check_close(transformed({1, 2}, {1, 2, 1}, xg::data::Rescale(2, -1)).to_vector(), {1, 3});
  check_close(transformed({1, 2, 3, 4}, {2, 2, 1}, xg::data::Normalize(2.0, 0.5)).to_vector(), {-2, 0, 2, 4});
  // Per channel: HWC interleaves channels, CHW keeps them in planes.
  const std::vector<float> hwc = {1, 10, 2, 20, 3, 30};  // [1, 3, 2]
  check_close(transformed(hwc, {1, 3, 2}, xg::data::Normalize({1, 10}, {1, 10})).to_vector(), {0, 0, 1, 1, 2, 2});
  const auto planes = transformed(hwc, {1, 3, 2}, xg::data::HWC2CHW());
  CHECK(planes.shape() == std::vector<std::int64_t>{2, 1, 3});
  check_close(planes.to_vector(), {1, 2, 3, 10, 20, 30});
  check_close(transformed(hwc, {1, 3, 2}, xg::data::HWC2CHW(), xg::data::Normalize({1, 10}, {1, 10})).to_vector(),
              {0, 1, 2, 0, 1, 2});
  // The seed's LeNet pipeline on a flat image: every pixel becomes (51 / 255 - 0.1307) / 0.3081.
  const auto lenet = transformed(std::vector<float>(28 * 28, 51.0f), {28, 28, 1}, xg::data::Resize(32),
                                 xg::data::Rescale(1.0 / 255), xg::data::Normalize(0.1307, 0.3081), xg::data::HWC2CHW(),
                                 xg::data::TypeCast(xg::DType::float32), xg::data::TypeCast(xg::DType::int32));
  CHECK(lenet.shape() == std::vector<std::int64_t>{1, 32, 32});
  for (float v : lenet.to_vector()) CHECK(v == doctest::Approx((0.2 - 0.1307) / 0.3081).epsilon(1e-5));
}

TEST_CASE("data: bad arguments name the function, the argument, what was expected and what came") {
  using namespace xg::data;
  auto msg = [](auto f) { return message_of<xg::ValueError>(f); };
  const auto ds = counting_dataset(4);
  CHECK(msg([&] { ds.batch(0); }).find("Dataset.batch: batch size must be >= 1, got 0 (at test_data.cpp:") == 0);
  CHECK(msg([&] { ds.batch(2).batch(2); }).find("already batched (batch size 2)") != std::string::npos);
  CHECK(msg([&] { ds.take(0); }).find("Dataset.take: n must be >= 1, got 0") == 0);
  CHECK(msg([&] { ds.prefetch(-1); }).find("Dataset.prefetch: depth must be >= 0, got -1") == 0);
  CHECK(msg([&] { ds.shuffle(1).shuffle(2); }).find("already shuffled") != std::string::npos);
  CHECK(msg([&] { ds.batch(2).shuffle(1); }).find("call shuffle before batch") != std::string::npos);
  CHECK(msg([&] { ds.take(2).shuffle(1); }).find("call shuffle before take") != std::string::npos);
  CHECK(msg([&] { ds.shard(1, 2).shuffle(1); }).find("call shuffle before shard") != std::string::npos);
  CHECK(msg([&] { ds.shard(2, 2); }).find("Dataset.shard: index must be in [0, 2), got 2") != std::string::npos);
  CHECK(msg([&] { ds.shard(0, 0); }).find("count must be >= 1, got 0") != std::string::npos);
  CHECK(msg([&] { ds.shard(0, 2).shard(1, 2); }).find("already sharded (shard 0 of 2)") != std::string::npos);
  CHECK(msg([&] { ds.batch(2).shard(0, 2); }).find("call shard before batch") != std::string::npos);
  CHECK(msg([&] { ds.take(2).shard(0, 2); }).find("call shard before take") != std::string::npos);
  CHECK(msg([&] { ds.batch(2).map(Rescale(2)); }).find("Dataset.map: call map before batch") == 0);
  CHECK(msg([] { Resize(0); }).find("Resize: size must be >= 1, got 0") == 0);
  CHECK(msg([] { Resize(4, -1); }).find("Resize: height and width must be >= 1, got 4 x -1") == 0);
  CHECK(msg([] { Normalize(0.5, 0.0); }).find("Normalize: std[0] must be finite and > 0, got 0") == 0);
  CHECK(msg([] {
          Normalize({0.5, 0.5}, {1.0});
        }).find("same number (>= 1) of values, got 2 and 1") != std::string::npos);
  CHECK(msg([] { Rescale(std::nan("")); }).find("Rescale: scale and shift must be finite") == 0);
  CHECK(msg([] { (void)TypeCast(xg::DType::float64); }).find("got target Float64") != std::string::npos);
  CHECK(msg([&] {
          ds.map(Normalize({1, 2, 3}, {1, 1, 1}));
        }).find("Normalize: got 3 means and stds for an image [2, 2, 1] with 1 channels, expected 1 or 1") == 0);
  CHECK(msg([&] { ds.map(HWC2CHW(), HWC2CHW()); }).find("HWC2CHW: expected an image [H, W, C], got one already") == 0);

  const auto vectors = TensorDataset(xg::zeros<float>({3, 5}), xg::tensor<std::int32_t>({0, 1, 2}));
  CHECK(vectors.batch(2).epoch(0).begin()->images.shape() == std::vector<std::int64_t>{2, 5});
  CHECK(msg([&] { vectors.map(Resize(4)); })
            .find("Resize: expected an image [H, W, C], [C, H, W] or [H, W], got "
                  "shape [5]") == 0);
  CHECK(msg([] {
          TensorDataset(xg::zeros<float>({3}), xg::tensor<std::int32_t>({0, 1, 2}));
        }).find("TensorDataset: images must be [N, ...] with rank >= 2, got shape [3]") == 0);
  CHECK(msg([] {
          TensorDataset(xg::zeros<float>({3, 2}), xg::tensor<std::int32_t>({0, 1}));
        }).find("TensorDataset: labels must be [N] with N = 3 (the images' first axis), got shape [2]") == 0);
}

// Fuzz target: the gzip path of the IDX reader (data/idx.hpp's IdxStream, xgrad's only gzip
// decoder). A random byte string rarely gets past a gzip header, so most inputs are compressed
// here first and then damaged in one controlled way: the fuzzer then explores both what a valid
// stream may decompress to (a lying IDX header, a payload too long or too short) and what a
// broken stream does to the decoder (a flipped byte, a cut, a second member, trailing junk).
// Every input must either read or throw xgrad::ValueError.
//
// Input: [mode] [damage] [at: 2 bytes] [xor] [split: 2 bytes] [content...]
//   mode 0: the content is the file itself, its first two bytes forced to the gzip magic;
//   mode 1: the content is gzipped (one member, or two split at `split`), then `damage` picks:
//           0 none, 1 xor the byte at `at`, 2 cut the file at `at`, 3 append `at % 64` junk
//           bytes, 4 append a gzip magic and nothing else, 5 a member of an empty stream.
#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/data/idx.hpp>

#include "fuzz_support.hpp"

namespace xf = xgrad::fuzz;
namespace xd = xgrad::data;

namespace {

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xf::write_seeds_if_asked([](const std::string& dir) {
    const auto idx = xf::idx_file(0x08, {2, 3}, {0, 1, 2, 253, 254, 255});
    auto with = [](std::vector<std::uint8_t> head, const std::vector<std::uint8_t>& content) {
      head.insert(head.end(), content.begin(), content.end());
      return head;
    };
    // [mode] [damage] [at lo, hi] [xor] [split lo, hi] [level] [content]
    xf::write_seed(dir, "compress_idx", with({1, 0, 0, 0, 0, 255, 255, 9}, idx));
    xf::write_seed(dir, "compress_two_members", with({1, 0, 0, 0, 0, 7, 0, 6}, idx));
    xf::write_seed(dir, "compress_flip", with({1, 1, 20, 0, 4, 255, 255, 9}, idx));
    xf::write_seed(dir, "compress_cut", with({1, 2, 12, 0, 0, 255, 255, 1}, idx));
    xf::write_seed(dir, "compress_junk", with({1, 3, 5, 0, 0x1f, 255, 255, 9}, idx));
    xf::write_seed(dir, "raw_gzip_file", with({0, 0, 0, 0, 0, 0, 0, 0}, xf::gzip_member(idx)));
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  xf::Bytes in(data, size);
  const int mode = in.u8() % 2;
  const int damage = in.u8() % 6;
  const std::size_t at = in.u16();
  const std::uint8_t x = in.u8();
  const std::size_t split = in.u16();
  const int level = in.u8() % 10;
  std::vector<std::uint8_t> content = in.rest();

  std::vector<std::uint8_t> file;
  if (mode == 0) {
    file = content;
    if (file.size() < 2) file.resize(2);
    file[0] = 0x1f;
    file[1] = 0x8b;
  } else {
    const std::size_t cut = std::min(split, content.size());
    file = xf::gzip_member(content.data(), split < content.size() ? cut : content.size(), level);
    if (split < content.size()) {
      auto second = xf::gzip_member(content.data() + cut, content.size() - cut, level);
      file.insert(file.end(), second.begin(), second.end());
    }
    switch (damage) {
      case 1:
        if (!file.empty()) file[at % file.size()] ^= x ? x : 1;
        break;
      case 2:
        file.resize(at % (file.size() + 1));
        break;
      case 3:
        for (std::size_t i = 0; i < at % 64; ++i) file.push_back(static_cast<std::uint8_t>(x + i));
        break;
      case 4:
        file.push_back(0x1f);
        file.push_back(0x8b);
        break;
      case 5: {
        auto empty = xf::gzip_member(nullptr, 0, level);
        file.insert(file.end(), empty.begin(), empty.end());
        break;
      }
      default:
        break;
    }
  }

  const std::string path = xf::scratch().file("input.idx.gz");
  xf::write_file(path, file);
  xf::refuses_cleanly([&] {
    const xd::IdxArray a = xd::read_idx(path);
    if (a.bytes.size() != static_cast<std::size_t>(a.numel()) * xd::idx_type_size(a.type))
      xf::finding("read_idx returned a payload whose size does not match its shape and type");
    (void)a.to_tensor<double>().to_vector();
  });
  return 0;
}

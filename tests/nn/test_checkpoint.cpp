// Tests for nn/checkpoint.hpp: the byte format, round trips, validation of truncated, corrupt
// and malformed files, matching against a module and optimizer, atomic writes, exact resume.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <xgrad/nn/checkpoint.hpp>
#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
namespace fs = std::filesystem;
using namespace xgrad::testing;  // Bytes, TempDir, read_bytes, write_bytes, message_of

namespace {

/// Values that depend on `base` and are not round in binary, so a stale value never matches.
template <class T> xg::Tensor<T> values(double base, const xg::Shape& shape) {
  std::vector<T> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(base + 0.1 * static_cast<double>(i) / 3.0);
  return xg::tensor<T>(v, shape);
}

struct Block : xg::nn::Module {
  xg::Parameter<float> weight, bias;
  xg::Tensor<float> running_mean;
  explicit Block(float base)
      : weight(values<float>(base, {2, 3}), "weight"),
        bias(values<float>(base + 10, {3}), "bias"),
        running_mean(values<float>(base + 20, {3})) {
    register_parameter("weight", weight);
    register_parameter("bias", bias);
    register_buffer("running_mean", running_mean);
  }
};

/// Parameters of two dtypes, integer and Bool buffers, and a child module.
struct Net : xg::nn::Module {
  xg::Parameter<float> scale;
  xg::Parameter<double> offset;
  xg::Tensor<std::int64_t> steps;
  xg::Tensor<bool> mask;
  Block block;
  explicit Net(float base = 0.5f)
      : scale(values<float>(base, {4}), "scale"),
        offset(values<double>(base * 2, {}), "offset"),
        steps(xg::scalar<std::int64_t>(static_cast<std::int64_t>(base * 1000))),
        mask(xg::tensor<bool>({true, false, base > 0})),
        block(base + 1) {
    register_parameter("scale", scale);
    register_parameter("offset", offset);
    register_buffer("steps", steps);
    register_buffer("mask", mask);
    register_module("block", block);
  }
};

Bytes raw(const xg::TensorBase& t) {
  const auto* p = static_cast<const unsigned char*>(t.impl()->storage->data());
  return Bytes(p, p + t.numel() * static_cast<std::int64_t>(xg::dtype_size(t.dtype())));
}
/// Every state tensor's bytes: equal means bitwise equal.
std::vector<Bytes> raw_state(const std::vector<std::pair<std::string, xg::TensorBase>>& state) {
  std::vector<Bytes> out;
  for (const auto& [name, t] : state) out.push_back(raw(t));
  return out;
}
std::vector<Bytes> raw_state(const xg::nn::Module& m) { return raw_state(m.named_state()); }

/// Whether `bytes`, written to `path`, are refused: load_checkpoint into `net` throws a
/// ValueError naming the file and leaves net's state as `before`, and load_tensors throws too.
bool rejected(xg::nn::Module& net, const std::string& path, const Bytes& bytes, const std::vector<Bytes>& before) {
  write_bytes(path, bytes);
  bool named = false, raw = false;
  try {
    xg::load_checkpoint(net, path);
  } catch (const xg::ValueError& e) {
    named = contains(e.what(), path);
  }
  try {
    xg::load_tensors(path);
  } catch (const xg::ValueError&) {
    raw = true;
  }
  return named && raw && raw_state(net) == before;
}

/// A saved checkpoint's bytes, and a module initialized differently to load damaged copies into.
struct Damaged {
  TempDir dir;
  const std::string good = dir.file("good.ckpt"), bad = dir.file("bad.ckpt");
  Net saved{0.5f}, net{-1.0f};
  Bytes bytes;
  std::vector<Bytes> before = raw_state(net);
  Damaged() {
    xg::save_checkpoint(saved, good);
    bytes = read_bytes(good);
  }
  /// Whether `damaged`, written to `bad`, is refused and leaves `net` as it was.
  bool rejected(const Bytes& damaged) { return ::rejected(net, bad, damaged, before); }
};

// Builds files field by field, with valid checksums unless told otherwise, to reach each check
// of the parser behind the checksums (and to pin the layout docs/CHECKPOINT.md describes).
struct RawRecord {
  RawRecord(std::string name, std::uint8_t dtype_code, std::vector<std::int64_t> dims, Bytes payload)
      : name(std::move(name)), dtype_code(dtype_code), dims(std::move(dims)), payload(std::move(payload)) {}
  std::string name;
  std::uint8_t dtype_code;
  std::vector<std::int64_t> dims;
  Bytes payload;
  std::optional<std::uint32_t> name_bytes;     // default: name.size()
  std::optional<std::uint8_t> rank;            // default: dims.size()
  std::optional<std::uint64_t> payload_bytes;  // default: payload.size()
  std::uint32_t crc_xor = 0;                   // nonzero: a wrong tensor checksum
};

struct RawFile {
  explicit RawFile(std::vector<RawRecord> records) : records(std::move(records)) {}
  std::vector<RawRecord> records;
  std::optional<std::uint32_t> count;  // default: records.size()
  std::uint32_t version = 1;
  std::uint32_t crc_xor = 0;  // nonzero: a wrong file checksum

  Bytes bytes() const {
    Bytes out{'X', 'G', 'C', 'K', 'P', 'T', 0, 0};
    auto le = [](Bytes& b, std::uint64_t v, int n) {
      for (int i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
    };
    le(out, version, 4);
    le(out, count.value_or(static_cast<std::uint32_t>(records.size())), 4);
    for (const auto& r : records) {
      Bytes rec;
      le(rec, r.name_bytes.value_or(static_cast<std::uint32_t>(r.name.size())), 4);
      rec.insert(rec.end(), r.name.begin(), r.name.end());
      rec.push_back(r.dtype_code);
      rec.push_back(r.rank.value_or(static_cast<std::uint8_t>(r.dims.size())));
      for (auto d : r.dims) le(rec, static_cast<std::uint64_t>(d), 8);
      le(rec, r.payload_bytes.value_or(r.payload.size()), 8);
      rec.insert(rec.end(), r.payload.begin(), r.payload.end());
      le(rec, xg::detail::ckpt::crc32(0, rec.data(), rec.size()) ^ r.crc_xor, 4);
      out.insert(out.end(), rec.begin(), rec.end());
    }
    le(out, xg::detail::ckpt::crc32(0, out.data(), out.size()) ^ crc_xor, 4);
    return out;
  }
};

Bytes float_bytes(std::vector<float> v) {
  Bytes out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

/// Steps the optimizer with gradients fixed by the step number.
void run_steps(xg::optim::Optimizer& opt, int first, int last) {
  for (int step = first; step < last; ++step) {
    std::vector<xg::Tensor<float>> grads;
    for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
      const auto& p = opt.parameters()[i];
      std::vector<float> g(static_cast<std::size_t>(p.numel()));
      for (std::size_t k = 0; k < g.size(); ++k)
        g[k] = std::sin(0.7f * static_cast<float>(step) + 0.3f * static_cast<float>(i) + 0.11f * static_cast<float>(k));
      grads.push_back(xg::tensor<float>(g, p.shape()));
    }
    opt.step(grads);
  }
}

using MakeOptimizer = std::function<std::unique_ptr<xg::optim::Optimizer>(std::vector<xg::Parameter<float>>)>;

/// Train, save, train on; a fresh module and optimizer that load the file and train on must
/// end bitwise where the first did. Without the optimizer state they must not.
void check_exact_resume(const MakeOptimizer& make) {
  TempDir dir;
  const auto path = dir.file("resume.ckpt");
  Net a(0.5f);
  auto opt_a = make(a.parameters());
  run_steps(*opt_a, 0, 2);
  xg::save_checkpoint(a, *opt_a, path);
  run_steps(*opt_a, 2, 5);

  Net b(-3.0f);
  auto opt_b = make(b.parameters());
  opt_b->set_learning_rate(0.5f);  // the checkpoint's learning rate must win
  run_steps(*opt_b, 0, 1);         // and its moments replace these
  xg::load_checkpoint(b, *opt_b, path);
  run_steps(*opt_b, 2, 5);
  CHECK(raw_state(b) == raw_state(a));
  CHECK(raw_state(opt_b->named_state()) == raw_state(opt_a->named_state()));

  Net c(-3.0f);
  auto opt_c = make(c.parameters());
  xg::load_checkpoint(c, path);
  run_steps(*opt_c, 2, 5);
  CHECK(raw_state(c) != raw_state(a));
}

}  // namespace

TEST_CASE("checkpoint: CRC-32 is zlib's crc32, and continues across chunks") {
  using xg::detail::ckpt::crc32;
  const std::string check = "123456789";
  const auto* p = reinterpret_cast<const unsigned char*>(check.data());
  CHECK(crc32(0, p, 0) == 0u);
  CHECK(crc32(0, p, 9) == 0xCBF43926u);
  CHECK(crc32(crc32(0, p, 3), p + 3, 6) == 0xCBF43926u);
  Bytes big(100003);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  CHECK(crc32(0, big.data(), big.size()) == 0x732376CEu);  // zlib.crc32 of the same bytes
}

TEST_CASE("checkpoint: a one-tensor file has exactly the bytes docs/CHECKPOINT.md describes") {
  TempDir dir;
  xg::save_tensors(dir.file("a.ckpt"), {{"a", xg::scalar<std::int32_t>(7)}});
  // clang-format off
  const Bytes expected{
      'X', 'G', 'C', 'K', 'P', 'T', 0, 0,  // magic
      1, 0, 0, 0,                          // format version 1
      1, 0, 0, 0,                          // 1 tensor
      1, 0, 0, 0, 'a',                     // name length, name
      3,                                   // dtype Int32
      0,                                   // rank 0: no dimensions
      4, 0, 0, 0, 0, 0, 0, 0,              // payload length
      7, 0, 0, 0,                          // payload
      0x21, 0xF1, 0x9F, 0x14,              // CRC-32 of the record (as zlib.crc32 computes it)
      0x50, 0xEE, 0x89, 0x5E};             // CRC-32 of all the bytes before
  // clang-format on
  CHECK(read_bytes(dir.file("a.ckpt")) == expected);
  CHECK(RawFile({RawRecord("a", 3, {}, {7, 0, 0, 0})}).bytes() == expected);
}

TEST_CASE("checkpoint: save_tensors and load_tensors round-trip every dtype, rank 0 to 8 and empty tensors") {
  TempDir dir;
  const auto path = dir.file("t.ckpt");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::string, xg::TensorBase>> tensors{
      {"f32", xg::tensor<float>({-0.0f, nan, inf, 1e-42f, 3.25f, -7.0f}, {2, 3})},
      {"f64", values<double>(-1.5, {3, 1, 2})},
      {"i32", xg::tensor<std::int32_t>({std::numeric_limits<std::int32_t>::min(), 0, 5})},
      {"i64", xg::scalar<std::int64_t>(std::numeric_limits<std::int64_t>::max())},
      {"bool", xg::tensor<bool>({{true, false}, {false, true}})},
      {"rank8", values<float>(2.0, {1, 2, 1, 2, 1, 2, 1, 2})},
      {"empty", xg::zeros<float>({0, 3})},
      {"ünïcode/名前", xg::scalar<float>(1.0f)},
  };
  xg::save_tensors(path, tensors);
  const auto loaded = xg::load_tensors(path);
  REQUIRE(loaded.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].first);
    CHECK(loaded[i].first == tensors[i].first);
    CHECK(loaded[i].second.dtype() == tensors[i].second.dtype());
    CHECK(loaded[i].second.shape() == tensors[i].second.shape());
    CHECK(raw(loaded[i].second) == raw(tensors[i].second));
  }
  CHECK(dir.entries() == std::vector<std::string>{"t.ckpt"});  // no temporary file left
}

TEST_CASE("checkpoint: a module round-trips bitwise into a fresh module, and overwriting replaces the file") {
  TempDir dir;
  const auto path = dir.file("net.ckpt");
  Net saved(0.5f);
  saved.scale.data()[1] = -0.0f;
  saved.block.weight.data()[2] = std::numeric_limits<float>::quiet_NaN();
  xg::save_checkpoint(saved, path);

  Net fresh(-2.0f);
  REQUIRE(raw_state(fresh) != raw_state(saved));
  const auto version = fresh.block.weight.version();
  xg::load_checkpoint(fresh, path);
  CHECK(raw_state(fresh) == raw_state(saved));
  CHECK(fresh.block.weight.version() > version);  // autodiff sees the write

  std::vector<std::string> names;
  for (const auto& [name, t] : xg::load_tensors(path)) names.push_back(name);
  CHECK(names == std::vector<std::string>{"model/scale", "model/offset", "model/block.weight", "model/block.bias",
                                          "model/steps", "model/mask", "model/block.running_mean"});

  Net other(7.0f);
  xg::save_checkpoint(other, path);
  xg::load_checkpoint(fresh, path);
  CHECK(raw_state(fresh) == raw_state(other));
  CHECK(dir.entries() == std::vector<std::string>{"net.ckpt"});
}

TEST_CASE("checkpoint: a load after a forward pass makes the stale backward throw") {
  TempDir dir;
  const auto path = dir.file("net.ckpt");
  Net net(0.5f);
  xg::save_checkpoint(net, path);
  auto loss = xg::sum(net.scale * net.scale);
  xg::load_checkpoint(net, path);
  CHECK_THROWS_AS(loss.backward(), xg::AutogradError);
}

TEST_CASE("checkpoint: a file truncated at every byte offset is a ValueError and leaves the module untouched") {
  Damaged d;
  const Bytes& bytes = d.bytes;
  const std::string &good = d.good, &cut = d.bad;
  Net &saved = d.saved, &net = d.net;
  std::string missed;
  for (std::size_t size = 0; size < bytes.size(); ++size)
    if (!d.rejected(Bytes(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size))))
      missed += std::to_string(size) + " ";
  CHECK(missed == "");
  // The last 10 bytes: both checksums and the last 2 bytes of the last payload.
  write_bytes(cut, Bytes(bytes.begin(), bytes.end() - 10));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_checkpoint(net, cut); }),
                 "tensor 6 ('model/block.running_mean'): the payload at byte 359 needs 12 bytes, but only 10 remain"));
  xg::load_checkpoint(net, good);  // the same module still loads the whole file
  CHECK(raw_state(net) == raw_state(saved));
}

TEST_CASE("checkpoint: every single-bit flip is a ValueError and leaves the module untouched") {
  Damaged d;
  const Bytes& bytes = d.bytes;
  const std::string& bad = d.bad;
  Net& net = d.net;
  std::string missed;
  for (std::size_t offset = 0; offset < bytes.size(); ++offset) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes flipped = bytes;
      flipped[offset] ^= static_cast<unsigned char>(1u << bit);
      if (!d.rejected(flipped)) missed += std::to_string(offset) + ":" + std::to_string(bit) + " ";
    }
  }
  CHECK(missed == "");

  auto flip_message = [&](std::size_t offset) {
    Bytes flipped = bytes;
    flipped[offset] ^= 0x10;
    write_bytes(bad, flipped);
    return message_of<xg::ValueError>([&] { xg::load_checkpoint(net, bad); });
  };
  CHECK(contains(flip_message(0), "not an xgrad checkpoint"));
  CHECK(contains(flip_message(8), "format version 17 is not supported"));
  CHECK(contains(flip_message(12), "the header claims 23 tensors"));
  CHECK(contains(flip_message(bytes.size() - 10), "tensor 6 ('model/block.running_mean'): checksum mismatch"));
  CHECK(contains(flip_message(bytes.size() - 2), "file checksum mismatch"));
}

TEST_CASE("checkpoint: each malformed field is reported by name, behind valid checksums") {
  TempDir dir;
  const auto path = dir.file("m.ckpt");
  auto error = [&](const RawFile& file) {
    write_bytes(path, file.bytes());
    return message_of<xg::ValueError>([&] { xg::load_tensors(path); });
  };
  const RawRecord good("w", 1, {2}, float_bytes({1.5f, -2.0f}));
  write_bytes(path, RawFile({good}).bytes());
  REQUIRE(xg::Tensor<float>(xg::load_tensors(path)[0].second).to_vector() == std::vector<float>{1.5f, -2.0f});

  auto with_file = [&](auto change) {
    RawFile file({good});
    change(file);
    return error(file);
  };
  CHECK(with_file([](RawFile& f) { f.version = 2; }) ==
        "checkpoint '" + path + "': format version 2 is not supported (this build of xgrad reads version 1)");
  CHECK(contains(with_file([](RawFile& f) { f.count = 1000; }), "the header claims 1000 tensors"));
  // Its name length is read from the file checksum.
  CHECK(contains(with_file([](RawFile& f) { f.count = 2; }), "tensor 1: the name"));
  CHECK(contains(with_file([](RawFile& f) { f.count = 0; }), "unexpected bytes after the file checksum"));
  CHECK(contains(with_file([](RawFile& f) { f.crc_xor = 1; }), "file checksum mismatch"));

  auto with = [&](auto change) {
    RawRecord r = good;
    change(r);
    return error(RawFile({r}));
  };
  CHECK(contains(with([](RawRecord& r) { r.name = ""; }), "tensor 0: the name is empty"));
  CHECK(contains(with([](RawRecord& r) { r.name_bytes = 1'000'000; }),
                 "tensor 0: the name at byte 20 needs 1000000 bytes, but only"));
  CHECK(contains(with([](RawRecord& r) { r.name = "\xff"; }), "tensor 0 ('\xff'): the name is not valid UTF-8"));
  CHECK(contains(with([](RawRecord& r) { r.name = "\xc0\x80"; }), "not valid UTF-8"));  // an overlong NUL
  CHECK(contains(with([](RawRecord& r) { r.dtype_code = 0; }), "tensor 0 ('w'): unknown dtype code 0"));
  CHECK(contains(with([](RawRecord& r) { r.dtype_code = 6; }), "unknown dtype code 6"));
  CHECK(contains(with([](RawRecord& r) { r.dims = {1, 1, 1, 1, 1, 1, 1, 1, 2}; }), "rank 9 exceeds the maximum of 8"));
  CHECK(contains(with([](RawRecord& r) { r.dims = {-1}; }), "dimension 0 is negative (-1)"));
  CHECK(contains(with([](RawRecord& r) {
                   r.dims = {2, std::int64_t{1} << 62};
                   r.payload.clear();
                 }),
                 "shape [2, 4611686018427387904]... has more elements than the 32 remaining bytes can hold"));
  CHECK(contains(with([](RawRecord& r) { r.dims = {3}; }), "payload length 8 does not match Float32[3] (12 bytes)"));
  CHECK(contains(with([](RawRecord& r) {
                   r.dims = {5};
                   r.payload_bytes = 20;
                 }),
                 "tensor 0 ('w'): the payload at byte 39 needs 20 bytes, but only 16 remain"));
  CHECK(contains(with([](RawRecord& r) { r.crc_xor = 1; }), "tensor 0 ('w'): checksum mismatch"));
  CHECK(contains(with([](RawRecord& r) {
                   r.dtype_code = 5;
                   r.payload = {1, 2};
                 }),
                 "Bool element 1 is 2, not 0 or 1"));
  CHECK(contains(error(RawFile({good, good})), "tensor 1 ('w'): the name is already used by tensor 0"));

  Bytes trailing = RawFile({good}).bytes();
  trailing.push_back(0);
  write_bytes(path, trailing);
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_tensors(path); }),
                 "1 unexpected bytes after the file checksum"));

  write_bytes(path, {});
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_tensors(path); }),
                 "the magic bytes at byte 0 needs 8 bytes, but only 0 remain"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_tensors(dir.file("missing.ckpt")); }), "cannot open"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::load_tensors(dir.path.string()); }), "not a regular file"));
}

TEST_CASE("checkpoint: missing, extra, reshaped and retyped tensors are named, and the module is untouched") {
  TempDir dir;
  const auto path = dir.file("m.ckpt");
  Net source(0.5f);
  Net net(-1.0f);
  const auto before = raw_state(net);
  auto load_edited = [&](auto edit) {
    auto tensors = xg::detail::ckpt::with_section("model/", source.named_state());
    edit(tensors);
    xg::save_tensors(path, tensors);
    auto message = message_of<xg::ValueError>([&] { xg::load_checkpoint(net, path); });
    CHECK(raw_state(net) == before);
    return message;
  };
  const std::string prefix = "checkpoint '" + path + "': ";
  CHECK(load_edited([](auto& t) { t.erase(t.begin() + 3); }) ==
        prefix + "'model/block.bias' is not in the file (the module has it as Float32[3])");
  CHECK(load_edited([](auto& t) { t.emplace_back("model/block.extra", xg::scalar<float>(1)); }) ==
        prefix + "tensor 7 ('model/block.extra'): the module has no tensor of that name");
  CHECK(load_edited([](auto& t) {
          t[2].second = values<float>(0, {3, 2});
        }) == prefix + "tensor 2 ('model/block.weight'): shape [3, 2] in the file, the module has [2, 3]");
  CHECK(load_edited([](auto& t) { t[0].second = values<double>(0, {4}); }) ==
        prefix + "tensor 0 ('model/scale'): dtype Float64 in the file, the module has Float32");
  CHECK(load_edited([](auto& t) { t.emplace_back("stray", xg::scalar<float>(1)); }) ==
        prefix + "tensor 7 ('stray'): in neither the 'model/' nor the 'optimizer/' section (a file of save_tensors?)");

  const auto several = load_edited([](auto& t) {
    t[0].second = values<double>(0, {4});
    t.pop_back();
  });
  CHECK(several == "checkpoint '" + path +
                       "' does not fit (2 problems):\n"
                       "  tensor 0 ('model/scale'): dtype Float64 in the file, the module has Float32\n"
                       "  'model/block.running_mean' is not in the file (the module has it as Float32[3])");
}

TEST_CASE("checkpoint: optimizer sections: required by load_checkpoint(module, optimizer), ignored without one") {
  TempDir dir;
  const auto model_only = dir.file("model.ckpt"), with_adam = dir.file("adam.ckpt");
  Net source(0.5f);
  xg::optim::Adam adam(source.parameters(), 0.01f);
  run_steps(adam, 0, 1);
  xg::save_checkpoint(source, model_only);
  xg::save_checkpoint(source, adam, with_adam);

  Net net(-1.0f);
  const auto before = raw_state(net);
  xg::optim::Adam net_adam(net.parameters(), 0.01f);
  const auto adam_before = raw_state(net_adam.named_state());
  CHECK(message_of<xg::ValueError>([&] { xg::load_checkpoint(net, net_adam, model_only); }) ==
        "checkpoint '" + model_only +
            "': the file has no optimizer state (it was saved without an optimizer; load_checkpoint(module, path) "
            "reads it)");
  CHECK(raw_state(net) == before);

  xg::optim::Momentum momentum(net.parameters(), 0.01f, 0.9f);
  const auto mismatch = message_of<xg::ValueError>([&] { xg::load_checkpoint(net, momentum, with_adam); });
  CHECK(
      contains(mismatch, "'optimizer/moments.scale' is not in the file (the Momentum optimizer has it as Float32[4])"));
  CHECK(contains(mismatch, "('optimizer/moment1.scale'): the Momentum optimizer has no tensor of that name"));
  CHECK(contains(mismatch, "('optimizer/beta1_power'): the Momentum optimizer has no tensor of that name"));
  CHECK(raw_state(net) == before);
  CHECK(raw_state(net_adam.named_state()) == adam_before);

  xg::load_checkpoint(net, with_adam);  // the module part only
  CHECK(raw_state(net) == raw_state(source));
  CHECK(raw_state(net_adam.named_state()) == adam_before);
  xg::load_checkpoint(net, net_adam, with_adam);
  CHECK(raw_state(net_adam.named_state()) == raw_state(adam.named_state()));
}

TEST_CASE("checkpoint: Momentum resumes exactly from a checkpoint") {
  check_exact_resume([](std::vector<xg::Parameter<float>> params) -> std::unique_ptr<xg::optim::Optimizer> {
    return std::make_unique<xg::optim::Momentum>(std::move(params), 0.05f, 0.9f,
                                                 xg::optim::MomentumOptions{.nesterov = true});
  });
}

TEST_CASE("checkpoint: Adam resumes exactly from a checkpoint") {
  check_exact_resume([](std::vector<xg::Parameter<float>> params) -> std::unique_ptr<xg::optim::Optimizer> {
    return std::make_unique<xg::optim::Adam>(std::move(params), 0.01f, xg::optim::AdamOptions{.weight_decay = 0.01f});
  });
}

TEST_CASE("checkpoint: saving into a missing directory throws and creates nothing") {
  TempDir dir;
  Net net;
  const auto path = dir.file("missing/net.ckpt");
  const auto message = message_of<xg::ValueError>([&] { xg::save_checkpoint(net, path); });
  CHECK(contains(message, "cannot save checkpoint '" + path + "': cannot create the temporary file"));
  CHECK(contains(message, "No such file or directory"));
  CHECK(dir.entries().empty());
}

TEST_CASE("checkpoint: a failed save leaves the existing checkpoint intact and no temporary file") {
  TempDir dir;
  const auto path = dir.file("net.ckpt");
  Net net(0.5f);
  xg::save_checkpoint(net, path);
  const Bytes old = read_bytes(path);

  SUBCASE("the write fails midway (the file size limit is hit)") {
    rlimit saved_limit{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_limit) == 0);
    rlimit small = saved_limit;
    small.rlim_cur = 64 * 1024;
    // Past the limit write() fails with EFBIG, unless the default SIGXFSZ kills the process.
    auto* saved_handler = std::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string message;
    try {
      xg::save_tensors(path, {{"big", xg::zeros<float>({100'000})}});
    } catch (const xg::ValueError& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved_limit);
    std::signal(SIGXFSZ, saved_handler);
    CHECK(contains(message, "cannot save checkpoint '" + path + "': cannot write '" + path + ".tmp-"));
    CHECK(contains(message, "File too large"));
  }
  SUBCASE("the rename fails (a directory is in the way)") {
    const auto blocked = dir.file("blocked.ckpt");
    fs::create_directories(fs::path(blocked) / "inside");
    const auto message = message_of<xg::ValueError>([&] { xg::save_checkpoint(net, blocked); });
    CHECK(contains(message, "cannot save checkpoint '" + blocked + "': cannot rename '" + blocked + ".tmp-"));
    fs::remove_all(blocked);
  }
  SUBCASE("a tensor cannot be saved") {
    const auto message = message_of<xg::ValueError>([&] {
      xg::save_tensors(path, {{"a", xg::scalar<float>(1)}, {"b", {}}});
    });
    CHECK(message == "cannot save checkpoint '" + path + "': tensor 'b' is undefined (an empty handle)");
    CHECK(contains(message_of<xg::ValueError>([&] {
                     xg::save_tensors(path, {{"a", xg::scalar<float>(1)}, {"a", xg::scalar<float>(2)}});
                   }),
                   "two tensors are named 'a'"));
    CHECK(contains(message_of<xg::ValueError>([&] {
                     xg::save_tensors(path, {{"", xg::scalar<float>(1)}});
                   }),
                   "a tensor has an empty name"));
    CHECK(contains(message_of<xg::ValueError>([&] {
                     xg::save_tensors(path, {{"\xfe", xg::scalar<float>(1)}});
                   }),
                   "is not valid UTF-8"));
  }
  CHECK(read_bytes(path) == old);
  CHECK(dir.entries() == std::vector<std::string>{"net.ckpt"});
}

// The module and optimizer fuzz_checkpoint loads files into, shared with make_seeds (which saves
// the valid checkpoints of the seed corpus from them), and the checksum repair that lets the
// fuzzer's changes reach the checks behind the CRCs.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xgrad::fuzz {

/// Parameters of two dtypes, integer and Bool buffers, a rank-0 tensor and a child module.
struct CkptBlock : nn::Module {
  Parameter<float> weight{tensor<float>({0.5f, -1.25f, 2.0f, 3.5f, -0.75f, 1.0f}, {2, 3}), "weight"};
  Parameter<float> bias{tensor<float>({0.25f, 0.125f, -4.0f}), "bias"};
  CkptBlock() {
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
};
struct CkptNet : nn::Module {
  Parameter<float> scale{tensor<float>({1.0f, 2.0f}), "scale"};
  Parameter<double> offset{scalar<double>(0.5), "offset"};
  Tensor<std::int64_t> steps = scalar<std::int64_t>(7);
  Tensor<bool> mask = tensor<bool>({true, false, true});
  Tensor<std::int32_t> empty = zeros<std::int32_t>({0, 3});
  CkptBlock block;
  CkptNet() {
    register_parameter("scale", scale);
    register_parameter("offset", offset);
    register_buffer("steps", steps);
    register_buffer("mask", mask);
    register_buffer("empty", empty);
    register_module("block", block);
  }
};

/// Adam over the net's float parameters, after one step, so its moments exist.
inline std::unique_ptr<optim::Adam> stepped_adam(CkptNet& net) {
  std::vector<Parameter<float>> params{net.scale, net.block.weight, net.block.bias};
  auto opt = std::make_unique<optim::Adam>(params, 0.01f);
  auto loss = sum(net.scale * net.scale) + sum(matmul(net.block.weight, expand_dims(net.block.bias, 1)));
  loss.backward();
  opt->step();
  return opt;
}

/// Rewrites the per-tensor and whole-file CRC-32s of a checkpoint's bytes (docs/CHECKPOINT.md)
/// wherever its structure can be followed, so that a change elsewhere is judged by the checks
/// behind the checksums. Stops at the first record that runs past the end.
inline void fix_checksums(std::vector<std::uint8_t>& f) {
  auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{f[at + i]} << (8 * i);
    return v;
  };
  auto u64 = [&](std::size_t at) { return std::uint64_t{u32(at)} | (std::uint64_t{u32(at + 4)} << 32); };
  auto put32 = [&](std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) f[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
  };
  auto crc = [&](std::size_t from, std::size_t to) {
    return static_cast<std::uint32_t>(::crc32(0, f.data() + from, static_cast<uInt>(to - from)));
  };
  if (f.size() < 16) return;
  const std::uint32_t count = u32(12);
  std::size_t pos = 16;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t start = pos;
    if (f.size() - pos < 4) return;
    const std::uint64_t name = u32(pos);
    pos += 4;
    if (f.size() - pos < name + 2) return;
    pos += name + 1;
    const std::size_t rank = f[pos++];
    if ((f.size() - pos) / 8 < rank + 1) return;
    pos += 8 * rank;
    const std::uint64_t payload = u64(pos);
    pos += 8;
    if (f.size() - pos < 4 || payload > f.size() - pos - 4) return;
    pos += payload;
    put32(pos, crc(start, pos));
    pos += 4;
  }
  if (f.size() - pos >= 4) put32(pos, crc(0, pos));
}

}  // namespace xgrad::fuzz

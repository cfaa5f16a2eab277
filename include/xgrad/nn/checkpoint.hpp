// Checkpoints: named tensors (a Module's state, an Optimizer's state) in a checksummed
// little-endian file (docs/CHECKPOINT.md), written atomically and loaded all-or-nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/optim.hpp"

namespace xgrad {

// The file format's helpers live in checkpoint-inl.hpp; the tests call these two.
namespace detail::ckpt {

using NamedTensors = std::vector<std::pair<std::string, TensorBase>>;

/// zlib's CRC-32 of n bytes, continued from `crc`; zlib takes at most UINT_MAX bytes a call.
XGRAD_API std::uint32_t crc32(std::uint32_t crc, const unsigned char* p, std::size_t n);

/// `state` with each name prefixed by `section` ("model/", "optimizer/").
XGRAD_API NamedTensors with_section(std::string_view section, const NamedTensors& state);

}  // namespace detail::ckpt

/// Writes (name, tensor) pairs to `path` in xgrad's checkpoint format (docs/CHECKPOINT.md).
/// Atomic: the file is written beside `path`, synced and renamed over it, so `path` holds
/// either its old content or the complete new file. Throws ValueError (naming the file and
/// the cause) for an undefined, traced or non-cpu tensor, an empty, duplicate or non-UTF-8
/// name, or any failed write.
XGRAD_API void save_tensors(const std::string& path, const std::vector<std::pair<std::string, TensorBase>>& tensors);

/// Reads a file written by save_tensors or save_checkpoint: (name, new tensor) in file order.
/// Every byte is validated first (magic, version, each field against the bytes that remain,
/// dtypes, shapes, payload sizes, checksums, unique names, no trailing bytes); a bad file
/// throws ValueError naming it, the tensor and the field.
XGRAD_API std::vector<std::pair<std::string, TensorBase>> load_tensors(const std::string& path);

/// Saves the module's parameters and buffers (named_state) to `path`, as "model/<name>".
XGRAD_API void save_checkpoint(const nn::Module& module, const std::string& path);

/// Saves the module's state and the optimizer's (learning rate, moments, step counters) to
/// `path`, as "model/<name>" and "optimizer/<name>": loading both resumes training exactly.
XGRAD_API void save_checkpoint(const nn::Module& module, const optim::Optimizer& optimizer, const std::string& path);

/// Loads the module's parameters and buffers from `path` in place. The file is validated and
/// matched first: every tensor of the module must be in it with the same dtype and shape, and
/// it must hold no other model tensor; otherwise ValueError lists every mismatch and the
/// module is left untouched. An optimizer section in the file is ignored.
XGRAD_API void load_checkpoint(nn::Module& module, const std::string& path);

/// Loads the module's and the optimizer's state from `path`, all or nothing, as above; a file
/// saved without an optimizer is an error.
XGRAD_API void load_checkpoint(nn::Module& module, optim::Optimizer& optimizer, const std::string& path);

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/checkpoint-inl.hpp"
#endif

// Definitions of data/text.hpp: included by it when header-only, compiled once into the library
// (src/data.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <numeric>
#include <system_error>

#include "xgrad/core/error.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/data/text.hpp"

namespace xgrad::data {

XGRAD_API Vocabulary::Vocabulary(std::string_view text) : m_ids(256, -1) {
  std::vector<bool> seen(256, false);
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)]) {
      m_ids[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(m_chars.size());
      m_chars.push_back(static_cast<char>(b));
    }
}

XGRAD_API std::vector<std::int32_t> Vocabulary::encode(std::string_view text, SourceLoc loc) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const std::int32_t id = m_ids[static_cast<unsigned char>(text[i])];
    if (id < 0)
      throw_value_error("Vocabulary::encode", loc, "character ", static_cast<int>(static_cast<unsigned char>(text[i])),
                        " (byte value) at position ", i, " is not in the vocabulary of ", size(), " characters");
    out.push_back(id);
  }
  return out;
}

XGRAD_API std::string Vocabulary::decode(std::span<const std::int32_t> ids, SourceLoc loc) const {
  std::string out;
  out.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size())
      throw_value_error("Vocabulary::decode", loc, "id ", ids[i], " at position ", i, " is outside [0, ", size(), ")");
    out.push_back(m_chars[static_cast<std::size_t>(ids[i])]);
  }
  return out;
}

namespace detail {

/// The bytes of `file`, appended to `text`.
inline void append_file(const std::filesystem::path& file, std::string& text, SourceLoc loc) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw_value_error("TextDataset", loc, "cannot open '", file.string(), "'");
  text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw_value_error("TextDataset", loc, "cannot read '", file.string(), "'");
}

/// The text of a file, or of a directory's regular files in name order (links and fortune's
/// *.dat indexes skipped).
inline std::string read_corpus(const std::filesystem::path& path, SourceLoc loc) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    if (!std::filesystem::is_regular_file(path, ec))
      throw_value_error("TextDataset", loc, "'", path.string(), "' is neither a file nor a directory");
    std::string text;
    append_file(path, text, loc);
    return text;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec))
    if (!entry.is_symlink() && entry.is_regular_file() && entry.path().extension() != ".dat")
      files.push_back(entry.path());
  if (ec) throw_value_error("TextDataset", loc, "cannot list '", path.string(), "': ", ec.message());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& file : files) append_file(file, text, loc);
  return text;
}

}  // namespace detail

XGRAD_API TextDataset::TextDataset(const std::filesystem::path& path, TextOptions options, SourceLoc loc) {
  if (options.context < 1) throw_value_error("TextDataset", loc, "context must be >= 1, got ", options.context);
  if (!(options.held_out >= 0.0 && options.held_out < 1.0))
    throw_value_error("TextDataset", loc, "held_out must be in [0, 1), got ", options.held_out);
  const std::string text = detail::read_corpus(path, loc);
  const auto length = static_cast<std::int64_t>(text.size());
  if (length < options.context + 1)
    throw_value_error("TextDataset", loc, "'", path.string(), "' holds ", length,
                      " characters, fewer than one window of context + 1 = ", options.context + 1);
  m_vocabulary = std::make_shared<const Vocabulary>(text);
  auto source = std::make_shared<detail::TextSource>();
  source->name = xgrad::detail::concat("TextDataset('", path.string(), "')");
  source->ids = m_vocabulary->encode(text, loc);
  source->context = options.context;
  // Window w is held out when it carries the running count of held-out windows past an
  // integer: the held-out ones spread evenly over the text.
  const std::int64_t count = (length - 1) / options.context;
  for (std::int64_t w = 0; w < count; ++w) {
    const bool held = std::floor(static_cast<double>(w + 1) * options.held_out) >
                      std::floor(static_cast<double>(w) * options.held_out);
    source->starts[held ? 1 : 0].push_back(w * options.context);
  }
  m_source = std::move(source);
}

XGRAD_API TextBatches TextDataset::batches(Split split, std::int64_t batch_size, std::uint64_t seed, std::int64_t epoch,
                                           SourceLoc loc) const {
  if (batch_size < 1) throw_value_error("TextDataset::batches", loc, "batch_size must be >= 1, got ", batch_size);
  std::vector<std::int64_t> starts = m_source->starts[index(split)];
  detail::shuffle(starts, seed + static_cast<std::uint64_t>(epoch));
  return TextBatches(m_source, std::move(starts), batch_size);
}

XGRAD_API TextBatch TextDataset::batch(Split split, std::int64_t first, std::int64_t count, SourceLoc loc) const {
  const auto& starts = m_source->starts[index(split)];
  const auto available = static_cast<std::int64_t>(starts.size());
  if (first < 0 || count < 1 || first > available - count)
    throw_value_error("TextDataset::batch", loc, "windows [", first, ", ", first, " + ", count,
                      ") are outside the split's ", available);
  return TextBatches(m_source, std::vector<std::int64_t>(starts.begin() + first, starts.begin() + first + count), count)
      .at(0);
}

XGRAD_API TextBatch TextBatches::at(std::int64_t i) const {
  const std::int64_t first = i * m_batch;
  const std::int64_t n = std::min(m_batch, static_cast<std::int64_t>(m_starts.size()) - first);
  const std::int64_t t = m_source->context;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(n * t)), targets(inputs.size());
  for (std::int64_t r = 0; r < n; ++r) {
    const auto* window = m_source->ids.data() + m_starts[static_cast<std::size_t>(first + r)];
    std::copy(window, window + t, inputs.begin() + r * t);
    std::copy(window + 1, window + t + 1, targets.begin() + r * t);
  }
  return {tensor<std::int32_t>(inputs, {n, t}), tensor<std::int32_t>(targets, {n, t})};
}

}  // namespace xgrad::data

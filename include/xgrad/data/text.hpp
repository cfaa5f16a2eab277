// TextDataset: a character-level language-modelling corpus, read from a text file or a directory
// of them (Debian's fortunes: /usr/share/games/fortunes), its vocabulary, and batches of windows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/data/dataset.hpp"

namespace xgrad::data {

/// The characters of a text, each an id in [0, size()) in byte order. A character is a byte: a
/// UTF-8 letter outside ASCII is two to four of them.
class Vocabulary {
 public:
  XGRAD_API explicit Vocabulary(std::string_view text);

  std::int64_t size() const { return static_cast<std::int64_t>(m_chars.size()); }
  /// The ids of `text`'s characters; a character the vocabulary lacks throws ValueError.
  XGRAD_API std::vector<std::int32_t> encode(std::string_view text, SourceLoc loc = SourceLoc::current()) const;
  /// The characters of `ids`; an id outside [0, size()) throws ValueError.
  XGRAD_API std::string decode(std::span<const std::int32_t> ids, SourceLoc loc = SourceLoc::current()) const;

 private:
  std::string m_chars;              // id -> character
  std::vector<std::int32_t> m_ids;  // byte -> id, -1 where absent
};

struct TextOptions {
  std::int64_t context = 128;  // characters per window
  double held_out = 0.1;       // the share of windows kept for Split::test, spread evenly over the text
};

/// A batch of windows: inputs [N, context] and targets [N, context], each target the character
/// after its input (the inputs shifted by one), int32 ids.
struct TextBatch {
  Tensor<std::int32_t> inputs, targets;
};

namespace detail {
/// What a TextDataset reads once and its batches share.
struct TextSource {
  std::string name;  // for messages: "TextDataset('/usr/share/games/fortunes')"
  std::vector<std::int32_t> ids;
  std::int64_t context = 0;
  std::vector<std::int64_t> starts[2];  // the windows' first characters, by Split
};
}  // namespace detail

/// The batches of one epoch of a TextDataset split, made as they are iterated.
class TextBatches {
 public:
  class iterator {
   public:
    using value_type = TextBatch;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const TextBatches* batches, std::int64_t index) : m_batches(batches), m_index(index) {}
    TextBatch operator*() const { return m_batches->at(m_index); }
    iterator& operator++() {
      ++m_index;
      return *this;
    }
    void operator++(int) { ++m_index; }
    bool operator==(const iterator& other) const { return m_index == other.m_index; }

   private:
    const TextBatches* m_batches = nullptr;
    std::int64_t m_index = 0;
  };

  TextBatches(std::shared_ptr<const detail::TextSource> source, std::vector<std::int64_t> starts, std::int64_t batch)
      : m_source(std::move(source)), m_starts(std::move(starts)), m_batch(batch) {}

  /// Batches in the epoch: the last may be smaller.
  std::int64_t size() const { return (static_cast<std::int64_t>(m_starts.size()) + m_batch - 1) / m_batch; }
  /// Batch i of the epoch.
  XGRAD_API TextBatch at(std::int64_t i) const;
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  std::shared_ptr<const detail::TextSource> m_source;
  std::vector<std::int64_t> m_starts;
  std::int64_t m_batch;
};

/// A character-level corpus: the text of a file, or of a directory's regular files in name order
/// (symbolic links and *.dat files, fortune's indexes, skipped), cut into windows of
/// options.context characters that start `context` characters apart; every 1 / held_out-th
/// window (evenly spread) is held out for Split::test, the rest are Split::train. A missing or
/// unreadable path, a text shorter than one window and a bad option throw ValueError naming
/// them.
///
///   xg::data::TextDataset text("/usr/share/games/fortunes", {.context = 128});
///   for (const auto& batch : text.batches(Split::train, 32, seed, epoch)) ...
class TextDataset {
 public:
  XGRAD_API explicit TextDataset(const std::filesystem::path& path, TextOptions options = {},
                                 SourceLoc loc = SourceLoc::current());

  const Vocabulary& vocabulary() const { return *m_vocabulary; }
  std::int64_t context() const { return m_source->context; }
  /// The corpus's characters, as ids.
  std::int64_t characters() const { return static_cast<std::int64_t>(m_source->ids.size()); }
  /// Windows in `split`.
  std::int64_t windows(Split split) const { return static_cast<std::int64_t>(m_source->starts[index(split)].size()); }

  /// Epoch `epoch` of `split`: its windows in a random order (seed + epoch: the same on every
  /// platform), `batch_size` at a time.
  XGRAD_API TextBatches batches(Split split, std::int64_t batch_size, std::uint64_t seed, std::int64_t epoch = 0,
                                SourceLoc loc = SourceLoc::current()) const;
  /// Windows [first, first + count) of `split` in order, as one batch (held-out evaluation).
  XGRAD_API TextBatch batch(Split split, std::int64_t first, std::int64_t count,
                            SourceLoc loc = SourceLoc::current()) const;

 private:
  static std::size_t index(Split split) { return split == Split::train ? 0 : 1; }
  std::shared_ptr<const detail::TextSource> m_source;
  std::shared_ptr<const Vocabulary> m_vocabulary;
};

}  // namespace xgrad::data

#if !defined(XGRAD_COMPILED)
#include "xgrad/data/text-inl.hpp"
#endif

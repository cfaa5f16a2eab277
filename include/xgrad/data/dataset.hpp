// Dataset: a pipeline of samples (shuffle, map, batch, take, prefetch) iterated epoch by
// epoch, and TensorDataset, which starts one from tensors in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/data/idx.hpp"
#include "xgrad/data/transforms.hpp"

namespace xgrad::data {

/// Which part of a data set: the training samples or the test (held-out) samples.
enum class Split { train, test };

/// One element of a dataset: after batch(n), images [N, ...image] and labels [N]; before,
/// one sample: its image (no batch axis) and a rank-0 label.
struct Batch {
  Tensor<float> images;
  Tensor<std::int32_t> labels;
};

namespace detail {

/// The samples a pipeline starts from. Shared by every copy of the pipeline and never changed
/// after construction, so the prefetch thread reads it without locks.
struct SampleSource {
  std::string name;  // for messages: "MnistDataset('/dir', train)"
  IdxArray images;   // [count, ...image shape], any IDX element type
  std::vector<std::int32_t> labels;

  std::int64_t count() const { return static_cast<std::int64_t>(labels.size()); }
  Shape image_shape() const { return Shape(images.shape.begin() + 1, images.shape.end()); }
  XGRAD_API void read(std::int64_t i, Image& out) const;
};

/// A pipeline's description: everything but the epoch being iterated. Cheap to copy.
struct Pipeline {
  std::shared_ptr<const SampleSource> source;
  std::optional<std::uint64_t> seed;
  std::int64_t shard_index = 0, shard_count = 1;  // shard(): every shard_count-th sample from shard_index
  std::int64_t take_samples = -1;                 // take() before batch(): a sample count, -1 for all
  std::vector<std::shared_ptr<const Transform>> transforms;
  ImageSpec spec;          // the images the transforms produce
  std::int64_t batch = 0;  // 0: not batched
  bool drop_remainder = false;
  std::int64_t take_batches = -1;  // take() after batch()
  std::int64_t prefetch = 2;

  XGRAD_API std::int64_t samples() const;
  XGRAD_API std::int64_t size() const;

  /// The sample order of one epoch: 0..count-1, shuffled (detail::shuffle) with seed + epoch,
  /// then this shard's part of it.
  XGRAD_API std::vector<std::int64_t> order(std::int64_t epoch) const;

  /// Element k of an epoch whose sample order is `order`.
  XGRAD_API Batch element(const std::vector<std::int64_t>& order, std::int64_t k) const;
};

/// Fisher-Yates over mt19937_64 seeded with `seed`, whose output the standard fixes: the same
/// order on every platform.
XGRAD_API void shuffle(std::vector<std::int64_t>& values, std::uint64_t seed);

/// One epoch being produced (dataset-inl.hpp).
class EpochState;

}  // namespace detail

/// Walks one epoch's elements (an input iterator; its end is std::default_sentinel).
class EpochIterator {
 public:
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using reference = const Batch&;

  EpochIterator() = default;
  explicit EpochIterator(std::shared_ptr<detail::EpochState> state) : m_state(std::move(state)) { ++*this; }

  const Batch& operator*() const { return *m_current; }
  const Batch* operator->() const { return &*m_current; }
  XGRAD_API EpochIterator& operator++();
  void operator++(int) { ++*this; }
  friend bool operator==(const EpochIterator& it, std::default_sentinel_t) { return !it.m_current; }

 private:
  std::shared_ptr<detail::EpochState> m_state;
  std::optional<Batch> m_current;
};

/// One epoch of a dataset, for range-for. Production (and the prefetch thread) starts when
/// the Epoch is made and stops when it and its iterators are gone, even mid-epoch.
class Epoch {
 public:
  XGRAD_API Epoch(const detail::Pipeline& pipeline, std::int64_t index);
  /// Iterates the epoch; call it once (the elements are produced once).
  EpochIterator begin() const { return EpochIterator(m_state); }
  std::default_sentinel_t end() const { return {}; }
  std::int64_t index() const { return m_index; }

 private:
  std::shared_ptr<detail::EpochState> m_state;
  std::int64_t m_index;
};

/// A pipeline of (image, label) samples: shuffle, map, batch, take, prefetch, then iterate
///
///   for (const auto& batch : ds) { batch.images; batch.labels; }   // the next epoch
///   for (const auto& batch : ds.epoch(3)) ...                       // epoch 3
///
/// The stages run in the order shuffle -> shard -> take (samples) -> map -> batch -> take (batches)
/// whatever order they were chained in, and each method checks its call fits that order.
/// Every method returns a new Dataset and leaves this one alone; copies share the samples,
/// so copying is cheap. Images are float32, labels int32.
class Dataset {
 public:
  XGRAD_API explicit Dataset(std::shared_ptr<const detail::SampleSource> source);

  /// Samples in a new random order each epoch, from a generator seeded with seed + epoch.
  XGRAD_API Dataset shuffle(std::uint64_t seed, SourceLoc loc = SourceLoc::current()) const;

  /// Shard `index` of `count` (a rank's part in data-parallel training: shard(rank(),
  /// world_size())): of each epoch's order, after shuffle, the samples at positions index,
  /// index + count, index + 2 count, ... The shards of one dataset are disjoint and together
  /// cover it, in the same order on every process (the shuffle seed is shared); their sizes
  /// differ by at most one sample. Comes before take and batch.
  XGRAD_API Dataset shard(std::int64_t index, std::int64_t count, SourceLoc loc = SourceLoc::current()) const;

  /// Applies the transforms, in order, to every image. Each is checked against the images it
  /// will get now, so a transform that cannot take them throws ValueError here.
  template <class... Ts>
  requires(std::is_base_of_v<Transform, Ts>&&...) Dataset map(const Ts&... transforms)
  const {
    Dataset out = *this;
    (out.add_transform(std::make_shared<Ts>(transforms)), ...);
    return out;
  }

  /// Groups n consecutive samples: images [n, ...image], labels [n]. The last batch is
  /// smaller unless drop_remainder drops it.
  XGRAD_API Dataset batch(std::int64_t n, bool drop_remainder = false, SourceLoc loc = SourceLoc::current()) const;

  /// The first n elements: n samples before batch(), n batches after.
  XGRAD_API Dataset take(std::int64_t n, SourceLoc loc = SourceLoc::current()) const;

  /// Produces up to `depth` elements ahead on a background thread (the default is 2); 0 makes
  /// each element in the iterating thread when it is asked for.
  XGRAD_API Dataset prefetch(std::int64_t depth, SourceLoc loc = SourceLoc::current()) const;

  /// Elements per epoch: batches after batch(), samples before.
  std::int64_t size() const { return m_pipeline.size(); }
  /// The batch size, or 0 before batch().
  std::int64_t batch_size() const { return m_pipeline.batch; }
  /// One image's shape after the transforms, without the batch axis.
  const Shape& image_shape() const { return m_pipeline.spec.shape; }

  /// Epoch `index` (its shuffle order is seeded with seed + index).
  Epoch epoch(std::int64_t index) const { return Epoch(m_pipeline, index); }
  /// Starts the next epoch of this Dataset object (0, 1, 2, ... over its begin() calls; a
  /// copy continues from the count it was copied at).
  EpochIterator begin() const { return epoch(m_epochs_started++).begin(); }
  std::default_sentinel_t end() const { return {}; }

 private:
  XGRAD_API void add_transform(std::shared_ptr<const Transform> t);

  detail::Pipeline m_pipeline;
  mutable std::int64_t m_epochs_started = 0;
};

/// A dataset of images [N, ...] (each sample is images[i]) and labels [N], copied out of the
/// tensors. Images [N, H, W, C] or [N, H, W] take every transform; [N, F] suits dense nets.
class TensorDataset : public Dataset {
 public:
  TensorDataset(const Tensor<float>& images, const Tensor<std::int32_t>& labels, SourceLoc loc = SourceLoc::current())
      : Dataset(make_source(images, labels, loc)) {}

 private:
  XGRAD_API static std::shared_ptr<const detail::SampleSource> make_source(const Tensor<float>& images,
                                                                           const Tensor<std::int32_t>& labels,
                                                                           SourceLoc loc);
};

}  // namespace xgrad::data

#if !defined(XGRAD_COMPILED)
#include "xgrad/data/dataset-inl.hpp"
#endif

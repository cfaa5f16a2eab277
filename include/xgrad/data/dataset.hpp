// Dataset: a pipeline of samples (shuffle, map, batch, take, prefetch) iterated epoch by
// epoch, and TensorDataset, which starts one from tensors in memory.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/data/idx.hpp"
#include "xgrad/data/transforms.hpp"

namespace xgrad::data {

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
  void read(std::int64_t i, Image& out) const {
    const std::int64_t n = image_shape().numel();
    out.spec = {image_shape(), Layout::hwc};
    out.pixels.resize(static_cast<std::size_t>(n));
    images.copy_to(i * n, n, out.pixels.data());
  }
};

/// A pipeline's description: everything but the epoch being iterated. Cheap to copy.
struct Pipeline {
  std::shared_ptr<const SampleSource> source;
  std::optional<std::uint64_t> seed;
  std::int64_t take_samples = -1;  // take() before batch(): a sample count, -1 for all
  std::vector<std::shared_ptr<const Transform>> transforms;
  ImageSpec spec;          // the images the transforms produce
  std::int64_t batch = 0;  // 0: not batched
  bool drop_remainder = false;
  std::int64_t take_batches = -1;  // take() after batch()
  std::int64_t prefetch = 2;

  std::int64_t samples() const {
    const std::int64_t n = source->count();
    return take_samples < 0 ? n : std::min(n, take_samples);
  }
  std::int64_t size() const {
    if (batch == 0) return samples();
    const std::int64_t n = drop_remainder ? samples() / batch : (samples() + batch - 1) / batch;
    return take_batches < 0 ? n : std::min(n, take_batches);
  }

  /// The sample order of one epoch: 0..count-1, shuffled by a generator seeded with
  /// seed + epoch (Fisher-Yates over mt19937_64, whose output the standard fixes, so the
  /// order is the same on every platform).
  std::vector<std::int64_t> order(std::int64_t epoch) const {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(source->count()));
    std::iota(idx.begin(), idx.end(), std::int64_t{0});
    if (seed) {
      std::mt19937_64 gen(*seed + static_cast<std::uint64_t>(epoch));
      for (std::size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[gen() % i]);
    }
    return idx;
  }

  /// Element k of an epoch whose sample order is `order`.
  Batch element(const std::vector<std::int64_t>& order, std::int64_t k) const {
    const std::int64_t first = batch ? k * batch : k;
    const std::int64_t n = batch ? std::min(batch, samples() - first) : 1;
    const std::int64_t per_image = spec.shape.numel();
    Shape shape = spec.shape;
    if (batch) {
      shape = Shape{n};
      for (std::int64_t d : spec.shape) shape.push_back(d);
    }
    auto images = Tensor<float>::empty(shape);
    auto labels = Tensor<std::int32_t>::empty(batch ? Shape{n} : Shape{});
    Image image;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t s = order[static_cast<std::size_t>(first + i)];
      source->read(s, image);
      for (const auto& t : transforms) t->apply(image);
      std::memcpy(images.data() + i * per_image, image.pixels.data(), sizeof(float) * image.pixels.size());
      labels.data()[i] = source->labels[static_cast<std::size_t>(s)];
    }
    return {images, labels};
  }
};

/// One epoch being produced: in the caller's thread on demand (prefetch 0), or by a
/// background thread that keeps up to `prefetch` elements ready.
class EpochState {
 public:
  EpochState(Pipeline pipeline, std::int64_t epoch)
      : m_pipeline(std::move(pipeline)), m_order(m_pipeline.order(epoch)), m_size(m_pipeline.size()) {
    if (m_pipeline.prefetch > 0 && m_size > 0) m_thread = std::thread([this] { produce(); });
  }
  EpochState(const EpochState&) = delete;
  EpochState& operator=(const EpochState&) = delete;
  ~EpochState() {
    if (!m_thread.joinable()) return;
    {
      std::lock_guard lock(m_mutex);
      m_stop = true;
    }
    m_space.notify_all();
    m_thread.join();
  }

  /// The next element, or nothing at the end of the epoch. An exception the producer met (a
  /// transform that threw, memory) is rethrown here, after the elements made before it.
  std::optional<Batch> next() {
    if (m_next >= m_size) return std::nullopt;
    if (!m_thread.joinable()) return m_pipeline.element(m_order, m_next++);
    std::unique_lock lock(m_mutex);
    m_ready.wait(lock, [&] { return !m_queue.empty() || m_error; });
    if (m_queue.empty()) std::rethrow_exception(m_error);
    Batch out = std::move(m_queue.front());
    m_queue.pop_front();
    ++m_next;
    lock.unlock();
    m_space.notify_one();
    return out;
  }

 private:
  void produce() {
    // Kernels called from here (Resize) must not take the shared pool from the training thread.
    cpu::keep_this_thread_serial();
    try {
      for (std::int64_t k = 0; k < m_size; ++k) {
        {
          std::unique_lock lock(m_mutex);
          m_space.wait(lock, [&] { return m_stop || static_cast<std::int64_t>(m_queue.size()) < m_pipeline.prefetch; });
          if (m_stop) return;
        }
        Batch b = m_pipeline.element(m_order, k);
        {
          std::lock_guard lock(m_mutex);
          m_queue.push_back(std::move(b));
        }
        m_ready.notify_one();
      }
    } catch (...) {
      {
        std::lock_guard lock(m_mutex);
        m_error = std::current_exception();
      }
      m_ready.notify_one();
    }
  }

  const Pipeline m_pipeline;
  const std::vector<std::int64_t> m_order;
  const std::int64_t m_size;
  std::int64_t m_next = 0;  // consumer side only
  std::mutex m_mutex;
  std::condition_variable m_ready, m_space;
  std::deque<Batch> m_queue;
  std::exception_ptr m_error;
  bool m_stop = false;
  std::thread m_thread;
};

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
  EpochIterator& operator++() {
    m_current = m_state->next();
    return *this;
  }
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
  Epoch(const detail::Pipeline& pipeline, std::int64_t index)
      : m_state(std::make_shared<detail::EpochState>(pipeline, index)), m_index(index) {}
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
/// The stages run in the order shuffle -> take (samples) -> map -> batch -> take (batches)
/// whatever order they were chained in, and each method checks its call fits that order.
/// Every method returns a new Dataset and leaves this one alone; copies share the samples,
/// so copying is cheap. Images are float32, labels int32.
class Dataset {
 public:
  explicit Dataset(std::shared_ptr<const detail::SampleSource> source) {
    m_pipeline.source = std::move(source);
    m_pipeline.spec = {m_pipeline.source->image_shape(), Layout::hwc};
  }

  /// Samples in a new random order each epoch, from a generator seeded with seed + epoch.
  Dataset shuffle(std::uint64_t seed, SourceLoc loc = SourceLoc::current()) const {
    if (m_pipeline.seed) throw_value_error("Dataset.shuffle", loc, "the dataset is already shuffled");
    if (m_pipeline.batch) throw_value_error("Dataset.shuffle", loc, "call shuffle before batch");
    if (m_pipeline.take_samples >= 0) throw_value_error("Dataset.shuffle", loc, "call shuffle before take");
    Dataset out = *this;
    out.m_pipeline.seed = seed;
    return out;
  }

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
  Dataset batch(std::int64_t n, bool drop_remainder = false, SourceLoc loc = SourceLoc::current()) const {
    if (n < 1) throw_value_error("Dataset.batch", loc, "batch size must be >= 1, got ", n);
    if (m_pipeline.batch)
      throw_value_error("Dataset.batch", loc, "the dataset is already batched (batch size ", m_pipeline.batch, ")");
    Dataset out = *this;
    out.m_pipeline.batch = n;
    out.m_pipeline.drop_remainder = drop_remainder;
    return out;
  }

  /// The first n elements: n samples before batch(), n batches after.
  Dataset take(std::int64_t n, SourceLoc loc = SourceLoc::current()) const {
    if (n < 1) throw_value_error("Dataset.take", loc, "n must be >= 1, got ", n);
    Dataset out = *this;
    auto& slot = m_pipeline.batch ? out.m_pipeline.take_batches : out.m_pipeline.take_samples;
    slot = slot < 0 ? n : std::min(slot, n);
    return out;
  }

  /// Produces up to `depth` elements ahead on a background thread (the default is 2); 0 makes
  /// each element in the iterating thread when it is asked for.
  Dataset prefetch(std::int64_t depth, SourceLoc loc = SourceLoc::current()) const {
    if (depth < 0) throw_value_error("Dataset.prefetch", loc, "depth must be >= 0, got ", depth);
    Dataset out = *this;
    out.m_pipeline.prefetch = depth;
    return out;
  }

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
  void add_transform(std::shared_ptr<const Transform> t) {
    if (m_pipeline.batch)
      throw_value_error("Dataset.map", t->loc(), "call map before batch: transforms take one image at a time");
    if (!t->on_labels()) m_pipeline.spec = t->output(m_pipeline.spec);
    m_pipeline.transforms.push_back(std::move(t));
  }

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
  static std::shared_ptr<const detail::SampleSource> make_source(const Tensor<float>& images,
                                                                 const Tensor<std::int32_t>& labels, SourceLoc loc) {
    if (images.ndim() < 2)
      throw_value_error("TensorDataset", loc, "images must be [N, ...] with rank >= 2, got shape ", images.shape());
    if (labels.ndim() != 1 || labels.shape()[0] != images.shape()[0])
      throw_value_error("TensorDataset", loc, "labels must be [N] with N = ", images.shape()[0],
                        " (the images' first axis), got shape ", labels.shape());
    auto source = std::make_shared<detail::SampleSource>();
    source->name = "TensorDataset";
    source->images.type = IdxType::float32;
    source->images.shape = images.shape();
    const auto* p = reinterpret_cast<const unsigned char*>(images.data());
    source->images.bytes.assign(p, p + sizeof(float) * static_cast<std::size_t>(images.numel()));
    source->labels = labels.to_vector();
    return source;
  }
};

}  // namespace xgrad::data

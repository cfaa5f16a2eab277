// Definitions of data/dataset.hpp: included by it when header-only, compiled once into the
// library (src/data.cpp) otherwise.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/data/dataset.hpp"

namespace xgrad::data {

namespace detail {

XGRAD_API void SampleSource::read(std::int64_t i, Image& out) const {
  const std::int64_t n = image_shape().numel();
  out.spec = {image_shape(), Layout::hwc};
  out.pixels.resize(static_cast<std::size_t>(n));
  images.copy_to(i * n, n, out.pixels.data());
}

XGRAD_API std::int64_t Pipeline::samples() const {
  const std::int64_t n = (source->count() - shard_index + shard_count - 1) / shard_count;
  return take_samples < 0 ? n : std::min(n, take_samples);
}

XGRAD_API std::int64_t Pipeline::size() const {
  if (batch == 0) return samples();
  const std::int64_t n = drop_remainder ? samples() / batch : (samples() + batch - 1) / batch;
  return take_batches < 0 ? n : std::min(n, take_batches);
}

XGRAD_API void shuffle(std::vector<std::int64_t>& values, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (std::size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[gen() % i]);
}

XGRAD_API std::vector<std::int64_t> Pipeline::order(std::int64_t epoch) const {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(source->count()));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  if (seed) shuffle(idx, *seed + static_cast<std::uint64_t>(epoch));
  if (shard_count == 1) return idx;
  std::vector<std::int64_t> part;
  for (auto i = static_cast<std::size_t>(shard_index); i < idx.size(); i += static_cast<std::size_t>(shard_count))
    part.push_back(idx[i]);
  return part;
}

XGRAD_API Batch Pipeline::element(const std::vector<std::int64_t>& order, std::int64_t k) const {
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

XGRAD_API EpochIterator& EpochIterator::operator++() {
  m_current = m_state->next();
  return *this;
}

XGRAD_API Epoch::Epoch(const detail::Pipeline& pipeline, std::int64_t index)
    : m_state(std::make_shared<detail::EpochState>(pipeline, index)), m_index(index) {}

XGRAD_API Dataset::Dataset(std::shared_ptr<const detail::SampleSource> source) {
  m_pipeline.source = std::move(source);
  m_pipeline.spec = {m_pipeline.source->image_shape(), Layout::hwc};
}

XGRAD_API Dataset Dataset::shuffle(std::uint64_t seed, SourceLoc loc) const {
  if (m_pipeline.seed) throw_value_error("Dataset.shuffle", loc, "the dataset is already shuffled");
  if (m_pipeline.batch) throw_value_error("Dataset.shuffle", loc, "call shuffle before batch");
  if (m_pipeline.take_samples >= 0) throw_value_error("Dataset.shuffle", loc, "call shuffle before take");
  if (m_pipeline.shard_count > 1) throw_value_error("Dataset.shuffle", loc, "call shuffle before shard");
  Dataset out = *this;
  out.m_pipeline.seed = seed;
  return out;
}

XGRAD_API Dataset Dataset::shard(std::int64_t index, std::int64_t count, SourceLoc loc) const {
  if (count < 1) throw_value_error("Dataset.shard", loc, "count must be >= 1, got ", count);
  if (index < 0 || index >= count)
    throw_value_error("Dataset.shard", loc, "index must be in [0, ", count, "), got ", index);
  if (m_pipeline.shard_count > 1)
    throw_value_error("Dataset.shard", loc, "the dataset is already sharded (shard ", m_pipeline.shard_index, " of ",
                      m_pipeline.shard_count, ")");
  if (m_pipeline.batch) throw_value_error("Dataset.shard", loc, "call shard before batch");
  if (m_pipeline.take_samples >= 0) throw_value_error("Dataset.shard", loc, "call shard before take");
  Dataset out = *this;
  out.m_pipeline.shard_index = index;
  out.m_pipeline.shard_count = count;
  return out;
}

XGRAD_API Dataset Dataset::batch(std::int64_t n, bool drop_remainder, SourceLoc loc) const {
  if (n < 1) throw_value_error("Dataset.batch", loc, "batch size must be >= 1, got ", n);
  if (m_pipeline.batch)
    throw_value_error("Dataset.batch", loc, "the dataset is already batched (batch size ", m_pipeline.batch, ")");
  Dataset out = *this;
  out.m_pipeline.batch = n;
  out.m_pipeline.drop_remainder = drop_remainder;
  return out;
}

XGRAD_API Dataset Dataset::take(std::int64_t n, SourceLoc loc) const {
  if (n < 1) throw_value_error("Dataset.take", loc, "n must be >= 1, got ", n);
  Dataset out = *this;
  auto& slot = m_pipeline.batch ? out.m_pipeline.take_batches : out.m_pipeline.take_samples;
  slot = slot < 0 ? n : std::min(slot, n);
  return out;
}

XGRAD_API Dataset Dataset::prefetch(std::int64_t depth, SourceLoc loc) const {
  if (depth < 0) throw_value_error("Dataset.prefetch", loc, "depth must be >= 0, got ", depth);
  Dataset out = *this;
  out.m_pipeline.prefetch = depth;
  return out;
}

XGRAD_API void Dataset::add_transform(std::shared_ptr<const Transform> t) {
  if (m_pipeline.batch)
    throw_value_error("Dataset.map", t->loc(), "call map before batch: transforms take one image at a time");
  if (!t->on_labels()) m_pipeline.spec = t->output(m_pipeline.spec);
  m_pipeline.transforms.push_back(std::move(t));
}

XGRAD_API std::shared_ptr<const detail::SampleSource> TensorDataset::make_source(const Tensor<float>& images,
                                                                                 const Tensor<std::int32_t>& labels,
                                                                                 SourceLoc loc) {
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

}  // namespace xgrad::data

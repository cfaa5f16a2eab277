// xgrad CPU backend: persistent worker thread pool, thread-count control and parallel_for.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/core/error.hpp"

namespace xgrad::cpu {

/// The most threads a parallel region may use (set_num_threads refuses more).
inline constexpr int kMaxThreads = 1024;

namespace detail {

/// True on pool workers and on a caller while it runs its share of a parallel region;
/// parallel_for runs inline when set, so nested calls cannot deadlock.
inline constinit thread_local bool t_in_parallel = false;

/// Hint to the core that we are spin-waiting.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Thread count from XGRAD_NUM_THREADS if set to a positive integer, else the hardware's.
inline int default_num_threads() {
  if (const char* env = std::getenv("XGRAD_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && v > 0) return static_cast<int>(std::min<long>(v, kMaxThreads));
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

/// The thread count parallel regions use (including the calling thread).
inline std::atomic<int>& requested_num_threads() {
  static std::atomic<int> n{default_num_threads()};
  return n;
}

/// One parallel region: [m_begin, m_begin + m_size) split into m_num_chunks near-equal chunks
/// claimed dynamically. Lives on the caller's stack; the caller outlives every worker's use.
struct Job {
  void (*m_invoke)(void*, int64_t, int64_t) = nullptr;
  void* m_ctx = nullptr;
  int64_t m_begin = 0;
  int64_t m_size = 0;
  int64_t m_num_chunks = 0;
  std::atomic<int64_t> m_next{0};
  std::atomic<bool> m_failed{false};
  std::exception_ptr m_error;

  /// Claims and runs chunks until none are left; records the first exception and
  /// stops handing out further chunks after it.
  void run() noexcept {
    const int64_t base = m_size / m_num_chunks;
    const int64_t rem = m_size % m_num_chunks;
    for (;;) {
      const int64_t c = m_next.fetch_add(1, std::memory_order_relaxed);
      if (c >= m_num_chunks) return;
      const int64_t lo = m_begin + c * base + std::min(c, rem);
      const int64_t hi = lo + base + (c < rem ? 1 : 0);
      try {
        m_invoke(m_ctx, lo, hi);
      } catch (...) {
        if (!m_failed.exchange(true, std::memory_order_acq_rel)) m_error = std::current_exception();
        m_next.store(m_num_chunks, std::memory_order_relaxed);
      }
    }
  }
};

/// Fixed set of workers that sleep between parallel regions. The calling thread takes part in
/// each region, so a pool of size N owns N - 1 threads. One region runs at a time. When the
/// system refuses a thread (a process or memory limit), the pool keeps those that started:
/// size() says how many, start_failure() why.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads) : m_size(std::max(1, num_threads)) {
    try {
      m_workers.reserve(static_cast<size_t>(m_size - 1));
      for (int i = 0; i < m_size - 1; ++i) m_workers.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::exception& e) {  // std::system_error or std::bad_alloc
      m_start_failure = e.what();
      m_size = static_cast<int>(m_workers.size()) + 1;
    }
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(m_mutex);
      m_stop = true;
    }
    m_wake_cv.notify_all();
    for (auto& t : m_workers) t.join();
  }

  /// Total threads taking part in a region, the caller included.
  int size() const noexcept { return m_size; }
  /// Why fewer threads started than were asked for; empty when all did.
  const std::string& start_failure() const noexcept { return m_start_failure; }

  /// Runs `job` on the workers and the calling thread and waits for it. Returns false without
  /// running anything if another thread is already using the pool.
  bool try_run(Job& job) {
    std::unique_lock<std::mutex> dispatch(m_dispatch, std::try_to_lock);
    if (!dispatch.owns_lock()) return false;

    {
      std::lock_guard<std::mutex> lk(m_mutex);
      m_job = &job;
      m_job_helpers = static_cast<int>(std::min<int64_t>(m_size - 1, job.m_num_chunks - 1));
      m_generation.fetch_add(1, std::memory_order_release);
    }
    m_wake_cv.notify_all();

    t_in_parallel = true;
    job.run();
    t_in_parallel = false;

    // Every chunk is claimed. Withdraw the job: a worker not yet in (still waking) never
    // touches it, so only the workers running a chunk are waited for, not the late ones.
    {
      std::lock_guard<std::mutex> lk(m_mutex);
      m_job = nullptr;
    }
    for (int i = 0; i < k_spin_iters && m_active.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
    if (m_active.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lk(m_mutex);
      m_done_cv.wait(lk, [&] { return m_active.load(std::memory_order_acquire) == 0; });
    }
    return true;
  }

 private:
  // Short spin before sleeping: back-to-back regions (the common case in tensor code)
  // then avoid a futex round trip, while idle workers stop burning a core quickly.
  static constexpr int k_spin_iters = 2000;

  void worker_loop(int id) {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      for (int i = 0; i < k_spin_iters && m_generation.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(m_mutex);
        m_wake_cv.wait(lk, [&] { return m_stop || m_generation.load(std::memory_order_relaxed) != seen; });
        if (m_stop) return;
        seen = m_generation.load(std::memory_order_relaxed);
        // Joining under the lock: the caller withdraws the job under it too, so it counts
        // every worker that may still touch the job. Workers beyond the chunk count sit out.
        if (m_job && id < m_job_helpers) {
          job = m_job;
          m_active.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!job) continue;
      job->run();
      if (m_active.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Taking the lock orders this notify after the caller's predicate check.
        { std::lock_guard<std::mutex> lk(m_mutex); }
        m_done_cv.notify_one();
      }
    }
  }

  int m_size;  // lowered only in the constructor, when a thread cannot start
  std::string m_start_failure;
  std::vector<std::thread> m_workers;
  std::mutex m_dispatch;
  std::mutex m_mutex;
  std::condition_variable m_wake_cv;
  std::condition_variable m_done_cv;
  std::atomic<uint64_t> m_generation{0};
  std::atomic<int> m_active{0};  // workers inside the current job
  Job* m_job = nullptr;
  int m_job_helpers = 0;
  bool m_stop = false;
};

inline std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}

inline std::shared_ptr<ThreadPool>& pool_slot() {
  static std::shared_ptr<ThreadPool> p;
  return p;
}

/// The shared pool sized to the requested thread count, created (or re-created) on demand.
/// Returned as shared_ptr so a concurrent set_num_threads cannot free it under a running region.
inline std::shared_ptr<ThreadPool> get_pool() {
  const int want = requested_num_threads().load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(pool_mutex());
  auto& slot = pool_slot();
  if (!slot || slot->size() != want) {
    slot = std::make_shared<ThreadPool>(want);
    // Fewer threads started (XGRAD_NUM_THREADS or the hardware's count was more than the system
    // allows): run with those from now on, rather than try again on every region.
    requested_num_threads().store(slot->size(), std::memory_order_relaxed);
  }
  return slot;
}

}  // namespace detail

/// Number of threads parallel regions use, the calling thread included.
inline int num_threads() { return detail::requested_num_threads().load(std::memory_order_relaxed); }

/// Makes every later parallel region started on the calling thread run inline on it. For a
/// background thread (a data loader's): the pool runs one region at a time, and the training
/// thread must not find it taken.
inline void keep_this_thread_serial() { detail::t_in_parallel = true; }

/// Sets the number of threads for later parallel regions; n <= 0 restores the default
/// (XGRAD_NUM_THREADS or the hardware concurrency). The workers start now: more than
/// kMaxThreads, or more than the system lets start, is a ValueError and keeps the count as it was.
inline void set_num_threads(int n) {
  if (n > kMaxThreads)
    throw ValueError(
        xgrad::detail::concat("set_num_threads: ", n, " threads asked for, at most ", kMaxThreads, " are allowed"));
  if (n <= 0) n = detail::default_num_threads();
  std::shared_ptr<detail::ThreadPool> old;
  {
    std::lock_guard<std::mutex> lk(detail::pool_mutex());
    auto& slot = detail::pool_slot();
    if (!slot || slot->size() != n) {
      auto pool = std::make_shared<detail::ThreadPool>(n);
      if (pool->size() != n)
        throw ValueError(xgrad::detail::concat("set_num_threads: only ", pool->size() - 1, " of the ", n - 1,
                                               " worker threads could start (", pool->start_failure(),
                                               "); the thread count stays ", num_threads()));
      old = std::exchange(slot, std::move(pool));
    }
    detail::requested_num_threads().store(n, std::memory_order_relaxed);
  }
  // `old` (if last owner) joins its workers here, outside the lock.
}

namespace detail {
/// parallel_for for every loop body alike: `invoke(ctx, lo, hi)` runs the body on one range.
/// The body reaches it as a function pointer, so that each loop's code is generated once,
/// not once for every branch here that may run it inline.
inline void parallel_for_erased(int64_t begin, int64_t end, int64_t grain, void (*invoke)(void*, int64_t, int64_t),
                                void* ctx) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  if (grain < 1) grain = 1;
  // Up to four chunks a thread, claimed as threads come: a worker still waking (tens of
  // microseconds after a serial stretch put it to sleep) leaves its chunks to the others.
  const int threads = num_threads();
  const int64_t chunks =
      n <= grain || t_in_parallel || threads <= 1 ? 1 : std::min<int64_t>(int64_t{4} * threads, n / grain);
  if (chunks <= 1) return invoke(ctx, begin, end);

  Job job;
  job.m_invoke = invoke;
  job.m_ctx = ctx;
  job.m_begin = begin;
  job.m_size = n;
  job.m_num_chunks = chunks;
  const std::shared_ptr<ThreadPool> pool = get_pool();
  // Another thread owns the pool: do the work here rather than wait for it.
  if (!pool->try_run(job)) return invoke(ctx, begin, end);
  if (job.m_error) std::rethrow_exception(job.m_error);
}
}  // namespace detail

/// Calls f(lo, hi) on disjoint chunks, each at least `grain` long, that together cover
/// [begin, end); chunks run concurrently on the pool and the calling thread. Runs f(begin, end)
/// inline when the range is at most `grain`, with one thread, or when nested in a region.
/// The first exception thrown by f is rethrown here after all chunks have stopped.
template <class F> void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  detail::parallel_for_erased(
      begin, end, grain, [](void* ctx, int64_t lo, int64_t hi) { (*static_cast<Fn*>(ctx))(lo, hi); },
      const_cast<void*>(static_cast<const void*>(std::addressof(f))));
}

}  // namespace xgrad::cpu

// xgrad CPU backend: persistent worker thread pool, thread-count control, parallel_for and the
// flush-denormal mode its regions carry to the workers.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
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

#if defined(__x86_64__) || defined(__i386__)
inline constexpr unsigned kFlushBits = (1u << 15) | (1u << 6);  // MXCSR: FTZ, DAZ
#elif defined(__aarch64__)
inline constexpr std::uint64_t kFlushBits = std::uint64_t{1} << 24;  // FPCR: FZ
#endif

/// Hint to the core that we are spin-waiting.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Whether the calling thread flushes denormal floats to zero, as results and as inputs (x86
/// MXCSR's FTZ and DAZ, AArch64 FPCR's FZ).
inline bool thread_flushes_denormals() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return (__builtin_ia32_stmxcsr() & kFlushBits) != 0;
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & kFlushBits) != 0;
#else
  return false;
#endif
}

/// Sets the calling thread's flush-to-zero mode; false where this CPU has none to set.
inline bool set_thread_flushes_denormals(bool on) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = __builtin_ia32_stmxcsr();
  __builtin_ia32_ldmxcsr(on ? csr | kFlushBits : csr & ~kFlushBits);
  return true;
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  fpcr = on ? fpcr | kFlushBits : fpcr & ~kFlushBits;
  asm volatile("msr fpcr, %0" : : "r"(fpcr));
  return true;
#else
  return !on;
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

/// A number no earlier call has had. A kernel whose threads all read the same prepared data
/// (its weights laid out for its loop) keeps that data per thread, stamped with the call it was
/// made for, and each thread makes its own once per call: one copy the caller made for all
/// would cost every other core a miss on each of its cache lines, and the caller, at its next
/// call, taking each line back (LeNet5's conv2 input gradient on 2 threads: 61 -> 49 us).
inline std::uint64_t new_call_stamp() noexcept {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// The thread count parallel regions use (including the calling thread).
inline std::atomic<int>& requested_num_threads() {
  static std::atomic<int> n{default_num_threads()};
  return n;
}

/// One parallel region: [m_begin, m_begin + m_size) split into m_num_chunks near-equal chunks.
/// The chunks are dealt into up to kSlots home ranges, one per thread: each thread claims from
/// its own range first (a counter no other thread touches while it has work there), then from
/// the others' (so one still waking leaves its chunks to the rest). Lives on the caller's
/// stack; the caller outlives every worker's use.
struct Job {
  static constexpr int kSlots = 8;
  struct alignas(64) Slot {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  void (*m_invoke)(void*, int64_t, int64_t) = nullptr;
  void* m_ctx = nullptr;
  int64_t m_begin = 0;
  int64_t m_size = 0;
  int64_t m_num_chunks = 0;
  int m_slots = 1;
  int m_helpers = 0;               // workers that take part (ids below it), the caller besides
  bool m_flush_denormals = false;  // the caller's mode, which each worker takes on for the region
  std::array<Slot, kSlots> m_slot;
  std::atomic<bool> m_failed{false};
  std::exception_ptr m_error;

  /// `chunks` chunks for `threads` threads, the caller included.
  void plan(int64_t chunks, int threads) {
    m_num_chunks = chunks;
    m_slots = std::clamp(threads, 1, kSlots);
    for (int s = 0; s < m_slots; ++s) {
      m_slot[static_cast<std::size_t>(s)].next.store(chunks * s / m_slots, std::memory_order_relaxed);
      m_slot[static_cast<std::size_t>(s)].end = chunks * (s + 1) / m_slots;
    }
  }

  /// The next chunk for thread `id` (0: the caller), its own range first; -1 when none is left.
  int64_t claim(int id) {
    for (int k = 0; k < m_slots; ++k) {
      Slot& slot = m_slot[static_cast<std::size_t>((id + k) % m_slots)];
      if (slot.next.load(std::memory_order_relaxed) >= slot.end) continue;
      const int64_t c = slot.next.fetch_add(1, std::memory_order_relaxed);
      if (c < slot.end) return c;
    }
    return -1;
  }

  /// Claims and runs chunks until none are left; records the first exception and
  /// stops handing out further chunks after it.
  void run(int id) noexcept {
    const int64_t base = m_size / m_num_chunks;
    const int64_t rem = m_size % m_num_chunks;
    for (;;) {
      const int64_t c = claim(id);
      if (c < 0) return;
      const int64_t lo = m_begin + c * base + std::min(c, rem);
      const int64_t hi = lo + base + (c < rem ? 1 : 0);
      try {
        m_invoke(m_ctx, lo, hi);
      } catch (...) {
        if (!m_failed.exchange(true, std::memory_order_acq_rel)) m_error = std::current_exception();
        for (int s = 0; s < m_slots; ++s) {
          Slot& slot = m_slot[static_cast<std::size_t>(s)];
          slot.next.store(slot.end, std::memory_order_relaxed);
        }
      }
    }
  }
};

// Spins before a thread sleeps or yields: back-to-back regions (the common case in tensor code)
// then avoid a futex round trip, while idle workers stop burning a core quickly.
inline constexpr int k_spin_iters = 2000;

/// Waits until `done()` holds: spinning k_spin_iters times, then yielding the core between looks.
template <class Done> void spin_until(Done done) {
  for (int i = 0; !done(); ++i) {
    if (i < k_spin_iters)
      cpu_relax();
    else
      std::this_thread::yield();
  }
}

/// Work a worker runs beside the calling thread while the caller goes on, parallel regions
/// included (run_in_background, wait_for). Lives with the caller, who waits for it before it goes.
class ThreadPool;
struct BackgroundTask {
  void (*m_invoke)(void*) = nullptr;
  void* m_ctx = nullptr;
  bool m_flush_denormals = false;
  std::atomic<bool> m_done{true};
  std::exception_ptr m_error;
  std::shared_ptr<ThreadPool> m_pool;  // the pool running it, kept until it is waited for
};

/// Fixed set of workers that spin, then sleep, between parallel regions. The calling thread
/// takes part in each region, so a pool of size N owns N - 1 threads. One region runs at a time.
/// A spinning worker joins a region without a lock: it counts itself in (m_active) before it
/// reads the job, and the caller withdraws the job before it waits for the count to reach 0, so
/// a worker either sees the job while the caller waits for it, or sees none. When the system
/// refuses a thread (a process or memory limit), the pool keeps those that started: size() says
/// how many, start_failure() why.
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
      m_stop.store(true);
    }
    m_wake_cv.notify_all();
    for (auto& t : m_workers) t.join();
  }

  /// Total threads taking part in a region, the caller included.
  int size() const noexcept { return m_size; }
  /// Why fewer threads started than were asked for; empty when all did.
  const std::string& start_failure() const noexcept { return m_start_failure; }

  /// Hands `task` to the first worker, which runs the tasks handed to it in order, each before
  /// it next joins a region (a region started meanwhile goes on without it, its chunks taken by
  /// the others). Returns false, handing nothing, when the pool has no worker.
  bool post(BackgroundTask& task) {
    if (m_size < 2) return false;
    task.m_done.store(false, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(m_task_mutex);
      m_tasks.push_back(&task);
    }
    m_generation.fetch_add(1);
    if (m_sleepers.load() > 0) {
      { std::lock_guard<std::mutex> lk(m_mutex); }
      m_wake_cv.notify_all();
    }
    return true;
  }

  /// Runs `job` on the workers and the calling thread and waits for it. Returns false without
  /// running anything if another thread is already using the pool.
  bool try_run(Job& job) {
    std::unique_lock<std::mutex> dispatch(m_dispatch, std::try_to_lock);
    if (!dispatch.owns_lock()) return false;

    job.m_helpers = static_cast<int>(std::min<int64_t>(m_size - 1, job.m_num_chunks - 1));
    m_job.store(&job);
    m_generation.fetch_add(1);
    // A worker counts itself asleep before it last looks at the generation: one that missed
    // this one is counted here, and is woken.
    if (m_sleepers.load() > 0) {
      { std::lock_guard<std::mutex> lk(m_mutex); }
      m_wake_cv.notify_all();
    }

    t_in_parallel = true;
    job.run(0);
    t_in_parallel = false;

    // Every chunk is claimed. Withdraw the job, then wait for the workers that saw it.
    m_job.store(nullptr);
    spin_until([&] { return m_active.load() == 0; });
    return true;
  }

 private:
  void worker_loop(int id) {
    t_in_parallel = true;
    bool flushes = thread_flushes_denormals();
    uint64_t seen = 0;
    for (;;) {
      for (int i = 0; i < k_spin_iters && m_generation.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
      if (m_generation.load() == seen) {
        std::unique_lock<std::mutex> lk(m_mutex);
        m_sleepers.fetch_add(1);
        m_wake_cv.wait(lk, [&] { return m_stop.load() || m_generation.load() != seen; });
        m_sleepers.fetch_sub(1);
      }
      if (m_stop.load()) return;
      seen = m_generation.load();
      if (id == 0) run_tasks(flushes);
      m_active.fetch_add(1);
      if (Job* job = m_job.load(); job && id < job->m_helpers) {
        if (job->m_flush_denormals != flushes) {
          set_thread_flushes_denormals(job->m_flush_denormals);
          flushes = job->m_flush_denormals;
        }
        job->run(id + 1);
      }
      m_active.fetch_sub(1);
    }
  }

  void run_tasks(bool& flushes) {
    for (;;) {
      BackgroundTask* task = nullptr;
      {
        std::lock_guard<std::mutex> lk(m_task_mutex);
        if (m_tasks.empty()) return;
        task = m_tasks.front();
        m_tasks.pop_front();
      }
      if (task->m_flush_denormals != flushes) {
        set_thread_flushes_denormals(task->m_flush_denormals);
        flushes = task->m_flush_denormals;
      }
      try {
        task->m_invoke(task->m_ctx);
      } catch (...) {
        task->m_error = std::current_exception();
      }
      task->m_done.store(true, std::memory_order_release);
    }
  }

  int m_size;  // lowered only in the constructor, when a thread cannot start
  std::string m_start_failure;
  std::vector<std::thread> m_workers;
  std::mutex m_dispatch;
  std::mutex m_mutex;  // for sleeping and waking only
  std::condition_variable m_wake_cv;
  std::atomic<uint64_t> m_generation{0};
  std::atomic<Job*> m_job{nullptr};
  std::atomic<int> m_active{0};    // workers between counting themselves in and out
  std::atomic<int> m_sleepers{0};  // workers asleep, or about to look at the generation for the last time
  std::atomic<bool> m_stop{false};
  std::mutex m_task_mutex;
  std::deque<BackgroundTask*> m_tasks;  // handed to the first worker, not yet started
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

/// Whether floats too small to be normal (denormals, below 1.2e-38 for float) are flushed to
/// zero, as results and as inputs, by kernels run from the calling thread: on it and on the
/// pool's workers, which take on the mode of the thread that starts each parallel region.
/// Off by default (IEEE arithmetic, as PyTorch's set_flush_denormal). On, arithmetic on
/// denormals runs at full speed: a model trained long on the same data can drive its values
/// into denormals, where each operation can take a hundred cycles. Returns false, changing
/// nothing, where the CPU has no such mode (x86 and AArch64 have). Other threads keep theirs.
inline bool set_flush_denormal(bool on) noexcept { return detail::set_thread_flushes_denormals(on); }

/// The calling thread's mode of set_flush_denormal.
inline bool flush_denormal() noexcept { return detail::thread_flushes_denormals(); }

namespace detail {
/// parallel_for for every loop body alike: `invoke(ctx, lo, hi)` runs the body on one range.
/// The body reaches it as a function pointer, so that each loop's code is generated once,
/// not once for every branch here that may run it inline.
inline void parallel_for_erased(int64_t begin, int64_t end, int64_t grain, void (*invoke)(void*, int64_t, int64_t),
                                void* ctx) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  if (grain < 1) grain = 1;
  // Up to sixteen chunks a thread, dealt into home ranges (Job): each thread works through the
  // same part of a batch from one op to the next, so its data stays in its own cache (on two
  // vCPUs whose caches are far apart, a LeNet5 step 355 -> 320 us); a worker still waking (tens
  // of microseconds after a serial stretch put it to sleep) leaves its chunks to the others.
  const int threads = num_threads();
  const int64_t chunks =
      n <= grain || t_in_parallel || threads <= 1 ? 1 : std::min<int64_t>(int64_t{16} * threads, n / grain);
  if (chunks <= 1) return invoke(ctx, begin, end);

  Job job;
  job.m_invoke = invoke;
  job.m_ctx = ctx;
  job.m_begin = begin;
  job.m_size = n;
  job.plan(chunks, static_cast<int>(std::min<int64_t>(threads, chunks)));
  job.m_flush_denormals = thread_flushes_denormals();
  const std::shared_ptr<ThreadPool> pool = get_pool();
  // Another thread owns the pool: do the work here rather than wait for it.
  if (!pool->try_run(job)) return invoke(ctx, begin, end);
  if (job.m_error) std::rethrow_exception(job.m_error);
}

/// Starts `task` (its m_invoke and m_ctx set) on a worker beside the calling thread and returns;
/// runs it here and now instead with one thread, or when called within a region. Either way
/// the caller must wait_for(task) before the task's data goes; what it threw is in m_error then.
inline void run_in_background(BackgroundTask& task) {
  task.m_flush_denormals = thread_flushes_denormals();
  task.m_error = nullptr;
  if (!t_in_parallel && num_threads() > 1) {
    task.m_pool = get_pool();
    if (task.m_pool->post(task)) return;
    task.m_pool.reset();
  }
  try {
    task.m_invoke(task.m_ctx);
  } catch (...) {
    task.m_error = std::current_exception();
  }
}

/// Waits until `task` has run, without rethrowing what it threw (see task.m_error).
inline void wait_for(BackgroundTask& task) noexcept {
  spin_until([&] { return task.m_done.load(std::memory_order_acquire); });
  task.m_pool.reset();
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

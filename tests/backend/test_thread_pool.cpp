// Tests for xgrad::cpu::parallel_for and the thread-count controls.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "xgrad/backend/cpu/copy.hpp"
#include "xgrad/backend/cpu/reduce.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"

namespace {

/// Restores the thread count when a test exits, however it exits.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int n) : m_saved(xgrad::cpu::num_threads()) { xgrad::cpu::set_num_threads(n); }
  ~ThreadCountGuard() { xgrad::cpu::set_num_threads(m_saved); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int m_saved;
};

}  // namespace

TEST_CASE("parallel_for covers the range exactly once") {
  for (int threads : {1, 2, 3, 8}) {
    ThreadCountGuard guard(threads);
    CAPTURE(threads);
    for (int64_t begin : {int64_t{0}, int64_t{-5}, int64_t{17}}) {
      for (int64_t len : {1, 2, 3, 7, 64, 1000, 12345}) {
        for (int64_t grain : {1, 3, 100, 5000}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(len));
          for (auto& h : hits) h.store(0);
          xgrad::cpu::parallel_for(begin, begin + len, grain, [&](int64_t lo, int64_t hi) {
            REQUIRE(begin <= lo);
            REQUIRE(lo < hi);
            REQUIRE(hi <= begin + len);
            for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i - begin)].fetch_add(1);
          });
          const bool all_once =
              std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; });
          CHECK(all_once);
        }
      }
    }
  }
}

TEST_CASE("a region's chunks: each thread claims its home range in order, then the others' ranges") {
  using xgrad::cpu::detail::Job;
  Job two;
  two.plan(8, 2);  // homes [0, 4) and [4, 8)
  CHECK(two.claim(1) == 4);
  CHECK(two.claim(0) == 0);
  CHECK(two.claim(0) == 1);
  CHECK(two.claim(1) == 5);
  CHECK(two.claim(0) == 2);
  CHECK(two.claim(0) == 3);
  CHECK(two.claim(0) == 6);  // its own range done: takes from the other's
  CHECK(two.claim(1) == 7);
  CHECK(two.claim(1) == -1);
  CHECK(two.claim(0) == -1);

  Job uneven;
  uneven.plan(5, 3);  // homes [0, 1), [1, 3), [3, 5)
  std::vector<std::int64_t> order;
  for (int id : {2, 2, 2, 0, 1, 0}) order.push_back(uneven.claim(id));
  CHECK(order == std::vector<std::int64_t>{3, 4, 0, 1, 2, -1});
}

TEST_CASE("parallel_for on an empty range does not call f") {
  ThreadCountGuard guard(4);
  int calls = 0;
  xgrad::cpu::parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  xgrad::cpu::parallel_for(5, 2, 1, [&](int64_t, int64_t) { ++calls; });
  CHECK(calls == 0);
}

TEST_CASE("parallel_for grain behaviour") {
  ThreadCountGuard guard(4);

  SUBCASE("range within grain runs inline as one call") {
    std::vector<std::pair<int64_t, int64_t>> calls;
    const auto caller = std::this_thread::get_id();
    bool same_thread = true;
    xgrad::cpu::parallel_for(0, 100, 100, [&](int64_t lo, int64_t hi) {
      calls.emplace_back(lo, hi);
      same_thread = same_thread && std::this_thread::get_id() == caller;
    });
    REQUIRE(calls.size() == 1);
    CHECK(calls[0] == std::make_pair(int64_t{0}, int64_t{100}));
    CHECK(same_thread);
  }

  SUBCASE("chunks are never shorter than grain and at most one per thread") {
    std::mutex mu;
    std::vector<int64_t> sizes;
    xgrad::cpu::parallel_for(0, 1000, 300, [&](int64_t lo, int64_t hi) {
      std::lock_guard<std::mutex> lk(mu);
      sizes.push_back(hi - lo);
    });
    CHECK(sizes.size() == 3);
    for (int64_t s : sizes) CHECK(s >= 300);
  }

  SUBCASE("non-positive grain is treated as one") {
    std::atomic<int64_t> total{0};
    xgrad::cpu::parallel_for(0, 10, 0, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    CHECK(total.load() == 10);
  }
}

TEST_CASE("parallel_for uses several threads when work is large") {
  ThreadCountGuard guard(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  xgrad::cpu::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    // Keep the first chunk busy until the second has started, so the caller cannot
    // claim both; gives up after a while rather than hang if only one thread runs.
    arrived.fetch_add(1);
    for (int i = 0; i < 2000 && arrived.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  CHECK(ids.size() == 2);
}

TEST_CASE("nested parallel_for runs inline without deadlock") {
  ThreadCountGuard guard(4);
  std::atomic<int64_t> total{0};
  xgrad::cpu::parallel_for(0, 8, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const auto outer_thread = std::this_thread::get_id();
      xgrad::cpu::parallel_for(0, 1000, 1, [&](int64_t ilo, int64_t ihi) {
        CHECK(std::this_thread::get_id() == outer_thread);
        total += ihi - ilo;
      });
    }
  });
  CHECK(total.load() == 8000);
}

TEST_CASE("parallel_for propagates exceptions") {
  for (int threads : {1, 4}) {
    ThreadCountGuard guard(threads);
    CAPTURE(threads);
    CHECK_THROWS_AS(xgrad::cpu::parallel_for(0, 100, 1,
                                             [](int64_t lo, int64_t hi) {
                                               if (lo <= 50 && 50 < hi) throw std::runtime_error("boom");
                                             }),
                    std::runtime_error);
    // Every chunk throwing still yields exactly one exception at the caller.
    CHECK_THROWS_WITH_AS(xgrad::cpu::parallel_for(0, 100, 1, [](int64_t, int64_t) { throw std::logic_error("all"); }),
                         "all", std::logic_error);
    // The pool stays usable afterwards.
    std::atomic<int64_t> total{0};
    xgrad::cpu::parallel_for(0, 1000, 1, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    CHECK(total.load() == 1000);
  }
}

TEST_CASE("a background task runs on a worker while the caller runs regions; inline with one thread") {
  using xgrad::cpu::detail::BackgroundTask;
  struct Probe {
    std::thread::id ran_on;
    std::atomic<bool> release{false};  // the caller's go-ahead, given after its region
    bool wait_for_release = false;
  };
  auto invoke = [](void* ctx) {
    auto& probe = *static_cast<Probe*>(ctx);
    probe.ran_on = std::this_thread::get_id();
    while (probe.wait_for_release && !probe.release.load()) std::this_thread::yield();
  };
  {
    ThreadCountGuard guard(2);
    Probe probe;
    probe.wait_for_release = true;
    BackgroundTask task;
    task.m_invoke = invoke;
    task.m_ctx = &probe;
    xgrad::cpu::detail::run_in_background(task);
    // The task holds its worker until the region below is done: the caller takes every chunk.
    std::atomic<int64_t> covered{0};
    xgrad::cpu::parallel_for(0, 1 << 16, 1, [&](int64_t lo, int64_t hi) { covered += hi - lo; });
    CHECK(covered.load() == 1 << 16);
    CHECK_FALSE(task.m_done.load());
    probe.release.store(true);
    xgrad::cpu::detail::wait_for(task);
    CHECK(task.m_done.load());
    CHECK(probe.ran_on != std::this_thread::get_id());
    CHECK_FALSE(task.m_error);
  }
  {
    ThreadCountGuard guard(1);
    Probe probe;
    BackgroundTask task;
    task.m_invoke = invoke;
    task.m_ctx = &probe;
    xgrad::cpu::detail::run_in_background(task);
    CHECK(probe.ran_on == std::this_thread::get_id());  // already run, here
    xgrad::cpu::detail::wait_for(task);
  }
}

TEST_CASE("a background task's exception waits in the task for its caller; the worker goes on") {
  for (int threads : {1, 2}) {
    ThreadCountGuard guard(threads);
    CAPTURE(threads);
    xgrad::cpu::detail::BackgroundTask failing, next;
    failing.m_invoke = [](void*) { throw std::runtime_error("background boom"); };
    std::atomic<int> runs{0};
    next.m_invoke = [](void* ctx) { ++*static_cast<std::atomic<int>*>(ctx); };
    next.m_ctx = &runs;
    xgrad::cpu::detail::run_in_background(failing);
    xgrad::cpu::detail::run_in_background(next);
    xgrad::cpu::detail::wait_for(failing);
    xgrad::cpu::detail::wait_for(next);
    REQUIRE(failing.m_error);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(failing.m_error), "background boom", std::runtime_error);
    CHECK_FALSE(next.m_error);
    CHECK(runs.load() == 1);
  }
}

TEST_CASE("set_num_threads and num_threads") {
  const int saved = xgrad::cpu::num_threads();
  CHECK(saved >= 1);
  xgrad::cpu::set_num_threads(3);
  CHECK(xgrad::cpu::num_threads() == 3);
  xgrad::cpu::set_num_threads(1);
  CHECK(xgrad::cpu::num_threads() == 1);
  int calls = 0;
  xgrad::cpu::parallel_for(0, 1000, 1, [&](int64_t lo, int64_t hi) {
    ++calls;
    CHECK(lo == 0);
    CHECK(hi == 1000);
  });
  CHECK(calls == 1);
  xgrad::cpu::set_num_threads(0);  // back to the default
  CHECK(xgrad::cpu::num_threads() >= 1);
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE("parallel_for from several external threads at once") {
  ThreadCountGuard guard(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        xgrad::cpu::parallel_for(0, 100, 1, [&](int64_t lo, int64_t hi) { total += hi - lo; });
      }
    });
  }
  for (auto& th : callers) th.join();
  CHECK(total.load() == 4 * 200 * 100);
}

TEST_CASE("many back-to-back small regions") {
  ThreadCountGuard guard(2);
  int64_t sum = 0;
  std::vector<int64_t> partial(2);
  for (int rep = 0; rep < 20000; ++rep) {
    std::fill(partial.begin(), partial.end(), 0);
    xgrad::cpu::parallel_for(0, 2, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) partial[static_cast<size_t>(i)] += i + 1;
    });
    sum += partial[0] + partial[1];
  }
  CHECK(sum == 20000 * 3);
}

TEST_CASE("copy_bytes copies every byte, in 32 KiB parts on the pool above 64 KiB") {
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{32769}, std::size_t{65536},
                              std::size_t{65537}, std::size_t{200003}}) {
      std::vector<unsigned char> src(bytes), dst(bytes + 1, 0xAB);
      for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
      xgrad::cpu::copy_bytes(dst.data(), src.data(), bytes);
      CHECK(std::equal(src.begin(), src.end(), dst.begin()));
      CHECK(dst[bytes] == 0xAB);  // nothing past the end
    }
  }
}

namespace {
/// A sum for cpu::reduce (the kernel's own test; op::SumReducer lives in the ops layer).
struct PlainSum {
  template <class T> static T identity() { return T(0); }
  template <class V> static V combine(const V& a, const V& b) { return a + b; }
  template <class B> static auto horizontal(const B& b) { return xsimd::hadd(b); }
};
}  // namespace

TEST_CASE("a reduction over a middle axis splits its columns over threads and gives the same bits at any count") {
  // One slice of [rows, columns] (a bias's gradient), a few slices, and columns not a multiple of
  // the split; each column's rows combine in order, so 1, 2 and 3 threads agree bit for bit.
  for (auto [outer, reduced, inner] : {std::array<std::int64_t, 3>{1, 4096, 128}, {3, 100, 1000}, {1, 7, 33}}) {
    std::vector<float> x(static_cast<std::size_t>(outer * reduced * inner));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 997.0f - 0.5f;
    std::vector<float> want;
    for (int threads : {1, 2, 3}) {
      ThreadCountGuard guard(threads);
      std::vector<float> y(static_cast<std::size_t>(outer * inner));
      xgrad::cpu::reduce<PlainSum>(x.data(), y.data(), outer, reduced, inner);
      if (want.empty()) {
        want = y;
        // Each column against a plain loop in the same order.
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t c = 0; c < inner; ++c) {
            float sum = 0;
            for (std::int64_t r = 0; r < reduced; ++r)
              sum += x[static_cast<std::size_t>((o * reduced + r) * inner + c)];
            CHECK(y[static_cast<std::size_t>(o * inner + c)] == sum);
          }
      }
      CHECK(y == want);
    }
  }
}

TEST_CASE("set_flush_denormal: denormals flushed to zero on the caller and on the pool's workers, then not") {
  ThreadCountGuard threads(2);
  struct Restore {
    bool was = xgrad::cpu::flush_denormal();
    ~Restore() { xgrad::cpu::set_flush_denormal(was); }
  } restore;
  const float tiny = std::numeric_limits<float>::denorm_min() * 1000.0f;
  REQUIRE(std::fpclassify(tiny) == FP_SUBNORMAL);
  const std::int64_t n = 1 << 16;
  std::vector<float> x(static_cast<std::size_t>(n), tiny), y(static_cast<std::size_t>(n), -1.0f);
  std::set<std::thread::id> ran_on;
  std::mutex m;
  // Two halves, each held until the other has started, so the worker runs one.
  const auto triple = [&] {
    std::atomic<int> arrived{0};
    xgrad::cpu::parallel_for(0, 2, 1, [&](std::int64_t half, std::int64_t) {
      {
        std::lock_guard lock(m);
        ran_on.insert(std::this_thread::get_id());
      }
      arrived.fetch_add(1);
      for (int i = 0; i < 2000 && arrived.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (std::int64_t i = half * n / 2; i < (half + 1) * n / 2; ++i)
        y[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] * 3.0f;
    });
  };
  CHECK_FALSE(xgrad::cpu::flush_denormal());  // IEEE by default
  REQUIRE(xgrad::cpu::set_flush_denormal(true));
  CHECK(xgrad::cpu::flush_denormal());
  triple();
  // By their bits: with inputs read as zero (DAZ), a denormal would compare equal to 0 here.
  const auto count_bits = [&](float value) {
    return std::count_if(y.begin(), y.end(), [&](float v) {
      return std::bit_cast<std::uint32_t>(v) == std::bit_cast<std::uint32_t>(value);
    });
  };
  CHECK(ran_on.size() == 2);  // the worker took part, in the caller's mode
  CHECK(count_bits(0.0f) == n);
  REQUIRE(xgrad::cpu::set_flush_denormal(false));
  CHECK_FALSE(xgrad::cpu::flush_denormal());
  triple();
  CHECK(count_bits(tiny * 3.0f) == n);
  CHECK(tiny * 3.0f > 0.0f);
}

// Definitions of distributed/process_group.hpp: included by it when header-only, compiled once
// into the library (src/distributed.cpp) otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/distributed/process_group.hpp"

#if defined(XGRAD_WITH_MPI)
#define OMPI_SKIP_MPICXX 1  // xgrad calls MPI's C API; the deprecated C++ bindings only cost parsing
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#if defined(XGRAD_WITH_NCCL)
#if !defined(XGRAD_WITH_MPI)
#error "XGRAD_WITH_NCCL needs XGRAD_WITH_MPI: NCCL's communicator id travels over MPI"
#endif
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace xgrad::distributed {

XGRAD_API std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

namespace detail {

struct GroupState {
  bool initialized = false;
  bool finalized = false;
  bool owns_mpi = false;  // init() started MPI, so finalize() ends it
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::uint64_t collectives = 0;    // called so far: errors number them
  std::int64_t bytes = 0;           // passed to them
  double seconds = 0;               // spent in them
  std::atomic<bool> broken{false};  // a collective timed out (on the worker): finalize() ends the job instead
  std::unordered_map<const void*, std::shared_future<void>> in_flight;  // started collectives, by buffer
#if defined(XGRAD_WITH_MPI)
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of the world's, so xgrad's messages never meet the program's
  MPI_Op nan_max = MPI_OP_NULL, nan_min = MPI_OP_NULL;
  std::unique_ptr<class Worker> worker;
#endif
#if defined(XGRAD_WITH_NCCL)
  int device = -1;                // the CUDA device init() chose for this rank; -1: none
  ncclComm_t nccl = nullptr;      // made by the first collective on the device, on the worker
  cudaStream_t stream = nullptr;  // NCCL's, on the worker
#endif
};

#if defined(XGRAD_WITH_MPI)
/// The thread that makes xgrad's MPI calls, one collective after another in the order they were
/// issued: a started collective (all_reduce_start, ...) runs while the caller computes, and the
/// calls keep the same order on every rank.
class Worker {
 public:
  Worker() : m_thread([this] { loop(); }) {}
  ~Worker() {
    {
      const std::lock_guard<std::mutex> lock(m_mutex);
      m_stop = true;
    }
    m_ready.notify_one();
    m_thread.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Queues `work`; the future holds what it threw.
  std::shared_future<void> submit(std::function<void()> work) {
    std::packaged_task<void()> task(std::move(work));
    std::shared_future<void> done = task.get_future().share();
    {
      const std::lock_guard<std::mutex> lock(m_mutex);
      m_tasks.push_back(std::move(task));
    }
    m_ready.notify_one();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(m_mutex);
        m_ready.wait(lock, [this] { return m_stop || !m_tasks.empty(); });
        if (m_tasks.empty()) return;
        task = std::move(m_tasks.front());
        m_tasks.pop_front();
      }
      task();
    }
  }

  std::mutex m_mutex;
  std::condition_variable m_ready;
  std::deque<std::packaged_task<void()>> m_tasks;
  bool m_stop = false;
  std::thread m_thread;  // last: it starts once the members it uses exist
};
#endif

XGRAD_API GroupState& group() {
  static GroupState state;
  return state;
}

[[noreturn]] inline void fail(std::string_view op, SourceLoc loc, const std::string& what) {
  throw DistributedError(xgrad::detail::op_message(op, loc, what));
}

inline const GroupState& joined(std::string_view op, SourceLoc loc) {
  const GroupState& g = group();
  if (!g.initialized)
    fail(op, loc,
         g.finalized ? "the process group was finalized"
                     : "call xg::distributed::init() first (a process started "
                       "without mpirun is then a group of one)");
  return g;
}

XGRAD_API int joined_size(std::string_view op, SourceLoc loc) { return joined(op, loc).size; }

/// The world size mpirun (Open MPI's, MPICH's or a PMIx launcher) gave this process, or 1.
inline int launched_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  return 1;
}

/// The collectives as records number them: all_reduce is 0, ...
inline constexpr std::string_view kCollectives[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                    "barrier"};
enum Collective : int { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };

/// A rank's record of a collective, which every other rank must match: its kind, dtype,
/// parameter, rank, extents, number and whether it exchanges on the device.
inline constexpr int kRecordWidth = 6 + kMaxRank;

/// "collective #3 all_reduce (sum) of Float32[3, 4]": a rank's record in the messages of check_signature.
inline std::string describe(const std::int64_t* record) {
  const auto code = static_cast<std::size_t>(record[0]);
  std::string out = xgrad::detail::concat("collective #", record[4 + kMaxRank], " ",
                                          code < std::size(kCollectives) ? kCollectives[code] : "(unknown)");
  if (code == 4) return out;
  if (code == 0 || code == 2) out += xgrad::detail::concat(" (", reduce_op_name(static_cast<ReduceOp>(record[2])), ")");
  if (code == 3) out += xgrad::detail::concat(" (root ", record[2], ")");
  return out + xgrad::detail::concat(" of ", dtype_name(static_cast<DType>(record[1])),
                                     Shape(record + 4, record + 4 + record[3]),
                                     record[5 + kMaxRank] ? " on the device (NCCL)" : "");
}

#if defined(XGRAD_WITH_MPI)

inline void check_mpi(int code, std::string_view op, SourceLoc loc) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(op, loc, xgrad::detail::concat("MPI failed on rank ", group().rank, ": ", std::string(text, length)));
}

inline MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::boolean:
      return MPI_C_BOOL;
  }
  return MPI_BYTE;
}

/// max and min as xgrad's maximum and minimum: a NaN wins (MPI_MAX leaves NaN undefined).
template <bool Max, class T> void nan_extreme(const T* in, T* inout, int n) {
  for (int i = 0; i < n; ++i)
    if (std::isnan(in[i]) || (!std::isnan(inout[i]) && (Max ? in[i] > inout[i] : in[i] < inout[i]))) inout[i] = in[i];
}
template <bool Max> void nan_extreme_op(void* in, void* inout, int* n, MPI_Datatype* type) {
  if (*type == MPI_FLOAT)
    nan_extreme<Max>(static_cast<const float*>(in), static_cast<float*>(inout), *n);
  else
    nan_extreme<Max>(static_cast<const double*>(in), static_cast<double*>(inout), *n);
}

inline MPI_Op mpi_op(ReduceOp reduce, DType dtype) {
  const bool floating = dtype == DType::float32 || dtype == DType::float64;
  switch (reduce) {
    case ReduceOp::max:
      return floating ? group().nan_max : MPI_MAX;
    case ReduceOp::min:
      return floating ? group().nan_min : MPI_MIN;
    default:
      return MPI_SUM;  // mean divides the sum
  }
}

using Clock = std::chrono::steady_clock;

/// Adds a collective's bytes and time to the group's stats().
class Counted {
 public:
  explicit Counted(std::int64_t bytes) : m_start(Clock::now()) { group().bytes += bytes; }
  ~Counted() { group().seconds += std::chrono::duration<double>(Clock::now() - m_start).count(); }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;

 private:
  Clock::time_point m_start;
};

/// Waits until `done()` (which tests the pending MPI requests) or the group's timeout, then a
/// DistributedError saying which collective of which caller did not finish and `missing()`:
/// the ranks that did not come, where known. After a timeout the group cannot go on.
template <class Done, class Missing>
void await(Done done, Missing missing, std::uint64_t number, const Signature& sig) {
  GroupState& g = group();
  const Clock::time_point start = Clock::now();
  // Poll without pause while a collective may still be quick (MPI progresses it only inside
  // MPI_Test, so a sleeping rank delays both), then, for a rank that waits long (a slow peer),
  // with pauses of 50 us.
  constexpr auto kBusy = std::chrono::milliseconds(20);
  while (!done()) {
    const auto waited = Clock::now() - start;
    if (waited > g.timeout) {
      g.broken = true;
      fail(sig.op, sig.loc,
           xgrad::detail::concat(
               "collective #", number, " (", sig.op, "): ", missing(), " within the timeout of ",
               std::chrono::duration<double>(g.timeout).count(),
               " s (distributed::InitOptions::timeout, XGRAD_DISTRIBUTED_TIMEOUT): a rank stopped, hangs, or runs "
               "other collectives; the group cannot go on, and this process ends the job when it exits"));
    }
    if (waited > kBusy) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// Waits for MPI requests (a collective's data) as await() does.
inline void await_requests(std::vector<MPI_Request>& requests, std::uint64_t number, const Signature& sig) {
  await(
      [&] {
        int done = 0;
        check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), sig.op,
                  sig.loc);
        return done != 0;
      },
      [] { return std::string("the ranks did not finish exchanging its data"); }, number, sig);
}

/// Every rank's record of this collective (its kind, dtype, parameter, rank, extents and
/// number), exchanged with each other rank, before any data moves: a DistributedError naming
/// the ranks that differ (which would otherwise hang MPI or truncate its messages), or, after
/// the timeout, the ranks that never sent theirs. `number` counts the collectives issued.
inline void check_signature(int collective, std::uint64_t number, const Signature& sig) {
  const GroupState& g = group();
  std::vector<std::int64_t> all(static_cast<std::size_t>(kRecordWidth) * g.size);
  std::int64_t* mine = all.data() + static_cast<std::size_t>(kRecordWidth) * g.rank;
  mine[0] = collective;
  mine[1] = static_cast<std::int64_t>(sig.dtype);
  mine[2] = sig.parameter;
  mine[3] = sig.shape.ndim();
  std::copy(sig.shape.begin(), sig.shape.end(), mine + 4);
  mine[4 + kMaxRank] = static_cast<std::int64_t>(number);
  mine[5 + kMaxRank] = sig.on_device;
  std::vector<MPI_Request> received(g.size, MPI_REQUEST_NULL), sent(g.size, MPI_REQUEST_NULL);
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank) continue;
    check_mpi(MPI_Irecv(all.data() + static_cast<std::size_t>(kRecordWidth) * r, kRecordWidth, MPI_INT64_T, r, 0,
                        g.comm, &received[r]),
              sig.op, sig.loc);
    check_mpi(MPI_Isend(mine, kRecordWidth, MPI_INT64_T, r, 0, g.comm, &sent[r]), sig.op, sig.loc);
  }
  std::vector<bool> arrived(g.size, false);
  arrived[g.rank] = true;
  auto done = [&] {
    bool all_done = true;
    for (int r = 0; r < g.size; ++r) {
      if (!arrived[r]) {
        int flag = 0;
        check_mpi(MPI_Test(&received[r], &flag, MPI_STATUS_IGNORE), sig.op, sig.loc);
        arrived[r] = flag != 0;
      }
      all_done = all_done && arrived[r];
    }
    return all_done;
  };
  auto missing = [&] {
    std::string ranks;
    for (int r = 0; r < g.size; ++r)
      if (!arrived[r]) ranks += xgrad::detail::concat(ranks.empty() ? "" : ", ", r);
    return xgrad::detail::concat("rank ", ranks, " did not reach it");
  };
  await(done, missing, number, sig);
  await_requests(sent, number, sig);
  const std::int64_t* first = all.data();
  for (int r = 1; r < g.size; ++r) {
    const std::int64_t* theirs = all.data() + static_cast<std::size_t>(kRecordWidth) * r;
    if (!std::equal(first, first + kRecordWidth, theirs))
      fail(sig.op, sig.loc,
           xgrad::detail::concat("the ranks disagree on the collective: rank 0 calls ", describe(first), ", rank ", r,
                                 " calls ", describe(theirs),
                                 "; every rank must call the same collectives in the same order, with the same "
                                 "dtypes, shapes and parameters"));
  }
}

/// Element counts of MPI calls are ints: a count past INT_MAX is sent in parts.
inline int mpi_count(std::int64_t n, const Signature& sig) {
  if (n > INT_MAX)
    fail(sig.op, sig.loc,
         xgrad::detail::concat("a tensor of ", n, " elements per rank is more than MPI sends at once (", INT_MAX, ")"));
  return static_cast<int>(n);
}

#endif

template <class T> void divide_by(void* data, std::int64_t count, int n) {
  T* p = static_cast<T*>(data);
  for (std::int64_t i = 0; i < count; ++i) p[i] /= static_cast<T>(n);
}

/// Mean's division of the summed elements (floating point only: the ops reject integer means).
inline void divide_sum(void* data, std::int64_t count, DType dtype, int n) {
  if (dtype == DType::float32) divide_by<float>(data, count, n);
  if (dtype == DType::float64) divide_by<double>(data, count, n);
}

#if defined(XGRAD_WITH_MPI)
/// all_reduce's exchange, on the worker: reduce-scatter, then all-gather. Each element is reduced
/// on one rank and copied to the others, so every rank ends with the same bits
/// (MPI_Allreduce's algorithms may round differently on different ranks), at a ring
/// all-reduce's cost.
inline void exchange_all_reduce(void* data, std::int64_t count, ReduceOp reduce, std::uint64_t number,
                                const Signature& sig) {
  const GroupState& g = group();
  check_signature(kAllReduce, number, sig);
  const std::size_t element = dtype_size(sig.dtype);
  std::vector<int> counts(g.size), offsets(g.size);
  for (int r = 0; r < g.size; ++r) {
    const std::int64_t begin = count * r / g.size, end = count * (r + 1) / g.size;
    counts[r] = mpi_count(end - begin, sig);
    offsets[r] = mpi_count(begin, sig);
  }
  std::vector<std::byte> part(static_cast<std::size_t>(counts[g.rank]) * element);
  const MPI_Datatype type = mpi_type(sig.dtype);
  std::vector<MPI_Request> request(1);
  check_mpi(MPI_Ireduce_scatter(data, part.data(), counts.data(), type, mpi_op(reduce, sig.dtype), g.comm, &request[0]),
            sig.op, sig.loc);
  await_requests(request, number, sig);
  if (reduce == ReduceOp::mean) divide_sum(part.data(), counts[g.rank], sig.dtype, g.size);
  check_mpi(MPI_Iallgatherv(part.data(), counts[g.rank], type, data, counts.data(), offsets.data(), type, g.comm,
                            &request[0]),
            sig.op, sig.loc);
  await_requests(request, number, sig);
}

/// Queues exchange(number) on the worker after the collectives issued before it: waits for it,
/// or, with `started`, registers it under started->key for wait() and returns at once.
template <class Exchange> void issue(std::int64_t bytes, const Started* started, Exchange exchange) {
  GroupState& g = group();
  const std::uint64_t number = ++g.collectives;
  if (!started) {
    const Counted counted(bytes);
    g.worker->submit([&exchange, number] { exchange(number); }).get();
    return;
  }
  g.bytes += bytes;
  g.in_flight.emplace(started->key, g.worker->submit([exchange, number, owner = started->owner] { exchange(number); }));
}
#endif

#if defined(XGRAD_WITH_NCCL)
inline void check_cuda(cudaError_t code, const Signature& sig) {
  if (code != cudaSuccess)
    fail(sig.op, sig.loc, xgrad::detail::concat("CUDA failed on rank ", group().rank, ": ", cudaGetErrorString(code)));
}

inline void check_nccl(ncclResult_t code, const Signature& sig) {
  if (code == ncclSuccess) return;
  const GroupState& g = group();
  const std::string detail = g.nccl ? ncclGetLastError(g.nccl) : "";
  fail(sig.op, sig.loc,
       xgrad::detail::concat("NCCL failed on rank ", g.rank, ": ", ncclGetErrorString(code),
                             detail.empty() ? "" : xgrad::detail::concat(" (", detail, ")")));
}

inline ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return ncclFloat32;
    case DType::float64:
      return ncclFloat64;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
    case DType::boolean:
      return ncclUint8;
  }
  return ncclUint8;
}

/// The group's NCCL communicator, made by the first collective on the device (on the worker,
/// once every rank's record has come, so that all of them make it): rank 0's id reaches the
/// others over MPI.
inline ncclComm_t nccl_comm(std::uint64_t number, const Signature& sig) {
  GroupState& g = group();
  if (g.nccl) return g.nccl;
  if (g.device < 0) fail(sig.op, sig.loc, xgrad::detail::concat("rank ", g.rank, " has no CUDA device"));
  check_cuda(cudaSetDevice(g.device), sig);  // a thread's current device is its own
  ncclUniqueId id{};
  if (g.rank == 0) check_nccl(ncclGetUniqueId(&id), sig);
  std::vector<MPI_Request> request(1);
  check_mpi(MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, g.comm, &request[0]), sig.op, sig.loc);
  await_requests(request, number, sig);
  check_nccl(ncclCommInitRank(&g.nccl, g.size, id, g.rank), sig);
  // Not synchronized with the legacy default stream, so that started exchanges overlap the
  // kernels computing meanwhile; each exchange waits for an event recorded when it was issued.
  check_cuda(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), sig);
  return g.nccl;
}

/// An event on the issuing thread's default stream, marking that the kernels writing a
/// collective's input have run once it fires.
inline std::shared_ptr<CUevent_st> inputs_written(const Signature& sig) {
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), sig);
  std::shared_ptr<CUevent_st> owned(event, cudaEventDestroy);
  check_cuda(cudaEventRecord(event, nullptr), sig);
  return owned;
}

/// Queues a collective on device buffers as issue() does: on the worker, the record check over
/// MPI, then `launch(comm, stream)` (an NCCL call) once the input is written, awaited with the
/// group's timeout; NCCL's own errors become DistributedErrors.
template <class Launch>
void issue_on_device(int collective, std::int64_t bytes, const Signature& sig, const Started* started, Launch launch) {
  issue(bytes, started, [=, ready = inputs_written(sig)](std::uint64_t number) {
    check_signature(collective, number, sig);
    const ncclComm_t comm = nccl_comm(number, sig);
    const GroupState& g = group();
    check_cuda(cudaStreamWaitEvent(g.stream, ready.get(), 0), sig);
    check_nccl(launch(comm, g.stream), sig);
    await(
        [&] {
          const cudaError_t state = cudaStreamQuery(g.stream);
          if (state == cudaSuccess) return true;
          if (state != cudaErrorNotReady) check_cuda(state, sig);
          ncclResult_t failure = ncclSuccess;
          check_nccl(ncclCommGetAsyncError(comm, &failure), sig);
          check_nccl(failure, sig);
          return false;
        },
        [] { return std::string("the ranks did not finish exchanging its data on the device"); }, number, sig);
  });
}
#endif

/// A group of one's collective, done already: registered for wait() when started.
inline void done_at_once(const Started* started) {
  if (started) finished(started->key);
}

/// The checks every raw collective makes before it runs.
inline const GroupState& check_call(const Signature& sig, const Started* started) {
  const GroupState& g = joined(sig.op, sig.loc);
  if (started && g.in_flight.count(started->key))
    fail(sig.op, sig.loc, "xgrad internal error: a buffer already in flight was started again");
  return g;
}

XGRAD_API bool exchanges_on_device(std::optional<ReduceOp> reduce) {
#if defined(XGRAD_WITH_NCCL)
  const GroupState& g = group();
  return g.initialized && g.size > 1 && g.device >= 0 &&
         (!reduce || *reduce == ReduceOp::sum || *reduce == ReduceOp::mean);
#else
  (void)reduce;
  return false;
#endif
}

XGRAD_API void all_reduce(void* data, std::int64_t count, ReduceOp reduce, const Signature& sig,
                          const Started* started) {
  const GroupState& g = check_call(sig, started);
  if (g.size == 1) return done_at_once(started);
#if defined(XGRAD_WITH_NCCL)
  if (sig.on_device)
    return issue_on_device(kAllReduce, count * static_cast<std::int64_t>(dtype_size(sig.dtype)), sig, started,
                           [=](ncclComm_t comm, cudaStream_t stream) {
                             return ncclAllReduce(data, data, static_cast<std::size_t>(count), nccl_type(sig.dtype),
                                                  reduce == ReduceOp::mean ? ncclAvg : ncclSum, comm, stream);
                           });
#endif
#if defined(XGRAD_WITH_MPI)
  issue(count * static_cast<std::int64_t>(dtype_size(sig.dtype)), started,
        [=](std::uint64_t number) { exchange_all_reduce(data, count, reduce, number, sig); });
#else
  (void)data, (void)count, (void)reduce;
#endif
}

XGRAD_API void all_gather(const void* in, void* out, std::int64_t bytes, const Signature& sig, const Started* started) {
  const GroupState& g = check_call(sig, started);
  if (g.size == 1) {
    if (bytes > 0) std::memcpy(out, in, static_cast<std::size_t>(bytes));
    return done_at_once(started);
  }
#if defined(XGRAD_WITH_NCCL)
  if (sig.on_device)
    return issue_on_device(kAllGather, bytes, sig, started, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(in, out, static_cast<std::size_t>(bytes), ncclUint8, comm, stream);
    });
#endif
#if defined(XGRAD_WITH_MPI)
  issue(bytes, started, [=](std::uint64_t number) {
    const GroupState& group_state = group();
    check_signature(kAllGather, number, sig);
    const int n = mpi_count(bytes, sig);
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, group_state.comm, &request[0]), sig.op, sig.loc);
    await_requests(request, number, sig);
  });
#endif
}

XGRAD_API void reduce_scatter(const void* in, void* out, std::int64_t count, ReduceOp reduce, const Signature& sig,
                              const Started* started) {
  const GroupState& g = check_call(sig, started);
  if (g.size == 1) {
    if (count > 0) std::memcpy(out, in, static_cast<std::size_t>(count) * dtype_size(sig.dtype));
    return done_at_once(started);
  }
#if defined(XGRAD_WITH_NCCL)
  if (sig.on_device)
    return issue_on_device(kReduceScatter, count * g.size * static_cast<std::int64_t>(dtype_size(sig.dtype)), sig,
                           started, [=](ncclComm_t comm, cudaStream_t stream) {
                             return ncclReduceScatter(in, out, static_cast<std::size_t>(count), nccl_type(sig.dtype),
                                                      reduce == ReduceOp::mean ? ncclAvg : ncclSum, comm, stream);
                           });
#endif
#if defined(XGRAD_WITH_MPI)
  issue(count * g.size * static_cast<std::int64_t>(dtype_size(sig.dtype)), started, [=](std::uint64_t number) {
    const GroupState& group_state = group();
    check_signature(kReduceScatter, number, sig);
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Ireduce_scatter_block(in, out, mpi_count(count, sig), mpi_type(sig.dtype), mpi_op(reduce, sig.dtype),
                                        group_state.comm, &request[0]),
              sig.op, sig.loc);
    await_requests(request, number, sig);
    if (reduce == ReduceOp::mean) divide_sum(out, count, sig.dtype, group_state.size);
  });
#else
  (void)reduce;
#endif
}

XGRAD_API void broadcast(void* data, std::int64_t bytes, int root, const Signature& sig, const Started* started) {
  const GroupState& g = check_call(sig, started);
  if (root < 0 || root >= g.size)
    fail(sig.op, sig.loc, xgrad::detail::concat("root ", root, " is not a rank of this group of ", g.size));
  if (g.size == 1) return done_at_once(started);
#if defined(XGRAD_WITH_NCCL)
  if (sig.on_device)
    return issue_on_device(kBroadcast, bytes, sig, started, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(data, data, static_cast<std::size_t>(bytes), ncclUint8, root, comm, stream);
    });
#endif
#if defined(XGRAD_WITH_MPI)
  issue(bytes, started, [=](std::uint64_t number) {
    check_signature(kBroadcast, number, sig);
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Ibcast(data, mpi_count(bytes, sig), MPI_BYTE, root, group().comm, &request[0]), sig.op, sig.loc);
    await_requests(request, number, sig);
  });
#else
  (void)data, (void)bytes;
#endif
}

XGRAD_API void finished(const void* key) {
  std::promise<void> done;
  done.set_value();
  group().in_flight.emplace(key, done.get_future().share());
}

XGRAD_API void wait(const void* key, std::string_view op, SourceLoc loc) {
  GroupState& g = group();
  const auto found = g.in_flight.find(key);
  if (found == g.in_flight.end()) fail(op, loc, "no started collective is in flight on this tensor");
  const std::shared_future<void> result = found->second;
  g.in_flight.erase(found);
#if defined(XGRAD_WITH_MPI)
  const Counted counted(0);  // the wait is what the caller spends
#endif
  result.get();
}

}  // namespace detail

XGRAD_API void init(InitOptions options, SourceLoc loc) {
  detail::GroupState& g = detail::group();
  if (g.initialized) return;
  if (g.finalized) detail::fail("distributed::init", loc, "the process group was finalized; MPI cannot start again");
  if (const char* seconds = std::getenv("XGRAD_DISTRIBUTED_TIMEOUT")) {
    char* end = nullptr;
    const double value = std::strtod(seconds, &end);
    if (end == seconds || *end != '\0' || !(value > 0) || value > 1e9)
      detail::fail(
          "distributed::init", loc,
          xgrad::detail::concat("XGRAD_DISTRIBUTED_TIMEOUT must be a positive number of seconds, got '", seconds, "'"));
    options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(value * 1000));
  }
  if (options.timeout.count() <= 0)
    detail::fail("distributed::init", loc,
                 xgrad::detail::concat("timeout must be positive, got ", options.timeout.count(), " ms"));
  g.timeout = options.timeout;
#if defined(XGRAD_WITH_MPI)
  int started = 0;
  MPI_Initialized(&started);
  if (!started) {
    int provided = 0;
    detail::check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "distributed::init", loc);
    if (provided < MPI_THREAD_SERIALIZED)  // xgrad's worker thread calls MPI, not the main thread
      detail::fail("distributed::init", loc, "this MPI library supports no calls from threads other than the main one");
    g.owns_mpi = true;
    std::atexit([] { finalize(); });  // mpirun counts a rank that exits without MPI_Finalize as failed
  }
  detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &g.comm), "distributed::init", loc);
  MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);  // errors become DistributedErrors
  MPI_Comm_rank(g.comm, &g.rank);
  MPI_Comm_size(g.comm, &g.size);
  MPI_Op_create(&detail::nan_extreme_op<true>, /*commute=*/1, &g.nan_max);
  MPI_Op_create(&detail::nan_extreme_op<false>, /*commute=*/1, &g.nan_min);
  if (g.size > 1) g.worker = std::make_unique<detail::Worker>();
#if defined(XGRAD_WITH_NCCL)
  if (int gpus = 0; cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
    MPI_Comm host = MPI_COMM_NULL;  // the ranks sharing this host
    int local_rank = 0;
    MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &host);
    MPI_Comm_rank(host, &local_rank);
    MPI_Comm_free(&host);
    g.device = local_rank % gpus;
    detail::check_cuda(cudaSetDevice(g.device), {.op = "distributed::init", .loc = loc});
  }
  cudaGetLastError();  // a host without a GPU is no error: its tensors stay on the cpu
#endif
#else
  if (const int launched = detail::launched_world_size(); launched > 1)
    detail::fail("distributed::init", loc,
                 xgrad::detail::concat("this process was started by mpirun as one of ", launched,
                                       " but xgrad was built without MPI: configure with -DXGRAD_MPI=ON "
                                       "(Debian: apt-get install libopenmpi-dev openmpi-bin)"));
#endif
  g.initialized = true;
}

XGRAD_API bool is_initialized() { return detail::group().initialized; }

XGRAD_API Stats stats() {
  const detail::GroupState& g = detail::group();
  return {.collectives = g.collectives, .bytes = g.bytes, .seconds = g.seconds};
}

XGRAD_API int rank(SourceLoc loc) { return detail::joined("distributed::rank", loc).rank; }

XGRAD_API int world_size(SourceLoc loc) { return detail::joined("distributed::world_size", loc).size; }

XGRAD_API void barrier(SourceLoc loc) {
  [[maybe_unused]] const detail::GroupState& g = detail::joined("distributed::barrier", loc);
#if defined(XGRAD_WITH_MPI)
  // Every rank's record reaching every other is a barrier, one that names a rank that never comes.
  if (g.size > 1)
    detail::issue(0, nullptr, [&](std::uint64_t number) {
      detail::check_signature(detail::kBarrier, number,
                              {.op = "distributed::barrier", .dtype = DType::float32, .loc = loc});
    });
#endif
}

XGRAD_API void finalize() {
  detail::GroupState& g = detail::group();
  if (!g.initialized) return;
#if defined(XGRAD_WITH_MPI)
  if (g.broken) MPI_Abort(g.comm, 1);  // the others may wait in a collective forever
#if defined(XGRAD_WITH_NCCL)
  if (g.nccl)  // on the thread that made them; at exit CUDA may be gone already, so failures are ignored
    g.worker
        ->submit([&g] {
          ncclCommDestroy(g.nccl);
          cudaStreamDestroy(g.stream);
          g.nccl = nullptr;
        })
        .get();
#endif
  g.worker.reset();
  MPI_Op_free(&g.nan_max);
  MPI_Op_free(&g.nan_min);
  MPI_Comm_free(&g.comm);
  if (g.owns_mpi) MPI_Finalize();
#endif
  g.in_flight.clear();
  g.initialized = false;
  g.finalized = true;
}

}  // namespace xgrad::distributed

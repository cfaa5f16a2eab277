// The process group of data-parallel training: the processes mpirun started (Open MPI), each a
// rank. A process started without mpirun is a group of one, where every collective is the
// identity. MPI is opt-in: CMake's XGRAD_MPI=ON links it and defines XGRAD_WITH_MPI; without
// it the group is always one process, and init() says how to enable MPI when mpirun asked for
// more. Declarations only: the definitions are in distributed/process_group-inl.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "xgrad/core/config.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/source_loc.hpp"

namespace xgrad::distributed {

/// How a collective combines the ranks' tensors elementwise.
enum class ReduceOp { sum, mean, max, min };

/// "sum", "mean", "max", "min".
XGRAD_API std::string_view reduce_op_name(ReduceOp op);

/// How the process group behaves.
struct InitOptions {
  /// How long a collective waits for the other ranks before it gives up with a DistributedError
  /// naming the ranks that did not come (one that died, hangs or runs other collectives).
  /// After that the group cannot go on: the error ends this process, and its end (an uncaught
  /// exception, or finalize() at exit, which then calls MPI_Abort) ends every rank. The
  /// environment's XGRAD_DISTRIBUTED_TIMEOUT, in seconds, overrides it.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// Joins the process group: MPI's world when mpirun started this process (MPI_Init_thread,
/// unless the program initialized MPI itself), else a group of one. A second call does
/// nothing; a call after finalize() is a DistributedError (MPI cannot start twice). In a CUDA
/// build with NCCL it also makes GPU (local rank mod the host's GPUs) the calling thread's CUDA
/// device, so that the ranks of one host use different GPUs: call it before making device tensors.
XGRAD_API void init(InitOptions options = {}, SourceLoc loc = SourceLoc::current());

/// True between init() and finalize().
XGRAD_API bool is_initialized();

/// This process's rank in [0, world_size()). DistributedError before init().
XGRAD_API int rank(SourceLoc loc = SourceLoc::current());

/// The number of processes in the group. DistributedError before init().
XGRAD_API int world_size(SourceLoc loc = SourceLoc::current());

/// Returns when every rank has called it.
XGRAD_API void barrier(SourceLoc loc = SourceLoc::current());

/// Leaves the group (MPI_Finalize, unless the program initialized MPI itself). Every rank
/// calls it; nothing after it communicates. A call without init() does nothing; a program
/// that never calls it gets it when it exits. After a collective timed out, it ends the whole
/// job instead (MPI_Abort): the other ranks may be waiting in a collective that never ends.
XGRAD_API void finalize();

/// What this process has spent on collectives since init(): how many it issued with more than
/// one rank (barriers included), the bytes it passed in, and the wall time its callers spent
/// in them or waiting for started ones (the other ranks' lateness included). The data_parallel
/// benchmark reads the share of a train step spent waiting on communication.
struct Stats {
  std::uint64_t collectives = 0;
  std::int64_t bytes = 0;
  double seconds = 0;
};
XGRAD_API Stats stats();

/// True when this build of xgrad has MPI (XGRAD_WITH_MPI).
constexpr bool built_with_mpi() {
#if defined(XGRAD_WITH_MPI)
  return true;
#else
  return false;
#endif
}

/// init() for a scope: finalize() when it ends (the program's main, typically).
class Session {
 public:
  explicit Session(InitOptions options = {}, SourceLoc loc = SourceLoc::current()) { init(options, loc); }
  ~Session() { finalize(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

namespace detail {

/// The collectives on raw buffers, which the ops (distributed/collectives.hpp) run. Each first
/// checks that every rank calls the same collective on the same dtype and shape (a
/// DistributedError naming the ranks that differ, instead of a hang or a truncated message);
/// `op` and `loc` name the caller in errors.
struct Signature {
  std::string_view op;         // "all_reduce", ...
  DType dtype;                 // of the tensor this rank passes
  Shape shape;                 // and its shape
  std::int64_t parameter = 0;  // what must also agree: the ReduceOp or the root
  SourceLoc loc;
  bool on_device = false;  // the buffers are Device::thrust's, exchanged there (NCCL)
};

/// Makes a collective asynchronous: it is queued after the collectives issued before it and
/// runs while the caller goes on; `key` names it for wait(), and `owner` keeps its buffers alive
/// until it is done. Nothing may touch them before wait(key).
struct Started {
  const void* key;
  std::shared_ptr<const void> owner;
};

/// Whether a collective on Device::thrust tensors (reducing by `reduce`, if it reduces)
/// exchanges the device's buffers where they are, through NCCL, rather than copies staged
/// through the host: in a CUDA build with MPI and NCCL (XGRAD_WITH_NCCL), in a group of more
/// than one, for NCCL's reductions (sum and mean; max and min go through the host, where a NaN
/// wins as in xgrad's maximum and minimum).
XGRAD_API bool exchanges_on_device(std::optional<ReduceOp> reduce = std::nullopt);

/// The group's size; a DistributedError naming `op` and `loc` before init().
XGRAD_API int joined_size(std::string_view op, SourceLoc loc);

/// data[i] = reduce over the ranks of their data[i], in place (count elements).
XGRAD_API void all_reduce(void* data, std::int64_t count, ReduceOp reduce, const Signature& sig,
                          const Started* started = nullptr);
/// out = the ranks' `bytes` bytes of `in`, rank after rank (out holds world_size() * bytes).
XGRAD_API void all_gather(const void* in, void* out, std::int64_t bytes, const Signature& sig,
                          const Started* started = nullptr);
/// out[i] = reduce over the ranks of their in[rank() * count + i] (in holds world_size() *
/// count elements).
XGRAD_API void reduce_scatter(const void* in, void* out, std::int64_t count, ReduceOp reduce, const Signature& sig,
                              const Started* started = nullptr);
/// data = root's data, `bytes` bytes.
XGRAD_API void broadcast(void* data, std::int64_t bytes, int root, const Signature& sig,
                         const Started* started = nullptr);
/// Registers `key` as a started collective already done (a device tensor's, exchanged through
/// the host at once), for wait().
XGRAD_API void finished(const void* key);
/// Returns when the collective started under `key` has finished (or throws what it threw).
XGRAD_API void wait(const void* key, std::string_view op, SourceLoc loc);

}  // namespace detail

}  // namespace xgrad::distributed

#if !defined(XGRAD_COMPILED)
#include "xgrad/distributed/process_group-inl.hpp"
#endif

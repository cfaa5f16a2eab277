// The graph executor: runs a verified graph on concrete tensors, node by node, through the
// kernels eager mode uses, on the device of its inputs (cpu or Device::thrust). On the cpu the
// nodes of a stage (backend/schedule.hpp) run at once on the thread pool, and a node in the
// background (an optimizer's update of a small layer) runs on a worker while the caller goes on
// with the stages after it, the worker joining their regions when done. With a memory
// plan (backend/memory_plan.hpp) every intermediate lives in an arena on that device, made on
// the first call and kept for the next, and kernels write into it: after warm-up a call
// allocates only what it returns. Without one, each node allocates its outputs and drops each
// intermediate after its last use.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/backend/memory_plan.hpp"
#include "xgrad/backend/schedule.hpp"
#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::backend {

struct ProgramOptions {
  bool plan_memory = false;
  /// Fill every arena buffer with 0xFF bytes when it is freed, so a kernel that reads a
  /// buffer after its last planned use (an aliasing bug) gets NaNs, not stale values.
  bool poison_freed_buffers = false;
};

/// A graph ready to run. Immutable once built, so one Program serves concurrent calls (each
/// takes its own arena).
class Program {
 public:
  Program() = default;
  XGRAD_API explicit Program(std::shared_ptr<const ir::Graph> graph, ProgramOptions options = {});

  const ir::Graph& graph() const { return *m_graph; }
  /// The memory plan, when the program runs from one.
  const MemoryPlan* memory_plan() const { return m_plan ? &*m_plan : nullptr; }
  /// The graph's nodes cut into stages, each run at once on the cpu.
  std::span<const Stage> stages() const { return m_stages; }
  /// The nodes that run in the background (backend/schedule.hpp), in order.
  std::span<const std::size_t> background_nodes() const { return m_background; }

  /// Runs the graph on `inputs` (one per graph input, of its dtype and shape), applies its
  /// effects to those inputs and returns its outputs.
  XGRAD_API std::vector<TensorBase> run(std::span<const TensorBase> inputs) const;

  /// As run(inputs), the outputs put in `results` (emptied first): a caller that keeps the
  /// vector from call to call allocates nothing for it.
  XGRAD_API void run(std::span<const TensorBase> inputs, std::vector<TensorBase>& results) const;

 private:
  /// The bytes a memory plan lays out, on the device a call runs on.
  class Arena {
   public:
    XGRAD_API Arena(std::size_t bytes, Device device);
    XGRAD_API ~Arena();
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    std::byte* data() const { return m_data; }

   private:
    Device m_device;
    std::byte* m_data = nullptr;
    std::unique_ptr<Storage> m_storage;  // off the cpu
  };

  /// What one call needs besides the graph: made on the first call on a device, kept for the
  /// next call there.
  struct Workspace {
    Device device = Device::cpu;
    std::unique_ptr<Arena> arena;
    std::vector<TensorBase> planned;  // per value id: a tensor over its arena buffer, if planned
    /// Per value written into an input (m_written_into): a tensor over its arena buffer, and one
    /// over the caller's buffer for the call under way.
    std::vector<TensorBase> in_arena, into_input;
    std::vector<TensorBase> env;        // per value id: the value while it is live
    std::vector<TensorBase> constants;  // off the cpu, per node: a Const's value moved to the device
    /// Per node of the longest stage: its kernel's inputs and outputs while it runs.
    struct Operands {
      std::vector<TensorBase> in, out;
    };
    std::vector<Operands> operands;
    std::vector<TensorBase> effect_sources;
    /// Per node in the background (m_background): its operands and its task on the pool,
    /// defined beside the code that runs it.
    struct Background;
    std::vector<Background> background;

    XGRAD_API ~Workspace();
  };

  struct Pool {
    std::mutex mutex;
    std::vector<std::unique_ptr<Workspace>> idle;
  };
  struct Pools {
    Pool cpu, thrust;
    Pool& of(Device device) { return device == Device::cpu ? cpu : thrust; }
  };

  /// A workspace taken from the pool for one call and given back after it.
  class Lease {
   public:
    template <class Make> Lease(Pool& pool, Make&& make) : m_pool(pool) {
      {
        std::lock_guard lock(pool.mutex);
        if (!pool.idle.empty()) {
          m_ws = std::move(pool.idle.back());
          pool.idle.pop_back();
        }
      }
      if (!m_ws) m_ws = make();
    }
    ~Lease() {
      std::lock_guard lock(m_pool.mutex);
      m_pool.idle.push_back(std::move(m_ws));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Workspace& workspace() { return *m_ws; }

   private:
    Pool& m_pool;
    std::unique_ptr<Workspace> m_ws;
  };

  /// The device a call runs on: that of its inputs, which must agree (a one-element cpu tensor
  /// goes with any device, as in eager ops).
  XGRAD_API Device device_of_inputs(std::span<const TensorBase> inputs) const;

  XGRAD_API std::string describe_input(std::size_t i) const;

  XGRAD_API std::unique_ptr<Workspace> make_workspace(Device device) const;

  /// Runs node k, reading and writing the values in `ws.env`.
  XGRAD_API void run_node(Workspace& ws, Workspace::Operands& ops, std::size_t k) const;
  /// run_node before and after the kernel: node k's operands gathered from `ws.env`, its results
  /// checked and kept there.
  XGRAD_API void gather_operands(Workspace& ws, Workspace::Operands& ops, std::size_t k) const;
  XGRAD_API void keep_results(Workspace& ws, Workspace::Operands& ops, std::size_t k) const;

  /// A node's output j, when made on the cpu during a call on the workspace's device, moved there (into its
  /// planned buffer when it has one); a one-element result may stay, as scalars do.
  XGRAD_API static void move_to_device(const Workspace& ws, Workspace::Operands& ops, const ir::Node& node,
                                       std::size_t j);

  XGRAD_API static void check_output(const ir::Node& node, const ir::Value& v, const TensorBase& t);

  /// A kernel that did not write into its planned buffer made its own, which is fine, unless
  /// it returned some arena buffer (an input it passed through): that one is copied into the
  /// planned buffer, since the plan may give the arena buffer away.
  XGRAD_API static void keep_in_plan(const Workspace& ws, const ir::Value& v, TensorBase& t);

  /// Writes every effect's value into its input. A value that is itself another effect's
  /// target (a swap) is copied first, so each write sees the values from before the call.
  XGRAD_API void apply_effects(std::span<const TensorBase> inputs, Workspace& ws) const;

  /// Points the planned tensor of each value written into an input at that input's buffer for
  /// this call, unless another input shares the buffer (then the arena's, and the effect copies).
  XGRAD_API void bind_written_into(std::span<const TensorBase> inputs, Workspace& ws) const;

  XGRAD_API static void write_into(const TensorBase& dst, const TensorBase& src);

  std::shared_ptr<const ir::Graph> m_graph;
  ProgramOptions m_options;
  std::vector<Stage> m_stages;
  /// The effects' values the memory plan writes into the inputs they update: (value id, input).
  std::vector<std::pair<std::size_t, std::size_t>> m_written_into;
  std::vector<std::vector<int>> m_release;  // per node: the values no later node reads
  /// The nodes that run in the background (backend/schedule.hpp), and per node its index
  /// among them (-1: none).
  std::vector<std::size_t> m_background;
  std::vector<std::ptrdiff_t> m_background_index;
  std::optional<MemoryPlan> m_plan;
  std::unique_ptr<Pools> m_pools;
};

}  // namespace xgrad::backend

#if !defined(XGRAD_COMPILED)
#include "xgrad/backend/executor-inl.hpp"
#endif

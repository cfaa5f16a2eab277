// Memory planning: before a compiled graph first runs, every intermediate gets a place in one
// arena. A buffer is free again after the last node that reads it (or any view of it), and a
// later value of the right size takes it; an elementwise node (or fused group) may write its
// output over an input it reads last. Nodes that run side by side (backend/schedule.hpp) are
// planned as one step: none takes a buffer another reads, and their dead buffers are free after
// the last of them. A node in the background may run until the call's end: its buffers stay its
// own to then, and no node after it writes into an input it reads. Inputs, constants, outputs
// and whatever views them stay outside the arena: a caller owns what a call returns.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::backend {

struct MemoryPlan {
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::ptrdiff_t kNotPlanned = -1;

  struct Region {
    std::size_t offset = 0;
    std::size_t bytes = 0;
  };

  /// Per value id: where its buffer starts in the arena, or kNotPlanned (inputs, constants,
  /// outputs, views, and values of nodes that make their own).
  std::vector<std::ptrdiff_t> offset;
  /// Per value id: the input whose buffer it writes over (-1: none).
  std::vector<int> in_place_of;
  /// Per value id: whether it takes a buffer freed by a dead value (else a fresh part).
  std::vector<bool> reused;
  /// Per value id: the graph input (its value id) whose buffer the value's node writes it into,
  /// else -1. Such a value is an effect's, written into the tensor the effect updates: nothing
  /// reads that input after the node, which reads it, if at all, element by element before
  /// writing. The executor hands the node the caller's buffer instead of the arena's (where the
  /// value keeps a place for a call that cannot: the tensor shared with another input), and the
  /// effect has nothing left to copy.
  std::vector<int> written_into;
  /// Per node: the arena regions free after it runs; a stage's all after its last node.
  std::vector<std::vector<Region>> freed_after;
  std::size_t arena_bytes = 0;      // the peak: what one call's arena takes
  std::size_t unplanned_bytes = 0;  // what the planned values would take without any reuse
  int num_planned = 0, num_in_place = 0, num_reused = 0, num_written_into = 0;

  /// "arena 1.5 MiB for 24 buffers (4.2 MiB without reuse); 5 in place, 12 reuse a dead buffer;
  /// 4 written into the inputs they update"
  XGRAD_API std::string summary() const;

  /// The note the IR printer puts after a node: where each planned output lives.
  XGRAD_API std::string note(const ir::Node& node) const;

  XGRAD_API static std::string bytes_text(std::size_t bytes);
};

XGRAD_API MemoryPlan plan_memory(const ir::Graph& g);

}  // namespace xgrad::backend

#if !defined(XGRAD_COMPILED)
#include "xgrad/backend/memory_plan-inl.hpp"
#endif

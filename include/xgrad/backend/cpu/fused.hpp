// The kernel of a fused group of elementwise ops (passes/fuse.hpp): the output range is cut
// into blocks small enough that every intermediate stays in L1; per block each input is read
// once (a broadcast one gathered into a scratch block), each op runs its own block kernel (the
// xsimd code eager mode runs), and each live output is written once. With an anchor (a GEMM
// whose product only the group reads) the blocks are the parts of the product the anchor
// reports finished, while they are still in cache.
//
// A row group also holds reductions over the last axis and ops on their results (a layer
// norm's mean, variance and scale; a softmax's maximum and sum): its blocks are whole rows, a
// reduction step makes one value per row of the block, ops on those run per row, and a step
// reading one per element reads it repeated along the row.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ir/graph.hpp"

namespace xgrad::cpu {

class FusedKernel {
 public:
  /// Elements per block: a multiple of kBlockUnit, as many as let one block of every value the
  /// group streams or keeps in scratch fit in kBlockBytes (half of a 48 KiB L1), at most kMaxBlock.
  /// A step then reads what the one before wrote from L1; fewer, larger blocks cost less per-block
  /// work (tanh(1.5 x + 0.25) * sigmoid(x) + x * x, 24 bytes per element: 1024, 5% faster than 512).
  static constexpr std::int64_t kBlockUnit = 512, kMaxBlock = 2048;
  static constexpr std::size_t kBlockBytes = 24 * 1024;
  /// At most this many values (inputs and step results) in one group.
  static constexpr std::size_t kMaxSlots = 64;

  /// One op of the group. Slots number the group's inputs first, then the steps' results.
  struct Step {
    BlockKernel kernel;
    std::vector<int> args;                       // slots
    DType dtype;                                 // of the result
    int result;                                  // slot
    std::string_view op;                         // the op's name, for the node's "merged" attribute
    const MergedBlockKernels* merged = nullptr;  // a unary op's kernels merged with a neighbour
    int feeder = -1;                             // the op's place among MergedBlockKernels' feeders, or -1
    int consumer = -1;                           // and among its consumers
    // In a row group: a reduction of each row of args[0] (kernel null), the repetition of
    // args[0]'s value per row along it (neither), or an op on values per row.
    RowsKernel reduce_rows = nullptr;
    bool repeat_rows = false;
    bool per_row = false;  // the result holds a value per row: reductions and ops on them
  };

  /// Makes each unary step with merged kernels one step with a cheap neighbour (see
  /// MergedBlockKernels): the op making its operand, when only it reads that, or else the op
  /// reading its result, when only that does. `live` are the slots read outside the group,
  /// which stay steps' results. Returns each merged pair as "Fma+Tanh" (the feeding op first).
  static std::vector<std::string> merge_neighbours(std::vector<Step>& steps, std::span<const int> live) {
    std::unordered_map<int, std::size_t> maker;  // result slot -> step
    std::unordered_map<int, int> reads;          // slot -> times a step reads it
    for (std::size_t k = 0; k < steps.size(); ++k) {
      maker[steps[k].result] = k;
      for (int a : steps[k].args) ++reads[a];
    }
    for (int slot : live) reads[slot] += 2;  // never only one step's
    auto only_reader_of = [&](int slot) { return reads[slot] == 1; };
    std::vector<bool> gone(steps.size(), false), merged(steps.size(), false);
    std::vector<std::string> pairs;
    for (std::size_t m = 0; m < steps.size(); ++m) {  // a feeder into a unary step
      Step& u = steps[m];
      if (!u.merged || u.args.size() != 1 || !maker.count(u.args[0]) || !only_reader_of(u.args[0])) continue;
      const std::size_t k = maker[u.args[0]];
      const int p = steps[k].feeder;
      if (merged[k] || p < 0 || steps[k].dtype != u.dtype) continue;
      pairs.push_back(xgrad::detail::concat(steps[k].op, "+", u.op));
      u.kernel = u.merged->after[static_cast<std::size_t>(p)];
      u.args = steps[k].args;
      gone[k] = merged[k] = merged[m] = true;
    }
    for (std::size_t k = 0; k < steps.size(); ++k) {  // a unary step into its consumer
      Step& u = steps[k];
      if (!u.merged || merged[k] || !only_reader_of(u.result)) continue;
      std::size_t m = k + 1;
      while (m < steps.size() && std::count(steps[m].args.begin(), steps[m].args.end(), u.result) == 0) ++m;
      if (m == steps.size()) continue;
      const int e = steps[m].consumer;
      if (merged[m] || e < 0 || steps[m].dtype != u.dtype) continue;
      Step& c = steps[m];
      const auto pos = static_cast<std::size_t>(std::find(c.args.begin(), c.args.end(), u.result) - c.args.begin());
      pairs.push_back(xgrad::detail::concat(u.op, "+", c.op));
      c.kernel = u.merged->into[static_cast<std::size_t>(e)][pos];
      c.args.erase(c.args.begin() + static_cast<std::ptrdiff_t>(pos));
      c.args.insert(c.args.begin(), u.args[0]);
      gone[k] = merged[k] = merged[m] = true;
    }
    std::size_t kept = 0;
    for (std::size_t k = 0; k < steps.size(); ++k)
      if (!gone[k]) {
        if (kept != k) steps[kept] = std::move(steps[k]);
        ++kept;
      }
    steps.resize(kept);
    return pairs;
  }

  /// A kernel the group runs as an epilogue of (a GEMM): it reads the node's first `num_inputs`
  /// inputs, writes the node's last output, and the group runs on each part of that output as
  /// soon as it is final. The group reads it as its last input slot. When nothing else reads
  /// the anchor's result, `into` >= 0 names the group output it is written into instead: the
  /// group then overwrites it part by part (see anchor_output_in_place), with no buffer of its own.
  struct Anchor {
    ir::EpilogueKernel kernel;
    int num_inputs;  // no default member initializers: `Anchor anchor = {}` below needs none
    int into;
  };

  /// The group output (index into `outputs`) an anchor's result may be written into, or -1:
  /// one whose step comes after every step reading the result, so each part is read before it
  /// is overwritten, of the result's element size. Elementwise steps read and write a part's
  /// elements at the same positions, which makes the overwrite safe.
  static int anchor_output_in_place(const std::vector<Step>& steps, const std::vector<int>& outputs, int result_slot,
                                    std::size_t result_size) {
    int last_read = -1;
    for (std::size_t k = 0; k < steps.size(); ++k)
      for (int a : steps[k].args)
        if (a == result_slot) last_read = static_cast<int>(k);
    for (std::size_t j = 0; j < outputs.size(); ++j)
      for (std::size_t k = 0; k < steps.size(); ++k)
        if (steps[k].result == outputs[j] && static_cast<int>(k) >= last_read &&
            dtype_size(steps[k].dtype) == result_size)
          return static_cast<int>(j);
    return -1;
  }

  /// `inputs`: the types of the group's input slots (with an anchor: the node's inputs, then
  /// the anchor's result); `steps` in order; `outputs`: the slots written out. A row group
  /// (`row_length`, the last axis's extent, above 0) reads inputs of the shape's rows ([..., 1])
  /// as values per row.
  FusedKernel(Shape shape, const std::vector<std::pair<DType, Shape>>& inputs, std::vector<Step> steps,
              std::vector<int> outputs, Anchor anchor = {}, std::int64_t row_length = 0)
      : m_shape(std::move(shape)),
        m_numel(m_shape.numel()),
        m_row_length(row_length),
        m_num_inputs(static_cast<int>(inputs.size())),
        m_steps(std::move(steps)),
        m_outputs(std::move(outputs)),
        m_anchor(std::move(anchor)) {
    int num_slots = m_num_inputs;
    for (const Step& step : m_steps) num_slots = std::max(num_slots, step.result + 1);
    if (static_cast<std::size_t>(num_slots) > kMaxSlots)
      throw std::logic_error("xgrad internal error: fused group too large");
    m_slots.resize(static_cast<std::size_t>(num_slots));
    for (int i = 0; i < m_num_inputs; ++i) {
      Slot& s = m_slots[static_cast<std::size_t>(i)];
      const auto& [dtype, in_shape] = inputs[static_cast<std::size_t>(i)];
      s.dtype = dtype;
      s.elem_size = dtype_size(dtype);
      s.source = in_shape == m_shape       ? Source::input
                 : in_shape.numel() == 1   ? Source::scalar
                 : in_shape == row_shape() ? Source::input
                                           : Source::gather;
      s.per_row = s.source == Source::input && !(in_shape == m_shape);
      if (s.source == Source::gather) s.gather.emplace(m_shape, std::array<const Shape*, 1>{&in_shape});
    }
    if (m_anchor.kernel) {
      // The anchor's inputs that no step reads as well (x in tanh(x @ w) * x is read by both).
      std::vector<bool> read(static_cast<std::size_t>(m_num_inputs), false);
      for (const Step& step : m_steps)
        for (int a : step.args)
          if (a < m_num_inputs) read[static_cast<std::size_t>(a)] = true;
      for (int i = 0; i < m_anchor.num_inputs; ++i)
        if (!read[static_cast<std::size_t>(i)]) {
          m_slots[static_cast<std::size_t>(i)].source = Source::unused;
          m_slots[static_cast<std::size_t>(i)].gather.reset();
        }
      Slot& result = m_slots[static_cast<std::size_t>(m_num_inputs - 1)];
      result.source = Source::input;
      // After the group's own outputs, or the one it is written into.
      result.output = m_anchor.into >= 0 ? m_anchor.into : static_cast<int>(m_outputs.size());
    }
    for (const Step& step : m_steps) {
      Slot& s = m_slots[static_cast<std::size_t>(step.result)];
      s.dtype = step.dtype;
      s.elem_size = dtype_size(step.dtype);
      s.source = Source::scratch;
      s.per_row = step.per_row;
    }
    for (std::size_t j = 0; j < m_outputs.size(); ++j) {
      m_slots[static_cast<std::size_t>(m_outputs[j])].source = Source::output;
      m_slots[static_cast<std::size_t>(m_outputs[j])].output = static_cast<int>(j);
    }
    std::vector<int> read_as(m_slots.size());  // the slot a step reads for each slot
    for (std::size_t i = 0; i < read_as.size(); ++i) read_as[i] = static_cast<int>(i);
    assign_scratch(read_as);
    std::size_t bytes_per_element = static_cast<std::size_t>(m_num_scratch) * sizeof(double);
    for (const Slot& slot : m_slots)
      if (slot.source == Source::input || slot.source == Source::output) bytes_per_element += slot.elem_size;
    const auto fits = static_cast<std::int64_t>(kBlockBytes / std::max<std::size_t>(bytes_per_element, 1));
    if (m_row_length > 0) {  // whole rows
      const std::int64_t rows = std::max<std::int64_t>(1, std::min(fits, kMaxBlock) / m_row_length);
      m_block = rows * m_row_length;
    } else {
      m_block = std::clamp<std::int64_t>(fits / kBlockUnit, 1, kMaxBlock / kBlockUnit) * kBlockUnit;
    }
    // A block of one row holds one value per row: a step reads it with stride 0 instead of its
    // repetition along the row, which is then not made (its reader keeps the value's block).
    if (m_row_length > 0 && m_block == m_row_length) {
      for (const Step& step : m_steps)
        if (step.repeat_rows) {
          read_as[static_cast<std::size_t>(step.result)] = step.args[0];
          m_slots[static_cast<std::size_t>(step.result)].source = Source::unused;
        }
      assign_scratch(read_as);
    }
    for (const Step& step : m_steps) {
      if (step.args.size() > 3) throw std::logic_error("xgrad internal error: fused step with more than 3 inputs");
      StepArgs& a = m_step_args.emplace_back();
      a.count = static_cast<int>(step.args.size());
      a.skip = read_as[static_cast<std::size_t>(step.result)] != step.result;
      for (int j = 0; j < a.count; ++j) {
        const int arg = step.args[static_cast<std::size_t>(j)];
        const int slot = read_as[static_cast<std::size_t>(arg)];
        a.slot[static_cast<std::size_t>(j)] = slot;
        a.stride[static_cast<std::size_t>(j)] =
            slot != arg || m_slots[static_cast<std::size_t>(slot)].source == Source::scalar ? 0 : 1;
      }
    }
  }

  /// The kernel of the fused node: outputs already defined (planned buffers) are written into.
  void operator()(std::span<const TensorBase> in, std::span<TensorBase> out) const {
    for (std::size_t j = 0; j < out.size(); ++j)
      if (!out[j].defined()) {
        // The last output of an anchored group is the anchor's result, its last input slot.
        const int slot = j < m_outputs.size() ? m_outputs[j] : m_num_inputs - 1;
        const Slot& s = m_slots[static_cast<std::size_t>(slot)];
        out[j] = TensorBase(TensorImpl::allocate(s.per_row ? row_shape() : m_shape, s.dtype));
      }
    if (m_anchor.kernel) {
      // Each finished part of the anchor's result, while it is in cache. The callback holds
      // one pointer, which std::function keeps without a heap allocation.
      struct Call {
        const FusedKernel* kernel;
        std::span<const TensorBase> in;
        std::span<TensorBase> out;
      } call{this, in, out};
      const ir::BlockDone done = [c = &call](std::int64_t begin, std::int64_t end) {
        c->kernel->run_range(c->in, c->out, begin, end);
      };
      TensorBase& result = m_anchor.into >= 0 ? out[static_cast<std::size_t>(m_anchor.into)] : out.back();
      m_anchor.kernel(in.first(static_cast<std::size_t>(m_anchor.num_inputs)), result, done);
      return;
    }
    const std::int64_t blocks = (m_numel + m_block - 1) / m_block;
    parallel_for(
        0, blocks, std::max<std::int64_t>(1, kElementwiseGrain / m_block),
        [&](std::int64_t lo, std::int64_t hi) { run_range(in, out, lo * m_block, std::min(hi * m_block, m_numel)); });
  }

 private:
  // unused: an anchor's input, which only the anchor reads, or a repetition not made.
  enum class Source { input, scalar, gather, scratch, output, unused };
  struct Slot {
    DType dtype = DType::float32;
    std::size_t elem_size = 0;
    Source source = Source::unused;          // also a value merged into the step reading it
    bool per_row = false;                    // a value per row of a row group's block
    std::optional<BroadcastPlan<1>> gather;  // Source::gather: how the input maps to the output
    int scratch = -1;                        // Source::gather / scratch: its block buffer
    int output = -1;                         // Source::output, and an anchor's result: which output
  };

  /// Gives each gathered input and each intermediate a scratch block, reusing the block of a
  /// value no later step reads; a step reads slot read_as[a] for its argument a.
  void assign_scratch(std::span<const int> read_as) {
    m_num_scratch = 0;
    for (Slot& s : m_slots) s.scratch = -1;
    std::vector<int> last_read(m_slots.size(), -1);
    for (std::size_t k = 0; k < m_steps.size(); ++k)
      for (int a : m_steps[k].args)
        last_read[static_cast<std::size_t>(read_as[static_cast<std::size_t>(a)])] = static_cast<int>(k);
    std::vector<int> free;
    auto take = [&] {
      if (free.empty()) return m_num_scratch++;
      int s = free.back();
      free.pop_back();
      return s;
    };
    for (int i = 0; i < m_num_inputs; ++i)
      if (m_slots[static_cast<std::size_t>(i)].source == Source::gather)
        m_slots[static_cast<std::size_t>(i)].scratch = take();
    for (std::size_t k = 0; k < m_steps.size(); ++k) {
      Slot& result = m_slots[static_cast<std::size_t>(m_steps[k].result)];
      if (result.source == Source::scratch) result.scratch = take();
      for (int arg : m_steps[k].args) {
        const int a = read_as[static_cast<std::size_t>(arg)];
        Slot& s = m_slots[static_cast<std::size_t>(a)];
        if (s.scratch >= 0 && last_read[static_cast<std::size_t>(a)] == static_cast<int>(k) &&
            std::count(free.begin(), free.end(), s.scratch) == 0)
          free.push_back(s.scratch);
      }
    }
  }

  /// Copies elements [lo, lo + n) of the broadcast input into `to`.
  /// `count` copies of the Size-byte value at `value` (a size known here: a memcpy call per
  /// element cost more than the ops of a block when a [rows, 1] input is broadcast along rows).
  template <std::size_t Size> static void repeat(const std::byte* value, std::int64_t count, std::byte* to) {
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(to + static_cast<std::size_t>(i) * Size, value, Size);
  }

  /// Each of `rows` values at `from` repeated `length` times, into `to`.
  static void repeat_rows(const std::byte* from, std::size_t elem_size, std::int64_t rows, std::int64_t length,
                          std::byte* to) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::byte* value = from + static_cast<std::size_t>(r) * elem_size;
      std::byte* row = to + static_cast<std::size_t>(r * length) * elem_size;
      if (elem_size == 8)
        repeat<8>(value, length, row);
      else if (elem_size == 4)
        repeat<4>(value, length, row);
      else
        repeat<1>(value, length, row);
    }
  }

  static void gather(const BroadcastPlan<1>& plan, const std::byte* from, std::size_t elem_size, std::int64_t lo,
                     std::int64_t n, std::byte* to) {
    const std::int64_t inner = plan.inner(), stride = plan.inner_stride(0);
    std::int64_t row = lo / inner, col = lo % inner;
    while (n > 0) {
      const std::int64_t count = std::min(n, inner - col);
      const std::byte* src = from + static_cast<std::size_t>(plan.row_offset(0, row) + col * stride) * elem_size;
      if (stride == 1)
        std::memcpy(to, src, static_cast<std::size_t>(count) * elem_size);
      else if (elem_size == 8)
        repeat<8>(src, count, to);
      else if (elem_size == 4)
        repeat<4>(src, count, to);
      else  // a bool: every DType is 8, 4 or 1 bytes
        repeat<1>(src, count, to);
      to += static_cast<std::size_t>(count) * elem_size;
      n -= count;
      ++row;
      col = 0;
    }
  }

  /// Runs elements [lo, hi) block by block: each value's pointer is worked out once, then moved
  /// on by a block per block (inputs and outputs) or left in place (scalars, scratch blocks).
  void run_range(std::span<const TensorBase> in, std::span<TensorBase> out, std::int64_t lo, std::int64_t hi) const {
    // Per thread, reused across calls: no allocation once it has grown. Blocks start on cache
    // lines (a batch load must not straddle two), 128 bytes more than a multiple of 4 KiB apart:
    // at a multiple of 4 KiB a step's loads would wait on the previous step's stores to the same
    // page offset.
    thread_local std::vector<double> scratch;
    const std::size_t block_doubles = static_cast<std::size_t>(m_block) + 16, line_doubles = 8;
    const std::size_t needed = static_cast<std::size_t>(m_num_scratch) * block_doubles + line_doubles;
    if (scratch.size() < needed) scratch.resize(needed);
    const std::size_t misalignment = reinterpret_cast<std::uintptr_t>(scratch.data()) % 64 / sizeof(double);
    double* first_block = scratch.data() + (misalignment ? line_doubles - misalignment : 0);

    std::byte* ptr[kMaxSlots];       // each slot's data in the current block
    std::size_t advance[kMaxSlots];  // bytes per block: nonzero for inputs and outputs read in place
    for (std::size_t i = 0; i < m_slots.size(); ++i) {
      const Slot& s = m_slots[i];
      advance[i] = 0;
      ptr[i] = nullptr;
      if (s.source == Source::unused) continue;
      if (s.scratch >= 0) {
        ptr[i] = reinterpret_cast<std::byte*>(first_block + static_cast<std::size_t>(s.scratch) * block_doubles);
        continue;
      }
      const TensorBase& t = s.output >= 0 ? out[static_cast<std::size_t>(s.output)] : in[i];
      ptr[i] = static_cast<std::byte*>(const_cast<void*>(t.impl()->storage->data()));
      if (s.source == Source::input || s.source == Source::output) {
        const std::int64_t per = s.per_row ? m_row_length : 1;
        advance[i] = static_cast<std::size_t>(m_block / per) * s.elem_size;
        ptr[i] += static_cast<std::size_t>(lo / per) * s.elem_size;
      }
    }
    const void* args[3];
    for (std::int64_t start = lo; start < hi; start += m_block) {
      const std::int64_t n = std::min(m_block, hi - start);
      for (std::size_t i = 0; i < static_cast<std::size_t>(m_num_inputs); ++i)
        if (m_slots[i].source == Source::gather) {
          const std::byte* from = static_cast<const std::byte*>(in[i].impl()->storage->data());
          gather(*m_slots[i].gather, from, m_slots[i].elem_size, start, n, ptr[i]);
        }
      for (std::size_t k = 0; k < m_steps.size(); ++k) {
        const Step& step = m_steps[k];
        const StepArgs& a = m_step_args[k];
        if (a.skip) continue;
        std::byte* result = ptr[static_cast<std::size_t>(step.result)];
        if (step.kernel) {
          for (int j = 0; j < a.count; ++j) args[j] = ptr[a.slot[j]];
          step.kernel(args, a.stride.data(), result, step.per_row ? n / m_row_length : n);
        } else if (step.reduce_rows) {
          step.reduce_rows(ptr[a.slot[0]], result, n / m_row_length, m_row_length);
        } else {
          repeat_rows(ptr[a.slot[0]], dtype_size(step.dtype), n / m_row_length, m_row_length, result);
        }
      }
      for (std::size_t i = 0; i < m_slots.size(); ++i) ptr[i] += advance[i];
    }
  }

  /// A step's argument slots and their strides (0 for a scalar), laid out for the block loop.
  struct StepArgs {
    std::array<int, 3> slot{};
    std::array<std::int64_t, 3> stride{};
    int count = 0;
    bool skip = false;  // a repetition that no step reads
  };

  /// A row group's shape with its last axis 1: values per row.
  Shape row_shape() const {
    if (m_row_length == 0) return Shape{};
    Shape rows = m_shape;
    rows[rows.ndim() - 1] = 1;
    return rows;
  }

  Shape m_shape;
  std::int64_t m_numel;
  std::int64_t m_row_length;  // a row group's rows' extent; 0: not a row group
  int m_num_inputs;           // input slots
  std::vector<Step> m_steps;
  std::vector<StepArgs> m_step_args;
  std::vector<int> m_outputs;
  std::vector<Slot> m_slots;
  int m_num_scratch = 0;
  std::int64_t m_block = kBlockUnit;  // elements per block
  Anchor m_anchor;
};

}  // namespace xgrad::cpu

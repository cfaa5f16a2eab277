// Callbacks Model::train and fit call around epochs and steps: LossMonitor and TimeMonitor
// (printing what MindSpore's print), ModelCheckpoint, ProgressBar and CSVLogger. A custom callback
// derives from Callback and overrides the hooks it needs.
#pragma once

#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/optim.hpp"

namespace xgrad::callbacks {

/// Where a run is, as the hooks see it.
struct RunContext {
  int epoch = 0;                          // 1-based
  int epochs = 0;                         // in this train / fit call
  std::int64_t step = 0;                  // 1-based, counted over the whole call
  std::int64_t step_in_epoch = 0;         // 1-based
  std::int64_t steps_per_epoch = 0;       // the data set's batches
  std::int64_t batch_size = 0;            // samples in the last batch (data parallel: all ranks')
  float loss = 0.0f;                      // the last step's loss
  std::map<std::string, double> metrics;  // the last evaluation's results (fit), else empty
  nn::Module* network = nullptr;
  optim::Optimizer* optimizer = nullptr;
  mutable bool stop_training = false;  // a hook may set it (ctx is const): the run ends after the current step
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(const RunContext&) {}
  virtual void on_train_end(const RunContext&) {}
  virtual void on_epoch_begin(const RunContext&) {}
  virtual void on_epoch_end(const RunContext&) {}
  virtual void on_step_begin(const RunContext&) {}
  virtual void on_step_end(const RunContext&) {}
  /// After fit's evaluation at the end of an epoch; ctx.metrics holds the results.
  virtual void on_eval_end(const RunContext&) {}
  /// True for a callback that prints or writes files: in data-parallel training only rank 0
  /// runs it (the others would repeat its lines or race for its files). The rest run on every
  /// rank, and a stop_training set on any rank stops them all.
  virtual bool lead_rank_only() const { return false; }
};

/// One callback given to train or fit: moved in (owned by the run) or std::ref(cb) (the caller
/// keeps it and its state).
class CallbackHandle {
 public:
  template <class C>
  requires std::is_base_of_v<Callback, std::decay_t<C>> CallbackHandle(C&& cb)
      : m_cb(std::make_shared<std::decay_t<C>>(std::forward<C>(cb))) {}
  template <class C>
  requires std::is_base_of_v<Callback, C> CallbackHandle(std::reference_wrapper<C> cb)
      : m_cb(std::shared_ptr<Callback>(), &cb.get()) {}
  Callback& operator*() const { return *m_cb; }

 private:
  std::shared_ptr<Callback> m_cb;
};

using Callbacks = std::vector<CallbackHandle>;

namespace detail {
using Clock = std::chrono::steady_clock;
}  // namespace detail

/// Prints "epoch: 1 step: 1875, loss is 0.1087..." every `per_print_steps` steps of an epoch,
/// and fit's "Eval result: epoch 1, metrics: {'Accuracy': 0.98...}".
class LossMonitor : public Callback {
 public:
  bool lead_rank_only() const override { return true; }
  XGRAD_API explicit LossMonitor(std::int64_t per_print_steps = 1, std::ostream& out = std::cout);
  XGRAD_API void on_step_end(const RunContext& ctx) override;
  XGRAD_API void on_eval_end(const RunContext& ctx) override;

 private:
  std::int64_t m_every;
  std::ostream* m_out;
};

/// Prints "Train epoch time: 59068.311 ms, per step time: 31.503 ms" after each epoch.
/// `data_size`: the steps to divide by (0: the steps the epoch ran).
class TimeMonitor : public Callback {
 public:
  bool lead_rank_only() const override { return true; }
  explicit TimeMonitor(std::int64_t data_size = 0, std::ostream& out = std::cout) : m_size(data_size), m_out(&out) {}
  void on_epoch_begin(const RunContext&) override { m_start = detail::Clock::now(); }
  XGRAD_API void on_epoch_end(const RunContext& ctx) override;
  double last_epoch_ms() const { return m_epoch_ms; }

 private:
  std::int64_t m_size;
  std::ostream* m_out;
  detail::Clock::time_point m_start;
  double m_epoch_ms = 0;
};

struct CheckpointConfig {
  std::int64_t save_steps = 1875;  // save every this many steps (counted over the run)
  int keep_max = 5;                // keep the newest this many files; older ones this run wrote are removed
  bool save_optimizer = true;      // also save the optimizer's state, so a run can resume exactly
};

/// Saves "<directory>/<prefix>-<epoch>_<step in epoch>.ckpt" every save_steps steps. When files
/// of that prefix already exist in the directory, it writes "<prefix>_1-...", "<prefix>_2-..."
/// instead, so an earlier run's checkpoints are never overwritten.
class ModelCheckpoint : public Callback {
 public:
  bool lead_rank_only() const override { return true; }
  XGRAD_API ModelCheckpoint(std::string prefix = "CKP", std::string directory = ".", CheckpointConfig config = {});

  XGRAD_API void on_train_begin(const RunContext& ctx) override;

  XGRAD_API void on_step_end(const RunContext& ctx) override;

  /// The files this callback wrote and kept, oldest first.
  const std::deque<std::string>& files() const { return m_written; }

 private:
  XGRAD_API bool prefix_taken(const std::string& prefix) const;

  std::string m_prefix, m_dir, m_used_prefix;
  CheckpointConfig m_config;
  std::deque<std::string> m_written;
};

/// A progress bar with ETA and throughput, redrawn in place on a terminal; when the output is not
/// a terminal (a log file, CI), a plain line every tenth of an epoch instead.
class ProgressBar : public Callback {
 public:
  bool lead_rank_only() const override { return true; }
  XGRAD_API explicit ProgressBar(std::FILE* out = stdout);
  XGRAD_API void on_epoch_begin(const RunContext& ctx) override;
  XGRAD_API void on_step_end(const RunContext& ctx) override;

 private:
  std::FILE* m_out;
  bool m_tty;
  detail::Clock::time_point m_start;
  std::int64_t m_samples = 0;
};

/// Writes one CSV row per step: epoch,step,loss,step_ms (step counted over the run). An existing
/// file at the path is replaced when training begins.
class CSVLogger : public Callback {
 public:
  bool lead_rank_only() const override { return true; }
  explicit CSVLogger(std::string path) : m_path(std::move(path)) {}
  CSVLogger(const CSVLogger& other) : m_path(other.m_path) {}

  XGRAD_API void on_train_begin(const RunContext& ctx) override;
  void on_step_begin(const RunContext&) override { m_step_start = detail::Clock::now(); }
  XGRAD_API void on_step_end(const RunContext& ctx) override;
  XGRAD_API void on_epoch_end(const RunContext& ctx) override;
  XGRAD_API void on_train_end(const RunContext& ctx) override;

 private:
  std::string m_path;
  std::shared_ptr<std::ofstream> m_file;
  detail::Clock::time_point m_step_start;
};

}  // namespace xgrad::callbacks

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/callbacks-inl.hpp"
#endif

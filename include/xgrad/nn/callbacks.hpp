// Callbacks Model::train and fit call around epochs and steps: LossMonitor and TimeMonitor
// (printing what MindSpore's print), ModelCheckpoint, ProgressBar and CSVLogger. A custom callback
// derives from Callback and overrides the hooks it needs.
#pragma once

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "xgrad/nn/checkpoint.hpp"
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
  std::int64_t batch_size = 0;            // samples in the last batch
  float loss = 0.0f;                      // the last step's loss
  std::map<std::string, double> metrics;  // the last evaluation's results (fit), else empty
  nn::Module* network = nullptr;
  optim::Optimizer* optimizer = nullptr;
  bool stop_training = false;  // a hook may set it: the run ends after the current step
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
/// The shortest text that reads back as the same float, as Python prints a float32 loss.
inline std::string shortest(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}
inline std::string format_metrics(const std::map<std::string, double>& metrics) {
  std::string out = "{";
  for (const auto& [name, value] : metrics) out += (out.size() > 1 ? ", '" : "'") + name + "': " + shortest(value);
  return out + "}";
}
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
}  // namespace detail

/// Prints "epoch: 1 step: 1875, loss is 0.1087..." every `per_print_steps` steps of an epoch,
/// and fit's "Eval result: epoch 1, metrics: {'Accuracy': 0.98...}".
class LossMonitor : public Callback {
 public:
  explicit LossMonitor(std::int64_t per_print_steps = 1, std::ostream& out = std::cout)
      : m_every(per_print_steps), m_out(&out) {
    if (per_print_steps <= 0)
      throw ValueError(xgrad::detail::concat("LossMonitor: per_print_steps must be > 0, got ", per_print_steps));
  }
  void on_step_end(const RunContext& ctx) override {
    if (!std::isfinite(ctx.loss))
      throw ValueError(xgrad::detail::concat("LossMonitor: the loss is ", ctx.loss, " at epoch ", ctx.epoch, " step ",
                                             ctx.step_in_epoch, "; training stopped"));
    if (ctx.step_in_epoch % m_every == 0)
      *m_out << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch << ", loss is " << detail::shortest(ctx.loss)
             << std::endl;
  }
  void on_eval_end(const RunContext& ctx) override {
    *m_out << "Eval result: epoch " << ctx.epoch << ", metrics: " << detail::format_metrics(ctx.metrics) << std::endl;
  }

 private:
  std::int64_t m_every;
  std::ostream* m_out;
};

/// Prints "Train epoch time: 59068.311 ms, per step time: 31.503 ms" after each epoch.
/// `data_size`: the steps to divide by (0: the steps the epoch ran).
class TimeMonitor : public Callback {
 public:
  explicit TimeMonitor(std::int64_t data_size = 0, std::ostream& out = std::cout) : m_size(data_size), m_out(&out) {}
  void on_epoch_begin(const RunContext&) override { m_start = detail::Clock::now(); }
  void on_epoch_end(const RunContext& ctx) override {
    m_epoch_ms = detail::ms_since(m_start);
    const auto steps = static_cast<double>(m_size > 0 ? m_size : ctx.step_in_epoch);
    char line[128];
    std::snprintf(line, sizeof line, "Train epoch time: %.3f ms, per step time: %.3f ms", m_epoch_ms,
                  m_epoch_ms / std::max(steps, 1.0));
    *m_out << line << std::endl;
  }
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
  ModelCheckpoint(std::string prefix = "CKP", std::string directory = ".", CheckpointConfig config = {})
      : m_prefix(std::move(prefix)), m_dir(std::move(directory)), m_config(config) {
    if (m_prefix.empty() || m_prefix.find('/') != std::string::npos)
      throw ValueError(xgrad::detail::concat("ModelCheckpoint: prefix '", m_prefix, "' must be a non-empty file name"));
    if (config.save_steps <= 0 || config.keep_max <= 0)
      throw ValueError(xgrad::detail::concat("ModelCheckpoint: save_steps (", config.save_steps, ") and keep_max (",
                                             config.keep_max, ") must be > 0"));
  }

  void on_train_begin(const RunContext&) override {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(m_dir, ec);
    if (ec)
      throw ValueError(xgrad::detail::concat("ModelCheckpoint: cannot create directory '", m_dir, "': ", ec.message()));
    m_used_prefix = m_prefix;
    for (int n = 1; prefix_taken(m_used_prefix); ++n) m_used_prefix = m_prefix + "_" + std::to_string(n);
  }

  void on_step_end(const RunContext& ctx) override {
    if (ctx.step % m_config.save_steps != 0) return;
    const std::string path = (std::filesystem::path(m_dir) / (m_used_prefix + "-" + std::to_string(ctx.epoch) + "_" +
                                                              std::to_string(ctx.step_in_epoch) + ".ckpt"))
                                 .string();
    if (m_config.save_optimizer && ctx.optimizer)
      save_checkpoint(*ctx.network, *ctx.optimizer, path);
    else
      save_checkpoint(*ctx.network, path);
    m_written.push_back(path);
    while (static_cast<int>(m_written.size()) > m_config.keep_max) {
      std::filesystem::remove(m_written.front());
      m_written.pop_front();
    }
  }

  /// The files this callback wrote and kept, oldest first.
  const std::deque<std::string>& files() const { return m_written; }

 private:
  bool prefix_taken(const std::string& prefix) const {
    for (const auto& entry : std::filesystem::directory_iterator(m_dir)) {
      const std::string file = entry.path().filename().string();
      if (file.starts_with(prefix + "-") && file.ends_with(".ckpt")) return true;
    }
    return false;
  }

  std::string m_prefix, m_dir, m_used_prefix;
  CheckpointConfig m_config;
  std::deque<std::string> m_written;
};

/// A progress bar with ETA and throughput, redrawn in place on a terminal; when the output is not
/// a terminal (a log file, CI), a plain line every tenth of an epoch instead.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(std::FILE* out = stdout) : m_out(out), m_tty(isatty(fileno(out)) != 0) {}
  void on_epoch_begin(const RunContext&) override {
    m_start = detail::Clock::now();
    m_samples = 0;
  }
  void on_step_end(const RunContext& ctx) override {
    m_samples += ctx.batch_size;
    const std::int64_t total = std::max<std::int64_t>(ctx.steps_per_epoch, ctx.step_in_epoch);
    const bool last = ctx.step_in_epoch == total;
    if (!m_tty && !last && ctx.step_in_epoch % std::max<std::int64_t>(total / 10, 1) != 0) return;
    const double seconds = detail::ms_since(m_start) / 1000.0;
    const double eta =
        seconds / static_cast<double>(ctx.step_in_epoch) * static_cast<double>(total - ctx.step_in_epoch);
    constexpr int width = 30;
    const int filled = static_cast<int>(width * ctx.step_in_epoch / total);
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<std::size_t>(width - filled - 1), ' ');
    std::fprintf(m_out, "%sepoch %d/%d [%s] %lld/%lld  ETA %02d:%02d  %.0f samples/s  loss %.4f%s", m_tty ? "\r" : "",
                 ctx.epoch, ctx.epochs, bar.c_str(), static_cast<long long>(ctx.step_in_epoch),
                 static_cast<long long>(total), static_cast<int>(eta) / 60, static_cast<int>(eta) % 60,
                 seconds > 0 ? static_cast<double>(m_samples) / seconds : 0.0, static_cast<double>(ctx.loss),
                 m_tty && !last ? "" : "\n");
    std::fflush(m_out);
  }

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
  explicit CSVLogger(std::string path) : m_path(std::move(path)) {}
  CSVLogger(const CSVLogger& other) : m_path(other.m_path) {}

  void on_train_begin(const RunContext&) override {
    m_file = std::make_shared<std::ofstream>(m_path, std::ios::trunc);
    if (!*m_file) throw ValueError(xgrad::detail::concat("CSVLogger: cannot open '", m_path, "' for writing"));
    *m_file << "epoch,step,loss,step_ms\n";
  }
  void on_step_begin(const RunContext&) override { m_step_start = detail::Clock::now(); }
  void on_step_end(const RunContext& ctx) override {
    *m_file << ctx.epoch << ',' << ctx.step << ',' << detail::shortest(ctx.loss) << ','
            << detail::ms_since(m_step_start) << '\n';
  }
  void on_epoch_end(const RunContext&) override { m_file->flush(); }
  void on_train_end(const RunContext&) override {
    m_file->close();
    if (m_file->fail()) throw ValueError(xgrad::detail::concat("CSVLogger: writing '", m_path, "' failed"));
  }

 private:
  std::string m_path;
  std::shared_ptr<std::ofstream> m_file;
  detail::Clock::time_point m_step_start;
};

}  // namespace xgrad::callbacks

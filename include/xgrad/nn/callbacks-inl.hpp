// Definitions of nn/callbacks.hpp: included by it when header-only, compiled once into the
// library (src/nn.cpp) otherwise.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "xgrad/nn/callbacks.hpp"
#include "xgrad/nn/checkpoint.hpp"

namespace xgrad::callbacks {

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
inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
}  // namespace detail

XGRAD_API LossMonitor::LossMonitor(std::int64_t per_print_steps, std::ostream& out)
    : m_every(per_print_steps), m_out(&out) {
  if (per_print_steps <= 0)
    throw ValueError(xgrad::detail::concat("LossMonitor: per_print_steps must be > 0, got ", per_print_steps));
}

XGRAD_API void LossMonitor::on_step_end(const RunContext& ctx) {
  if (!std::isfinite(ctx.loss))
    throw ValueError(xgrad::detail::concat("LossMonitor: the loss is ", ctx.loss, " at epoch ", ctx.epoch, " step ",
                                           ctx.step_in_epoch, "; training stopped"));
  if (ctx.step_in_epoch % m_every == 0)
    *m_out << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch << ", loss is " << detail::shortest(ctx.loss)
           << std::endl;
}

XGRAD_API void LossMonitor::on_eval_end(const RunContext& ctx) {
  *m_out << "Eval result: epoch " << ctx.epoch << ", metrics: " << detail::format_metrics(ctx.metrics) << std::endl;
}

XGRAD_API void TimeMonitor::on_epoch_end(const RunContext& ctx) {
  m_epoch_ms = detail::ms_since(m_start);
  const auto steps = static_cast<double>(m_size > 0 ? m_size : ctx.step_in_epoch);
  char line[128];
  std::snprintf(line, sizeof line, "Train epoch time: %.3f ms, per step time: %.3f ms", m_epoch_ms,
                m_epoch_ms / std::max(steps, 1.0));
  *m_out << line << std::endl;
}

XGRAD_API ModelCheckpoint::ModelCheckpoint(std::string prefix, std::string directory, CheckpointConfig config)
    : m_prefix(std::move(prefix)), m_dir(std::move(directory)), m_config(config) {
  if (m_prefix.empty() || m_prefix.find('/') != std::string::npos)
    throw ValueError(xgrad::detail::concat("ModelCheckpoint: prefix '", m_prefix, "' must be a non-empty file name"));
  if (config.save_steps <= 0 || config.keep_max <= 0)
    throw ValueError(xgrad::detail::concat("ModelCheckpoint: save_steps (", config.save_steps, ") and keep_max (",
                                           config.keep_max, ") must be > 0"));
}

XGRAD_API void ModelCheckpoint::on_train_begin(const RunContext&) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(m_dir, ec);
  if (ec)
    throw ValueError(xgrad::detail::concat("ModelCheckpoint: cannot create directory '", m_dir, "': ", ec.message()));
  m_used_prefix = m_prefix;
  for (int n = 1; prefix_taken(m_used_prefix); ++n) m_used_prefix = m_prefix + "_" + std::to_string(n);
}

XGRAD_API void ModelCheckpoint::on_step_end(const RunContext& ctx) {
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

XGRAD_API bool ModelCheckpoint::prefix_taken(const std::string& prefix) const {
  for (const auto& entry : std::filesystem::directory_iterator(m_dir)) {
    const std::string file = entry.path().filename().string();
    if (file.starts_with(prefix + "-") && file.ends_with(".ckpt")) return true;
  }
  return false;
}

XGRAD_API ProgressBar::ProgressBar(std::FILE* out) : m_out(out), m_tty(isatty(fileno(out)) != 0) {}

XGRAD_API void ProgressBar::on_epoch_begin(const RunContext&) {
  m_start = detail::Clock::now();
  m_samples = 0;
}

XGRAD_API void ProgressBar::on_step_end(const RunContext& ctx) {
  m_samples += ctx.batch_size;
  const std::int64_t total = std::max<std::int64_t>(ctx.steps_per_epoch, ctx.step_in_epoch);
  const bool last = ctx.step_in_epoch == total;
  if (!m_tty && !last && ctx.step_in_epoch % std::max<std::int64_t>(total / 10, 1) != 0) return;
  const double seconds = detail::ms_since(m_start) / 1000.0;
  const double eta = seconds / static_cast<double>(ctx.step_in_epoch) * static_cast<double>(total - ctx.step_in_epoch);
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

XGRAD_API void CSVLogger::on_train_begin(const RunContext&) {
  m_file = std::make_shared<std::ofstream>(m_path, std::ios::trunc);
  if (!*m_file) throw ValueError(xgrad::detail::concat("CSVLogger: cannot open '", m_path, "' for writing"));
  *m_file << "epoch,step,loss,step_ms\n";
}

XGRAD_API void CSVLogger::on_step_end(const RunContext& ctx) {
  *m_file << ctx.epoch << ',' << ctx.step << ',' << detail::shortest(ctx.loss) << ',' << detail::ms_since(m_step_start)
          << '\n';
}

XGRAD_API void CSVLogger::on_epoch_end(const RunContext&) { m_file->flush(); }

XGRAD_API void CSVLogger::on_train_end(const RunContext&) {
  m_file->close();
  if (m_file->fail()) throw ValueError(xgrad::detail::concat("CSVLogger: writing '", m_path, "' failed"));
}

}  // namespace xgrad::callbacks

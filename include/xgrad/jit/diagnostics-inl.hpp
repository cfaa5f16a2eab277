// Definitions of jit/diagnostics.hpp: included by it when header-only, compiled once into the
// library (src/jit.cpp) otherwise.
#pragma once

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>

#include "xgrad/ir/printer.hpp"
#include "xgrad/jit/diagnostics.hpp"

namespace xgrad {

namespace tracing::detail {

struct Settings {
  std::mutex mutex;
  std::string graphs_dir;
  int save_level = 0;
  std::function<void(const std::string&)> log = [](const std::string& line) { std::cerr << line << '\n'; };
};
inline Settings& settings() {
  static Settings s;
  return s;
}

XGRAD_API void log(const std::string& line) {
  std::function<void(const std::string&)> sink;
  {
    std::lock_guard lock(settings().mutex);
    sink = settings().log;
  }
  if (sink) sink(line);
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees a
/// half-written file.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  auto tmp = path;
  tmp += ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw ValueError(xgrad::detail::concat("set_save_graphs: cannot write ", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw ValueError(xgrad::detail::concat("set_save_graphs: cannot write ", path.string(), ": ", ec.message()));
}

/// A file-name-safe version of a function name.
inline std::string file_stem(const std::string& name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  return out;
}

XGRAD_API void save_stage(const ir::Graph& graph, const std::string& stage, const ir::NodeNote& note) {
  std::string dir;
  {
    std::lock_guard lock(settings().mutex);
    if (settings().save_level < 2) return;
    dir = settings().graphs_dir;
  }
  static std::atomic<int> counter{0};
  auto stem = std::filesystem::path(dir) /
              xgrad::detail::concat(file_stem(graph.name), "_", counter.fetch_add(1), "_", file_stem(stage));
  write_file(stem.string() + ".ir", ir::to_text(graph, nullptr, note));
  write_file(stem.string() + ".dot", ir::to_dot(graph));
}

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

inline std::string json_value(const ir::Value& v) {
  std::string shape;
  for (auto d : v.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  return xgrad::detail::concat("{\"id\": ", v.id, ", \"dtype\": \"", dtype_short_name(v.dtype), "\", \"shape\": [",
                               shape, "], \"by_reference\": ", v.by_reference ? "true" : "false",
                               ", \"name\": ", json_string(v.name), "}");
}

inline std::string json_location(SourceLoc loc) {
  return xgrad::detail::concat("{\"file\": ", json_string(loc.file()), ", \"line\": ", loc.line(), "}");
}

inline std::string json_graph(const ir::Graph& g) {
  std::ostringstream out;
  out << "{\"name\": " << json_string(g.name) << ", \"inputs\": [";
  for (std::size_t i = 0; i < g.inputs.size(); ++i) out << (i ? ", " : "") << json_value(*g.inputs[i]);
  out << "], \"nodes\": [";
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& n = *g.nodes[k];
    out << (k ? ", " : "") << "{\"op\": " << json_string(n.op()) << ", \"inputs\": [";
    for (std::size_t i = 0; i < n.inputs.size(); ++i) out << (i ? ", " : "") << n.inputs[i]->id;
    out << "], \"outputs\": [";
    for (std::size_t i = 0; i < n.outputs.size(); ++i) out << (i ? ", " : "") << json_value(*n.outputs[i]);
    out << "], \"attrs\": {";
    const std::vector<ir::Attr> attrs = n.attrs();
    for (std::size_t i = 0; i < attrs.size(); ++i)
      out << (i ? ", " : "") << json_string(attrs[i].name) << ": " << json_string(attrs[i].value);
    out << "}, \"location\": " << json_location(n.loc) << ", \"scope\": " << json_string(n.scope) << "}";
  }
  out << "], \"outputs\": [";
  for (std::size_t i = 0; i < g.outputs.size(); ++i) out << (i ? ", " : "") << g.outputs[i]->id;
  out << "]}";
  return out.str();
}

/// How a value came to be, for the failing node's input list.
inline std::string origin(const ir::Value& v) {
  if (v.producer) return xgrad::detail::concat("made by ", v.producer->op(), " at ", v.producer->loc.str());
  std::string name = v.name.empty() ? "" : " '" + v.name + "'";
  return v.by_reference ? "a tensor read by reference" + name : "an input of the graph" + name;
}

XGRAD_API TraceError trace_error(Tracer& tracer, const ShapeError& error) {
  const Failure* failure = tracer.failure();
  ir::FailedNode failed{
      failure ? failure->op : "?", {}, failure ? failure->loc : SourceLoc(), failure ? failure->scope : scope_path()};
  if (failure) {
    try {
      for (const auto& in : failure->inputs) failed.inputs.push_back(tracer.resolve(in));
    } catch (const std::exception&) {
      failed.inputs.clear();
    }
  }
  const ir::Graph& graph = tracer.graph();
  std::ostringstream text;
  text << error.what() << "\n\njit '" << graph.name << "' stopped tracing at " << failed.op;
  if (failure) text << " (" << failed.loc.str() << ")";
  text << ". The graph traced so far, the failing node marked:\n\n" << ir::to_text(graph, &failed);
  if (!failed.inputs.empty()) {
    text << "\nThe failing node's inputs:\n";
    for (const ir::Value* v : failed.inputs)
      text << "  %" << v->id << " : " << ir::type_str(*v) << "  " << origin(*v) << "\n";
  }
  std::ostringstream json;
  json << "{\"error\": " << json_string(error.what()) << ", \"function\": " << json_string(graph.name)
       << ", \"failing_node\": {\"op\": " << json_string(failed.op) << ", \"location\": " << json_location(failed.loc)
       << ", \"scope\": " << json_string(failed.scope) << ", \"inputs\": [";
  for (std::size_t i = 0; i < failed.inputs.size(); ++i) json << (i ? ", " : "") << json_value(*failed.inputs[i]);
  json << "]}, \"graph\": " << json_graph(graph) << "}\n";

  std::string dir;
  {
    std::lock_guard lock(settings().mutex);
    if (settings().save_level >= 1) dir = settings().graphs_dir;
  }
  if (!dir.empty()) {
    auto stem = std::filesystem::path(dir) / (file_stem(graph.name) + ".analyze_fail");
    try {
      write_file(stem.string() + ".ir", text.str());
      write_file(stem.string() + ".json", json.str());
      text << "\nThis report is also in " << stem.string() << ".ir and .json\n";
    } catch (const std::exception& e) {
      text << "\n(could not save this report: " << e.what() << ")\n";
    }
  }
  return TraceError(text.str(), json.str());
}

}  // namespace tracing::detail

XGRAD_API void set_save_graphs(const std::string& dir, int level) {
  if (level < 0 || level > 2) throw ValueError(detail::concat("set_save_graphs: level must be 0, 1 or 2, got ", level));
  std::lock_guard lock(tracing::detail::settings().mutex);
  tracing::detail::settings().graphs_dir = dir;
  tracing::detail::settings().save_level = level;
}

XGRAD_API void set_jit_log(std::function<void(const std::string&)> sink) {
  std::lock_guard lock(tracing::detail::settings().mutex);
  tracing::detail::settings().log = std::move(sink);
}

}  // namespace xgrad

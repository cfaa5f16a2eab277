// What jit tells its users: TraceError and its report (text and JSON), the retrace log, and
// the graphs set_save_graphs writes to disk.
#pragma once

#include <functional>
#include <string>

#include "xgrad/core/config.hpp"
#include "xgrad/ir/printer.hpp"
#include "xgrad/ir/tracer.hpp"

namespace xgrad {

/// A shape or dtype error found while jit traced a function. what() holds the error, the
/// graph traced so far with the failing node marked, and that node's inputs; report_json()
/// holds the same for tools.
class TraceError : public ShapeError {
 public:
  TraceError(const std::string& what, std::string json) : ShapeError(what), m_json(std::move(json)) {}
  const std::string& report_json() const { return m_json; }

 private:
  std::string m_json;
};

/// A jitted function traced where the user said it must not: inside expect_cache_hit, or
/// more often than JitConfig::max_retraces allows.
class RetraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace tracing::detail {

XGRAD_API void log(const std::string& line);

/// With save level 2: the graph as text and dot after `stage`, numbered in the order written.
XGRAD_API void save_stage(const ir::Graph& graph, const std::string& stage, const ir::NodeNote& note = {});

/// Turns a ShapeError thrown while `tracer` traced into a TraceError with the full report,
/// written to disk too when set_save_graphs asked for it.
XGRAD_API TraceError trace_error(Tracer& tracer, const ShapeError& error);

/// Runs `body` under `tracer`; a shape error inside becomes a TraceError with the report.
template <class Body> auto traced(Tracer& tracer, Body&& body) {
  try {
    return body();
  } catch (const TraceError&) {
    throw;
  } catch (const ShapeError& e) {
    throw trace_error(tracer, e);
  }
}

}  // namespace tracing::detail

/// Where and how much jit writes: level 0 nothing; 1 the failure report (text and JSON) when
/// tracing fails; 2 also the IR (text and dot) of every compiled graph at each stage.
XGRAD_API void set_save_graphs(const std::string& dir, int level = 1);

/// Where jit's log lines go (a retrace and why); standard error by default, nowhere for null.
XGRAD_API void set_jit_log(std::function<void(const std::string&)> sink);

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/jit/diagnostics-inl.hpp"
#endif

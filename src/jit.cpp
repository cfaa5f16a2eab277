// xgrad::compiled: jit's cache, tracing of flat functions, control flow and diagnostics
// (include/xgrad/jit), compiled once.
#include "xgrad/jit/control_flow-inl.hpp"
#include "xgrad/jit/diagnostics-inl.hpp"
#include "xgrad/jit/function-inl.hpp"
#include "xgrad/jit/jit-inl.hpp"

// xgrad::compiled: the graph, its primitives, the tracer, the graph printers and verifier
// (include/xgrad/ir), compiled once.
#include "xgrad/ir/graph-inl.hpp"
#include "xgrad/ir/primitive-inl.hpp"
#include "xgrad/ir/printer-inl.hpp"
#include "xgrad/ir/tracer-inl.hpp"
#include "xgrad/ir/verify-inl.hpp"

// xgrad::compiled: the graph printers and verifier (include/xgrad/ir), compiled once.
#include "xgrad/ir/printer-inl.hpp"
#include "xgrad/ir/verify-inl.hpp"

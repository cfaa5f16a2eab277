// xgrad::compiled: jit's diagnostics (include/xgrad/jit), compiled once.
#include "xgrad/jit/diagnostics-inl.hpp"

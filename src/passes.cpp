// xgrad::compiled: the graph passes (include/xgrad/passes), compiled once.
#include "xgrad/passes/cse-inl.hpp"
#include "xgrad/passes/dce-inl.hpp"
#include "xgrad/passes/fold-inl.hpp"
#include "xgrad/passes/fuse-inl.hpp"
#include "xgrad/passes/pipeline-inl.hpp"
#include "xgrad/passes/rewrite-inl.hpp"
#include "xgrad/passes/schedule-inl.hpp"
#include "xgrad/passes/simplify-inl.hpp"

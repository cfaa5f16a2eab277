// xgrad's graph mode on top of xgrad/core.hpp: jit and its cache, cond / while_loop /
// fori_loop, the passes and the IR printers.
#pragma once

#include "xgrad/core.hpp"
#include "xgrad/ir/printer.hpp"
#include "xgrad/jit/control_flow.hpp"
#include "xgrad/jit/jit.hpp"
#include "xgrad/passes/pipeline.hpp"

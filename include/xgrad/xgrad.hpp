// xgrad: the one header users include.
#pragma once

#include "xgrad/autograd/engine.hpp"
#include "xgrad/autograd/functional.hpp"
#include "xgrad/core/context.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/core/print.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/core/xtensor_interop.hpp"
#include "xgrad/ir/printer.hpp"
#include "xgrad/jit/jit.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/linalg.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/print.hpp"
#include "xgrad/ops/reduce.hpp"

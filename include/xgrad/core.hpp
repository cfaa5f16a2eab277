// xgrad's eager layer: Tensor, factories, every op, autodiff (backward, grad, value_and_grad,
// custom gradients). No jit, no nn, no file formats: the layer headers above it are
// xgrad/jit.hpp, xgrad/nn.hpp and xgrad/data.hpp; xgrad/xgrad.hpp includes them all.
#pragma once

#include "xgrad/autograd/engine.hpp"
#include "xgrad/autograd/functional.hpp"
#include "xgrad/core/context.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/core/print.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ops/device.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/linalg.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/print.hpp"
#include "xgrad/ops/random.hpp"
#include "xgrad/ops/reduce.hpp"

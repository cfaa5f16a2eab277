// xgrad: everything, in one header. The layer headers include less: xgrad/core.hpp (tensors,
// ops, autodiff), xgrad/jit.hpp, xgrad/nn.hpp, xgrad/data.hpp.
#pragma once

#include "xgrad/core.hpp"
#include "xgrad/core/xtensor_interop.hpp"
#include "xgrad/data.hpp"
#include "xgrad/distributed.hpp"
#include "xgrad/jit.hpp"
#include "xgrad/models/char_transformer.hpp"
#include "xgrad/models/lenet5.hpp"
#include "xgrad/nn.hpp"

// xgrad's training layer on top of xgrad/jit.hpp: Module, layers, initializers, losses,
// optimizers, metrics, Model, callbacks and checkpoints.
#pragma once

#include "xgrad/jit.hpp"
#include "xgrad/nn/callbacks.hpp"
#include "xgrad/nn/checkpoint.hpp"
#include "xgrad/nn/init.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/loss.hpp"
#include "xgrad/nn/metrics.hpp"
#include "xgrad/nn/model.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/optim.hpp"
#include "xgrad/nn/sampling.hpp"

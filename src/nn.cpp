// xgrad::compiled: modules, layers, initializers, losses, metrics, optimizers, sampling, Model,
// callbacks and checkpoints (include/xgrad/nn), compiled once.
#include "xgrad/nn/callbacks-inl.hpp"
#include "xgrad/nn/checkpoint-inl.hpp"
#include "xgrad/nn/init-inl.hpp"
#include "xgrad/nn/layers-inl.hpp"
#include "xgrad/nn/loss-inl.hpp"
#include "xgrad/nn/metrics-inl.hpp"
#include "xgrad/nn/model-inl.hpp"
#include "xgrad/nn/module-inl.hpp"
#include "xgrad/nn/optim-inl.hpp"
#include "xgrad/nn/sampling-inl.hpp"

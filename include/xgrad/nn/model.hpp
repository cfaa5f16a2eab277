// Model: a network with its loss, optimizer and metrics, trained and evaluated over a data set
// (MindSpore's Model). It follows the mode: in Mode::graph the whole train step (forward, loss,
// backward, optimizer update) is one compiled graph, in Mode::eager it runs op by op.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "xgrad/autograd/functional.hpp"
#include "xgrad/core/config.hpp"
#include "xgrad/distributed/collectives.hpp"
#include "xgrad/jit/jit.hpp"
#include "xgrad/nn/callbacks.hpp"
#include "xgrad/nn/loss.hpp"
#include "xgrad/nn/metrics.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/optim.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad {

using Metrics = std::map<std::string, std::shared_ptr<metrics::Metric>>;

/// How a Model trains, besides its parts.
struct ModelOptions {
  /// Data-parallel training over the process group (distributed::init() first; each rank
  /// iterates its own part of the data, Dataset::shard): the network's parameters and buffers
  /// start as rank 0's, and every step averages the ranks' gradients before the update
  /// (distributed::GradientMean: all_reduce_bucketed's buckets, each reduced while the backward
  /// pass goes on), so the parameters stay the same, bit for bit, on every rank; the step's loss
  /// is the ranks' mean. In both modes (graph mode compiles the averaging into the train step).
  bool data_parallel = false;
  /// The gradient buckets' size in bytes.
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
};

class Model {
 public:
  Model(nn::Module& network, const nn::Loss& loss, optim::Optimizer& optimizer, Metrics metrics = {},
        ModelOptions options = {})
      : m_network(network), m_loss(loss), m_optimizer(optimizer), m_metrics(std::move(metrics)), m_options(options) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// One training step on a batch in the current mode; returns its loss. Errors of the
  /// network and the loss name `loc`, the caller's line (train, fit and eval take one too).
  template <class Labels>
  float train_step(const Tensor<float>& images, const Labels& labels, SourceLoc loc = SourceLoc::current()) {
    m_caller = loc;
    m_network.set_train(true);
    if (m_options.data_parallel && !m_replicas_synced) sync_replicas(loc);
    if (get_mode() == Mode::eager) return step(images, labels).item();
    return compiled_step()(images, labels).item();
  }

  /// The compiled train step for a batch like this one, without running it: its graph (ir(),
  /// dot()) after the optimizer's passes, and its memory plan.
  template <class Labels>
  Lowered lower_train_step(const Tensor<float>& images, const Labels& labels, SourceLoc loc = SourceLoc::current()) {
    m_caller = loc;
    m_network.set_train(true);
    return compiled_step().lower(images, labels);
  }

  /// Trains for `epochs` passes over `dataset` (anything iterable whose batches have `images`
  /// and `labels`, with size() batches), calling `callbacks` around epochs and steps.
  template <class Dataset> void train(int epochs, const Dataset& dataset, callbacks::Callbacks callbacks = {},
                                      SourceLoc loc = SourceLoc::current()) {
    run(epochs, dataset, static_cast<const Dataset*>(nullptr), callbacks, loc);
  }

  /// Trains as train() does and evaluates on `valid` after each epoch; the results reach the
  /// callbacks' on_eval_end (LossMonitor prints them).
  template <class Dataset, class Valid> void fit(int epochs, const Dataset& train, const Valid& valid,
                                                 callbacks::Callbacks callbacks = {},
                                                 SourceLoc loc = SourceLoc::current()) {
    run(epochs, train, &valid, callbacks, loc);
  }

  /// The metrics over `dataset` with the network in evaluation behaviour: {"Accuracy": 0.9...}.
  template <class Dataset>
  std::map<std::string, double> eval(const Dataset& dataset, SourceLoc loc = SourceLoc::current()) {
    if (m_metrics.empty())
      throw ValueError(xgrad::detail::op_message(
          "Model::eval", loc,
          "the model has no metrics (give them to the constructor, e.g. {{\"Accuracy\", xg::metrics::accuracy()}})"));
    m_network.set_train(false);
    for (auto& [name, metric] : m_metrics) metric->reset();
    for (const auto& batch : dataset) {
      const Tensor<float> output = m_network(batch.images, loc);
      const float loss = mean(m_loss(output, batch.labels, loc), {}, false, loc).item();
      for (auto& [name, metric] : m_metrics) metric->update(output, batch.labels, loss);
    }
    m_network.set_train(true);
    return metric_values(loc);
  }

  /// How graph mode compiles the train step (level, name, ...; default: O2, "train_step").
  /// The step is compiled again, with this configuration, on its next call.
  XGRAD_API void set_jit_config(JitConfig config);

  nn::Module& network() { return m_network; }
  optim::Optimizer& optimizer() { return m_optimizer; }

 private:
  /// forward, loss, gradients and the update, as one function of the batch: eager runs it,
  /// graph mode traces it once per batch signature.
  template <class Labels> Tensor<float> step(const Tensor<float>& images, const Labels& labels) {
    // Traced in graph mode: m_caller is the line of the call that traced it.
    auto loss_of = [this](const Tensor<float>& x, const Labels& y) {
      return m_loss(m_network(x, m_caller), y, m_caller);
    };
    // A group of one has nothing to average (its mean is the gradient itself, bit for bit).
    if (!m_options.data_parallel || distributed::world_size(m_caller) == 1) {
      auto [loss, grads] = value_and_grad(loss_of, m_optimizer.parameters())(images, labels);
      m_optimizer.step(grads);
      return loss;
    }
    // Each bucket's reduction starts when the backward pass has made its gradients (traced into
    // the graph there, in graph mode) and runs beside the rest of the pass.
    std::vector<Shape> shapes;
    for (const auto& p : m_optimizer.parameters()) shapes.push_back(p.shape());
    distributed::GradientMean mean(shapes, m_options.bucket_bytes, m_caller);
    auto on_gradient = [&mean](std::size_t i, const TensorBase& g) { mean.ready(i, Tensor<float>(g)); };
    const Tensor<float> loss = value_and_grad(loss_of, m_optimizer.parameters(), on_gradient)(images, labels).first;
    m_optimizer.step(mean.finish());
    return distributed::all_reduce(loss, distributed::ReduceOp::mean, m_caller);
  }
  struct Step {
    Model* self;
    template <class Labels> Tensor<float> operator()(const Tensor<float>& images, const Labels& labels) const {
      return self->step(images, labels);
    }
  };
  XGRAD_API Jitted<Step>& compiled_step();
  /// The metrics' values; in data-parallel training, over every rank's samples.
  XGRAD_API std::map<std::string, double> metric_values(SourceLoc loc) const;
  /// True on every rank when a callback on any rank asked to stop.
  XGRAD_API bool any_rank_stops(bool stop, SourceLoc loc) const;
  /// Data-parallel training's start: rank 0's parameters and buffers on every rank.
  XGRAD_API void sync_replicas(SourceLoc loc);
  /// Data-parallel training's check that every rank has `steps` batches per epoch (else the
  /// ranks' collectives would not pair up).
  XGRAD_API void check_same_steps(std::int64_t steps, SourceLoc loc) const;

  template <class Dataset, class Valid>
  void run(int epochs, const Dataset& dataset, const Valid* valid, callbacks::Callbacks& callbacks, SourceLoc loc) {
    if (epochs <= 0)
      throw ValueError(xgrad::detail::op_message("Model::train", loc, "epochs must be > 0, got ", epochs));
    if (m_options.data_parallel) check_same_steps(static_cast<std::int64_t>(dataset.size()), loc);
    callbacks::RunContext ctx;
    ctx.epochs = epochs;
    ctx.steps_per_epoch = static_cast<std::int64_t>(dataset.size());
    ctx.network = &m_network;
    ctx.optimizer = &m_optimizer;
    const bool lead = !m_options.data_parallel || distributed::rank(loc) == 0;
    auto each = [&](auto hook) {
      for (auto& cb : callbacks)
        if (lead || !(*cb).lead_rank_only()) hook(*cb);
    };
    each([&](callbacks::Callback& cb) { cb.on_train_begin(ctx); });
    for (int epoch = 1; epoch <= epochs && !ctx.stop_training; ++epoch) {
      ctx.epoch = epoch;
      ctx.step_in_epoch = 0;
      each([&](callbacks::Callback& cb) { cb.on_epoch_begin(ctx); });
      for (const auto& batch : dataset) {
        ++ctx.step;
        ++ctx.step_in_epoch;
        ctx.batch_size = batch.images.shape()[0] * (m_options.data_parallel ? distributed::world_size(loc) : 1);
        each([&](callbacks::Callback& cb) { cb.on_step_begin(ctx); });
        ctx.loss = train_step(batch.images, batch.labels, loc);
        each([&](callbacks::Callback& cb) { cb.on_step_end(ctx); });
        if (m_options.data_parallel) ctx.stop_training = any_rank_stops(ctx.stop_training, loc);
        if (ctx.stop_training) break;
      }
      each([&](callbacks::Callback& cb) { cb.on_epoch_end(ctx); });
      if (valid) {
        ctx.metrics = eval(*valid, loc);
        each([&](callbacks::Callback& cb) { cb.on_eval_end(ctx); });
      }
    }
    each([&](callbacks::Callback& cb) { cb.on_train_end(ctx); });
    // What rank 0's callbacks wrote (checkpoints, logs) is complete when train() returns on any rank.
    if (m_options.data_parallel) distributed::barrier(loc);
  }

  nn::Module& m_network;
  const nn::Loss& m_loss;
  SourceLoc m_caller;  // the line of the public call running now, for errors
  optim::Optimizer& m_optimizer;
  Metrics m_metrics;
  ModelOptions m_options;
  bool m_replicas_synced = false;
  JitConfig m_jit_config{.name = "train_step"};
  std::unique_ptr<Jitted<Step>> m_compiled_step;
};

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/model-inl.hpp"
#endif

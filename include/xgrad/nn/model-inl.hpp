// Definitions of nn/model.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include "xgrad/core/factory.hpp"
#include "xgrad/nn/model.hpp"

namespace xgrad {

XGRAD_API void Model::set_jit_config(JitConfig config) {
  m_jit_config = std::move(config);
  m_compiled_step.reset();
}

XGRAD_API Jitted<Model::Step>& Model::compiled_step() {
  if (!m_compiled_step)
    m_compiled_step = std::make_unique<Jitted<Step>>(Step{this}, m_jit_config, SourceLoc::current());
  return *m_compiled_step;
}

XGRAD_API std::map<std::string, double> Model::metric_values(SourceLoc loc) const {
  std::map<std::string, double> out;
  for (const auto& [name, metric] : m_metrics) {
    if (!m_options.data_parallel) {
      out[name] = metric->value();
      continue;
    }
    const auto [sum, count] = metric->totals();
    const std::vector<double> all =
        distributed::all_reduce(tensor<double>({sum, count}), distributed::ReduceOp::sum, loc).to_vector();
    out[name] = all[1] > 0 ? all[0] / all[1] : 0.0;
  }
  return out;
}

XGRAD_API bool Model::any_rank_stops(bool stop, SourceLoc loc) const {
  return distributed::all_reduce(tensor<std::int32_t>({stop ? 1 : 0}), distributed::ReduceOp::max, loc).item() != 0;
}

XGRAD_API void Model::sync_replicas(SourceLoc loc) {
  for (const auto& [name, t] : m_network.named_state()) distributed::broadcast_into(t, 0, loc);
  m_replicas_synced = true;
}

XGRAD_API void Model::check_same_steps(std::int64_t steps, SourceLoc loc) const {
  const std::vector<std::int64_t> all = distributed::all_gather(tensor<std::int64_t>({steps}), loc).to_vector();
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != steps)
      throw ValueError(xgrad::detail::op_message(
          "Model::train", loc, "data-parallel ranks need the same number of batches per epoch: rank ",
          distributed::rank(loc), " has ", steps, ", rank ", r, " has ", all[r],
          " (batch the shards with drop_remainder, or take the same count on every rank)"));
}

}  // namespace xgrad

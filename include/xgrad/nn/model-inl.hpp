// Definitions of nn/model.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

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

}  // namespace xgrad

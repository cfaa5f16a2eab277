// Definitions of nn/module.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <cxxabi.h>

#include <cctype>
#include <cstdlib>
#include <typeinfo>

#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

namespace detail {

/// "LeNet5" for a type named xgrad::models::LeNet5.
inline std::string type_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : type.name();
  std::free(demangled);
  if (auto angle = name.find('<'); angle != std::string::npos) name.resize(angle);
  if (auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  return name;
}

}  // namespace detail

XGRAD_API Tensor<float> Module::forward(Tensor<float> /*x*/) {
  throw ValueError(xgrad::detail::concat("Module ", name(), " does not define forward(Tensor<float>)"));
}

XGRAD_API Tensor<float> Module::forward(Tensor<float> /*x*/, Tensor<float> /*y*/) {
  throw ValueError(xgrad::detail::concat("Module ", name(), " does not define forward(Tensor<float>, Tensor<float>)"));
}

XGRAD_API std::string Module::name() const { return m_name.empty() ? detail::type_name(typeid(*this)) : m_name; }

XGRAD_API void Module::register_module(const std::string& name, Module& child) {
  if (child.m_parent)
    throw ValueError(xgrad::detail::concat("Module ", this->name(), ": module '", name, "' is already registered in ",
                                           child.m_parent->name()));
  child.m_parent = this;
  child.m_name = name;
  child.prefix_parameter_names(name + ".");
  m_children.emplace_back(name, &child);
}

XGRAD_API void Module::register_modules(std::initializer_list<std::pair<std::string, Module*>> children) {
  for (const auto& [name, child] : children) register_module(name, *child);
}

XGRAD_API void Module::register_modules(std::initializer_list<Module*> children) {
  for (Module* child : children) {
    std::string type = detail::type_name(typeid(*child));
    for (auto& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    int index = 0;
    for (const auto& [name, sibling] : m_children)
      index += detail::type_name(typeid(*sibling)) == detail::type_name(typeid(*child));
    register_module(type + std::to_string(index), *child);
  }
}

XGRAD_API std::vector<Parameter<float>> Module::parameters() const {
  std::vector<Parameter<float>> out;
  for (const auto& [name, p] : named_parameters())
    if (p.dtype() == DType::float32) out.push_back(Parameter<float>::shared(Tensor<float>(p)));
  return out;
}

XGRAD_API std::vector<std::pair<std::string, TensorBase>> Module::named_parameters() const {
  std::vector<std::pair<std::string, TensorBase>> out;
  collect(out);
  return out;
}

XGRAD_API std::vector<std::pair<std::string, TensorBase>> Module::named_buffers() const {
  std::vector<std::pair<std::string, TensorBase>> out;
  collect_buffers("", out);
  return out;
}

XGRAD_API std::vector<std::pair<std::string, TensorBase>> Module::named_state() const {
  auto out = named_parameters();
  for (auto& b : named_buffers()) out.push_back(std::move(b));
  return out;
}

XGRAD_API void Module::set_train(bool on) {
  m_training = on;
  for (auto& [name, child] : m_children) child->set_train(on);
}

namespace detail {

/// A copy of each tensor (eagerly its data; traced, its value now, whatever is written later).
inline std::vector<TensorBase> copies(const std::vector<std::pair<std::string, TensorBase>>& tensors) {
  std::vector<TensorBase> out;
  for (const auto& named : tensors) {
    const TensorBase& t = named.second;
    out.push_back(
        visit_element(t.dtype(), [&]<class T>() { return TensorBase(zeros_like(Tensor<T>(t)).assign(Tensor<T>(t))); }));
  }
  return out;
}

/// Writes values[k] into tensor k.
inline void put(const std::vector<std::pair<std::string, TensorBase>>& tensors, const std::vector<TensorBase>& values) {
  no_grad off;
  for (std::size_t k = 0; k < tensors.size(); ++k)
    visit_element(tensors[k].second.dtype(), [&]<class T>() {
      Tensor<T> target(tensors[k].second);
      target.assign(Tensor<T>(values[k]));
      return 0;
    });
}

}  // namespace detail

XGRAD_API std::function<std::function<void()>()> Module::state_replay() const {
  auto buffers = named_buffers();
  if (buffers.empty()) return {};
  return [buffers, seen = detail::copies(buffers)] {
    auto now = detail::copies(buffers);
    detail::put(buffers, seen);
    return std::function<void()>([buffers, now] { detail::put(buffers, now); });
  };
}

XGRAD_API Jitted<Module::Forward>& Module::compiled() {
  const std::size_t which = m_training ? 1 : 0;
  std::call_once(m_compile_once[which], [this, which] {
    m_compiled[which] = std::make_unique<Jitted<Forward>>(
        Forward{this}, JitConfig{.name = name() + (m_training ? "" : ".eval")}, SourceLoc::current());
  });
  return *m_compiled[which];
}

XGRAD_API void Module::prefix_parameter_names(const std::string& prefix) {
  for (auto& [name, p] : m_parameters) p.impl()->autograd->name = prefix + p.impl()->autograd->name;
  for (auto& [name, child] : m_children) child->prefix_parameter_names(prefix);
}

XGRAD_API void Module::collect(std::vector<std::pair<std::string, TensorBase>>& out) const {
  for (const auto& [name, p] : m_parameters) out.emplace_back(p.impl()->autograd->name, p);
  for (const auto& [name, child] : m_children) child->collect(out);
}

XGRAD_API void Module::collect_buffers(const std::string& prefix,
                                       std::vector<std::pair<std::string, TensorBase>>& out) const {
  for (const auto& [name, b] : m_buffers) out.emplace_back(prefix + name, b);
  for (const auto& [name, child] : m_children) child->collect_buffers(prefix + name + ".", out);
}

}  // namespace xgrad::nn

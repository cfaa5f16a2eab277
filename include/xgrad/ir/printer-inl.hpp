// Definitions of ir/printer.hpp: included by it when header-only, compiled once into the
// library (src/ir.cpp) otherwise.
#pragma once

#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/ir/printer.hpp"

namespace xgrad::ir {

XGRAD_API std::string type_str(DType dtype, const Shape& shape) {
  return xgrad::detail::concat(dtype_short_name(dtype), shape);
}
XGRAD_API std::string type_str(const Value& v) {
  return v.by_reference ? "Ref[" + type_str(v.dtype, v.shape) + "]" : type_str(v.dtype, v.shape);
}

namespace detail {

inline std::string operand_list(const std::vector<Value*>& values) {
  std::string out;
  for (const Value* v : values) out += xgrad::detail::concat(out.empty() ? "" : ", ", "%", v->id);
  return out;
}

inline std::string node_comment(const Node& node) {
  std::string out;
  if (node.loc.line() != 0) out += "  # " + node.loc.str();
  if (!node.scope.empty()) out += "  @" + node.scope;
  return out;
}

}  // namespace detail

XGRAD_API std::string node_str(const Node& node) {
  std::ostringstream out;
  if (node.outputs.size() == 1) {
    out << "%" << node.outputs[0]->id << " : " << type_str(*node.outputs[0]) << " = ";
  } else if (!node.outputs.empty()) {
    out << "(";
    for (std::size_t i = 0; i < node.outputs.size(); ++i)
      out << (i ? ", " : "") << "%" << node.outputs[i]->id << " : " << type_str(*node.outputs[i]);
    out << ") = ";
  }
  out << node.op() << "(" << detail::operand_list(node.inputs) << ")";
  if (const std::vector<Attr> attrs = node.attrs(); !attrs.empty()) {
    out << " {";
    for (std::size_t i = 0; i < attrs.size(); ++i) out << (i ? ", " : "") << attrs[i].name << "=" << attrs[i].value;
    out << "}";
  }
  out << detail::node_comment(node);
  return out.str();
}

XGRAD_API std::string to_text(const Graph& graph, const FailedNode* failed, const NodeNote& note) {
  std::ostringstream out;
  out << "graph " << graph.name << "(\n";
  for (std::size_t i = 0; i < graph.inputs.size(); ++i) {
    const Value& v = *graph.inputs[i];
    out << "    %" << v.id << " : " << type_str(v);
    if (!v.name.empty()) out << "  # " << v.name;
    out << "\n";
  }
  out << ") {\n";
  for (const auto& node : graph.nodes) out << "  " << node_str(*node) << (note ? note(*node) : "") << "\n";
  if (failed) {
    out << "#------------------------> failed here\n  " << failed->op << "(" << detail::operand_list(failed->inputs)
        << ")";
    if (!failed->inputs.empty()) {
      out << "  # (";
      for (std::size_t i = 0; i < failed->inputs.size(); ++i) out << (i ? ", " : "") << type_str(*failed->inputs[i]);
      out << ")";
    }
    out << "  # " << failed->loc.str();
    if (!failed->scope.empty()) out << "  @" << failed->scope;
    out << "\n";
  } else {
    out << "  return " << detail::operand_list(graph.outputs) << "\n";
    for (const auto& e : graph.effects)
      out << "  effect: %" << graph.inputs[e.input]->id << " <- %" << e.value->id << "  # " << e.loc.str() << "\n";
  }
  out << "}\n";
  std::unordered_set<const Graph*> printed;
  for (const auto& node : graph.nodes)
    for (const auto& sub : node->subgraphs)
      if (printed.insert(sub.get()).second) out << "\n" << to_text(*sub);
  return out.str();
}

namespace detail {

inline std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

inline void dot_body(std::ostringstream& out, const Graph& graph, const std::string& prefix) {
  std::unordered_map<const Node*, std::size_t> index_of;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) index_of[graph.nodes[i].get()] = i;
  for (const Value* v : graph.inputs)
    out << "  " << prefix << "v" << v->id << " [shape=ellipse, label=\"%" << v->id
        << (v->name.empty() ? "" : " " + dot_escape(v->name)) << "\\n"
        << dot_escape(type_str(*v)) << "\"];\n";
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = *graph.nodes[i];
    std::string id = prefix + "n" + std::to_string(i);
    std::string types;
    for (const Value* v : node.outputs) types += "\\n" + dot_escape(type_str(*v));
    out << "  " << id << " [shape=box, label=\"" << dot_escape(std::string(node.op())) << types << "\\n"
        << node.loc.str() << "\"];\n";
    for (const Value* in : node.inputs) {
      std::string from = in->producer ? prefix + "n" + std::to_string(index_of.at(in->producer))
                                      : prefix + "v" + std::to_string(in->id);
      out << "  " << from << " -> " << id << " [label=\"%" << in->id << "\"];\n";
    }
  }
}

}  // namespace detail

XGRAD_API std::string to_dot(const Graph& graph) {
  std::ostringstream out;
  out << "digraph \"" << detail::dot_escape(graph.name) << "\" {\n  rankdir=TB;\n";
  detail::dot_body(out, graph, "");
  int k = 0;
  for (const auto& node : graph.nodes)
    for (const auto& sub : node->subgraphs) {
      std::string prefix = xgrad::detail::concat("s", k++, "_");
      out << "  subgraph cluster_" << prefix << " {\n  label=\"" << detail::dot_escape(sub->name) << "\";\n";
      detail::dot_body(out, *sub, prefix);
      out << "  }\n";
    }
  out << "}\n";
  return out.str();
}

}  // namespace xgrad::ir

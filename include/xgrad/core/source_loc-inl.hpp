// Definitions of core/source_loc.hpp: included by it when header-only, compiled once into the
// library (src/core.cpp) otherwise.
#pragma once

#include <string>

#include "xgrad/core/source_loc.hpp"

namespace xgrad {

XGRAD_API std::string SourceLoc::str() const {
  std::string path(m_file);
  auto slash = path.find_last_of('/');
  return (slash == std::string::npos ? path : path.substr(slash + 1)) + ":" + std::to_string(m_line);
}

}  // namespace xgrad

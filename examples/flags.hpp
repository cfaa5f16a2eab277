// The examples' parser of "--flag value" arguments.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>

namespace xgrad::examples {

/// "--flag value" pairs; a bad one prints the problem and the usage line and exits with 2.
class Flags {
 public:
  Flags(std::string program, std::string usage) : m_program(std::move(program)), m_usage(std::move(usage)) {}

  [[noreturn]] void fail(const std::string& problem) const {
    std::cerr << m_program << ": " << problem << "\nusage: " << m_program << " " << m_usage << "\n";
    std::exit(2);
  }

  long positive(const std::string& flag, const std::string& text) const {
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v <= 0) fail(flag + " takes a positive integer, got '" + text + "'");
    return v;
  }

  /// Calls handle(flag, value) for each pair, and handle(flag, "") for a flag of `switches`
  /// (which takes no value); handle returns false for a flag it does not know.
  template <class Handle>
  void parse(int argc, char** argv, Handle handle, std::initializer_list<std::string_view> switches = {}) const {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
        if (!handle(flag, "")) fail("unknown flag " + flag);
        continue;
      }
      if (i + 1 >= argc) fail(flag == "--help" ? "" : "missing the value of " + flag);
      const std::string value = argv[++i];
      if (!handle(flag, value)) fail("unknown flag " + flag);
    }
  }

 private:
  std::string m_program, m_usage;
};

}  // namespace xgrad::examples

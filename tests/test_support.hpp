// Helpers shared by the test files.
#pragma once

#include <doctest/doctest.h>

#include <string>

namespace xgrad::testing {

/// Runs f, which must throw E, and returns the exception's what().
template <class E, class F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("the call did not throw the expected exception type");
  return {};
}

}  // namespace xgrad::testing

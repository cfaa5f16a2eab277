// The one doctest main for the whole suite.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

// Under AddressSanitizer an allocation beyond its limit aborts by default; xgrad turns the
// allocator's refusal into a ValueError, which the limits tests check, so let it return null.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

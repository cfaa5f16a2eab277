// How xgrad is compiled into a program.
//
// Header-only (the default, CMake target xgrad::xgrad): every definition is in the headers and
// is compiled again by each file that includes them.
//
// Compiled (CMake target xgrad::compiled, which defines XGRAD_COMPILED): a header `x.hpp` whose
// definitions live in `x-inl.hpp` leaves that file out, and the library (src/) compiles those
// definitions once. A user's file then parses and instantiates only declarations.
#pragma once

/// Marks a function whose definition is in an -inl.hpp file: inline when header-only, defined
/// once in the library when compiled.
#if defined(XGRAD_COMPILED)
#define XGRAD_API
#else
#define XGRAD_API inline
#endif

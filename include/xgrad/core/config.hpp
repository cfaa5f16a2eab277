// How xgrad is compiled into a program.
//
// Header-only (the default, CMake target xgrad::xgrad): every definition is in the headers and
// is compiled again by each file that includes them.
//
// Compiled (CMake target xgrad::compiled, which defines XGRAD_COMPILED): a header `x.hpp` whose
// definitions live in `x-inl.hpp` leaves that file out, and the library (src/) compiles those
// definitions once. A user's file then parses and instantiates only declarations.
//
// Templates (the ops, in every dtype) are compiled once too: a header lists the instances the
// library holds in a macro beside the templates, `XGRAD_<GROUP>_INSTANCES(keyword)`. Compiled,
// the header expands it with `extern template`, so a user's file instantiates none of them;
// the library source that defines `XGRAD_INSTANTIATE_<GROUP>` before its includes expands it
// with `template` instead, and holds the group's instances.
#pragma once

/// Marks a function whose definition is in an -inl.hpp file: inline when header-only, defined
/// once in the library when compiled.
#if defined(XGRAD_COMPILED)
#define XGRAD_API
#else
#define XGRAD_API inline
#endif

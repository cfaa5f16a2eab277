// xgrad::compiled: the tensor, its storage and device memory, shapes and source locations
// (include/xgrad/core), compiled once.
#include "xgrad/core/device_memory-inl.hpp"
#include "xgrad/core/shape-inl.hpp"
#include "xgrad/core/source_loc-inl.hpp"
#include "xgrad/core/storage-inl.hpp"
#include "xgrad/core/tensor-inl.hpp"

// xgrad::compiled: the memory planner and graph executor (include/xgrad/backend), compiled once.
#include "xgrad/backend/executor-inl.hpp"
#include "xgrad/backend/memory_plan-inl.hpp"
#include "xgrad/backend/schedule-inl.hpp"

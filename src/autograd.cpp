// xgrad::compiled: the backward engine (include/xgrad/autograd), compiled once.
#include "xgrad/autograd/engine-inl.hpp"

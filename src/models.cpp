// xgrad::compiled: the model zoo (include/xgrad/models), compiled once.
#include "xgrad/models/char_transformer-inl.hpp"
#include "xgrad/models/lenet5-inl.hpp"

// xgrad::compiled: the model zoo (include/xgrad/models), compiled once.
#include "xgrad/models/lenet5-inl.hpp"

// xgrad::compiled: the IDX reader, the Dataset pipeline, MnistDataset, TextDataset and the image
// transforms (include/xgrad/data), compiled once.
#include "xgrad/data/dataset-inl.hpp"
#include "xgrad/data/idx-inl.hpp"
#include "xgrad/data/mnist-inl.hpp"
#include "xgrad/data/text-inl.hpp"
#include "xgrad/data/transforms-inl.hpp"

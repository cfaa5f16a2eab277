// xgrad's data layer: the IDX (MNIST-format) reader, the Dataset pipeline, MnistDataset,
// TextDataset and image transforms. Needs only the tensor core; include it beside
// xgrad/core.hpp or xgrad/nn.hpp.
#pragma once

#include "xgrad/data/dataset.hpp"
#include "xgrad/data/idx.hpp"
#include "xgrad/data/mnist.hpp"
#include "xgrad/data/text.hpp"
#include "xgrad/data/transforms.hpp"

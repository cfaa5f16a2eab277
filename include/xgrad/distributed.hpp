// Data-parallel training's layer: the process group (init, rank, world_size, barrier) and the
// collectives as ops (all_reduce, all_gather, reduce_scatter, broadcast), over MPI when xgrad
// is built with XGRAD_MPI=ON (docs/DISTRIBUTED.md).
#pragma once

#include "xgrad/distributed/collectives.hpp"
#include "xgrad/distributed/process_group.hpp"

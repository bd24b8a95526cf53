// <carve/carve.hpp> with every host-only component in a .cu: CARVE_CUDA_FULL_UMBRELLAS must keep
// compiling under nvcc, though the .cu files of carve's own tests include those parts by name.
#define CARVE_CUDA_FULL_UMBRELLAS
#include <carve/carve.hpp>

__global__ void umbrella_everything(int* out) { *out = 0; }

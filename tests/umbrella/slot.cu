// What including <carve/slot.hpp> costs a .cu: the header and one empty kernel, compiled once per
// architecture (see CMakeLists.txt); the test command compiles it, timed, and prints the times.
#include <carve/slot.hpp>

__global__ void umbrella_slot(int* out) { *out = 0; }

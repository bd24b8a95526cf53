// What including <carve/mr.hpp> costs a .cu: the header and one empty kernel, compiled once per
// architecture (see CMakeLists.txt); the test command compiles it, timed, and prints the times.
#include <carve/mr.hpp>

__global__ void umbrella_mr(int* out) { *out = 0; }

// What including <carve/queue.hpp> costs a .cu: the header and one empty kernel, compiled once per
// architecture (see CMakeLists.txt); the test command compiles it, timed, and prints the times.
#include <carve/queue.hpp>

__global__ void umbrella_queue(int* out) { *out = 0; }

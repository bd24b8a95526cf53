// Compiled as C++17 on purpose (see CMakeLists.txt): the build must fail, and its first error must
// say that carve needs C++20 and how to get it.
#include <carve/carve.hpp>

int main() { return 0; }

// What the host compiler makes of each type in device_types.hpp, one line per entry, for
// check_layout.py to set beside the PTX:
//   <index> <tab> <sizeof> <tab> <alignof> <tab> <by value: 1 or 0> <tab> <member offsets, comma-separated> <tab>
//   <type>
// then a line `not listed <tab> <name> <tab> <why>` for each of device_types.hpp's exemptions.
// A data member pointer is its member's offset under the Itanium C++ ABI, which both g++ and
// nvcc's device side follow, so the offsets are read the way the PTX writes them.
#include "layout/device_types.hpp"

#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

namespace {

template <class T>
std::string type_name() {
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(typeid(T).name(), nullptr, nullptr, &status), &std::free);
  return status == 0 ? name.get() : typeid(T).name();
}

template <class T, auto... Members>
void print(std::size_t index, carve_layout::Probe<T, Members...>) {
  std::string offsets;
  ((offsets += (offsets.empty() ? "" : ",") + std::to_string(std::bit_cast<std::ptrdiff_t>(Members))), ...);
  std::printf("%zu\t%zu\t%zu\t%d\t%s\t%s\n", index, sizeof(T), alignof(T), carve_layout::copied_at_launch<T> ? 1 : 0,
              offsets.c_str(), type_name<T>().c_str());
}

template <class... P, std::size_t... I>
void print_all(carve_layout::ProbeList<P...>, std::index_sequence<I...>) {
  (print(I, P{}), ...);
}

} // namespace

int main() {
  print_all(carve_layout::DeviceTypes{}, std::make_index_sequence<carve_layout::DeviceTypes::size>{});
  for (const auto& [name, why] : carve_layout::not_listed) {
    std::printf("not listed\t%s\t%s\n", name, why);
  }
  return 0;
}

// libFuzzer target for carve's topology readers. Every input goes to both readers; each must
// either build a topology whose answers are sane or throw a parse error (carve::Exception,
// invalid_argument, "line N: ...") naming a line of the input. Anything else (a crash, another exception, a sanitizer
// report) is a bug.
#include <carve/core/error.hpp>
#include <carve/topology/topology.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

void require(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

// The N of a parse error's "line N: ..."; 0 when the message has no line.
std::size_t error_line(const carve::Exception& e) {
  const std::string_view m = e.what();
  std::size_t n = 0;
  if (m.substr(0, 5) != "line ") {
    return 0;
  }
  for (std::size_t i = 5; i < m.size() && m[i] >= '0' && m[i] <= '9'; ++i) {
    n = n * 10 + static_cast<std::size_t>(m[i] - '0');
  }
  return n;
}

std::size_t line_count(std::string_view text) {
  std::size_t lines = 1;
  for (const char c : text) {
    lines += c == '\n' ? 1 : 0;
  }
  return lines;
}

void check(const carve::Topology& t) {
  const auto n = static_cast<std::uint32_t>(t.node_count());
  for (std::uint32_t a = 0; a < n; ++a) {
    for (std::uint32_t b = 0; b < n; ++b) {
      const carve::NodeId x{a};
      const carve::NodeId y{b};
      const int hops = t.hops(x, y);
      require(hops <= t.options().max_hops);
      require(t.path_bandwidth(x, y) == t.path_bandwidth(y, x)); // links and relay rules are symmetric
      require(t.path(x, y).size() == static_cast<std::size_t>(hops + 1));
    }
  }
  for (int g = 0; g < t.gpu_count(); ++g) {
    require(t.node(t.gpu(g)).ordinal == g);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t lines = line_count(text);
  try {
    check(carve::Topology::from_nvidia_smi(text));
  } catch (const carve::Exception& e) {
    require(e.code() == carve::Errc::invalid_argument && error_line(e) >= 1 && error_line(e) <= lines + 1);
  }
  try {
    const carve::Topology t = carve::Topology::from_description(text);
    if (t.node_count() <= 64) {
      check(t);
    }
  } catch (const carve::Exception& e) {
    require(e.code() == carve::Errc::invalid_argument && error_line(e) >= 1 && error_line(e) <= lines + 1);
  }
  return 0;
}

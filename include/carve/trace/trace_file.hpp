/// @file carve/trace/trace_file.hpp
/// Any allocation trace carve reads, from a file, its format told by its first bytes.
///
/// @code
/// auto t = carve::trace::read_trace_file("snapshot.pickle");
/// if (!t) { std::cerr << t.error().message << '\n'; return 2; }
/// std::cout << t->peak_live_bytes() << '\n';
/// @endcode
///
/// Formats: carve's own CSV (its first line is `# carve trace`, as TraceResource writes it), RMM's
/// `logging_resource_adaptor` CSV (a first line starting `Thread,Time,Action`), and otherwise a
/// PyTorch memory snapshot (a pickle; anything else is refused by the pickle reader). Errors: the
/// reader's, or io_error naming the file when it cannot be read.
#pragma once

#include <carve/core/error.hpp>
#include <carve/trace/allocation_trace.hpp>
#include <carve/trace/carve_csv.hpp>
#include <carve/trace/memory_snapshot.hpp>
#include <carve/trace/rmm_log.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace carve::trace {

/// The formats read_trace_file tells apart.
enum class TraceFormat { pytorch_snapshot, rmm_log, carve_csv };

/// The format of a file that begins with `head`.
inline TraceFormat trace_format(std::string_view head) noexcept {
  if (head.starts_with("# carve trace")) {
    return TraceFormat::carve_csv;
  }
  if (head.starts_with("Thread,Time,Action")) {
    return TraceFormat::rmm_log;
  }
  return TraceFormat::pytorch_snapshot;
}

/// The whole of the file at `path`. Errors: io_error naming it.
inline Result<std::string> read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return fail(Errc::io_error, path + ": cannot open: " + std::strerror(errno));
  }
  std::string bytes;
  char buffer[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) {
    bytes.append(buffer, n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return fail(Errc::io_error, path + ": cannot read: " + std::strerror(errno));
  }
  return bytes;
}

/// The trace in the file at `path` (for a snapshot, of `device`: nullopt for the first device with
/// events). Messages start with the path.
inline Result<AllocationTrace> read_trace_file(const std::string& path,
                                               std::optional<std::uint64_t> device = std::nullopt) {
  auto bytes = read_whole_file(path);
  if (!bytes) {
    return cuda::std::unexpected(bytes.error());
  }
  switch (trace_format(*bytes)) {
  case TraceFormat::carve_csv:
    return read_carve_csv(*bytes, path);
  case TraceFormat::rmm_log:
    return read_rmm_log(*bytes, path);
  case TraceFormat::pytorch_snapshot:
    break;
  }
  return read_memory_snapshot(*bytes, path, device);
}

} // namespace carve::trace

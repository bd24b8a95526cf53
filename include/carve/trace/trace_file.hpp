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
/// reader's, io_error naming the file when it cannot be read, or invalid_argument when it is larger
/// than the limit.
///
/// The limit: the whole file is read into memory, and decoding it takes more (the pickle reader
/// up to about 80 bytes per byte of input, about 3 for a real snapshot: see
/// carve/trace/pickle_reader.hpp), so a file above `max_bytes` (max_trace_file_bytes, 4 GiB,
/// unless the caller passes another) is refused before it is read, or as soon as it passes the
/// limit when its size cannot be known in advance (a pipe, a device).
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

/// The largest trace file read_whole_file and read_trace_file read unless told otherwise: 4 GiB.
/// Real snapshots are megabytes to hundreds of megabytes; a larger file is most likely not a trace
/// (a disk image, /dev/zero). The limit bounds memory only loosely, a pickle of 4 GiB taking some
/// 12 GiB to decode if it is a real snapshot and up to about 320 GiB if it is hostile: a caller
/// short of memory passes a smaller one.
inline constexpr std::uint64_t max_trace_file_bytes = std::uint64_t{4} << 30;

/// The whole of the file at `path`, at most `max_bytes` of it. Errors: io_error naming it when it
/// cannot be opened or read; invalid_argument when it holds more than `max_bytes`.
[[nodiscard]] inline Result<std::string> read_whole_file(const std::string& path,
                                                         std::uint64_t max_bytes = max_trace_file_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return fail(Errc::io_error, path + ": cannot open: " + std::strerror(errno));
  }
  const auto too_large = [&](const std::string& what) {
    std::fclose(f);
    return fail(Errc::invalid_argument, path + ": " + what);
  };
  // The size, where the file has one: refused before anything is read, or reserved at once.
  std::string bytes;
  if (std::fseek(f, 0, SEEK_END) == 0) {
    const long size = std::ftell(f);
    if (size > 0 && static_cast<std::uint64_t>(size) > max_bytes) {
      return too_large(std::to_string(size) + " bytes, above the limit of " + std::to_string(max_bytes) +
                       " bytes for a trace file");
    }
    if (size > 0) {
      bytes.reserve(static_cast<std::size_t>(size));
    }
  }
  std::rewind(f);
  char buffer[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) {
    if (n > max_bytes - bytes.size()) { // bytes.size() <= max_bytes: no wrap
      return too_large("more than " + std::to_string(max_bytes) + " bytes, above the limit for a trace file");
    }
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
/// requests, as read_memory_snapshot chooses), a file of at most `max_bytes`. Messages start with
/// the path.
[[nodiscard]] inline Result<AllocationTrace> read_trace_file(const std::string& path,
                                                             std::optional<std::uint64_t> device = std::nullopt,
                                                             std::uint64_t max_bytes = max_trace_file_bytes) {
  auto bytes = read_whole_file(path, max_bytes);
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

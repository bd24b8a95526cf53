/// @file carve/trace/rmm_log.hpp
/// The CSV that RMM's logging_resource_adaptor writes, as an AllocationTrace.
///
/// @code
/// Thread,Time,Action,Pointer,Size,Stream
/// 140573312345856,10:30:45.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020
/// 140573312345856,10:30:45.123789,allocate failure,(nil),68719476736,0x7f8a38001020
/// 140573312345856,10:30:45.124001,free,0x7f8a40000000,1024,0x7f8a38001020
/// @endcode
///
/// The adaptor logs through spdlog (rapids_logger in later RMM): first the header line, then one
/// line per call with the pattern "%t,%H:%M:%S.%f,%v", where the message is
/// "allocate,%p,%zu,<stream>", "allocate failure,%p,%zu,<stream>" (a null pointer) or
/// "free,%p,%zu,<stream>". So a line is the OS thread id (decimal), the time of day with
/// microseconds, the action, the pointer, the size in bytes and the stream. Allocations are
/// logged after they succeed and frees before they happen, so a block freed by one thread and
/// handed to another is freed in the log before it is allocated again.
///
/// What this reader accepts, the format above read strictly:
/// - The first line is the header. Its columns are found by name, so their order does not matter
///   and columns of other names are ignored (a log written with a changed pattern still reads);
///   Thread, Action, Pointer, Size and Stream must be there, each once, and Time may be. Every line
///   has as many fields as the header. Lines end with "\n" or "\r\n"; empty lines are skipped.
/// - Pointer and Stream: `(nil)` (glibc's %p for a null pointer) or hexadecimal digits, with or
///   without `0x` (fmt's pointers, and `0` for the default stream where RMM streams a null handle
///   with std::hex). A stream becomes the trace's stream number: the handle's value.
/// - Time: HH:MM:SS.ffffff (spdlog's %H:%M:%S.%f), read as microseconds. A time more than half a
///   day before the line above it is taken as a wrap past midnight and adds a day; smaller steps
///   back (threads racing to the log) are kept as they are.
/// - Action: `allocate`, `free` or `allocate failure`. Failures allocated nothing and are skipped;
///   an allocation at the null pointer is refused.
///
/// The event index in messages counts the lines after the header, from 0, failures included and
/// empty lines not: line k + 2 of a log without empty lines is event k. Errors are
/// Errc::invalid_argument: "<source>: line <n>: <what>" for a line that does not parse (or whose
/// time, with a day added for each wrap past midnight, passes 2^63 - 1 microseconds), "<source>:
/// event <i>: <what>" for what TraceBuilder refuses (a size of 0 or above 2^62, an address live
/// already, a free of an address not live or with other bytes than its allocation's, and the rest
/// carve/trace/allocation_trace.hpp lists).
#pragma once

#include <carve/core/error.hpp>
#include <carve/trace/allocation_trace.hpp>
#include <carve/trace/carve_csv.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace carve::trace {

/// The header RMM's logging_resource_adaptor writes.
inline constexpr std::string_view rmm_log_header = "Thread,Time,Action,Pointer,Size,Stream";

namespace detail {

// Where each column of an RMM log is, found by name in its header.
struct RmmColumns {
  static constexpr std::array<std::string_view, 6> names = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
  static constexpr std::size_t thread = 0, time = 1, action = 2, pointer = 3, size = 4, stream = 5;
  std::array<std::optional<std::size_t>, 6> at{}; // by the indices above
  std::size_t fields = 0;                         // in the header, so in every line

  // The columns of `header`, or what is wrong with it.
  [[nodiscard]] static cuda::std::expected<RmmColumns, std::string> find(std::string_view header) {
    std::vector<std::string_view> f;
    csv_split(header, f);
    RmmColumns c;
    c.fields = f.size();
    for (std::size_t i = 0; i < f.size(); ++i) {
      for (std::size_t k = 0; k < names.size(); ++k) {
        if (f[i] != names[k]) {
          continue;
        }
        if (c.at[k]) {
          return cuda::std::unexpected("the header " + csv_quoted(header) + " names " + std::string(names[k]) +
                                       " twice");
        }
        c.at[k] = i;
      }
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (!c.at[k] && k != time) {
        return cuda::std::unexpected("the header " + csv_quoted(header) + " has no " + std::string(names[k]) +
                                     " column (RMM's is " + csv_quoted(rmm_log_header) + ")");
      }
    }
    return c;
  }
};

// `field` (the column `name`) as a pointer RMM logged: (nil), or hexadecimal digits with or
// without 0x.
inline std::uint64_t rmm_pointer(CsvFieldReader& read, std::string_view name, std::string_view field) {
  if (field == "(nil)") {
    return 0;
  }
  return read.hex_digits(name, field, "is not a pointer (hexadecimal, or (nil))");
}

// `field`, HH:MM:SS.ffffff, as microseconds since midnight.
inline std::int64_t rmm_time_of_day(CsvFieldReader& read, std::string_view field) {
  const auto digit = [&](std::size_t i) { return field[i] >= '0' && field[i] <= '9'; };
  const auto two = [&](std::size_t i) { return (field[i] - '0') * 10 + (field[i + 1] - '0'); };
  bool ok = field.size() == 15 && field[2] == ':' && field[5] == ':' && field[8] == '.';
  static constexpr std::array<std::size_t, 12> digits = {0, 1, 3, 4, 6, 7, 9, 10, 11, 12, 13, 14};
  for (const std::size_t i : digits) {
    ok = ok && digit(i);
  }
  if (!ok || two(0) > 23 || two(3) > 59 || two(6) > 59) {
    read.refuse("Time", field, "is not a time of day HH:MM:SS.ffffff");
    return 0;
  }
  std::int64_t micros = 0;
  for (std::size_t i = 9; i < 15; ++i) {
    micros = micros * 10 + (field[i] - '0');
  }
  return ((two(0) * std::int64_t{60} + two(3)) * 60 + two(6)) * 1'000'000 + micros;
}

} // namespace detail

/// The trace in `text`, a log of RMM's logging_resource_adaptor (see the top of this header);
/// `source` (a file name) starts every message. Errors: Errc::invalid_argument for a header
/// without the columns, a line with another number of fields, a field that does not parse, an
/// allocation at the null pointer, and all that TraceBuilder refuses.
[[nodiscard]] inline Result<AllocationTrace> read_rmm_log(std::string_view text, std::string source) {
  using Columns = detail::RmmColumns;
  detail::CsvLines lines(text);
  std::string_view line;
  if (!lines.next(line)) {
    return detail::csv_line_failure(
        source, 1, "expected the header " + detail::csv_quoted(rmm_log_header) + ", found an empty text");
  }
  const auto columns = Columns::find(line);
  if (!columns) {
    return detail::csv_line_failure(source, 1, columns.error());
  }
  const auto& at = columns->at;
  TraceBuilder builder(source);
  std::vector<std::string_view> f;
  std::uint64_t event = 0;     // the next line's index
  std::int64_t last_time = -1; // as written, without the days added
  std::int64_t days_added = 0; // in microseconds
  constexpr std::int64_t day = std::int64_t{24} * 3600 * 1'000'000;
  while (lines.next(line)) {
    if (line.empty()) {
      continue;
    }
    const std::uint64_t this_event = event++;
    detail::csv_split(line, f);
    if (f.size() != columns->fields) {
      return detail::csv_line_failure(source, lines.number(),
                                      std::to_string(f.size()) + " fields, expected " +
                                          std::to_string(columns->fields) + " as in the header");
    }
    detail::CsvFieldReader read;
    read.decimal("Thread", f[*at[Columns::thread]]);
    std::int64_t time_us = no_time;
    if (at[Columns::time]) {
      const std::int64_t of_day = detail::rmm_time_of_day(read, f[*at[Columns::time]]);
      if (read.ok()) {
        if (last_time >= 0 && of_day < last_time - day / 2) {
          if (days_added > INT64_MAX - 2 * day) { // of_day + days_added must fit too
            return detail::csv_line_failure(source, lines.number(), "the time passes 2^63 - 1 microseconds");
          }
          days_added += day;
        }
        last_time = of_day;
        time_us = of_day + days_added;
      }
    }
    const std::string_view action = f[*at[Columns::action]];
    const bool allocate = action == "allocate";
    const bool failure = action == "allocate failure";
    if (!allocate && !failure && action != "free") {
      read.refuse("Action", action, "is not allocate, free or allocate failure");
    }
    const std::uint64_t pointer = detail::rmm_pointer(read, "Pointer", f[*at[Columns::pointer]]);
    const std::uint64_t size = read.decimal("Size", f[*at[Columns::size]]);
    const std::uint64_t stream = detail::rmm_pointer(read, "Stream", f[*at[Columns::stream]]);
    if (read.ok() && allocate && pointer == 0) {
      read.refuse("an allocation at the null pointer");
    }
    if (!read.ok()) {
      return detail::csv_line_failure(source, lines.number(), read.problem());
    }
    if (failure) {
      continue; // it allocated nothing
    }
    if (allocate) {
      if (auto ok = builder.allocate(this_event, pointer, size, stream, time_us); !ok) {
        return detail::csv_passed_on(std::move(ok));
      }
    } else if (auto ok = builder.free(this_event, pointer, size, time_us); !ok) {
      return detail::csv_passed_on(std::move(ok));
    }
  }
  return std::move(builder).finish();
}

} // namespace carve::trace

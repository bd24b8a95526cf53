/// @file carve/trace/carve_csv.hpp
/// carve's own allocation trace: one CSV line per call a carve::TraceResource saw, the writer that
/// formats those lines, and the reader that turns such a file into an AllocationTrace.
///
/// @code
/// # carve trace v1
/// seq,thread,time_ns,action,address,bytes,alignment,stream,result
/// 0,0,1520,allocate,0x7f3a2c000000,4096,256,,ok
/// 1,1,2210,allocate,,1073741824,256,3,no space
/// 2,0,2950,deallocate,0x7f3a2c000000,4096,256,,ok
/// @endcode
///
/// The format, version 1:
/// - Line 1 is exactly `# carve trace v1` (another format changes the number, so an old reader
///   refuses a new file instead of misreading it) and line 2 exactly the header above. Then one
///   line per call: nine fields separated by commas, never csv_quoted, since no field can hold a comma.
///   Lines end with "\n" ("\r\n" is read too); empty lines are skipped.
/// - seq: the call's number in its log, from 0, in the order the calls were made; lines are
///   written in seq order. A reader requires seq to rise from line to line but allows gaps, so a
///   trace filtered with grep (one thread's lines, say) still reads.
/// - thread: the calling thread's carve::thread_number() (small numbers, reused once a thread ends).
/// - time_ns: nanoseconds from the log's opening to the call's numbering (a steady clock).
/// - action: `allocate` or `deallocate`.
/// - address: the block, 0x-prefixed lowercase hexadecimal; empty for an allocation that failed.
/// - bytes, alignment: as the caller passed them.
/// - stream: the stream a stream-ordered call named, as a number (see carve::trace_stream_id in
///   carve/mr/trace_resource.hpp); empty for a synchronous call.
/// - result: `ok`, or the carve::Errc the call returned as carve::to_string writes it (`no space`).
/// Whole numbers are decimal (a stream may also be 0x-hexadecimal); every number fits in 64 bits.
///
/// Reading (read_carve_csv): successful allocations and deallocations feed a TraceBuilder, with
/// the line's seq as the event index, so its messages name the call. Failed calls changed nothing
/// and are skipped: a failed allocation allocated nothing, and a failed deallocation leaves its
/// block live. A successful call's alignment must be a power of two (a resource refuses any
/// other). Errors are Errc::invalid_argument: "<source>: line <n>: <what>" for a line that does
/// not parse, "<source>: event <seq>: <what>" for what the TraceBuilder refuses.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/trace/allocation_trace.hpp>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace carve::trace {

/// The first line of every file in carve's trace CSV, version 1.
inline constexpr std::string_view carve_csv_version_line = "# carve trace v1";
/// Its second line: the column names.
inline constexpr std::string_view carve_csv_header = "seq,thread,time_ns,action,address,bytes,alignment,stream,result";

/// What a call did.
enum class CsvAction : unsigned char {
  allocate,  ///< try_allocate, or a throwing allocate
  deallocate ///< deallocate or try_deallocate
};

/// One call, as a line of carve's trace CSV records it.
struct CarveCsvRecord {
  std::uint64_t seq = 0;                  ///< the call's number in its log
  std::uint64_t thread = 0;               ///< the calling thread's carve::thread_number()
  std::uint64_t time_ns = 0;              ///< since the log was opened
  CsvAction action = CsvAction::allocate; ///< allocate or deallocate
  std::uint64_t address = 0;              ///< the block (not written for a failed allocation)
  std::uint64_t bytes = 0;                ///< as the caller passed them
  std::uint64_t alignment = 0;            ///< as the caller passed it
  std::optional<std::uint64_t> stream;    ///< the stream's number; nullopt for a synchronous call
  std::optional<Errc> error;              ///< what the call returned; nullopt for success
};

namespace detail {
// Every Errc's text fits a line's result field and holds no comma or line end, so no field is
// ever csv_quoted and a line never outgrows CarveCsvLine.
constexpr bool csv_errc_texts_fit(std::size_t most) noexcept {
  for (int e = 1; e <= static_cast<int>(last_errc); ++e) {
    std::size_t n = 0;
    for (const char* c = to_string(static_cast<Errc>(e)); *c != '\0'; ++c, ++n) {
      if (*c == ',' || *c == '\n' || *c == '\r') {
        return false;
      }
    }
    if (n > most) {
      return false;
    }
  }
  return true;
}
static_assert(csv_errc_texts_fit(48), "an Errc's text must fit a carve trace CSV field");
} // namespace detail

/// One formatted line, "\n" included. 256 bytes hold the longest: six 20-digit numbers, an
/// 18-character address, the action, a result of at most 48 characters and the commas.
struct CarveCsvLine {
  std::array<char, 256> text{}; ///< the line; the first `size` characters count
  std::size_t size = 0;         ///< its length

  /// The line as text.
  std::string_view view() const noexcept { return {text.data(), size}; }
};

/// `r` as a line of carve's trace CSV. Allocates nothing, so it is safe in a noexcept path.
inline CarveCsvLine format_carve_csv(const CarveCsvRecord& r) noexcept {
  CarveCsvLine line;
  char* out = line.text.data();
  char* const end = out + line.text.size();
  const auto number = [&](std::uint64_t v, int base) { out = std::to_chars(out, end, v, base).ptr; };
  const auto text = [&](std::string_view s) {
    for (const char c : s) {
      *out++ = c;
    }
  };
  number(r.seq, 10);
  *out++ = ',';
  number(r.thread, 10);
  *out++ = ',';
  number(r.time_ns, 10);
  *out++ = ',';
  const bool allocate = r.action == CsvAction::allocate;
  text(allocate ? "allocate," : "deallocate,");
  if (!allocate || !r.error) {
    text("0x");
    number(r.address, 16);
  }
  *out++ = ',';
  number(r.bytes, 10);
  *out++ = ',';
  number(r.alignment, 10);
  *out++ = ',';
  if (r.stream) {
    number(*r.stream, 10);
  }
  *out++ = ',';
  text(r.error ? std::string_view(to_string(*r.error)) : std::string_view("ok"));
  *out++ = '\n';
  line.size = static_cast<std::size_t>(out - line.text.data());
  return line;
}

/// Writes carve's trace CSV into a std::FILE* or a std::ostream that the caller owns and keeps
/// open. Not synchronised: carve::TraceLog numbers the calls and serialises the writes.
class CarveCsvWriter {
public:
  /// Writes into `out`.
  explicit CarveCsvWriter(std::FILE* out) noexcept : file_(out) {}
  /// Writes into `out`.
  explicit CarveCsvWriter(std::ostream& out) noexcept : stream_(&out) {}

  /// The version line and the header: the first two lines of a file. False when writing failed.
  bool write_header() noexcept {
    return put(carve_csv_version_line) && put("\n") && put(carve_csv_header) && put("\n");
  }
  /// One line for `r`. False when writing failed.
  bool write(const CarveCsvRecord& r) noexcept { return put(format_carve_csv(r).view()); }
  /// Hands what is buffered to the file or stream. False when that failed.
  bool flush() noexcept {
    if (file_ != nullptr) {
      return std::fflush(file_) == 0;
    }
    try {
      return static_cast<bool>(stream_->flush());
    } catch (...) { // a stream set to throw on failure
      return false;
    }
  }

private:
  bool put(std::string_view s) noexcept {
    if (file_ != nullptr) {
      return std::fwrite(s.data(), 1, s.size(), file_) == s.size();
    }
    try {
      return static_cast<bool>(stream_->write(s.data(), static_cast<std::streamsize>(s.size())));
    } catch (...) {
      return false;
    }
  }

  std::FILE* file_ = nullptr;
  std::ostream* stream_ = nullptr;
};

namespace detail {

// The lines of a text, numbered from 1, without their "\n" or "\r\n".
class CsvLines {
public:
  explicit CsvLines(std::string_view text) noexcept : rest_(text) {}

  // The next line into `line`; false at the end of the text.
  bool next(std::string_view& line) noexcept {
    if (at_ >= rest_.size()) {
      return false;
    }
    const std::size_t newline = rest_.find('\n', at_);
    const std::size_t end = newline == std::string_view::npos ? rest_.size() : newline;
    line = rest_.substr(at_, end - at_);
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    at_ = end == rest_.size() ? end : end + 1;
    ++number_;
    return true;
  }
  // The number of the line next() gave last (0 before the first).
  std::uint64_t number() const noexcept { return number_; }

private:
  std::string_view rest_;
  std::size_t at_ = 0;
  std::uint64_t number_ = 0;
};

// `line`'s comma-separated fields into `fields` (cleared first).
inline void csv_split(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      fields.push_back(line.substr(start));
      return;
    }
    fields.push_back(line.substr(start, comma - start));
    start = comma + 1;
  }
}

// `text` csv_quoted for a message, cut short past 80 characters.
inline std::string csv_quoted(std::string_view text) {
  constexpr std::size_t most = 80;
  return "\"" + std::string(text.substr(0, most)) + (text.size() > most ? "...\"" : "\"");
}

// The failed Result for line `line` of `source`: "<source>: line <n>: <what>".
inline cuda::std::unexpected<Error> csv_line_failure(const std::string& source, std::uint64_t line,
                                                     const std::string& what) {
  return fail(Errc::invalid_argument, source + ": line " + std::to_string(line) + ": " + what);
}

// Reads the fields of one line, keeping the first problem it meets: the parsers return 0 for a
// field that does not parse, and ok() tells whether all did.
class CsvFieldReader {
public:
  // `field` (the column `name`) as a decimal whole number.
  std::uint64_t decimal(std::string_view name, std::string_view field) {
    return digits(name, field, field, 10, "is not a decimal number");
  }
  // `field` as 0x-prefixed hexadecimal.
  std::uint64_t hexadecimal(std::string_view name, std::string_view field) {
    if (field.size() < 3 || field[0] != '0' || (field[1] != 'x' && field[1] != 'X')) {
      refuse(name, field, "is not 0x-prefixed hexadecimal");
      return 0;
    }
    return digits(name, field, field.substr(2), 16, "is not 0x-prefixed hexadecimal");
  }
  // `field` as hexadecimal digits with or without a 0x prefix.
  std::uint64_t hex_digits(std::string_view name, std::string_view field, std::string_view what) {
    std::string_view body = field;
    if (body.size() > 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X')) {
      body.remove_prefix(2);
    }
    return digits(name, field, body, 16, what);
  }
  // Records a problem (the first one is kept).
  void refuse(std::string what) {
    if (problem_.empty()) {
      problem_ = std::move(what);
    }
  }
  // Records that `field`, of column `name`, `what` ("is not a decimal number").
  void refuse(std::string_view name, std::string_view field, std::string_view what) {
    if (field.empty()) {
      refuse(std::string(name) + " is empty");
    } else {
      refuse(std::string(name) + " " + csv_quoted(field) + " " + std::string(what));
    }
  }
  // Whether every field so far parsed.
  bool ok() const noexcept { return problem_.empty(); }
  // The first problem.
  const std::string& problem() const noexcept { return problem_; }

private:
  std::uint64_t digits(std::string_view name, std::string_view field, std::string_view body, int base,
                       std::string_view what) {
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value, base);
    if (ec == std::errc::result_out_of_range) {
      refuse(name, field, "does not fit in 64 bits");
      return 0;
    }
    if (body.empty() || ec != std::errc() || end != body.data() + body.size()) {
      refuse(name, field, what);
      return 0;
    }
    return value;
  }

  std::string problem_;
};

// The Errc whose to_string is `text`, or nullopt.
inline std::optional<Errc> csv_errc_named(std::string_view text) noexcept {
  for (int e = 1; e <= static_cast<int>(last_errc); ++e) {
    if (text == to_string(static_cast<Errc>(e))) {
      return static_cast<Errc>(e);
    }
  }
  return std::nullopt;
}

// A failed Result<void> as a failed Result of another type.
inline cuda::std::unexpected<Error> csv_passed_on(Result<void>&& failed) {
  return cuda::std::unexpected(std::move(failed.error()));
}

} // namespace detail

/// The trace in `text`, carve's trace CSV (see the top of this header); `source` (a file name)
/// starts every message. Errors: Errc::invalid_argument for a wrong version line or header, a
/// line without nine fields, a field that does not parse, a seq that does not rise, and all that
/// TraceBuilder refuses (a size of 0 or above 2^62, an address live already, a deallocation of an
/// address not live or with other bytes than its allocation's).
[[nodiscard]] inline Result<AllocationTrace> read_carve_csv(std::string_view text, std::string source) {
  detail::CsvLines lines(text);
  std::string_view line;
  if (!lines.next(line) || line != carve_csv_version_line) {
    return detail::csv_line_failure(
        source, 1,
        "expected " + detail::csv_quoted(carve_csv_version_line) + ", found " +
            (lines.number() == 0 ? std::string("an empty text") : detail::csv_quoted(line)));
  }
  if (!lines.next(line) || line != carve_csv_header) {
    return detail::csv_line_failure(
        source, 2,
        "expected the header " + detail::csv_quoted(carve_csv_header) + ", found " +
            (lines.number() < 2 ? std::string("the end of the text") : detail::csv_quoted(line)));
  }
  TraceBuilder builder(source);
  std::vector<std::string_view> f;
  std::optional<std::uint64_t> last_seq;
  while (lines.next(line)) {
    if (line.empty()) {
      continue;
    }
    detail::csv_split(line, f);
    if (f.size() != 9) {
      return detail::csv_line_failure(source, lines.number(), std::to_string(f.size()) + " fields, expected 9");
    }
    detail::CsvFieldReader read;
    const std::uint64_t seq = read.decimal("seq", f[0]);
    if (read.ok() && last_seq && seq <= *last_seq) {
      read.refuse("seq " + std::to_string(seq) + " after seq " + std::to_string(*last_seq) +
                  ": lines out of order or repeated");
    }
    read.decimal("thread", f[1]);
    const std::uint64_t time_ns = read.decimal("time_ns", f[2]);
    const bool allocate = f[3] == "allocate";
    if (!allocate && f[3] != "deallocate") {
      read.refuse("action", f[3], "is neither allocate nor deallocate");
    }
    // Whether an address belongs in the line depends on the result, read first but reported in
    // its place: a failed allocation has none, every other call has one.
    const std::optional<Errc> error = detail::csv_errc_named(f[8]);
    const bool succeeded = f[8] == "ok";
    std::uint64_t address = 0;
    if (allocate && error && !f[4].empty()) {
      read.refuse("address " + detail::csv_quoted(f[4]) + " in a failed allocation, which has none");
    } else if (!(allocate && f[4].empty() && !succeeded)) {
      address = read.hexadecimal("address", f[4]);
    }
    const std::uint64_t bytes = read.decimal("bytes", f[5]);
    const std::uint64_t alignment = read.decimal("alignment", f[6]);
    if (read.ok() && succeeded && (alignment == 0 || (alignment & (alignment - 1)) != 0)) {
      read.refuse("alignment " + std::to_string(alignment) + " is not a power of two");
    }
    std::uint64_t stream = 0;
    if (!f[7].empty()) {
      const bool hex = f[7].size() > 1 && f[7][0] == '0' && (f[7][1] == 'x' || f[7][1] == 'X');
      stream = hex ? read.hexadecimal("stream", f[7]) : read.decimal("stream", f[7]);
    }
    if (!succeeded && !error) {
      read.refuse("result", f[8], "is neither ok nor a carve::Errc's text");
    }
    if (!read.ok()) {
      return detail::csv_line_failure(source, lines.number(), read.problem());
    }
    last_seq = seq;
    if (!succeeded) {
      continue; // it changed nothing
    }
    const auto time_us = static_cast<std::int64_t>(time_ns / 1000);
    if (allocate) {
      if (auto ok = builder.allocate(seq, address, bytes, stream, time_us); !ok) {
        return detail::csv_passed_on(std::move(ok));
      }
    } else if (auto ok = builder.free(seq, address, bytes, time_us); !ok) {
      return detail::csv_passed_on(std::move(ok));
    }
  }
  return std::move(builder).finish();
}

} // namespace carve::trace

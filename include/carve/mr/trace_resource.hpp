/// @file carve/mr/trace_resource.hpp
/// Records every call through a resource as a line of carve's trace CSV, for replaying the run
/// through other allocators (carve/trace/carve_csv.hpp reads it back).
///
/// @code
/// auto log = std::make_shared<carve::TraceLog>("run.csv");      // or TraceLog(std::cout)
/// carve::TraceResource<carve::CachingPool<carve::SimulatedCard>> pool(carve::SimulatedCard(1 << 30), log);
/// void* p = pool.allocate(4096);                                 // "0,0,812,allocate,0x...,4096,256,,ok"
/// pool.deallocate(p, 4096, 256);
/// // later: carve::trace::read_carve_csv(text_of("run.csv"), "run.csv")
/// @endcode
///
/// What is recorded: every try_allocate (successes and failures, with the Errc), deallocate,
/// try_deallocate where the resource has one (failures too), and the stream-ordered spellings
/// `try_allocate(stream, bytes, alignment)`, `deallocate(stream, p, bytes, alignment)` and
/// `try_deallocate(stream, ...)` where the resource has them (a `stream_type` and those members,
/// as carve::StreamOrderedPool has), with the stream written as a number: see trace_stream_id.
/// The throwing spellings (allocate, allocate_sync, allocate(stream, ...)) go through these, so
/// they are recorded once. Capabilities pass through: owns, free_bytes, capacity, trim, stats.
///
/// Order: lines are numbered (the seq column) in the order the calls were made, and written in
/// that order, each whole. An allocation is numbered when the resource has answered, a
/// deallocation before the resource takes the block back, so when one thread frees a block and
/// another is handed the same address, the free comes first in the log, as a replay needs it. A
/// try_deallocate's result is known only after the call, so its number is taken before and its
/// line waits, with the lines numbered after it, until the call returns.
///
/// TraceLog is where the lines go: a file it opens (and closes), or a caller's std::ostream.
/// TraceResources share one through a std::shared_ptr, so copies of a stack, and adaptors at
/// several levels of one, write one numbered log. Thread-safe (one mutex around the numbering and
/// the writing, never held while the resource runs). Host-only.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/core/thread_number.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/make_part.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/trace/carve_csv.hpp>

#include <cuda/std/expected>

#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

namespace carve {

/// A numbered, thread-safe log of calls in carve's trace CSV, written to a file it owns or to a
/// caller's std::ostream. The version line and header are written at once; what is buffered is
/// flushed on destruction. Share it with std::shared_ptr (TraceResource takes one).
class TraceLog {
public:
  /// A call's place in the log: its number, thread and time, taken when it is numbered.
  struct Ticket {
    std::uint64_t seq = 0;     ///< the call's number
    std::uint64_t thread = 0;  ///< carve::thread_number() of the caller
    std::uint64_t time_ns = 0; ///< since the log was opened
  };

  /// Creates (or empties) the file at `path` and writes the log there. Throws carve::Exception
  /// (io_error) naming the path when it cannot be opened or written.
  explicit TraceLog(const std::filesystem::path& path)
      : file_(std::fopen(path.string().c_str(), "w")), writer_(file_.get()) {
    if (!file_) {
      const int why = errno;
      throw Exception(Errc::io_error,
                      "carve::TraceLog: cannot open \"" + path.string() + "\" for writing: " + std::strerror(why));
    }
    if (!writer_.write_header()) {
      throw Exception(Errc::io_error, "carve::TraceLog: cannot write to \"" + path.string() + "\"");
    }
  }
  /// Writes the log to `out`, which must outlive this log.
  explicit TraceLog(std::ostream& out) : writer_(out) { good_ = writer_.write_header(); }

  TraceLog(const TraceLog&) = delete;
  TraceLog& operator=(const TraceLog&) = delete;
  /// Writes any line still waiting, and flushes.
  ~TraceLog() {
    const std::lock_guard lock(mutex_);
    for (const auto& [seq, record] : waiting_) {
      writer_.write(record);
    }
    writer_.flush();
  }

  /// Numbers a call whose line comes later (record(ticket, ...)): lines numbered after it wait
  /// until then.
  Ticket take() noexcept {
    const std::uint64_t thread = thread_number();
    const std::lock_guard lock(mutex_);
    return take_locked(thread);
  }
  /// Writes the line of the call numbered `ticket`; the log's seq, thread and time replace
  /// those of `call`. Each ticket must be recorded exactly once.
  void record(Ticket ticket, trace::CarveCsvRecord call) noexcept {
    call.seq = ticket.seq;
    call.thread = ticket.thread;
    call.time_ns = ticket.time_ns;
    const std::lock_guard lock(mutex_);
    put_locked(call);
  }
  /// Numbers `call` and writes its line.
  void record(trace::CarveCsvRecord call) noexcept {
    const std::uint64_t thread = thread_number();
    const std::lock_guard lock(mutex_);
    const Ticket t = take_locked(thread);
    call.seq = t.seq;
    call.thread = t.thread;
    call.time_ns = t.time_ns;
    put_locked(call);
  }

  /// Hands the lines written so far to the file or stream.
  void flush() noexcept {
    const std::lock_guard lock(mutex_);
    good_ = writer_.flush() && good_;
  }
  /// Calls numbered so far.
  std::uint64_t calls() const noexcept {
    const std::lock_guard lock(mutex_);
    return next_seq_;
  }
  /// False once a write failed, or a line could not wait its turn (no memory) and was written
  /// out of order: the log is then incomplete, and a reader may refuse it.
  bool good() const noexcept {
    const std::lock_guard lock(mutex_);
    return good_;
  }

private:
  struct CloseFile {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };

  Ticket take_locked(std::uint64_t thread) noexcept {
    const auto since = std::chrono::steady_clock::now() - opened_;
    return Ticket{next_seq_++, thread,
                  static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(since).count())};
  }

  // Writes `call` if it is next, then whatever waited for it; otherwise keeps it waiting.
  void put_locked(const trace::CarveCsvRecord& call) noexcept {
    if (in_order_ && call.seq != next_write_) {
      try {
        waiting_.emplace(call.seq, call);
        return;
      } catch (...) { // no memory: give up the order rather than the line
        in_order_ = false;
        good_ = false;
      }
    }
    good_ = writer_.write(call) && good_;
    ++next_write_;
    for (auto it = waiting_.begin(); it != waiting_.end() && (!in_order_ || it->first == next_write_);) {
      good_ = writer_.write(it->second) && good_;
      ++next_write_;
      it = waiting_.erase(it);
    }
  }

  std::unique_ptr<std::FILE, CloseFile> file_; // before writer_, which writes into it
  trace::CarveCsvWriter writer_;
  const std::chrono::steady_clock::time_point opened_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::uint64_t next_seq_ = 0;                             // the next call's number
  std::uint64_t next_write_ = 0;                           // the number of the next line to write
  std::map<std::uint64_t, trace::CarveCsvRecord> waiting_; // numbered after a call still running
  bool in_order_ = true;
  bool good_ = true;
};

/// The number a stream is written as: a SimulatedStream's id. The customisation point of
/// TraceResource: for a stream type of your own, declare `std::uint64_t trace_stream_id(S)` in
/// S's namespace (it is found by argument-dependent lookup). Without one, a pointer (cudaStream_t)
/// is written as its value, a handle with a pointer-returning get() (cuda::stream_ref) as the
/// value of get(), an integer or enumeration as itself, and a type without state (one stream) as 0.
constexpr std::uint64_t trace_stream_id(SimulatedStream s) noexcept { return s.id; }

namespace detail {
struct NoTracedStream {}; // the stream type of a resource without stream-ordered calls

template <class R>
struct traced_stream_of {
  using type = NoTracedStream;
};
template <class R>
requires requires { typename R::stream_type; }
struct traced_stream_of<R> {
  using type = typename R::stream_type;
};

// TraceResource's base: `stream_type` exactly where the resource has one, so that code asking
// for a stream-ordered resource finds none where there is none.
template <class R>
struct TracedStreams {};
template <class R>
requires requires { typename R::stream_type; }
struct TracedStreams<R> {
  using stream_type = typename R::stream_type; // the streams the resource's calls take
};

// A resource with try_allocate(stream, ...) and deallocate(stream, ...).
template <class R>
concept traced_stream_ordered = requires(R& r, typename traced_stream_of<R>::type s, void* p, std::size_t n) {
  requires !std::same_as<typename traced_stream_of<R>::type, NoTracedStream>;
  { r.try_allocate(s, n, n) }
  noexcept->std::same_as<cuda::std::expected<void*, Errc>>;
  { r.deallocate(s, p, n, n) }
  noexcept;
};
// One that also has try_deallocate(stream, ...).
template <class R>
concept traced_stream_checked = traced_stream_ordered<R> &&
    requires(R& r, typename R::stream_type s, void* p, std::size_t n) {
  { r.try_deallocate(s, p, n, n) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
};

// TraceResource's spellings: the stream-ordered ones exactly where the resource has them.
template <class Self, class R>
using traced_spellings =
    std::conditional_t<traced_stream_ordered<R>, StreamOrderedSpellings<Self, typename traced_stream_of<R>::type>,
                       CcclSpellings<Self>>;

template <class S>
std::uint64_t traced_stream_number(const S& s) noexcept {
  if constexpr (requires {
                  { trace_stream_id(s) } -> std::convertible_to<std::uint64_t>;
                }) {
    return static_cast<std::uint64_t>(trace_stream_id(s));
  } else if constexpr (std::is_pointer_v<S>) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s));
  } else if constexpr (std::is_integral_v<S> || std::is_enum_v<S>) {
    return static_cast<std::uint64_t>(s);
  } else if constexpr (requires {
                         { s.get() } -> std::convertible_to<const volatile void*>;
                       }) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s.get()));
  } else if constexpr (std::is_empty_v<S>) {
    return 0; // a stream type without state names one stream
  } else {
    static_assert(std::is_pointer_v<S>, "carve::TraceResource: declare trace_stream_id(S) for this stream type");
    return 0;
  }
}
} // namespace detail

/// Resource `R` with every call recorded in a TraceLog. A MemoryResource; stream-ordered where
/// `R` is.
template <MemoryResource R>
class TraceResource : public detail::traced_spellings<TraceResource<R>, R>, public detail::TracedStreams<R> {
  // The stream R's stream-ordered calls take; a tag where it has none (those calls are then
  // constrained away).
  using stream_arg = typename detail::traced_stream_of<R>::type;

public:
  /// The resource traced.
  using resource_type = R;

  /// `resource` (the resource itself, or what its constructor takes), recorded in `log`. Throws
  /// carve::Exception (invalid_argument) for a null log.
  template <class Resource>
  requires std::constructible_from<R, Resource> TraceResource(Resource&& resource, std::shared_ptr<TraceLog> log)
      : r_(std::forward<Resource>(resource)), log_(checked(std::move(log))) {}
  /// The resource built in place from `args`, its constructor's arguments
  /// (`std::piecewise_construct, std::forward_as_tuple(...)`; for resources that cannot move),
  /// recorded in `log`.
  template <class Tag, class Args>
  requires detail::piecewise_tag<Tag> && detail::part_arguments<R, Args> TraceResource(Tag, Args&& args,
                                                                                       std::shared_ptr<TraceLog> log)
      : r_(detail::make_part<R>(std::forward<Args>(args))), log_(checked(std::move(log))) {}

  /// The resource's try_allocate, recorded with its result.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const cuda::std::expected<void*, Errc> p = r_.try_allocate(bytes, alignment);
    log_->record(allocation(p, bytes, alignment, std::nullopt));
    return p;
  }
  /// Recorded, then the resource's deallocate.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    log_->record(deallocation(p, bytes, alignment, std::nullopt, {}));
    r_.deallocate(p, bytes, alignment);
  }
  /// The resource's try_deallocate, recorded with its result (where it has one).
  [[nodiscard]] cuda::std::expected<void, Errc>
  try_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept requires ChecksDeallocation<R> {
    const TraceLog::Ticket ticket = log_->take();
    const cuda::std::expected<void, Errc> r = r_.try_deallocate(p, bytes, alignment);
    log_->record(ticket, deallocation(p, bytes, alignment, std::nullopt, r));
    return r;
  }

  /// The resource's stream-ordered try_allocate, recorded with the stream.
  [[nodiscard]] cuda::std::expected<void*, Errc>
  try_allocate(stream_arg stream, std::size_t bytes,
               std::size_t alignment) noexcept requires detail::traced_stream_ordered<R> {
    const cuda::std::expected<void*, Errc> p = r_.try_allocate(stream, bytes, alignment);
    log_->record(allocation(p, bytes, alignment, detail::traced_stream_number(stream)));
    return p;
  }
  /// Recorded with the stream, then the resource's stream-ordered deallocate.
  void deallocate(stream_arg stream, void* p, std::size_t bytes,
                  std::size_t alignment) noexcept requires detail::traced_stream_ordered<R> {
    log_->record(deallocation(p, bytes, alignment, detail::traced_stream_number(stream), {}));
    r_.deallocate(stream, p, bytes, alignment);
  }
  /// The resource's stream-ordered try_deallocate, recorded with the stream and its result.
  [[nodiscard]] cuda::std::expected<void, Errc>
  try_deallocate(stream_arg stream, void* p, std::size_t bytes,
                 std::size_t alignment) noexcept requires detail::traced_stream_checked<R> {
    const TraceLog::Ticket ticket = log_->take();
    const cuda::std::expected<void, Errc> r = r_.try_deallocate(stream, p, bytes, alignment);
    log_->record(ticket, deallocation(p, bytes, alignment, detail::traced_stream_number(stream), r));
    return r;
  }
  /// The resource's owns, where it has one.
  bool owns(const void* p) const noexcept requires OwnsMemory<R> { return r_.owns(p); }
  /// The resource's free_bytes, where it has one.
  std::size_t free_bytes() const requires ReportsFreeBytes<R> { return r_.free_bytes(); }
  /// The resource's capacity, where it has one.
  std::size_t capacity() const requires ReportsCapacity<R> { return r_.capacity(); }
  /// The resource's trim, where it has one (not recorded: it is not a request).
  std::size_t trim() requires Trimmable<R> { return r_.trim(); }
  /// The resource's stats, where it has them.
  decltype(auto) stats() const requires ReportsStats<R> { return r_.stats(); }

  /// The resource traced.
  R& upstream() noexcept { return r_; }
  /// The resource traced.
  const R& upstream() const noexcept { return r_; }
  /// The log the calls go to.
  const std::shared_ptr<TraceLog>& log() const noexcept { return log_; }

  /// Equal when the resources are and both write to the same log.
  friend bool operator==(const TraceResource& a, const TraceResource& b) noexcept requires std::equality_comparable<R> {
    return a.r_ == b.r_ && a.log_ == b.log_;
  }

  /// Declares every CCCL memory property the resource declares.
  template <class Property>
  requires detail::declares_property<R, Property>
  friend constexpr void get_property(const TraceResource&, Property) noexcept {}

private:
  static std::shared_ptr<TraceLog> checked(std::shared_ptr<TraceLog> log) {
    if (!log) {
      throw Exception(Errc::invalid_argument, "carve::TraceResource: no log to write to");
    }
    return log;
  }
  static std::uint64_t address(const void* p) noexcept {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  }
  static trace::CarveCsvRecord allocation(const cuda::std::expected<void*, Errc>& p, std::size_t bytes,
                                          std::size_t alignment, std::optional<std::uint64_t> stream) noexcept {
    trace::CarveCsvRecord r;
    r.action = trace::CsvAction::allocate;
    r.address = p ? address(*p) : 0;
    r.bytes = bytes;
    r.alignment = alignment;
    r.stream = stream;
    if (!p) {
      r.error = p.error();
    }
    return r;
  }
  static trace::CarveCsvRecord deallocation(const void* p, std::size_t bytes, std::size_t alignment,
                                            std::optional<std::uint64_t> stream,
                                            const cuda::std::expected<void, Errc>& result) noexcept {
    trace::CarveCsvRecord r;
    r.action = trace::CsvAction::deallocate;
    r.address = address(p);
    r.bytes = bytes;
    r.alignment = alignment;
    r.stream = stream;
    if (!result) {
      r.error = result.error();
    }
    return r;
  }

  R r_;
  std::shared_ptr<TraceLog> log_;
};

static_assert(MemoryResource<TraceResource<detail::ResourceArchetype>> &&
              !OwnsMemory<TraceResource<detail::ResourceArchetype>>);
static_assert(OwnsMemory<TraceResource<detail::OwningArchetype>>);
static_assert(SynchronousResource<TraceResource<detail::ResourceArchetype>>);

} // namespace carve

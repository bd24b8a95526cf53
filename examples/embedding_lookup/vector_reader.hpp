// Reads embedding rows from a shard file and adds them up (sparse-length-sum), with pread or,
// where liburing is available (EMBEDDING_HAVE_LIBURING), io_uring with many reads in flight.
//
// Files opened with O_DIRECT (cold runs) are read in aligned 4 KiB blocks, as O_DIRECT demands;
// a read that ends early (a truncated file) is an error for the lookup, never a crash.
#pragma once

#include "dataset.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#if defined(EMBEDDING_HAVE_LIBURING)
#include <liburing.h>
#endif

namespace embedding {

enum class IoMode { pread, io_uring };

inline const char* to_string(IoMode m) { return m == IoMode::pread ? "pread" : "io_uring"; }

inline bool io_uring_available() {
#if defined(EMBEDDING_HAVE_LIBURING)
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) {
    return false; // e.g. forbidden by a seccomp profile
  }
  io_uring_queue_exit(&ring);
  return true;
#else
  return false;
#endif
}

class VectorReader {
public:
  static constexpr std::uint64_t block = 4096;
  static constexpr unsigned depth = 32; // reads in flight with io_uring

  explicit VectorReader(IoMode mode) : mode_(mode), buffers_(nullptr, &std::free) {
    void* p = nullptr;
    if (::posix_memalign(&p, block, depth * slot_bytes) != 0) {
      throw std::bad_alloc();
    }
    buffers_.reset(static_cast<char*>(p));
#if defined(EMBEDDING_HAVE_LIBURING)
    if (mode_ == IoMode::io_uring && io_uring_queue_init(depth, &ring_, 0) != 0) {
      mode_ = IoMode::pread;
    }
#else
    mode_ = IoMode::pread;
#endif
  }
  VectorReader(const VectorReader&) = delete;
  VectorReader& operator=(const VectorReader&) = delete;
  ~VectorReader() {
#if defined(EMBEDDING_HAVE_LIBURING)
    if (mode_ == IoMode::io_uring) {
      io_uring_queue_exit(&ring_);
    }
#endif
  }

  IoMode mode() const { return mode_; }

  // Adds rows (table row numbers inside `shard`) into `sum` (spec.dim floats). Returns an error
  // message when a read fails or comes back short.
  std::optional<std::string> add_rows(const TableSpec& spec, const Shard& shard, std::span<const std::uint64_t> rows,
                                      std::span<float> sum) {
    if (spec.row_bytes() + block > slot_bytes) {
      return "rows of " + std::to_string(spec.row_bytes()) + " bytes are too large for the reader";
    }
#if defined(EMBEDDING_HAVE_LIBURING)
    if (mode_ == IoMode::io_uring) {
      return add_rows_uring(spec, shard, rows, sum);
    }
#endif
    for (const std::uint64_t row : rows) {
      const Read r = plan(spec, shard, row);
      ssize_t got = ::pread(shard.file->fd(), slot(0), r.length, static_cast<off_t>(r.offset));
      if (got < 0) {
        got = -errno; // as io_uring reports errors
      }
      if (auto error = check(spec, shard, row, r, got)) {
        return error;
      }
      accumulate(sum, slot(0) + r.skip);
    }
    return std::nullopt;
  }

private:
  static constexpr std::size_t slot_bytes = 2 * block + 4096; // one row plus alignment slack

  struct Read {
    std::uint64_t offset; // where the read starts in the file
    std::size_t length;   // bytes asked for
    std::size_t skip;     // where the row starts in the buffer
    std::size_t need;     // bytes that must arrive for the row to be complete
  };

  static Read plan(const TableSpec& spec, const Shard& shard, std::uint64_t row) {
    const std::uint64_t at = (row - shard.first_row) * spec.row_bytes();
    if (!shard.file->direct()) {
      return {at, static_cast<std::size_t>(spec.row_bytes()), 0, static_cast<std::size_t>(spec.row_bytes())};
    }
    const std::uint64_t start = at / block * block;
    const std::uint64_t end = (at + spec.row_bytes() + block - 1) / block * block;
    return {start, static_cast<std::size_t>(end - start), static_cast<std::size_t>(at - start),
            static_cast<std::size_t>(at - start + spec.row_bytes())};
  }

  static std::optional<std::string> check(const TableSpec& spec, const Shard& shard, std::uint64_t row, const Read& r,
                                          ssize_t got) {
    if (got < 0) {
      return "table " + std::to_string(spec.id) + " row " + std::to_string(row) + ": " +
             std::strerror(static_cast<int>(-got));
    }
    if (static_cast<std::size_t>(got) < r.need) {
      return "table " + std::to_string(spec.id) + " row " + std::to_string(row) + ": " +
             shard.file->path().filename().string() + " ends before the row (truncated file)";
    }
    return std::nullopt;
  }

  static void accumulate(std::span<float> sum, const char* row) {
    const auto* v = reinterpret_cast<const float*>(row);
    for (std::size_t c = 0; c < sum.size(); ++c) {
      sum[c] += v[c];
    }
  }

  char* slot(unsigned i) { return buffers_.get() + std::size_t{i} * slot_bytes; }

#if defined(EMBEDDING_HAVE_LIBURING)
  std::optional<std::string> add_rows_uring(const TableSpec& spec, const Shard& shard,
                                            std::span<const std::uint64_t> rows, std::span<float> sum) {
    std::optional<std::string> error;
    std::size_t next = 0;
    unsigned in_flight = 0;
    std::vector<unsigned> free_slots;
    for (unsigned i = 0; i < depth; ++i) {
      free_slots.push_back(i);
    }
    std::vector<std::uint64_t> slot_row(depth);
    while (next < rows.size() || in_flight > 0) {
      while (next < rows.size() && !free_slots.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) {
          break;
        }
        const unsigned s = free_slots.back();
        free_slots.pop_back();
        const Read r = plan(spec, shard, rows[next]);
        io_uring_prep_read(sqe, shard.file->fd(), slot(s), static_cast<unsigned>(r.length), r.offset);
        io_uring_sqe_set_data64(sqe, s);
        slot_row[s] = rows[next];
        ++next;
        ++in_flight;
      }
      if (const int rc = io_uring_submit_and_wait(&ring_, 1); rc < 0) {
        return std::string("io_uring_submit: ") + std::strerror(-rc);
      }
      io_uring_cqe* cqe = nullptr;
      while (in_flight > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0) {
        const auto s = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
        const Read r = plan(spec, shard, slot_row[s]);
        if (auto e = check(spec, shard, slot_row[s], r, cqe->res); e && !error) {
          error = std::move(e);
        } else if (!e) {
          accumulate(sum, slot(s) + r.skip);
        }
        io_uring_cqe_seen(&ring_, cqe);
        free_slots.push_back(s);
        --in_flight;
      }
    }
    return error;
  }

  io_uring ring_{};
#endif

  IoMode mode_;
  std::unique_ptr<char, decltype(&std::free)> buffers_;
};

} // namespace embedding

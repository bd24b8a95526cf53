// Embedding tables as files on "storage devices" (directories), the device map that says where
// each table's rows live, and migration of a shard from one device to another.
//
// A table is rows x dim float32 values, row-major, no header. Its rows are stored either
// sharded (row ranges on different devices, one file per shard) or replicated (a whole copy on
// each of several devices). Values follow a formula, so a lookup's sum can be checked without
// reading the files: multiples of 1/64 in [-16, 16), which float32 adds exactly in any order
// for up to 2^13 vectors.
#pragma once

#include <carve/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace embedding {

inline float table_value(std::uint32_t table, std::uint64_t row, std::uint32_t col) {
  std::uint64_t h = (std::uint64_t{table} + 1) * 0x9e3779b97f4a7c15ULL ^ (row + 1) * 0xbf58476d1ce4e5b9ULL ^
                    (std::uint64_t{col} + 1) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return static_cast<float>(static_cast<std::int64_t>(h % 2048) - 1024) / 64.0f;
}

struct TableSpec {
  std::uint32_t id;
  std::uint64_t rows;
  std::uint32_t dim;
  std::uint64_t row_bytes() const { return std::uint64_t{dim} * sizeof(float); }
  std::uint64_t bytes() const { return rows * row_bytes(); }
};

// An open shard file. Shared: a part being read keeps the file open even if the shard migrates
// and the old file is unlinked meanwhile.
class ShardFile {
public:
  ShardFile(std::filesystem::path path, bool direct) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd_ < 0 && direct && errno == EINVAL) { // the file system has no O_DIRECT
      fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      direct_ = false;
    } else {
      direct_ = direct;
    }
    if (fd_ < 0) {
      throw carve::Exception(carve::Errc::io_error, "open " + path_.string() + ": " + std::strerror(errno));
    }
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ~ShardFile() { ::close(fd_); }

  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
};

struct Shard {
  std::uint32_t device;
  std::uint64_t first_row;
  std::uint64_t rows;
  std::shared_ptr<ShardFile> file;
  bool holds(std::uint64_t row) const { return row >= first_row && row < first_row + rows; }
};

// How a table is laid out: one or more copies, each a list of shards covering all rows.
struct TablePlacement {
  TableSpec spec;
  std::vector<std::vector<Shard>> copies;
};

struct DatasetConfig {
  std::filesystem::path root; // devices are root/dev0, root/dev1, ...
  std::uint32_t devices = 2;  // at least 2
  std::uint32_t tables = 8;
  std::uint64_t table_bytes = 8 << 20; // per table (the README's numbers used 1 GiB)
  bool direct_io = false;              // open shards with O_DIRECT (cold reads)
};

inline std::filesystem::path device_dir(const std::filesystem::path& root, std::uint32_t device) {
  return root / ("dev" + std::to_string(device));
}

// Table t has dim 64, 96 or 128; every fourth table is replicated on two devices, the others
// are split into one shard per device.
inline std::uint32_t table_dim(std::uint32_t table) { return 64 + 32 * (table % 3); }
inline bool table_replicated(std::uint32_t table) { return table % 4 == 3; }

inline void write_rows(const std::filesystem::path& path, const TableSpec& spec, std::uint64_t first,
                       std::uint64_t count) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw carve::Exception(carve::Errc::io_error, "create " + path.string() + ": " + std::strerror(errno));
  }
  std::vector<float> buffer;
  const std::uint64_t rows_per_chunk = std::max<std::uint64_t>(1, (1 << 20) / spec.row_bytes());
  for (std::uint64_t r = 0; r < count; r += rows_per_chunk) {
    const std::uint64_t n = std::min(rows_per_chunk, count - r);
    buffer.resize(n * spec.dim);
    for (std::uint64_t i = 0; i < n; ++i) {
      for (std::uint32_t c = 0; c < spec.dim; ++c) {
        buffer[i * spec.dim + c] = table_value(spec.id, first + r + i, c);
      }
    }
    const auto bytes = static_cast<std::size_t>(n * spec.row_bytes());
    if (::write(fd, buffer.data(), bytes) != static_cast<ssize_t>(bytes)) {
      const int e = errno;
      ::close(fd);
      throw carve::Exception(carve::Errc::io_error, "write " + path.string() + ": " + std::strerror(e));
    }
  }
  ::fsync(fd);
  ::close(fd);
}

// The map from table id to where its rows are. Readers (the manager) take a shared lock for a
// lookup; a migration takes it exclusively only to swap in the new shard.
class DeviceMap {
public:
  void add(TablePlacement placement) {
    const std::unique_lock lock(mutex_);
    tables_[placement.spec.id] = std::move(placement);
  }

  std::optional<TablePlacement> find(std::uint32_t table) const {
    const std::shared_lock lock(mutex_);
    const auto it = tables_.find(table);
    if (it == tables_.end()) {
      return std::nullopt;
    }
    return it->second;
  }

  std::vector<TableSpec> specs() const {
    const std::shared_lock lock(mutex_);
    std::vector<TableSpec> out;
    for (const auto& [id, p] : tables_) {
      out.push_back(p.spec);
    }
    std::sort(out.begin(), out.end(), [](const TableSpec& a, const TableSpec& b) { return a.id < b.id; });
    return out;
  }

  // Moves shard `shard` of copy `copy` of `table` to `device`: copies the file, syncs it, points
  // the map at it and unlinks the old file (reads in flight keep the old one open). Returns the
  // device it came from.
  std::uint32_t migrate(std::uint32_t table, std::size_t copy, std::size_t shard, std::uint32_t device,
                        const std::filesystem::path& root, bool direct_io) {
    Shard old;
    {
      const std::shared_lock lock(mutex_);
      const TablePlacement& p = tables_.at(table);
      old = p.copies.at(copy).at(shard);
    }
    if (old.device == device) {
      return device;
    }
    const std::filesystem::path to =
        device_dir(root, device) / old.file->path().filename().replace_extension(".migrating");
    std::filesystem::copy_file(old.file->path(), to, std::filesystem::copy_options::overwrite_existing);
    const int fd = ::open(to.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    const std::filesystem::path final_path = device_dir(root, device) / old.file->path().filename();
    std::filesystem::rename(to, final_path);
    Shard moved = old;
    moved.device = device;
    moved.file = std::make_shared<ShardFile>(final_path, direct_io);
    {
      const std::unique_lock lock(mutex_);
      tables_.at(table).copies.at(copy).at(shard) = moved;
    }
    std::filesystem::remove(old.file->path());
    return old.device;
  }

private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::uint32_t, TablePlacement> tables_;
};

inline std::string shard_name(std::uint32_t table, std::size_t copy, std::size_t shard) {
  return "table" + std::to_string(table) + ".copy" + std::to_string(copy) + ".shard" + std::to_string(shard) + ".f32";
}

// The map of the dataset cfg describes; with `write`, the table files are written first.
inline std::unique_ptr<DeviceMap> build_dataset(const DatasetConfig& cfg, bool write) {
  if (cfg.devices < 2) {
    throw carve::Exception(carve::Errc::invalid_argument, "the dataset needs at least 2 storage devices");
  }
  for (std::uint32_t d = 0; d < cfg.devices; ++d) {
    std::filesystem::create_directories(device_dir(cfg.root, d));
  }
  auto map = std::make_unique<DeviceMap>();
  for (std::uint32_t t = 0; t < cfg.tables; ++t) {
    TableSpec spec{t, 0, table_dim(t)};
    spec.rows = std::max<std::uint64_t>(1, cfg.table_bytes / spec.row_bytes());
    TablePlacement placement{spec, {}};
    if (table_replicated(t)) {
      for (std::uint32_t c = 0; c < 2; ++c) {
        const std::uint32_t device = (t + c) % cfg.devices;
        const auto path = device_dir(cfg.root, device) / shard_name(t, c, 0);
        if (write) {
          write_rows(path, spec, 0, spec.rows);
        }
        placement.copies.push_back({Shard{device, 0, spec.rows, std::make_shared<ShardFile>(path, cfg.direct_io)}});
      }
    } else {
      std::vector<Shard> shards;
      const std::uint64_t per = (spec.rows + cfg.devices - 1) / cfg.devices;
      for (std::uint32_t s = 0; s < cfg.devices && s * per < spec.rows; ++s) {
        const std::uint32_t device = (t + s) % cfg.devices;
        const std::uint64_t first = s * per;
        const std::uint64_t rows = std::min(per, spec.rows - first);
        const auto path = device_dir(cfg.root, device) / shard_name(t, 0, s);
        if (write) {
          write_rows(path, spec, first, rows);
        }
        shards.push_back(Shard{device, first, rows, std::make_shared<ShardFile>(path, cfg.direct_io)});
      }
      placement.copies.push_back(std::move(shards));
    }
    map->add(std::move(placement));
  }
  return map;
}

// Writes every table's files under cfg.root and returns the map.
inline std::unique_ptr<DeviceMap> generate_dataset(const DatasetConfig& cfg) { return build_dataset(cfg, true); }

// The map of a dataset generate_dataset wrote earlier with the same layout (e.g. to read it
// again with or without O_DIRECT).
inline std::unique_ptr<DeviceMap> open_dataset(const DatasetConfig& cfg) { return build_dataset(cfg, false); }

// Page cache control for the cold and warm runs.
// Every shard of every table, as the map holds them now.
inline std::vector<Shard> all_shards(const DeviceMap& map) {
  std::vector<Shard> out;
  for (const TableSpec& spec : map.specs()) {
    const std::optional<TablePlacement> placement = map.find(spec.id);
    for (const auto& copy : placement->copies) {
      out.insert(out.end(), copy.begin(), copy.end());
    }
  }
  return out;
}

inline void drop_page_cache(const DeviceMap& map) {
  for (const Shard& s : all_shards(map)) {
    ::posix_fadvise(s.file->fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

inline void warm_page_cache(const DeviceMap& map) {
  std::vector<char> buffer(1 << 20);
  for (const Shard& s : all_shards(map)) {
    const int fd = ::open(s.file->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      continue;
    }
    while (::read(fd, buffer.data(), buffer.size()) > 0) {
    }
    ::close(fd);
  }
}

// A directory that is removed with everything in it when this goes out of scope.
class TempDir {
public:
  explicit TempDir(const std::filesystem::path& parent, const std::string& prefix = "carve-embedding-") {
    std::string pattern = (parent / (prefix + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw carve::Exception(carve::Errc::io_error, "mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

} // namespace embedding

/// @file carve/vmm/on_demand_reservation.hpp
/// One address reservation whose granules get physical memory only where it is asked for, in
/// chunks, and give it back chunk by chunk: the memory under an ExpandablePool.
///
/// @code
/// carve::HostMemoryMapper mapper;                     // or carve::CudaMemoryMapper on a GPU
/// auto r = carve::OnDemandReservation<carve::HostMemoryMapper>::reserve(mapper, 0, 1ull << 30);
/// r->back(r->base() + (6 << 20), 100, [] { return carve::ChunkRule{}; });  // maps the 2 MiB granule holding it
/// r->release_within(r->base(), r->bytes());           // unmaps every chunk: nothing is reserved
/// @endcode
///
/// back(addr, bytes) maps every granule [addr, addr + bytes) touches and opens it to the device
/// and to every peer grant() let in (a peer that refuses a chunk finds it closed). Each run of
/// unmapped granules becomes one chunk (or several of ChunkRule::max_bytes at most): one physical
/// allocation (create), one mapping (map) and its access grants; its handle is released when it is
/// unmapped. A chunk may reach past its run, over the unmapped granules after it, up to
/// ChunkRule::min_bytes: every chunk costs driver calls
/// of tens of microseconds on a GPU, so a reservation that grows by many small requests should
/// grow by fewer, larger chunks; ChunkRule::limit_bytes bounds what one call adds, so an owner can
/// hold a cap. release_within unmaps the chunks wholly inside a range its owner knows unused: a
/// chunk is the unit of release, since a physical allocation is freed only once all of it is
/// unmapped. lend() maps whole granules of a chunk a second time, over unmapped granules: a chunk
/// with no memory of its own, whose owner keeps the granules it maps again unused until it is
/// unmapped and next_returned() hands them back.
///
/// Errors (nothing changes: chunks made by a failed back are unmapped again; one the mapper
/// refuses to unmap stays mapped, counted in mapped_bytes() but out of every block's way, until a
/// later back() or release_within unmaps it): the mapper's Error (no_space when the device is out
/// of memory), no_space when the limit would be passed, out_of_range for a range outside the
/// reservation; back() throws std::bad_alloc, with nothing changed, only when its own bookkeeping
/// cannot grow. Not thread-safe: its owner holds the lock.
/// Movable, not copyable; destruction unmaps every chunk and frees the reservation.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/error.hpp>
#include <carve/vmm/detail/granule_table.hpp>
#include <carve/vmm/detail/stuck_mappings.hpp>
#include <carve/vmm/mapping_counts.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// An address reservation mapped granule by granule on demand (see the file's description).
template <PhysicalMemoryMapper Mapper>
class OnDemandReservation {
public:
  /// `bytes` (rounded up to the device's granularity) of addresses on `device`, nothing mapped.
  /// Errors: the mapper's; invalid_size for 0 bytes or a size that overflows when rounded; no_space
  /// for more granules than 2^32 - 1 (more than a reservation can ever hold).
  [[nodiscard]] static Result<OnDemandReservation> reserve(Mapper mapper, int device, std::size_t bytes) {
    const auto g = mapper.granularity(device);
    if (!g) {
      return cuda::std::unexpected(g.error());
    }
    const auto rounded = round_up_to_granularity(bytes, *g);
    if ((*g & (*g - 1)) != 0) {
      return fail(Errc::invalid_argument, "the device's granularity " + std::to_string(*g) + " is not a power of two");
    }
    if (!rounded || *rounded / *g >= std::numeric_limits<std::uint32_t>::max()) {
      return fail(!rounded ? Errc::invalid_size : Errc::no_space,
                  "cannot reserve " + std::to_string(bytes) + " bytes in granules of " + std::to_string(*g));
    }
    auto va = mapper.reserve(*rounded, *g);
    if (!va) {
      return cuda::std::unexpected(va.error());
    }
    return OnDemandReservation(std::move(mapper), device, reinterpret_cast<std::uintptr_t>(*va), *rounded, *g);
  }

  /// Takes the reservation and its chunks over; `other` is left holding nothing.
  OnDemandReservation(OnDemandReservation&& other) noexcept
      : mapper_(std::move(other.mapper_)), device_(other.device_), base_(std::exchange(other.base_, 0)),
        bytes_(std::exchange(other.bytes_, 0)), granule_(other.granule_), shift_(other.shift_),
        table_(std::move(other.table_)), returned_(std::move(other.returned_)), stuck_(std::move(other.stuck_)),
        second_mappings_(other.second_mappings_), mapped_(std::exchange(other.mapped_, 0)), peers_(other.peers_),
        counts_(other.counts_), last_failure_(std::move(other.last_failure_)) {}
  OnDemandReservation& operator=(OnDemandReservation&&) = delete;
  OnDemandReservation(const OnDemandReservation&) = delete;
  OnDemandReservation& operator=(const OnDemandReservation&) = delete;

  /// Unmaps every chunk and frees the reservation.
  ~OnDemandReservation() {
    if (base_ == 0) {
      return;
    }
    (void)release_within(base_, bytes_); // stuck mappings too
    (void)mapper_.free_reservation(reinterpret_cast<void*>(base_), bytes_);
  }

  /// Maps every granule [addr, addr + bytes) touches (see the file's description). `rule()` gives
  /// the ChunkRule, asked only when something must be mapped. Returns the bytes newly mapped (0 when
  /// all were mapped already).
  template <class MakeRule>
  [[nodiscard]] Result<std::size_t> back(std::uintptr_t addr, std::size_t bytes, MakeRule&& make_rule) {
    if (bytes == 0 || addr < base_ || addr - base_ > bytes_ || bytes > bytes_ - (addr - base_)) {
      return fail(Errc::out_of_range, "back: the range is not inside the reservation");
    }
    const std::size_t first = (addr - base_) >> shift_;
    const std::size_t last = (addr - base_ + bytes - 1) >> shift_;
    if (table_.one_chunk(first, last) || table_.covered(first, last)) {
      return std::size_t{0}; // the common case: a block inside memory already mapped
    }
    mapped_ -= stuck_.unmap(mapper_, counts_); // one stuck under these addresses would refuse them
    const ChunkRule rule = make_rule();
    const std::size_t total = bytes_ / granule_;
    const std::size_t min_granules = std::max<std::size_t>(1, rule.min_bytes / granule_);
    const std::size_t piece = std::max<std::size_t>(1, rule.max_bytes / granule_);
    std::size_t limit = rule.limit_bytes / granule_;
    std::vector<std::size_t> made; // room for every chunk first: a chunk once mapped is never lost
    const auto [granules, runs] = table_.unmapped(first, last); // only the last run reaches past `last`
    made.reserve(runs + (granules + std::min({min_granules, limit, total - first})) / piece + 1);
    std::size_t added = 0;
    for (std::size_t g = first; g <= last;) {
      if (table_.mapped(g)) {
        g = table_.end_of(g);
        continue;
      }
      std::size_t end = g;
      while (end <= last && !table_.mapped(end)) {
        ++end;
      }
      const std::size_t run = end - g;
      if (run > limit) {
        undo(made);
        return fail(Errc::no_space, "back: " + std::to_string(run * granule_) + " more bytes would pass the limit");
      }
      const std::size_t want = std::min(std::max(run, min_granules), limit);
      while (end - g < want && end < total && !table_.mapped(end)) {
        ++end;
      }
      for (std::size_t at = g, n = 0; at < end; at += n) {
        n = std::min(piece, end - at);
        if (auto ok = map_chunk(at, n); !ok) {
          undo(made);
          return cuda::std::unexpected(ok.error());
        }
        made.push_back(at);
      }
      added += (end - g) * granule_;
      limit -= end - g;
      g = end;
    }
    return added;
  }

  /// Maps [from, from + bytes) (whole granules of one chunk back() made, which no block uses) a
  /// second time at [to, to + bytes) (whole unmapped granules): no memory added. The caller keeps
  /// the first range unused until release_within unmaps the second and next_returned() hands it
  /// back. Errors (nothing changes): invalid_argument for ranges not so; the mapper's.
  [[nodiscard]] Result<void> lend(std::uintptr_t to, std::uintptr_t from, std::size_t bytes) {
    const std::size_t t = (to - base_) >> shift_;
    const std::size_t f = (from - base_) >> shift_;
    const std::size_t n = bytes >> shift_;
    auto home = table_.chunks.upper_bound(f);
    const bool aligned = from >= base_ && ((to | from | bytes) & (granule_ - 1)) == 0 && n != 0;
    if (!aligned || unbacked_bytes(to, bytes) != bytes || home == table_.chunks.begin() || // inside, all unmapped
        !std::prev(home)->second.handle || f + n > std::prev(home)->first + std::prev(home)->second.granules) {
      return fail(Errc::invalid_argument, "lend: not whole unmapped granules over whole granules of one chunk");
    }
    --home;
    if (auto room = add_chunk(t, Chunk{n, std::nullopt, f}); !room) {
      return room;
    }
    if (auto ok = map_open(t, n, *home->second.handle, (f - home->first) * granule_); !ok) {
      table_.chunks.erase(t);
      stick(t, n, std::nullopt);
      return refused(ok.error());
    }
    table_.mark(t, n);
    ++second_mappings_;
    return {};
  }

  /// Where the memory of the second mapping that starts at `addr` lives (the `from` lend() had);
  /// only for an `addr` where lent_at() holds.
  std::uintptr_t lent_from(std::uintptr_t addr) const noexcept {
    return base_ + table_.chunks.find((addr - base_) >> shift_)->second.home * granule_;
  }
  /// Whether the chunk that starts at `addr` is a second mapping lend() made.
  bool lent_at(std::uintptr_t addr) const noexcept {
    const auto it = addr < base_ ? table_.chunks.end() : table_.chunks.find((addr - base_) >> shift_);
    return it != table_.chunks.end() && !it->second.handle;
  }

  /// The ranges lend() mapped again whose second mapping release_within has unmapped since the
  /// last call: the caller's to use again.
  /// One of them, or nullopt (each once; lend() keeps room for them, so release_within never fails to record one).
  std::optional<std::pair<std::uintptr_t, std::size_t>> next_returned() noexcept {
    if (returned_.empty()) {
      return std::nullopt;
    }
    const auto r = returned_.back();
    returned_.pop_back();
    return r;
  }

  /// Unmaps every chunk that lies wholly inside [addr, addr + bytes), which the caller knows no
  /// one uses; returns the bytes unmapped. A chunk the mapper refuses to unmap stays (counted in
  /// MappingCounts::failures).
  std::size_t release_within(std::uintptr_t addr, std::size_t bytes) noexcept {
    if (bytes == 0 || addr < base_ || addr - base_ >= bytes_) {
      return 0;
    }
    const std::size_t first = (addr - base_ + granule_ - 1) / granule_;
    const std::size_t end = std::min(bytes_, addr - base_ + std::min(bytes, bytes_ - (addr - base_))) / granule_;
    std::size_t released = stuck_.unmap(mapper_, counts_);
    mapped_ -= released;
    for (auto it = table_.chunks.lower_bound(first);
         it != table_.chunks.end() && it->first + it->second.granules <= end;) {
      const std::size_t size = it->second.granules * granule_;
      ++counts_.unmaps;
      if (!mapper_.unmap(at(it->first), size)) {
        ++counts_.failures;
        ++it;
        continue;
      }
      table_.mark(it->first, it->second.granules, false);
      if (it->second.handle) {
        ++counts_.releases;
        (void)mapper_.release(*it->second.handle); // its last mapping is gone: the memory goes with it
        mapped_ -= size;
        released += size;
      } else {
        returned_.emplace_back(base_ + it->second.home * granule_, size); // room kept by lend()
        --second_mappings_;
      }
      it = table_.chunks.erase(it);
    }
    return released;
  }

  /// Devices grant() takes: 0 to max_peers - 1 (the bits of a 64-bit set).
  static constexpr int max_peers = 64;

  /// Lets `peer` read and write every chunk: those mapped now (one set_access each) and every chunk
  /// mapped later. Granting the reservation's own device, or a peer already granted, does nothing.
  /// Errors: invalid_argument for a device outside [0, 64); the mapper's, after the chunks granted
  /// so far are closed to `peer` again (where the mapper lets them: see revoke).
  [[nodiscard]] Result<void> grant(int peer) {
    if (peer < 0 || peer >= max_peers) {
      return fail(Errc::invalid_argument, "grant: device " + std::to_string(peer) + " is outside [0, 64)");
    }
    if (peer == device_ || granted(peer)) {
      return {};
    }
    for (auto it = table_.chunks.begin(); it != table_.chunks.end(); ++it) {
      ++counts_.accesses;
      if (auto ok = mapper_.set_access(at(it->first), it->second.granules * granule_, peer, Access::read_write); !ok) {
        close_to(peer, table_.chunks.begin(), it);
        return cuda::std::unexpected(ok.error()); // the caller's to report: not a refusal of memory
      }
    }
    peers_ |= std::uint64_t{1} << peer;
    return {};
  }

  /// Closes every chunk to `peer` again and stops granting it: what grant() opened. A chunk the
  /// mapper refuses to close stays open (counted in MappingCounts::failures).
  void revoke(int peer) noexcept {
    if (granted(peer)) {
      close_to(peer, table_.chunks.begin(), table_.chunks.end());
      peers_ &= ~(std::uint64_t{1} << peer);
    }
  }

  /// Whether grant() has let `peer` in.
  bool granted(int peer) const noexcept { return peer >= 0 && peer < max_peers && (peers_ >> peer & 1u) != 0; }

  /// Calls `visit(start, bytes)` for every chunk, by address.
  template <class Visit>
  void for_each_chunk(Visit&& visit) const {
    for (const auto& [g, chunk] : table_.chunks) {
      visit(base_ + g * granule_, chunk.granules * granule_);
    }
  }

  /// Calls `visit(start, bytes)` for every chunk that overlaps [addr, addr + bytes), by address:
  /// O(log n) in the chunks plus one step per chunk visited, however long the range.
  template <class Visit>
  void for_each_chunk_in(std::uintptr_t addr, std::size_t bytes, Visit&& visit) const {
    if (bytes == 0 || addr < base_ || addr - base_ >= bytes_) {
      return;
    }
    const std::size_t first = (addr - base_) >> shift_;
    const std::size_t last = (addr - base_ + std::min(bytes, bytes_ - (addr - base_)) - 1) >> shift_;
    auto it = table_.chunks.upper_bound(first);
    if (it != table_.chunks.begin() && std::prev(it)->first + std::prev(it)->second.granules > first) {
      --it; // the chunk that holds the first granule
    }
    for (; it != table_.chunks.end() && it->first <= last; ++it) {
      visit(base_ + it->first * granule_, it->second.granules * granule_);
    }
  }

  /// Whether every granule [addr, addr + bytes) touches is mapped.
  bool backed(std::uintptr_t addr, std::size_t bytes) const noexcept {
    if (bytes == 0 || addr < base_ || addr - base_ > bytes_ || bytes > bytes_ - (addr - base_)) {
      return false;
    }
    return table_.covered((addr - base_) >> shift_, (addr - base_ + bytes - 1) >> shift_);
  }

  /// The bytes of the granules [addr, addr + bytes) touches that are not mapped: the least that
  /// back() over the same range maps (0 for a range outside the reservation).
  std::size_t unbacked_bytes(std::uintptr_t addr, std::size_t bytes) const noexcept {
    if (bytes == 0 || addr < base_ || addr - base_ > bytes_ || bytes > bytes_ - (addr - base_)) {
      return 0;
    }
    const std::size_t first = (addr - base_) >> shift_;
    const std::size_t last = (addr - base_ + bytes - 1) >> shift_;
    if (table_.one_chunk(first, last)) {
      return 0; // the common case: a block inside one chunk
    }
    return table_.unmapped(first, last).first * granule_;
  }

  /// The first address of the reservation.
  std::uintptr_t base() const noexcept { return base_; }
  /// Its size (a multiple of the granule).
  std::size_t bytes() const noexcept { return bytes_; }
  /// The device's granularity: the unit of mapping.
  std::size_t granule() const noexcept { return granule_; }
  /// Bytes mapped now by back(): the physical memory this reservation holds (lend()'s second
  /// mappings add none).
  std::size_t mapped_bytes() const noexcept { return mapped_; }
  /// Chunks mapped now.
  std::size_t chunk_count() const noexcept { return table_.chunks.size(); }
  /// What it has asked of the mapper so far.
  const MappingCounts& counts() const noexcept { return counts_; }
  /// Why the mapper last refused (empty when it never did).
  const std::string& last_failure() const noexcept { return last_failure_; }

  /// Whether the granule table and the chunks agree. For tests.
  bool consistent() const {
    return table_.total == bytes_ / granule_ && table_.consistent(granule_, mapped_ - stuck_.held_bytes());
  }

private:
  using Table = detail::GranuleTable<typename Mapper::physical_handle>;
  using Chunk = typename Table::Chunk;
  using Chunks = typename Table::Chunks;

  OnDemandReservation(Mapper mapper, int device, std::uintptr_t base, std::size_t bytes, std::size_t granule)
      : mapper_(std::move(mapper)), device_(device), base_(base), bytes_(bytes), granule_(granule) {
    while ((std::size_t{1} << shift_) < granule_) {
      ++shift_;
    }
    table_.total = bytes / granule;
  }

  void* at(std::size_t granule) const noexcept { return reinterpret_cast<void*>(base_ + granule * granule_); }

  // Creates, maps and opens one chunk of `n` granules at granule `g`; it keeps its handle.
  [[nodiscard]] Result<void> map_chunk(std::size_t g, std::size_t n) {
    const std::size_t size = n * granule_;
    if (auto room = add_chunk(g, Chunk{n, std::nullopt, 0}); !room) {
      return room;
    }
    ++counts_.creates;
    auto h = mapper_.create(device_, size);
    if (!h) {
      table_.chunks.erase(g);
      return refused(h.error());
    }
    if (auto ok = map_open(g, n, *h, 0); !ok) {
      table_.chunks.erase(g);
      if (!stick(g, n, *h)) {
        ++counts_.releases;
        (void)mapper_.release(*h);
      }
      return refused(ok.error());
    }
    table_.chunks.find(g)->second.handle = *h;
    table_.mark(g, n);
    mapped_ += size;
    return {};
  }

  // Room in the tables for a chunk at granule `g`, before its driver calls (nothing after throws);
  // for a second mapping, room for its entry in returned_ too, kept until it is handed back.
  [[nodiscard]] Result<void> add_chunk(std::size_t g, Chunk chunk) {
    try {
      if (!chunk.handle) {
        returned_.reserve(returned_.size() + second_mappings_ + 1);
      }
      stuck_.make_room(); // for a mapping the mapper then refuses to undo
      table_.add(g, chunk);
      return {};
    } catch (const std::bad_alloc&) {
      return fail(Errc::no_space, "out of memory for the reservation's tables");
    }
  }

  // Maps `n` granules of `h`, from `offset`, at granule `g` and opens them; nothing stays mapped
  // on failure, even where the mapper throws std::bad_alloc building its message.
  [[nodiscard]] Result<void> map_open(std::size_t g, std::size_t n, const typename Mapper::physical_handle& h,
                                      std::size_t offset) noexcept {
    ++counts_.maps;
    try {
      auto ok = mapper_.map(at(g), n * granule_, h, offset);
      if (ok && !(ok = open(g, n))) {
        ++counts_.unmaps;
        left_mapped_ = !mapper_.unmap(at(g), n * granule_);
      }
      return ok;
    } catch (const std::bad_alloc&) { // the mapper's refusal could not be told
      return cuda::std::unexpected(Error{Errc::no_space, std::string()});
    }
  }

  // Opens the mapping of `n` granules at granule `g` to the device, and to every granted peer
  // that lets it (a peer that refuses finds it closed: MappingCounts::peer_refusals).
  [[nodiscard]] Result<void> open(std::size_t g, std::size_t n) {
    ++counts_.accesses;
    if (auto ok = mapper_.set_access(at(g), n * granule_, device_, Access::read_write); !ok) {
      return ok;
    }
    for (int peer = 0; peer < max_peers; ++peer) {
      if (granted(peer)) {
        ++counts_.accesses;
        if (!mapper_.set_access(at(g), n * granule_, peer, Access::read_write)) {
          ++counts_.peer_refusals;
        }
      }
    }
    return {};
  }

  // Sets `peer`'s right on the chunks [first, last) back to none.
  void close_to(int peer, typename Chunks::const_iterator first, typename Chunks::const_iterator last) noexcept {
    for (; first != last; ++first) {
      ++counts_.accesses;
      if (!mapper_.set_access(at(first->first), first->second.granules * granule_, peer, Access::none)) {
        ++counts_.failures;
      }
    }
  }

  void undo(const std::vector<std::size_t>& made) noexcept {
    for (const std::size_t g : made) {
      (void)release_within(base_ + g * granule_, table_.chunks.find(g)->second.granules * granule_);
    }
  }

  // After a failed map_open whose cleanup the mapper refused: the mapping is kept (detail::
  // StuckMappings), its own memory counted as mapped; says whether it was.
  bool stick(std::size_t g, std::size_t n, std::optional<typename Mapper::physical_handle> memory) noexcept {
    if (!std::exchange(left_mapped_, false)) {
      return false;
    }
    mapped_ += memory ? n * granule_ : 0;
    stuck_.keep(at(g), n * granule_, memory);
    return true;
  }

  cuda::std::unexpected<Error> refused(Error e) {
    ++counts_.failures;
    try {
      last_failure_ = e.message;
    } catch (const std::bad_alloc&) {
      // the reason is lost, the refusal is not
    }
    return cuda::std::unexpected(std::move(e));
  }

  Mapper mapper_;
  int device_ = 0;
  std::uintptr_t base_ = 0;
  std::size_t bytes_ = 0;
  std::size_t granule_ = 0;
  unsigned shift_ = 0;                                           ///< log2(granule_)
  Table table_;                                                  ///< by first granule
  std::vector<std::pair<std::uintptr_t, std::size_t>> returned_; ///< next_returned()'s
  detail::StuckMappings<Mapper> stuck_;                          ///< mappings the mapper refused to undo
  std::size_t second_mappings_ = 0;                              ///< lend()'s, mapped now
  bool left_mapped_ = false;                                     ///< map_open's last cleanup was refused
  std::size_t mapped_ = 0;
  std::uint64_t peers_ = 0; ///< bit d: device d is granted every chunk (grant)
  MappingCounts counts_;
  std::string last_failure_;
};

} // namespace carve

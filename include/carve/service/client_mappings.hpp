/// @file carve/service/client_mappings.hpp
/// An AllocationClient's registry of what the server's memory looks like in this process: the
/// segments it has mapped and the regions in them, by pointer.
///
/// A segment is mapped when its first region arrives and unmapped when its last region here is
/// freed (the server gives each region a segment of its own) or when the server retires it. A
/// lost connection makes every region an orphan: its segment stays mapped, so pointers stay
/// valid, until the region is freed locally; the segment ids of the old session are forgotten,
/// as a new session numbers its segments afresh.
///
/// Not thread-safe: the client's mutex guards it. Host-only, Linux.
#pragma once

#include <carve/mr/detail/block_lookup.hpp>
#include <carve/service/protocol_messages.hpp>
#include <carve/service/segment_mapping.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

namespace carve::service::detail {

/// A region this process holds, and the segment mapping it lies in.
struct LocalRegion {
  RegionInfo info;               ///< as the server keeps it
  std::uint64_t segment_key = 0; ///< its segment in ClientMappings (a local key, not the server's id)
  bool orphan = false;           ///< from a lost connection
};

/// The segments and regions of one AllocationClient (see the file's description).
class ClientMappings {
public:
  ClientMappings() = default;
  ClientMappings(const ClientMappings&) = delete;
  ClientMappings& operator=(const ClientMappings&) = delete;
  /// Unmaps every segment, orphans' included.
  ~ClientMappings() {
    for (const auto& [key, s] : segments_) {
      unmap_segment(s.mapping);
    }
  }

  /// The local key of this session's segment `id`, when it is mapped here.
  std::optional<std::uint64_t> key_of(SegmentId id) const {
    const auto it = by_segment_.find(id);
    return it == by_segment_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second);
  }
  /// Records the new mapping of this session's segment `id`; returns its local key.
  std::uint64_t add_segment(SegmentId id, const MappedSegment& mapping) {
    const std::uint64_t key = next_key_++;
    segments_.emplace(key, Segment{mapping, 0, false});
    by_segment_.emplace(id, key);
    return key;
  }
  /// Records region `info` in the segment of local key `key` (from key_of or add_segment) and
  /// returns its address here; nullptr, recording nothing, when the region does not lie inside
  /// the segment.
  void* add_region(const RegionInfo& info, std::uint64_t key) {
    Segment& s = segments_.find(key)->second; // keys come from key_of or add_segment: mapped
    if (info.offset > s.mapping.size || info.size > s.mapping.size - info.offset) {
      return nullptr;
    }
    void* p = static_cast<std::uint8_t*>(s.mapping.base) + info.offset;
    ++s.live;
    regions_[address(p)] = LocalRegion{info, key, false};
    return p;
  }

  /// The region starting at `p`, orphan or not; nullptr for any other address.
  const LocalRegion* region_at(const void* p) const {
    const auto it = regions_.find(address(p));
    return it == regions_.end() ? nullptr : &it->second;
  }
  /// The region holding `p` (any byte of it), orphan or not; nullptr when none does.
  const LocalRegion* region_holding(const void* p) const {
    const auto it = carve::detail::block_containing(regions_, p, [](const LocalRegion& r) { return r.info.size; });
    return it == regions_.end() ? nullptr : &it->second;
  }

  /// Drops the region starting at `p` (region_at(p) must find it). When it was the last region in
  /// its segment, the segment is unmapped, and for this session's segment its id is returned: the
  /// server is to be told (Unmapped), so that it can end the lease.
  std::optional<SegmentId> remove_region(const void* p) {
    const auto it = regions_.find(address(p));
    const LocalRegion gone = it->second;
    regions_.erase(it);
    const auto s = segments_.find(gone.segment_key); // a region's segment stays mapped while it lives
    if (--s->second.live != 0) {
      return std::nullopt;
    }
    const bool orphan = s->second.orphan;
    unmap_segment(s->second.mapping);
    segments_.erase(s);
    if (orphan) {
      return std::nullopt; // its session's ids were forgotten; that server reclaimed it already
    }
    by_segment_.erase(gone.info.segment);
    return gone.info.segment;
  }

  /// Unmaps the segments of `retired` (a SegmentsRetired notice) that hold no region here, and
  /// returns their ids. Ids not mapped, and segments still holding regions, are ignored: a
  /// retired segment holds none, so a notice that says otherwise is not acted on.
  std::vector<SegmentId> unmap_retired(const std::vector<SegmentId>& retired) {
    std::vector<SegmentId> done;
    for (const SegmentId id : retired) {
      const auto it = by_segment_.find(id);
      if (it == by_segment_.end()) {
        continue;
      }
      const auto s = segments_.find(it->second); // every by_segment_ entry names a mapped segment
      if (s->second.live != 0) {
        continue;
      }
      unmap_segment(s->second.mapping);
      segments_.erase(s);
      by_segment_.erase(it);
      done.push_back(id);
    }
    return done;
  }

  /// The connection is gone: every region becomes an orphan, segments without regions are
  /// unmapped, and this session's segment ids are forgotten. Calling it again changes nothing.
  void orphan_all() {
    for (auto& [p, r] : regions_) {
      r.orphan = true;
    }
    by_segment_.clear();
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (it->second.live == 0) {
        unmap_segment(it->second.mapping);
        it = segments_.erase(it);
      } else {
        it->second.orphan = true;
        ++it;
      }
    }
  }

  /// Segments mapped now, orphans' included.
  std::size_t segment_count() const noexcept { return segments_.size(); }
  /// Regions held now, orphans included.
  std::size_t region_count() const noexcept { return regions_.size(); }
  /// Every segment mapped now.
  std::vector<MappedSegment> mappings() const {
    std::vector<MappedSegment> out;
    for (const auto& [key, s] : segments_) {
      out.push_back(s.mapping);
    }
    return out;
  }

private:
  struct Segment {
    MappedSegment mapping;
    std::size_t live = 0; // this process's regions in it
    bool orphan = false;  // from a lost connection
  };

  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  std::map<std::uintptr_t, LocalRegion> regions_;           // by pointer in this process
  std::unordered_map<std::uint64_t, Segment> segments_;     // by local key
  std::unordered_map<SegmentId, std::uint64_t> by_segment_; // this session's segment ids -> key
  std::uint64_t next_key_ = 1;
};

} // namespace carve::service::detail

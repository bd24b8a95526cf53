/// @file carve/service/service_report.hpp
/// What an AllocationService reports about itself: the StatsReply, the CardsReply, and the check
/// that its region table agrees with the cards and the leases. It reads the service's tables
/// and changes nothing; kept apart from the rules that change them.
#pragma once

#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/service/protocol_messages.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

namespace carve::service::detail {

/// The reports of an AllocationService (its friend), as static functions of the service.
struct ServiceReport {
  /// AllocationService::stats.
  template <class Service>
  static StatsReply stats(const Service& v, ClientId asking) {
    StatsReply s;
    s.clients = v.clients_.size();
    s.live_regions = v.regions_.size();
    s.allocations = v.counters_.allocations;
    s.frees = v.counters_.frees;
    s.failed_allocations = v.counters_.failed;
    s.reclaimed_regions = v.counters_.reclaimed;
    s.rejected_messages = v.counters_.rejected;
    s.open_descriptors = open_descriptors();
    if (const auto me = v.clients_.find(asking); me != v.clients_.end()) {
      s.my_regions = me->second.regions.size();
      s.my_bytes = me->second.bytes;
    }
    const std::vector<CardState> states = v.allocator_.card_states();
    const std::vector<CardUse> use = card_use(v);
    for (int c = 0; c < v.card_count(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      const auto& card = v.cards_[i];
      s.leased_segments += card.leased_count();
      s.retired_segments += card.retired_count();
      // The server keeps no cache (clients pool inside their own leases): cached bytes and hits
      // are 0, and every region is one segment taken from the card.
      s.cards.push_back(CardStats{card.capacity(), states[i].free_bytes, states[i].largest_free_block, use[i].bytes, 0,
                                  card.capacity() - card.free_bytes(), use[i].regions, card.held_count(), 0,
                                  v.counters_.taken[i], v.counters_.returned[i]});
    }
    const auto now = std::chrono::steady_clock::now();
    std::map<std::pair<int, int>, BorrowCount> pairs;
    const std::vector<BorrowRecord> records = v.allocator_.history().records();
    for (auto r = records.rbegin(); r != records.rend(); ++r) {
      BorrowCount& b = pairs[{r->requester, r->lender}];
      b.requester = r->requester;
      b.lender = r->lender;
      ++b.count;
      b.bytes += r->bytes;
      if (s.recent_borrows.size() < max_recent_borrows) {
        const auto age = std::chrono::duration_cast<std::chrono::microseconds>(now - r->time).count();
        s.recent_borrows.push_back(BorrowEvent{static_cast<std::uint64_t>(age), r->requester, r->lender, r->bytes});
      }
    }
    for (const auto& [key, b] : pairs) {
      s.borrows.push_back(b);
    }
    for (const auto& [id, c] : v.clients_) {
      if (s.client_list.size() < max_client_entries) {
        s.client_list.push_back(ClientSummary{id, c.peer.pid, c.peer.uid, c.regions.size(), c.bytes, c.name});
      }
    }
    std::sort(s.client_list.begin(), s.client_list.end(),
              [](const ClientSummary& a, const ClientSummary& b) { return a.client_id < b.client_id; });
    s.consistent = consistent(v);
    return s;
  }

  /// AllocationService::cards.
  template <class Service>
  static std::vector<CardInfo> cards(const Service& v) {
    const std::vector<CardState> states = v.allocator_.card_states();
    std::vector<CardInfo> out;
    for (int c = 0; c < v.card_count(); ++c) {
      CardInfo info;
      info.card = c;
      info.name = v.names_[static_cast<std::size_t>(c)];
      info.uuid = v.uuids_[static_cast<std::size_t>(c)];
      info.capacity = v.cards_[static_cast<std::size_t>(c)].capacity();
      info.free_bytes = states[static_cast<std::size_t>(c)].free_bytes;
      info.largest_free_block = states[static_cast<std::size_t>(c)].largest_free_block;
      for (int to = 0; to < v.card_count(); ++to) {
        info.bandwidth_gbps.push_back(v.allocator_.picker().bandwidth(c, to));
      }
      out.push_back(std::move(info));
    }
    return out;
  }

  /// AllocationService::consistent.
  template <class Service>
  static bool consistent(const Service& v) {
    std::vector<std::size_t> regions(static_cast<std::size_t>(v.card_count()), 0);
    for (const auto& [id, r] : v.regions_) {
      ++regions[static_cast<std::size_t>(r.handle.card)];
      const auto owner = v.clients_.find(r.owner);
      const auto mappers = v.mappers_.find(r.segment);
      if (owner == v.clients_.end() || owner->second.regions.count(id) != 1 || mappers == v.mappers_.end() ||
          mappers->second != std::vector<ClientId>{r.owner}) {
        return false;
      }
    }
    std::size_t leased = 0;
    for (int c = 0; c < v.card_count(); ++c) {
      const auto& card = v.cards_[static_cast<std::size_t>(c)];
      if (card.live_count() != regions[static_cast<std::size_t>(c)]) {
        return false;
      }
      leased += card.leased_count();
    }
    return leased == v.mappers_.size();
  }

private:
  struct CardUse {
    std::uint64_t bytes = 0;
    std::uint64_t regions = 0;
  };

  // Live regions and their bytes, per card.
  template <class Service>
  static std::vector<CardUse> card_use(const Service& v) {
    std::vector<CardUse> use(static_cast<std::size_t>(v.card_count()));
    for (const auto& [id, r] : v.regions_) {
      CardUse& u = use[static_cast<std::size_t>(r.handle.card)];
      u.bytes += r.handle.size;
      ++u.regions;
    }
    return use;
  }

  static std::uint64_t open_descriptors() {
    std::error_code ec;
    std::uint64_t n = 0;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
      ++n;
    }
    return n > 0 ? n - 1 : 0; // the iterator's own descriptor
  }
};

} // namespace carve::service::detail

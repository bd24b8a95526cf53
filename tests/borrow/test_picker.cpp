#include "support/errors.hpp"
#include "support/topology_data.hpp"

#include <carve/borrow.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using carve::BandwidthWeightedPicker;
using carve::BorrowHistory;
using carve::CardState;
using carve::Errc;
using carve::LargestBandwidth;
using carve::ThresholdMostFree;
using carve::Topology;
using carve::WeightedScore;

using carve::test::dgx1;

namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;

// Every card with `free` GiB in one piece, except those listed.
std::vector<CardState> cards(std::size_t free_gib, std::vector<std::pair<int, std::size_t>> except = {}) {
  std::vector<CardState> s(8, CardState{free_gib * GiB, free_gib * GiB});
  for (const auto& [card, gib] : except) {
    s[static_cast<std::size_t>(card)] = CardState{gib * GiB, gib * GiB};
  }
  return s;
}

} // namespace

TEST_CASE("the requester itself when it has room") {
  const BandwidthWeightedPicker picker(dgx1());
  const auto p = picker.pick(0, 4 * GiB, cards(16));
  REQUIRE(p);
  CHECK(p->card == 0);
  CHECK(p->local);
  CHECK(p->hops == 0);
  // Exactly enough is enough.
  CHECK(picker.pick(5, 3 * GiB, cards(16, {{5, 3}}))->card == 5);
}

TEST_CASE("(a) largest bandwidth; equal bandwidth goes to fewer hops, more free memory, the lower ordinal") {
  const BandwidthWeightedPicker<LargestBandwidth> picker(dgx1());
  // GPU0 full. A borrowed block is read where it lies, so only direct links count: GPU3 and GPU4
  // (NV2) are 40 GB/s away, GPU1 and GPU2 (NV1) 20, the rest 10 over the system path (two NVLink
  // hops through GPU3 would be 40, but a GPU does not relay another's loads); of the widest the
  // lower ordinal wins.
  auto p = picker.pick(0, 4 * GiB, cards(16, {{0, 1}}));
  REQUIRE(p);
  CHECK(p->card == 3);
  CHECK(p->bandwidth_gbps == 40.0);
  CHECK(p->hops == 1);
  CHECK(picker.bandwidth(0, 2) == 20.0);
  CHECK(picker.hops(0, 2) == 1);
  CHECK(picker.bandwidth(0, 7) == 10.0);
  // Bandwidth comes before free memory; free memory before the ordinal.
  CHECK(picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {7, 20}}))->card == 3);
  CHECK(picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {4, 20}}))->card == 4);
  CHECK(picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {3, 2}}))->card == 4);
  CHECK(picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {3, 2}, {4, 2}, {7, 20}}))->card == 1);
  CHECK(picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {3, 2}, {4, 2}, {2, 20}}))->card == 2);
  // A card without room is never chosen, however fast.
  p = picker.pick(0, 4 * GiB, cards(16, {{0, 1}, {2, 3}, {3, 3}, {4, 3}, {7, 3}}));
  REQUIRE(p);
  CHECK(p->bandwidth_gbps == 20.0);
  CHECK(p->card == 1);
}

TEST_CASE("(b) most free memory among cards at or above the threshold") {
  const BandwidthWeightedPicker picker(dgx1(), ThresholdMostFree{30.0});
  // GPU5 has the most memory but is only 10 GB/s away, GPU7 more than GPU3 but also 10 GB/s
  // away; of the 40 GB/s cards GPU3 has the most.
  auto p = picker.pick(0, 4 * GiB, cards(8, {{0, 0}, {5, 30}, {7, 12}, {3, 10}}));
  REQUIRE(p);
  CHECK(p->card == 3);
  // Nobody fast has room: non-strict falls back to the widest path that has room.
  p = picker.pick(0, 4 * GiB, cards(2, {{0, 0}, {5, 30}, {6, 20}}));
  REQUIRE(p);
  CHECK(p->card == 5); // 10 GB/s both; GPU5 has more free
  // Strict: no candidate.
  const BandwidthWeightedPicker strict(dgx1(), ThresholdMostFree{30.0, true});
  CHECK(strict.pick(0, 4 * GiB, cards(2, {{0, 0}, {5, 30}, {6, 20}})).error() == Errc::no_space);
  // The default 48 GB/s threshold lies between PCIe and NVLink speeds: with 25 GB/s per link, NV2 = 50 passes,
  // NV1 = 25 does not.
  const Topology fast = Topology::from_nvidia_smi(carve::test::topology_text("dgx1_v100.txt"), {25.0, 24.0, 10.0});
  const BandwidthWeightedPicker by_default(fast, ThresholdMostFree{});
  CHECK(by_default.pick(0, GiB, cards(8, {{0, 0}, {1, 30}, {4, 9}}))->card == 4);
}

TEST_CASE("(c) weighted score: free memory, bandwidth, and borrowing history") {
  // Bandwidth only: like (a).
  const BandwidthWeightedPicker bw_only(dgx1(), WeightedScore{0.0, 1.0, 0.0});
  CHECK(bw_only.pick(0, GiB, cards(8, {{0, 0}, {5, 30}}))->card == 3);
  // Free memory only: the roomiest.
  const BandwidthWeightedPicker free_only(dgx1(), WeightedScore{1.0, 0.0, 0.0});
  CHECK(free_only.pick(0, GiB, cards(8, {{0, 0}, {5, 30}}))->card == 5);
  // Both: GPU5 has 40 GiB at 10 GB/s -> 1.0 + 0.25 = 1.25; GPU3 has 8 at 40 -> 0.2 + 1.0 = 1.2.
  const BandwidthWeightedPicker both(dgx1(), WeightedScore{1.0, 1.0, 0.0});
  CHECK(both.pick(0, GiB, cards(8, {{0, 0}, {5, 40}}))->card == 5);
  CHECK(both.pick(0, GiB, cards(8, {{0, 0}, {5, 30}}))->card == 3); // 1.25 against 1.27
  // History: GPU0 keeps borrowing from GPU3; the next borrow goes elsewhere.
  const BandwidthWeightedPicker with_history(dgx1(), WeightedScore{1.0, 1.0, 1.0});
  BorrowHistory history(8, 16);
  const auto state = cards(8, {{0, 0}});
  CHECK(with_history.pick(0, GiB, state, &history)->card == 3);
  history.record(0, 3, GiB);
  history.record(0, 3, GiB);
  CHECK(with_history.pick(0, GiB, state, &history)->card == 4); // GPU3 scores 2 - 1, GPU4 2
  history.record(0, 4, GiB);
  CHECK(with_history.pick(0, GiB, state, &history)->card == 4); // GPU3 2 - 2/3, GPU4 2 - 1/3
  // With GPU3 and GPU4 full, the NV1 peers remain: GPU0's own borrows from GPU1 count against
  // GPU1, another requester's borrows from GPU2 do not count against GPU2.
  const auto nv1 = cards(8, {{0, 0}, {3, 0}, {4, 0}});
  history.record(0, 1, GiB);
  history.record(1, 2, GiB);
  history.record(1, 2, GiB);
  CHECK(with_history.pick(0, GiB, nv1, &history)->card == 2); // GPU1 2 - 1/4, GPU2 2
}

TEST_CASE("history window: old borrows fall out") {
  BorrowHistory h(4, 3);
  h.record(0, 1, 10);
  h.record(0, 1, 20);
  h.record(0, 2, 30);
  CHECK(h.count(0, 1) == 2);
  h.record(0, 3, 40); // evicts the first
  CHECK(h.count(0, 1) == 1);
  CHECK(h.total(0) == 3);
  const auto records = h.records();
  REQUIRE(records.size() == 3);
  CHECK(records[0].bytes == 20);
  CHECK(records[2].lender == 3);
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, h.record(0, 4, 1));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, h.count(0, 4)); // read past its table before
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, h.count(-1, 0));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, h.total(4));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, BorrowHistory(0, 3));
}

TEST_CASE("no candidate: no_space, and a message with every card's largest free block") {
  const BandwidthWeightedPicker picker(dgx1());
  const auto state = cards(2, {{0, 1}, {6, 3}});
  CHECK(picker.pick(0, 4 * GiB, state).error() == Errc::no_space);
  CHECK(carve::no_card_message(4 * GiB, state) ==
        "no card can hold 4.0 GiB (largest free block per card: GPU0 1.0 GiB, GPU1 2.0 GiB, GPU2 2.0 GiB, GPU3 2.0 "
        "GiB, GPU4 2.0 GiB, GPU5 2.0 GiB, GPU6 3.0 GiB, GPU7 2.0 GiB)");
  CHECK(picker.pick(8, GiB, state).error() == Errc::out_of_range);
  CHECK(picker.pick(-1, GiB, state).error() == Errc::out_of_range);
  CHECK(picker.pick(0, GiB, std::vector<CardState>(7)).error() == Errc::out_of_range);
}

TEST_CASE("card indices are checked: the picker's tables throw, a history of another machine is refused") {
  carve::TopologyBuilder cpu_only;
  cpu_only.add_cpu("CPU0");
  CHECK_THROWS_ERRC(Errc::invalid_argument, BandwidthWeightedPicker(cpu_only.build())); // empty before
  const BandwidthWeightedPicker picker(dgx1());
  CHECK(picker.bandwidth(0, 3) == 40.0);
  CHECK_THROWS_ERRC(Errc::out_of_range, picker.bandwidth(0, 8)); // read past the table before
  CHECK_THROWS_ERRC(Errc::out_of_range, picker.bandwidth(-1, 0));
  CHECK_THROWS_ERRC(Errc::out_of_range, picker.hops(8, 0));
  CHECK_THROWS_ERRC(Errc::out_of_range, picker.mappable(0, 99));
  // A history of four cards for a machine of eight: its counts would be read for cards it lacks.
  const BorrowHistory small(4, 16);
  const auto state = cards(2, {{0, 0}});
  CHECK(picker.pick(0, GiB, state, &small).error() == Errc::out_of_range);
  const auto explained = picker.pick_explained(0, GiB, state, &small);
  REQUIRE_FALSE(explained);
  CHECK(explained.error().code == Errc::out_of_range);
  CHECK(explained.error().message == "a borrowing history of 4 cards, the topology has 8 GPUs");
  const BorrowHistory right(8, 16);
  CHECK(picker.pick(0, GiB, state, &right).has_value());
}

TEST_CASE("pick_explained: the same decision, and an error that says why") {
  const BandwidthWeightedPicker picker(dgx1());
  const auto roomy = cards(8, {{0, 0}});
  REQUIRE(picker.pick_explained(0, GiB, roomy));
  CHECK(picker.pick_explained(0, GiB, roomy)->card == picker.pick(0, GiB, roomy)->card);
  CHECK(picker.pick_explained(0, GiB, roomy)->bandwidth_gbps == 40.0);

  // No card has room: every card's largest free block.
  const auto full = cards(2, {{0, 1}, {6, 3}});
  const auto none = picker.pick_explained(0, 4 * GiB, full);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == Errc::no_space);
  CHECK(none.error().message == carve::no_card_message(4 * GiB, full));
  CHECK(picker.explain_no_pick(0, 4 * GiB, full) == none.error().message);

  // Cards with room that the strategy declines are named, with the bandwidth that did it.
  const BandwidthWeightedPicker strict(dgx1(), ThresholdMostFree{30.0, true});
  const auto slow = cards(2, {{0, 0}, {5, 8}, {6, 8}});
  const auto declined = strict.pick_explained(0, 4 * GiB, slow);
  REQUIRE_FALSE(declined);
  CHECK(declined.error().code == Errc::no_space);
  CHECK(declined.error().message ==
        "no card can lend 4.0 GiB to GPU0: GPU5 has room but the threshold-most-free strategy declines it (10 GB/s); "
        "GPU6 has room but the threshold-most-free strategy declines it (10 GB/s) (largest free block per card: GPU0 "
        "0 B, GPU1 2.0 GiB, GPU2 2.0 GiB, GPU3 2.0 GiB, GPU4 2.0 GiB, GPU5 8.0 GiB, GPU6 8.0 GiB, GPU7 2.0 GiB)");
  // Through AnyStrategy the name is that of the strategy it holds.
  const BandwidthWeightedPicker<carve::AnyStrategy> any(dgx1(), carve::parse_strategy("threshold-most-free:strict"));
  CHECK(any.pick_explained(0, 4 * GiB, slow).error().message.find("GPU5 has room but the threshold-most-free") !=
        std::string::npos);

  // Bad arguments.
  CHECK(picker.pick_explained(8, GiB, roomy).error().code == Errc::out_of_range);
  CHECK(picker.pick_explained(8, GiB, roomy).error().message == "no card 8 (the topology has GPUs 0..7)");
  CHECK(picker.pick_explained(0, GiB, std::vector<CardState>(7)).error().message ==
        "states for 7 cards, the topology has 8 GPUs");
}

TEST_CASE("an unreachable card is never a candidate") {
  carve::TopologyBuilder b;
  const auto g0 = b.add_gpu("GPU0");
  const auto g1 = b.add_gpu("GPU1");
  b.add_gpu("GPU2"); // no links at all
  b.add_link(g0, g1, carve::LinkType::nvlink);
  const BandwidthWeightedPicker picker(b.build());
  const std::vector<CardState> state{{0, 0}, {GiB, GiB}, {8 * GiB, 8 * GiB}};
  CHECK(picker.pick(0, GiB, state)->card == 1);
  CHECK(picker.pick(0, 2 * GiB, state).error() == Errc::no_space);
  CHECK(picker.pick_explained(0, 2 * GiB, state).error().message ==
        "no card can lend 2.0 GiB to GPU0: GPU2 has room but no path to GPU0 within the topology's max_hops (largest "
        "free block per card: GPU0 0 B, GPU1 1.0 GiB, GPU2 8.0 GiB)");
}

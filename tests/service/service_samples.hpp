// One message of every type with every field set, for the protocol tests and the fuzz corpus
// (tests/data/service/: the encoding of each sample, sequence = its index + 1).
#pragma once

#include <carve/service/protocol.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace carve::test {

inline std::vector<service::Request> sample_requests() {
  using namespace service;
  return {Hello{"trainer-7"},
          Allocate{3ull << 30, 5},
          Free{42},
          Query{0xfedcba9876543210ull},
          StatsRequest{},
          CardsRequest{},
          Unmapped{{1, 2, 0xffffffffffffffffull}},
          WaitReclaimed{7, 4242, 1500}};
}

inline std::vector<service::Reply> sample_replies() {
  using namespace service;
  Allocated a;
  a.region = RegionInfo{17, 3, 0, 9, 4096, 1000000};
  a.kind = ExportKind::cuda_ipc;
  a.segment_size = 2u << 20;
  a.device = 3;
  for (std::size_t i = 0; i < a.device_uuid.size(); ++i) { // borrowed: the lender's GPU and the requester's
    a.device_uuid[i] = static_cast<std::uint8_t>(0xa0 + i);
    a.requester_uuid[i] = static_cast<std::uint8_t>(0x10 * i + 5);
  }
  for (std::size_t i = 0; i < a.handle.size(); ++i) {
    a.handle[i] = static_cast<std::uint8_t>(i * 3 + 1);
  }
  a.new_mapping = true;
  Allocated vmm; // a VMM segment: its descriptor travels with SCM_RIGHTS, the handle stays empty
  vmm.region = RegionInfo{19, 1, 2, 10, 0, 3000};
  vmm.kind = ExportKind::cuda_vmm;
  vmm.segment_size = 3000;
  vmm.device = 1;
  vmm.new_mapping = true;
  StatsReply s;
  s.clients = 2;
  s.live_regions = 5;
  s.allocations = 100;
  s.frees = 95;
  s.failed_allocations = 1;
  s.reclaimed_regions = 3;
  s.rejected_messages = 4;
  s.leased_segments = 6;
  s.retired_segments = 1;
  s.open_descriptors = 12;
  s.my_regions = 2;
  s.my_bytes = 8192;
  s.consistent = true;
  s.cards = {CardStats{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, CardStats{}};
  s.borrows = {BorrowCount{0, 3, 7, 1u << 20}};
  s.recent_borrows = {BorrowEvent{1500, 0, 3, 4096}, BorrowEvent{99, 1, 2, 512}};
  s.client_list = {ClientSummary{1, 4242, 1000, 2, 8192, "trainer"}};
  CardInfo c0{0,
              "GPU0",
              a.requester_uuid,
              16ull << 30,
              8ull << 30,
              4ull << 30,
              {std::numeric_limits<double>::infinity(), 40.0, 0.0}};
  CardInfo c1{
      1, "GPU1", {}, 16ull << 30, 16ull << 30, 16ull << 30, {40.0, std::numeric_limits<double>::infinity(), 20.5}};
  return {HelloReply{1234, 7, 4242, 1000, 8, ExportKind::shared_memory},
          a,
          Freed{17},
          QueryReply{RegionInfo{18, 1, 1, 2, 0, 512}},
          s,
          CardsReply{{c0, c1}},
          SegmentsRetired{{4, 5}},
          ErrorReply{Errc::permission_denied, "region 17 belongs to another client"},
          Reclaimed{12},
          vmm}; // added after the others, so that their seeds keep their names
}

} // namespace carve::test

// carve's trace CSV and RMM's logging_resource_adaptor log: good files read to the traces they
// hold, every kind of bad input refused with its exact message, and a TraceResource's log read
// back to the calls made through it.
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/trace_resource.hpp>
#include <carve/trace/carve_csv.hpp>
#include <carve/trace/rmm_log.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_csv_traces {

using carve::trace::AllocationTrace;
using carve::trace::read_carve_csv;
using carve::trace::read_rmm_log;

namespace {

std::string data_file(const std::string& name) {
  std::ifstream in(std::filesystem::path(CARVE_TEST_DATA_DIR) / "traces" / name, std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The requests as "+<block>" and "-<block>", in order: easy to compare whole.
std::vector<std::string> steps(const AllocationTrace& t) {
  std::vector<std::string> out;
  for (const auto& r : t.requests) {
    out.push_back((r.allocate ? "+" : "-") + std::to_string(r.block));
  }
  return out;
}

std::vector<std::uint64_t> events(const AllocationTrace& t) {
  std::vector<std::uint64_t> out;
  for (const auto& r : t.requests) {
    out.push_back(r.event);
  }
  return out;
}

// The message read_carve_csv gives for `text` ("" when it reads).
std::string carve_error(const std::string& text) {
  const auto t = read_carve_csv(text, "x.csv");
  if (t) {
    return "";
  }
  CHECK(t.error().code == carve::Errc::invalid_argument);
  return t.error().message;
}

std::string rmm_error(const std::string& text) {
  const auto t = read_rmm_log(text, "r.csv");
  if (t) {
    return "";
  }
  CHECK(t.error().code == carve::Errc::invalid_argument);
  return t.error().message;
}

const std::string carve_head = "# carve trace v1\nseq,thread,time_ns,action,address,bytes,alignment,stream,result\n";
const std::string rmm_head = "Thread,Time,Action,Pointer,Size,Stream\n";

} // namespace

TEST_CASE("carve CSV: a good file reads to its allocations and frees; failed calls are skipped") {
  const auto t = read_carve_csv(data_file("carve_small.csv"), "carve_small.csv");
  REQUIRE(t);
  CHECK(t->source == "carve_small.csv");
  CHECK(t->start_blocks == 0);
  CHECK(t->start_live_bytes() == 0);
  CHECK(!t->recorded);
  REQUIRE(t->blocks.size() == 3);
  CHECK(t->allocations() == 3);
  CHECK(t->blocks[0].address == 0x7f0000000000);
  CHECK(t->blocks[0].bytes == 4096);
  CHECK(t->blocks[0].stream == 0);
  CHECK(t->blocks[0].allocated_us == 1);
  CHECK(t->blocks[0].freed_us == 4);
  CHECK(t->blocks[1].bytes == 1048576);
  CHECK(t->blocks[1].stream == 3);
  CHECK(t->blocks[2].address == 0x7f0000000000); // the address again, once freed
  CHECK(t->blocks[2].bytes == 512);
  CHECK(t->blocks[2].freed_us == carve::trace::no_time); // its free failed: still live
  CHECK(steps(*t) == std::vector<std::string>{"+0", "+1", "-0", "+2", "-1"});
  CHECK(events(*t) == std::vector<std::uint64_t>{0, 1, 3, 4, 6}); // the seq column
  CHECK(t->peak_live_bytes() == 4096 + 1048576);
}

TEST_CASE("carve CSV: \\r\\n line ends, empty lines, gaps in seq and 0x streams read") {
  const std::string text = "# carve trace v1\r\nseq,thread,time_ns,action,address,bytes,alignment,stream,result\r\n"
                           "\r\n"
                           "5,2,10,allocate,0xA0,16,8,0x10,ok\r\n"
                           "\n"
                           "9,2,20,deallocate,0xa0,16,8,16,ok";
  const auto t = read_carve_csv(text, "x.csv");
  REQUIRE(t);
  CHECK(steps(*t) == std::vector<std::string>{"+0", "-0"});
  CHECK(events(*t) == std::vector<std::uint64_t>{5, 9});
  CHECK(t->blocks[0].stream == 16);
  CHECK(t->blocks[0].address == 0xa0);
  // Only the two lines that begin every file: an empty trace.
  const auto empty = read_carve_csv(carve_head, "x.csv");
  REQUIRE(empty);
  CHECK(empty->blocks.empty());
  CHECK(empty->peak_live_bytes() == 0);
}

TEST_CASE("carve CSV: every bad input is refused with a message naming the source, the line or event") {
  const std::string a = "0,0,0,allocate,0x10,16,8,,ok\n";
  // The two first lines.
  CHECK(carve_error("") == "x.csv: line 1: expected \"# carve trace v1\", found an empty text");
  CHECK(carve_error("# carve trace v2\n") ==
        "x.csv: line 1: expected \"# carve trace v1\", found \"# carve trace v2\"");
  CHECK(carve_error("seq,thread\n") == "x.csv: line 1: expected \"# carve trace v1\", found \"seq,thread\"");
  CHECK(carve_error("# carve trace v1\n") ==
        "x.csv: line 2: expected the header \"seq,thread,time_ns,action,address,bytes,alignment,stream,result\", "
        "found the end of the text");
  CHECK(carve_error("# carve trace v1\nseq,thread,time,action,address,bytes,alignment,stream,result\n") ==
        "x.csv: line 2: expected the header \"seq,thread,time_ns,action,address,bytes,alignment,stream,result\", "
        "found \"seq,thread,time,action,address,bytes,alignment,stream,result\"");
  // Fields.
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,ok\n") == "x.csv: line 3: 8 fields, expected 9");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,,ok,\n") == "x.csv: line 3: 10 fields, expected 9");
  CHECK(carve_error(carve_head + "a1,0,0,allocate,0x10,16,8,,ok\n") ==
        "x.csv: line 3: seq \"a1\" is not a decimal number");
  CHECK(carve_error(carve_head + "18446744073709551616,0,0,allocate,0x10,16,8,,ok\n") ==
        "x.csv: line 3: seq \"18446744073709551616\" does not fit in 64 bits");
  CHECK(carve_error(carve_head + "0,,0,allocate,0x10,16,8,,ok\n") == "x.csv: line 3: thread is empty");
  CHECK(carve_error(carve_head + "0,0,1e3,allocate,0x10,16,8,,ok\n") ==
        "x.csv: line 3: time_ns \"1e3\" is not a decimal number");
  CHECK(carve_error(carve_head + "0,0,0,free,0x10,16,8,,ok\n") ==
        "x.csv: line 3: action \"free\" is neither allocate nor deallocate");
  CHECK(carve_error(carve_head + "0,0,0,allocate,16,16,8,,ok\n") ==
        "x.csv: line 3: address \"16\" is not 0x-prefixed hexadecimal");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x,16,8,,ok\n") ==
        "x.csv: line 3: address \"0x\" is not 0x-prefixed hexadecimal");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x1g,16,8,,ok\n") ==
        "x.csv: line 3: address \"0x1g\" is not 0x-prefixed hexadecimal");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10000000000000000,16,8,,ok\n") ==
        "x.csv: line 3: address \"0x10000000000000000\" does not fit in 64 bits");
  CHECK(carve_error(carve_head + "0,0,0,allocate,,16,8,,ok\n") == "x.csv: line 3: address is empty");
  CHECK(carve_error(carve_head + "0,0,0,deallocate,,16,8,,not allocated\n") == "x.csv: line 3: address is empty");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,,no space\n") ==
        "x.csv: line 3: address \"0x10\" in a failed allocation, which has none");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,-16,8,,ok\n") ==
        "x.csv: line 3: bytes \"-16\" is not a decimal number");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,12,,ok\n") ==
        "x.csv: line 3: alignment 12 is not a power of two");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,0,,ok\n") ==
        "x.csv: line 3: alignment 0 is not a power of two");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,s1,ok\n") ==
        "x.csv: line 3: stream \"s1\" is not a decimal number");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,,OK\n") ==
        "x.csv: line 3: result \"OK\" is neither ok nor a carve::Errc's text");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,16,8,,no_space\n") ==
        "x.csv: line 3: result \"no_space\" is neither ok nor a carve::Errc's text");
  // The first bad field is the one named.
  CHECK(carve_error(carve_head + "x,y,z,allocate,0x10,16,8,,ok\n") ==
        "x.csv: line 3: seq \"x\" is not a decimal number");
  // Long fields are cut short in messages.
  CHECK(carve_error(carve_head + "0,0,0," + std::string(100, 'a') + ",0x10,16,8,,ok\n") ==
        "x.csv: line 3: action \"" + std::string(80, 'a') + "...\" is neither allocate nor deallocate");
  // Order.
  CHECK(carve_error(carve_head + a + "0,0,0,deallocate,0x10,16,8,,ok\n") ==
        "x.csv: line 4: seq 0 after seq 0: lines out of order or repeated");
  CHECK(carve_error(carve_head + "\n5,0,0,allocate,0x10,16,8,,ok\n3,0,0,deallocate,0x10,16,8,,ok\n") ==
        "x.csv: line 5: seq 3 after seq 5: lines out of order or repeated");
  // What TraceBuilder refuses, by event (the seq).
  CHECK(carve_error(carve_head + "7,0,0,allocate,0x10,0,8,,ok\n") == "x.csv: event 7: a block of 0 bytes");
  CHECK(carve_error(carve_head + "0,0,0,allocate,0x10,4611686018427387905,8,,ok\n") ==
        "x.csv: event 0: a block of 4611686018427387905 bytes, beyond 2^62");
  CHECK(carve_error(carve_head + a + "1,0,0,allocate,0x10,32,8,,ok\n") ==
        "x.csv: event 1: allocation at 0x10, which is live already");
  CHECK(carve_error(carve_head + "0,0,0,deallocate,0x10,16,8,,ok\n") ==
        "x.csv: event 0: free of address 0x10, which is not live (never allocated, or freed already)");
  CHECK(carve_error(carve_head + a + "1,0,0,deallocate,0x10,16,8,,ok\n2,0,0,deallocate,0x10,16,8,,ok\n") ==
        "x.csv: event 2: free of address 0x10, which is not live (never allocated, or freed already)");
  CHECK(carve_error(carve_head + a + "1,0,0,deallocate,0x10,8,8,,ok\n") ==
        "x.csv: event 1: free of 8 bytes at 0x10, allocated with 16");
  // A failed call is checked for form but not fed to the builder: any size, no live address.
  CHECK(carve_error(carve_head + "0,0,0,allocate,,0,3,,invalid size\n1,0,0,deallocate,0x99,16,8,,not allocated\n") ==
        "");
}

TEST_CASE("RMM log: a good file reads, with times past midnight, (nil) failures and streams as numbers") {
  const auto t = read_rmm_log(data_file("rmm_small.csv"), "rmm_small.csv");
  REQUIRE(t);
  CHECK(t->start_blocks == 0);
  CHECK(t->start_live_bytes() == 0);
  REQUIRE(t->blocks.size() == 3);
  CHECK(steps(*t) == std::vector<std::string>{"+0", "+1", "-0", "+2", "-1"});
  CHECK(events(*t) == std::vector<std::uint64_t>{0, 1, 3, 4, 5}); // the failure is event 2
  CHECK(t->blocks[0].address == 0x7f8a40000000);
  CHECK(t->blocks[0].bytes == 1024);
  CHECK(t->blocks[0].stream == 0);
  CHECK(t->blocks[1].stream == 0x7f8a38001020);
  CHECK(t->blocks[2].address == 0x7f8a40000000);
  CHECK(t->blocks[2].bytes == 4096);
  CHECK(t->blocks[2].stream == 0); // "0": a null stream written with std::hex
  const std::int64_t day = std::int64_t{86400} * 1'000'000;
  CHECK(t->blocks[0].allocated_us == day - 1000);
  CHECK(t->blocks[1].allocated_us == day - 500);
  CHECK(t->blocks[0].freed_us == day + 300);     // past midnight: a day added
  CHECK(t->blocks[2].allocated_us == day + 290); // a step back of 10 us: threads racing, no day added
  CHECK(t->blocks[1].freed_us == day + 1'500'000);
  CHECK(t->blocks[2].freed_us == carve::trace::no_time);
  CHECK(t->peak_live_bytes() == 2048 + 4096);
}

TEST_CASE("RMM log: columns by name in any order, extra columns ignored, Time optional") {
  const std::string text = "Size,Extra,Stream,Pointer,Action,Thread\r\n"
                           "64,x,0x2,7f0000000040,allocate,1\r\n"
                           "\r\n"
                           "64,y,(nil),0x7f0000000040,free,1\r\n";
  const auto t = read_rmm_log(text, "r.csv");
  REQUIRE(t);
  CHECK(steps(*t) == std::vector<std::string>{"+0", "-0"});
  CHECK(t->blocks[0].address == 0x7f0000000040);
  CHECK(t->blocks[0].stream == 2);
  CHECK(t->blocks[0].allocated_us == carve::trace::no_time);
  const auto empty = read_rmm_log(rmm_head, "r.csv");
  REQUIRE(empty);
  CHECK(empty->blocks.empty());
}

TEST_CASE("RMM log: every bad input is refused with a message naming the source, the line or event") {
  const std::string a = "1,10:00:00.000000,allocate,0x10,16,0x0\n";
  CHECK(rmm_error("") ==
        "r.csv: line 1: expected the header \"Thread,Time,Action,Pointer,Size,Stream\", found an empty text");
  CHECK(rmm_error("Thread,Time,Action,Pointer,Stream\n") ==
        "r.csv: line 1: the header \"Thread,Time,Action,Pointer,Stream\" has no Size column (RMM's is "
        "\"Thread,Time,Action,Pointer,Size,Stream\")");
  CHECK(rmm_error("1,10:00:00.000000,allocate,0x10,16,0x0\n") ==
        "r.csv: line 1: the header \"1,10:00:00.000000,allocate,0x10,16,0x0\" has no Thread column (RMM's is "
        "\"Thread,Time,Action,Pointer,Size,Stream\")");
  CHECK(rmm_error("Thread,Time,Action,Pointer,Size,Stream,Size\n") ==
        "r.csv: line 1: the header \"Thread,Time,Action,Pointer,Size,Stream,Size\" names Size twice");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10,16\n") ==
        "r.csv: line 2: 5 fields, expected 6 as in the header");
  CHECK(rmm_error(rmm_head + "t1,10:00:00.000000,allocate,0x10,16,0x0\n") ==
        "r.csv: line 2: Thread \"t1\" is not a decimal number");
  for (const char* time : {"10:00:00", "24:00:00.000000", "10:60:00.000000", "10:00:60.000000", "10:00:00.00000x",
                           "1:00:00.0000000", "10-00-00.000000"}) {
    CAPTURE(time);
    CHECK(rmm_error(rmm_head + "1," + time + ",allocate,0x10,16,0x0\n") ==
          "r.csv: line 2: Time \"" + std::string(time) + "\" is not a time of day HH:MM:SS.ffffff");
  }
  CHECK(rmm_error(rmm_head + "1,,allocate,0x10,16,0x0\n") == "r.csv: line 2: Time is empty");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,deallocate,0x10,16,0x0\n") ==
        "r.csv: line 2: Action \"deallocate\" is not allocate, free or allocate failure");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,nil,16,0x0\n") ==
        "r.csv: line 2: Pointer \"nil\" is not a pointer (hexadecimal, or (nil))");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x,16,0x0\n") ==
        "r.csv: line 2: Pointer \"0x\" is not a pointer (hexadecimal, or (nil))");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10000000000000000,16,0x0\n") ==
        "r.csv: line 2: Pointer \"0x10000000000000000\" does not fit in 64 bits");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10,16 ,0x0\n") ==
        "r.csv: line 2: Size \"16 \" is not a decimal number");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10,16,stream\n") ==
        "r.csv: line 2: Stream \"stream\" is not a pointer (hexadecimal, or (nil))");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,(nil),16,0x0\n") ==
        "r.csv: line 2: an allocation at the null pointer");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x0,16,0x0\n") ==
        "r.csv: line 2: an allocation at the null pointer");
  // What TraceBuilder refuses, by event: the index of the line among those after the header.
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10,0,0x0\n") == "r.csv: event 0: a block of 0 bytes");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x10,9223372036854775808,0x0\n") ==
        "r.csv: event 0: a block of 9223372036854775808 bytes, beyond 2^62");
  CHECK(rmm_error(rmm_head + a + a) == "r.csv: event 1: allocation at 0x10, which is live already");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate failure,(nil),16,0x0\n\n" +
                  "1,10:00:00.000000,free,0x10,16,0x0\n") ==
        "r.csv: event 1: free of address 0x10, which is not live (never allocated, or freed already)");
  CHECK(rmm_error(rmm_head + a + "1,10:00:00.000000,free,0x10,32,0x0\n") ==
        "r.csv: event 1: free of 32 bytes at 0x10, allocated with 16");
}

TEST_CASE("sizes and addresses whose sums overflow 64 bits are refused, never wrapped") {
  constexpr std::uint64_t two62 = std::uint64_t{1} << 62;
  const auto carve_line = [](int seq, const char* action, const char* address, std::uint64_t bytes) {
    return std::to_string(seq) + ",0,0," + action + "," + address + "," + std::to_string(bytes) + ",256,,ok\n";
  };
  // Four blocks of 2^62 bytes live at once would hold 2^64: refused at the second, past 2^62.
  CHECK(carve_error(carve_head + carve_line(0, "allocate", "0x1000", two62) +
                    carve_line(1, "allocate", "0x2000", two62) + carve_line(2, "allocate", "0x3000", two62) +
                    carve_line(3, "allocate", "0x4000", two62)) ==
        "x.csv: event 1: a block of 4611686018427387904 bytes at 0x2000: the blocks live would hold more than 2^62 "
        "bytes");
  CHECK(rmm_error(rmm_head + "1,10:00:00.000000,allocate,0x1000,4611686018427387904,0x0\n" +
                  "1,10:00:00.000001,allocate,0x2000,4611686018427387904,0x0\n") ==
        "r.csv: event 1: a block of 4611686018427387904 bytes at 0x2000: the blocks live would hold more than 2^62 "
        "bytes");
  // One after another they read: the limit is on the bytes live at once.
  const auto t =
      read_carve_csv(carve_head + carve_line(0, "allocate", "0x1000", two62) +
                         carve_line(1, "deallocate", "0x1000", two62) + carve_line(2, "allocate", "0x2000", two62),
                     "x.csv");
  REQUIRE(t);
  CHECK(t->peak_live_bytes() == two62);
  // A block whose end, address + size, does not fit in 64 bits; one ending just below 2^64 reads.
  CHECK(carve_error(carve_head + carve_line(0, "allocate", "0xfffffffffffff000", 4096)) ==
        "x.csv: event 0: a block of 4096 bytes at 0xfffffffffffff000: its end does not fit in 64 bits");
  CHECK(carve_error(carve_head + carve_line(0, "allocate", "0xfffffffffffff000", 4095)) == "");
}

TEST_CASE("the writer: one line per call, exactly as the format says") {
  carve::trace::CarveCsvRecord r;
  r.seq = 3;
  r.thread = 1;
  r.time_ns = 99;
  r.address = 0xdeadbeef00;
  r.bytes = 4096;
  r.alignment = 256;
  CHECK(carve::trace::format_carve_csv(r).view() == "3,1,99,allocate,0xdeadbeef00,4096,256,,ok\n");
  r.stream = 7;
  r.error = carve::Errc::no_space;
  CHECK(carve::trace::format_carve_csv(r).view() == "3,1,99,allocate,,4096,256,7,no space\n");
  r.action = carve::trace::CsvAction::deallocate;
  r.error = carve::Errc::not_allocated;
  CHECK(carve::trace::format_carve_csv(r).view() == "3,1,99,deallocate,0xdeadbeef00,4096,256,7,not allocated\n");
  // The longest line fits.
  const std::uint64_t most = ~std::uint64_t{0};
  const carve::trace::CarveCsvRecord longest{most, most, most, carve::trace::CsvAction::deallocate, most,
                                             most, most, most, carve::Errc::invalid_placement};
  const std::string line(carve::trace::format_carve_csv(longest).view());
  CHECK(line == "18446744073709551615,18446744073709551615,18446744073709551615,deallocate,0xffffffffffffffff,"
                "18446744073709551615,18446744073709551615,18446744073709551615,"
                "fit policy proposed a run that is not free\n");
  std::ostringstream out;
  carve::trace::CarveCsvWriter w(out);
  CHECK(w.write_header());
  CHECK(w.write(r));
  CHECK(w.flush());
  CHECK(out.str() == carve_head + "3,1,99,deallocate,0xdeadbeef00,4096,256,7,not allocated\n");
}

TEST_CASE("round trip: what a TraceResource records reads back as the requests made through it") {
  std::ostringstream log_text;
  auto log = std::make_shared<carve::TraceLog>(log_text);
  carve::TraceResource<carve::CachingPool<carve::SimulatedCard>> pool(carve::SimulatedCard(8 << 20), log);
  std::mt19937_64 rng(7);
  struct Live {
    void* p;
    std::size_t bytes;
    std::size_t alignment;
  };
  std::vector<Live> live;
  std::vector<std::pair<bool, std::uint64_t>> expected; // (allocate, bytes) of each successful call
  std::size_t failures = 0;
  for (int i = 0; i < 2000; ++i) {
    const bool allocate = live.empty() || rng() % 5 < 3;
    if (allocate) {
      // Now and then more than the card holds: recorded, not in the trace.
      const std::size_t bytes = rng() % 50 == 0 ? (16u << 20) : 1 + rng() % 65536;
      const std::size_t alignment = std::size_t{1} << (rng() % 9);
      const auto p = pool.try_allocate(bytes, alignment);
      if (!p) {
        ++failures;
        continue;
      }
      live.push_back({*p, bytes, alignment});
      expected.emplace_back(true, bytes);
    } else {
      const std::size_t k = rng() % live.size();
      const Live l = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      if (rng() % 2 == 0) {
        pool.deallocate(l.p, l.bytes, l.alignment);
      } else {
        REQUIRE(pool.try_deallocate(l.p, l.bytes, l.alignment));
        CHECK(!pool.try_deallocate(l.p, l.bytes, l.alignment)); // twice: refused, recorded, not in the trace
        ++failures;
      }
      expected.emplace_back(false, l.bytes);
    }
  }
  for (const Live& l : live) {
    pool.deallocate(l.p, l.bytes, l.alignment);
    expected.emplace_back(false, l.bytes);
  }
  CHECK(failures > 10);
  log->flush();
  CHECK(log->good());
  CHECK(log->calls() == expected.size() + failures);
  const auto t = read_carve_csv(log_text.str(), "round-trip");
  REQUIRE(t);
  REQUIRE(t->requests.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(t->requests[i].allocate == expected[i].first);
    CHECK(t->blocks[t->requests[i].block].bytes == expected[i].second);
  }
  std::uint64_t live_bytes = 0;
  for (const auto& r : t->requests) {
    live_bytes += r.allocate ? t->blocks[r.block].bytes : 0 - t->blocks[r.block].bytes;
  }
  CHECK(live_bytes == 0);
}

} // namespace test_csv_traces

// The service protocol's encoding: layout, round trips, and every way a message can be wrong.
#include "service_samples.hpp"

#include <carve/service/protocol.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_service_protocol {

using namespace carve::service;
using carve::Errc;
using carve::test::sample_replies;
using carve::test::sample_requests;

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes header(std::uint32_t magic, std::uint16_t version, std::uint16_t type, std::uint32_t length, std::uint32_t seq) {
  Bytes b;
  WireWriter w(b);
  w(magic, version, type, length, seq);
  return b;
}

// Re-encodes whatever decodes; for the canonical-form checks.
Bytes reencode(const Bytes& b, bool request) {
  if (request) {
    const auto d = decode_request(b);
    return d ? encode(d->body, d->sequence) : Bytes{};
  }
  const auto d = decode_reply(b);
  return d ? encode(d->body, d->sequence) : Bytes{};
}

} // namespace

TEST_CASE("the header and fields are little-endian with fixed widths") {
  const Bytes b = encode(Request{Allocate{0x0102030405060708ull, -2}}, 0x0a0b0c0d);
  const Bytes want{0x43, 0x52, 0x56, 0x45,                         // "CRVE"
                   0x02, 0x00,                                     // version 2
                   0x02, 0x00,                                     // allocate
                   0x0c, 0x00, 0x00, 0x00,                         // 12 payload bytes
                   0x0d, 0x0c, 0x0b, 0x0a,                         // sequence
                   0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // bytes
                   0xfe, 0xff, 0xff, 0xff};                        // card -2
  CHECK(b == want);
  const Bytes e = encode(Reply{ErrorReply{Errc::no_space, "ab"}}, 1);
  CHECK(e.size() == header_size + 4 + 2 + 2); // i32 code, u16 length, the text
  CHECK(e[6] == 0xff);
  CHECK(e[7] == 0x80);
  CHECK(e[16] == static_cast<std::uint8_t>(Errc::no_space));
}

TEST_CASE("every message survives a round trip and re-encodes to the same bytes") {
  std::uint32_t seq = 1;
  for (const Request& r : sample_requests()) {
    const Bytes b = encode(r, seq);
    const auto d = decode_request(b);
    REQUIRE_MESSAGE(d, (d ? "" : d.error().message));
    CHECK(d->sequence == seq);
    CHECK(d->body == r);
    CHECK(encode(d->body, d->sequence) == b);
    ++seq;
  }
  for (const Reply& r : sample_replies()) {
    const Bytes b = encode(r, seq);
    const auto d = decode_reply(b);
    REQUIRE_MESSAGE(d, (d ? "" : d.error().message));
    CHECK(d->sequence == seq);
    CHECK(d->body == r);
    CHECK(encode(d->body, d->sequence) == b);
    ++seq;
  }
}

TEST_CASE("a truncated message never decodes") {
  for (const Request& r : sample_requests()) {
    const Bytes b = encode(r, 9);
    for (std::size_t n = 0; n < b.size(); ++n) {
      const auto d = decode_request(std::span<const std::uint8_t>(b.data(), n));
      REQUIRE_FALSE(d);
      CHECK(d.error().fatal);
      CHECK(d.error().code == Errc::bad_message);
    }
  }
  for (const Reply& r : sample_replies()) {
    const Bytes b = encode(r, 9);
    for (std::size_t n = 0; n < b.size(); ++n) {
      CHECK_FALSE(decode_reply(std::span<const std::uint8_t>(b.data(), n)));
    }
  }
  // A header whose length matches a cut payload: the fields themselves run out.
  Bytes cut = encode(Request{Allocate{1, 1}}, 3);
  cut.resize(cut.size() - 4);
  cut[8] = static_cast<std::uint8_t>(cut.size() - header_size);
  const auto d = decode_request(cut);
  REQUIRE_FALSE(d);
  CHECK(d.error().message == "malformed payload: message ends inside a field");
  CHECK(d.error().sequence == 3);
}

TEST_CASE("header errors name the problem") {
  const auto reason = [](const Bytes& b) {
    const auto d = decode_request(b);
    REQUIRE_FALSE(d);
    return d.error();
  };
  CHECK(reason(Bytes(8, 0)).message == "truncated header (8 bytes)");
  CHECK(reason(header(0xdeadbeef, 1, 1, 0, 1)).message == "not a carve message (bad magic)");
  const auto v = reason(header(protocol_magic, 7, 1, 0, 1));
  CHECK(v.code == Errc::unsupported_version);
  CHECK(v.message == "protocol version 7 is not supported (this side speaks 2)");
  // Version 1 named a segment's GPU by the server's ordinal alone: a peer of it is told, not misread.
  Bytes old = encode(Request{Hello{"from before UUIDs"}}, 1);
  old[4] = 1;
  CHECK(reason(old).code == Errc::unsupported_version);
  CHECK(reason(header(protocol_magic, 2, 5, 4, 1)).message == "header announces 4 payload bytes but 0 arrived");
  Bytes trailing = encode(Request{StatsRequest{}}, 1);
  trailing.push_back(0);
  trailing[8] = 1;
  CHECK(reason(trailing).message == "malformed payload: trailing bytes");
  Bytes big = header(protocol_magic, 2, 2, max_request_size, 1);
  big.resize(header_size + max_request_size);
  CHECK(reason(big).message == "message of 4112 bytes exceeds the limit of 4096");
  const auto unknown = reason(header(protocol_magic, protocol_version, 0x8001, 0, 4)); // a reply type sent as a request
  CHECK(unknown.message == "unknown message type 32769");
  CHECK_FALSE(unknown.fatal);
  CHECK(unknown.sequence == 4);
}

// What WireWriter writes for a default `T` (every text and list empty).
template <class T>
std::size_t written_size() {
  Bytes b;
  WireWriter w(b);
  const T fewest{};
  fields(w, fewest);
  return b.size();
}

TEST_CASE("min_wire_size comes from the field lists and agrees with what the writer writes") {
  // Every type that travels in a list: the sizes the layouts add up to (the comments above each
  // fields() say the widths), and the writer's bytes for the fewest-bytes value.
  CHECK(min_wire_size<RegionInfo>() == 40); // u64, i32, i32, u64, u64, u64
  CHECK(min_wire_size<CardStats>() == 88);  // eleven u64
  CHECK(min_wire_size<BorrowCount>() == 20);
  CHECK(min_wire_size<BorrowEvent>() == 24);
  CHECK(min_wire_size<ClientSummary>() == 30); // three u32, two u64, a text's u16 length
  CHECK(min_wire_size<CardInfo>() == 50);      // i32, text, a 16-byte UUID, three u64, a list's u32 count
  CHECK(min_wire_size<SegmentId>() == 8);
  CHECK(min_wire_size<double>() == 8);
  CHECK(min_wire_size<RegionInfo>() == written_size<RegionInfo>());
  CHECK(min_wire_size<CardStats>() == written_size<CardStats>());
  CHECK(min_wire_size<BorrowCount>() == written_size<BorrowCount>());
  CHECK(min_wire_size<BorrowEvent>() == written_size<BorrowEvent>());
  CHECK(min_wire_size<ClientSummary>() == written_size<ClientSummary>());
  CHECK(min_wire_size<CardInfo>() == written_size<CardInfo>());
  // And for every message: a default one's payload is exactly its fewest bytes.
  const auto payload = [](const auto& message) {
    using M = std::remove_cvref_t<decltype(message)>;
    CHECK(encode(Request{message}, 1).size() - header_size == min_wire_size<M>());
  };
  std::apply([&](const auto&... m) { (payload(m), ...); },
             std::tuple<Hello, Allocate, Free, Query, StatsRequest, CardsRequest, Unmapped, WaitReclaimed>{});
  const auto reply_payload = [](const auto& message) {
    using M = std::remove_cvref_t<decltype(message)>;
    CHECK(encode(Reply{message}, 1).size() - header_size == min_wire_size<M>());
  };
  std::apply([&](const auto&... m) { (reply_payload(m), ...); },
             std::tuple<HelloReply, Allocated, Freed, QueryReply, StatsReply, CardsReply, SegmentsRetired, ErrorReply,
                        Reclaimed>{});
  // A list whose count promises more elements than the bytes could hold is refused before
  // anything is built: the check min_wire_size exists for.
  CardsReply two;
  two.cards.resize(2);
  Bytes cut = encode(Reply{two}, 1);
  cut.resize(cut.size() - 1);
  const std::uint32_t length = static_cast<std::uint32_t>(cut.size() - header_size);
  for (std::size_t i = 0; i < 4; ++i) {
    cut[8 + i] = static_cast<std::uint8_t>(length >> (8 * i));
  }
  const auto d = decode_reply(cut);
  REQUIRE_FALSE(d);
  CHECK(d.error().message == "malformed payload: list count exceeds the message");
}

TEST_CASE("out-of-range values are refused") {
  const auto fails = [](Bytes b, std::size_t at, std::uint8_t value, const std::string& why) {
    b[at] = value;
    const auto d = decode_reply(b);
    REQUIRE_FALSE(d);
    CHECK(d.error().message == "malformed payload: " + why);
  };
  const Bytes hello = encode(Reply{HelloReply{1, 2, 3, 4, 5, carve::ExportKind::shared_memory}}, 1);
  fails(hello, hello.size() - 1, 9, "unknown export kind");
  fails(hello, hello.size() - 1, 0, "unknown export kind");
  fails(hello, hello.size() - 1, 6, "unknown export kind");
  for (const auto kind : {carve::ExportKind::cuda_vmm, carve::ExportKind::host_vmm,
                          carve::ExportKind::cuda_fabric}) { // the kinds added after version 1 read back
    const auto d = decode_reply(encode(Reply{HelloReply{1, 2, 3, 4, 5, kind}}, 1));
    REQUIRE(d);
    CHECK(std::get<HelloReply>(d->body).backend == kind);
  }
  const Bytes error = encode(Reply{ErrorReply{Errc::no_space, "x"}}, 1);
  fails(error, header_size, 0, "unknown error code");
  fails(error, header_size, 200, "unknown error code");
  Allocated a;
  const Bytes allocated = encode(Reply{a}, 1);
  fails(allocated, allocated.size() - 1, 2, "a flag that is neither 0 nor 1");
}

TEST_CASE("text and lists have limits, and a count cannot outrun the message") {
  const Bytes long_name = encode(Request{Hello{std::string(500, 'n')}}, 1);
  const auto clipped = decode_request(long_name); // the writer cuts to the limit
  REQUIRE(clipped);
  CHECK(std::get<Hello>(clipped->body).client_name == std::string(max_name_length, 'n'));

  Bytes b = encode(Request{Hello{"x"}}, 1);
  b[header_size] = 65; // one more than max_name_length
  CHECK(decode_request(b).error().message == "malformed payload: text longer than its limit");

  Unmapped many;
  many.segments.assign(max_segment_list + 10, 7);
  const auto cut = decode_request(encode(Request{many}, 1));
  REQUIRE(cut);
  CHECK(std::get<Unmapped>(cut->body).segments.size() == max_segment_list);

  Bytes count = encode(Request{Unmapped{{1}}}, 1);
  count[header_size] = 0xff;
  count[header_size + 1] = 0x01; // 511 entries announced, one present
  CHECK(decode_request(count).error().message == "malformed payload: list longer than its limit");
  count[header_size] = 100; // within the limit, but 800 bytes do not follow
  count[header_size + 1] = 0;
  CHECK(decode_request(count).error().message == "malformed payload: list count exceeds the message");
}

TEST_CASE("random damage: every result is an error or a message that re-encodes to itself") {
  std::mt19937 rng(5);
  std::vector<Bytes> valid;
  for (const Request& r : sample_requests()) {
    valid.push_back(encode(r, 1));
  }
  const std::size_t requests = valid.size();
  for (const Reply& r : sample_replies()) {
    valid.push_back(encode(r, 2));
  }
  int decoded = 0;
  for (int round = 0; round < 20000; ++round) {
    const std::size_t which = rng() % valid.size();
    Bytes b = valid[which];
    for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips) {
      b[rng() % b.size()] = static_cast<std::uint8_t>(rng());
    }
    const bool request = which < requests;
    const Bytes again = reencode(b, request);
    if (!again.empty()) {
      ++decoded;
      CHECK(again == b);
    }
  }
  CHECK(decoded > 100); // damage in values (not structure) still decodes
}

TEST_CASE("the fuzz corpus is the encoding of the samples") {
  // CARVE_WRITE_SEEDS=1 rewrites the corpus after a protocol change.
  const std::filesystem::path dir = std::filesystem::path(CARVE_TEST_DATA_DIR) / "service";
  const bool write = std::getenv("CARVE_WRITE_SEEDS") != nullptr;
  std::vector<std::pair<std::string, Bytes>> seeds;
  std::uint32_t seq = 1;
  for (const Request& r : sample_requests()) {
    seeds.emplace_back("request_" + std::to_string(seq) + ".bin", encode(r, seq));
    ++seq;
  }
  for (const Reply& r : sample_replies()) {
    seeds.emplace_back("reply_" + std::to_string(seq) + ".bin", encode(r, seq));
    ++seq;
  }
  for (const auto& seed : seeds) {
    const std::string& name = seed.first;
    const Bytes& bytes = seed.second;
    CAPTURE(name);
    if (write) {
      std::ofstream(dir / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    std::ifstream in(dir / name, std::ios::binary);
    const Bytes stored{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    CHECK(stored == bytes);
  }
}

} // namespace test_service_protocol

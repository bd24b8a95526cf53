// libFuzzer target for carve's service protocol. Every input is decoded as a request and as a
// reply: each must either fail with a reason or decode to a message that re-encodes to exactly
// the input (the encoding is canonical). The input is then handed, as a message from a client,
// to a live AllocationService over two shared-memory cards: whatever it asks, the service must
// answer with messages that decode, and its pools and region table must stay consistent.
#include <carve/service/allocation_service.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/shared_memory_card.hpp>
#include <carve/topology/topology.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace {

using namespace carve::service;

void require(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

template <class Decoded>
void check_canonical(const Decoded& d, std::span<const std::uint8_t> input) {
  if (d) {
    const std::vector<std::uint8_t> again = encode(d->body, d->sequence);
    require(again.size() == input.size() && std::equal(again.begin(), again.end(), input.begin()));
  } else {
    require(!d.error().message.empty());
    require(d.error().fatal || d.error().code == carve::Errc::bad_message);
  }
}

struct Harness {
  Harness() : service(topology(), cards(), options()) { greet(); }

  static carve::Topology topology() {
    carve::TopologyBuilder b;
    const auto g0 = b.add_gpu("GPU0");
    const auto g1 = b.add_gpu("GPU1");
    b.add_link(g0, g1, carve::LinkType::nvlink, 2);
    return b.build();
  }
  static std::vector<carve::SharedMemoryCard> cards() {
    return {carve::SharedMemoryCard(4 << 20), carve::SharedMemoryCard(1 << 20)};
  }
  static ServiceOptions options() { return {}; }

  void greet() {
    client = service.connect(PeerCredentials{1, 0, 0});
    std::vector<Outgoing> out;
    service.receive(client, encode(Request{Hello{"fuzz"}}, 1), out);
  }

  void feed(std::span<const std::uint8_t> input) {
    std::vector<Outgoing> out;
    service.receive(client, input, out);
    bool closing = false;
    for (const Outgoing& o : out) {
      require(decode_reply(o.bytes).has_value());
      closing = closing || o.close_after;
    }
    // A new session now and then, so the cards do not stay full of regions nobody frees.
    if (closing || ++fed % 256 == 0) {
      service.disconnect(client, out);
      require(service.region_count() == 0);
      greet();
    }
    if (fed % 64 == 0) {
      require(service.consistent());
    }
  }

  AllocationService<carve::SharedMemoryCard> service;
  ClientId client = 0;
  unsigned fed = 0;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> input(data, size);
  check_canonical(decode_request(input), input);
  check_canonical(decode_reply(input), input);
  static Harness harness;
  harness.feed(input);
  return 0;
}

// detail::WatchedChunks: the blocks counted on lent holes' chunks and second mappings, and when a
// chunk may bring its holes home (no block on it nor on any of its second mappings).
#include <carve/vmm/detail/watched_chunks.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace test_watched_chunks {

using carve::detail::WatchedChunks;

constexpr std::size_t g = std::size_t{2} << 20; // a granule
constexpr std::uintptr_t base = std::uintptr_t{1} << 40;
constexpr std::uintptr_t at(std::size_t granule) { return base + granule * g; }

// (start, bytes, users) of every watched chunk, by start; false where a chunk's count of second
// mappings in use is wrong.
std::map<std::uintptr_t, std::pair<std::size_t, std::size_t>> listed(const WatchedChunks& w, bool& right) {
  std::map<std::uintptr_t, std::pair<std::size_t, std::size_t>> out;
  right = w.for_each([&](std::uintptr_t s, std::size_t n, std::size_t users) { out[s] = {n, users}; });
  return out;
}

TEST_CASE("a chunk is ready once no block touches it nor its second mappings, whichever goes last") {
  WatchedChunks w(base, g, true);
  w.watch_home(at(0), 8 * g, 1);         // one block pins the chunk
  w.watch_second(at(100), 2 * g, at(0)); // a hole's second mapping, lent to a block
  w.watch_second(at(200), 1 * g, at(0)); // another hole's
  w.add(at(100), 3 * g);                 // the borrower, on the first second mapping and past it
  CHECK(!w.ready(at(0)));
  CHECK(!w.remove(at(1), g / 2)); // the chunk's block: the borrower still uses a second mapping
  CHECK(!w.ready(at(0)));
  CHECK(w.unused(at(0)));
  std::vector<std::uintptr_t> homes;
  CHECK(w.remove(at(100), 3 * g)); // the borrower: the other second mapping never had a block
  w.for_each_ready_in(at(100), 3 * g, [&](std::uintptr_t home) { homes.push_back(home); });
  CHECK(homes == std::vector<std::uintptr_t>{at(0)});
  CHECK(w.ready(at(0)));
  w.add(at(200) + 4096, 512); // a block on the second one: not ready again
  CHECK(!w.ready(at(0)));
  CHECK(w.remove(at(200) + 4096, 512));
  CHECK(w.ready(at(0)));
  bool right = false;
  const auto chunks = listed(w, right);
  CHECK(right);
  CHECK(chunks.size() == 3);
}

TEST_CASE("a block across a chunk and its second mapping counts on both, once each") {
  WatchedChunks w(base, g, true);
  w.watch_home(at(0), 4 * g, 0);
  w.watch_second(at(4), 2 * g, at(0)); // right after the chunk
  w.add(at(3), 2 * g);                 // its last granule and the second mapping's first
  bool right = false;
  auto chunks = listed(w, right);
  CHECK(right);
  CHECK(chunks[at(0)].second == 1);
  CHECK(chunks[at(4)].second == 1);
  CHECK(!w.ready(at(0)));
  CHECK(w.remove(at(3), 2 * g));
  std::set<std::uintptr_t> homes;
  w.for_each_ready_in(at(3), 2 * g, [&](std::uintptr_t home) { homes.insert(home); });
  CHECK(homes == std::set<std::uintptr_t>{at(0)}); // visited twice (once from each), the same home
}

TEST_CASE("blocks off the watched granules count nowhere, across many bitmap words") {
  WatchedChunks w(base, g, true);
  w.watch_home(at(130), 3 * g, 0); // in the bitmap's third word
  w.add(at(0), 129 * g);           // up to the granule before it
  w.add(at(133), 70 * g);          // from the granule after it
  w.add(base - g, g);              // below the reservation
  CHECK(w.unused(at(130)));
  w.add(at(0), 131 * g); // into its first granule
  CHECK(!w.unused(at(130)));
  CHECK(w.remove(at(0), 131 * g));
  CHECK(w.ready(at(130)));
}

TEST_CASE("a forgotten chunk's slot and granules serve the next, and nothing watched costs nothing") {
  WatchedChunks w(base, g, true);
  w.watch_home(at(0), 2 * g, 0);
  w.watch_second(at(10), g, at(0));
  w.add(at(10), g);
  w.forget(at(10)); // unmapped with a block on it (trim, say): the chunk no longer waits for it
  CHECK(w.ready(at(0)));
  w.forget(at(0));
  CHECK(!w.watched(at(0)));
  CHECK(!w.ready(at(0)));
  w.add(at(0), 2 * g);       // nothing watched: no count anywhere
  w.watch_home(at(1), g, 0); // reuses a slot; granule 1 now names it
  w.watch_second(at(5), g, at(1));
  w.add(at(0), 2 * g);
  w.add(at(0), g / 2); // inside granule 0: the table alone answers, and the forgotten chunk's entry is gone
  bool right = false;
  auto chunks = listed(w, right);
  CHECK(right);
  CHECK(chunks.size() == 2);
  CHECK(chunks[at(1)] == std::pair<std::size_t, std::size_t>{g, 1});
  CHECK(!w.watched(at(0)));
  CHECK(w.unused(at(5)));
  w.watch_second(at(7), g, at(5)); // a second mapping is no chunk: refused
  CHECK(!w.watched(at(7)));
}

} // namespace test_watched_chunks

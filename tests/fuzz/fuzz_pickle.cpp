// libFuzzer target for carve's pickle reader, and the PyTorch memory snapshot reader over it.
// Every input must either fail with Errc::bad_message
// and a message "fuzz: byte <offset>: ..." naming an offset within the input, or decode to a
// document that holds together: the root and every item and entry an Id in the arena, every text
// inside it, str valid UTF-8 (surrogates allowed), the neutral answer to every question about
// another kind. The walk visits each value once, so cycles end it. A document is then read as a
// snapshot: it is a trace whose every free follows its allocation and whose blocks are of 1 to
// 2^62 bytes, or an error naming the source. Anything else (a crash, an exception, a sanitizer
// report) is a bug.
#include <carve/trace/memory_snapshot.hpp>
#include <carve/trace/pickle_reader.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

using carve::trace::PickleDocument;
using Id = PickleDocument::Id;
using Kind = PickleDocument::Kind;

void require(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

// Whether `s` is UTF-8 with surrogates allowed (what Python's "surrogatepass" reads).
bool utf8(std::string_view s) {
  for (std::size_t k = 0; k < s.size();) {
    const auto lead = static_cast<unsigned char>(s[k]);
    const std::size_t length = lead < 0x80 ? 1 : lead >= 0xc2 && lead < 0xe0 ? 2 : lead >= 0xe0 && lead < 0xf0 ? 3 : 4;
    if ((lead >= 0x80 && lead < 0xc2) || lead > 0xf4 || s.size() - k < length) {
      return false;
    }
    std::uint32_t cp = length == 1 ? lead : lead & (0x7fU >> length);
    for (std::size_t t = 1; t < length; ++t) {
      const auto c = static_cast<unsigned char>(s[k + t]);
      if ((c & 0xc0) != 0x80) {
        return false;
      }
      cp = cp << 6 | (c & 0x3fU);
    }
    const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[length] || cp > 0x10ffff) {
      return false;
    }
    k += length;
  }
  return true;
}

void walk(const PickleDocument& d) {
  const std::size_t size = d.size();
  require(size >= 1 && d.root() < size);
  std::vector<bool> seen(size, false);
  std::vector<Id> todo{d.root()};
  seen[d.root()] = true;
  const auto visit = [&](Id v) {
    require(v < size);
    if (!seen[v]) {
      seen[v] = true;
      todo.push_back(v);
    }
  };
  std::size_t visited = 0;
  while (!todo.empty()) {
    const Id v = todo.back();
    todo.pop_back();
    require(++visited <= size);
    const Kind k = d.kind(v);
    require(k != Kind::boolean ? !d.boolean(v) : true);
    require(k != Kind::integer ? d.integer(v) == 0 : true);
    require(k != Kind::floating ? d.floating(v) == 0.0 : true);
    require(k == Kind::string || k == Kind::bytes || d.text(v).empty());
    require(k == Kind::list || k == Kind::tuple || d.items(v).empty());
    require(k == Kind::dict || (d.entries(v).empty() && !d.find(v, "")));
    if (k == Kind::string) {
      require(utf8(d.text(v)));
    }
    for (const Id item : d.items(v)) {
      visit(item);
    }
    for (const auto& [key, value] : d.entries(v)) {
      visit(key);
      visit(value);
      if (d.kind(key) == Kind::string) {
        const auto found = d.find(v, d.text(key));
        require(found && *found < size);
      }
    }
  }
  require(d.kind(static_cast<Id>(size)) == Kind::none && d.items(static_cast<Id>(size)).empty());
}

// The snapshot reader on a document that decodes: a sound trace or a message naming the source.
void check_snapshot(std::string_view bytes) {
  const auto t = carve::trace::read_memory_snapshot(bytes, "fuzz");
  if (!t) {
    require(t.error().message.substr(0, 6) == "fuzz: ");
    return;
  }
  std::vector<bool> live(t->blocks.size(), false);
  for (std::uint32_t b = 0; b < t->start_blocks; ++b) {
    live[b] = true;
  }
  for (const auto& block : t->blocks) {
    require(block.bytes >= 1 && block.bytes <= carve::trace::max_block_bytes);
  }
  for (const auto& r : t->requests) {
    require(r.block < t->blocks.size() && live[r.block] != r.allocate);
    live[r.block] = r.allocate;
  }
  (void)t->peak_live_bytes();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto doc = carve::trace::read_pickle(bytes, "fuzz");
  if (!doc) {
    const std::string_view m = doc.error().message;
    require(doc.error().code == carve::Errc::bad_message && m.substr(0, 11) == "fuzz: byte ");
    std::size_t offset = 0;
    std::size_t i = 11;
    for (; i < m.size() && m[i] >= '0' && m[i] <= '9'; ++i) {
      offset = offset * 10 + static_cast<std::size_t>(m[i] - '0');
    }
    require(i > 11 && offset <= size && m.substr(i, 2) == ": ");
    return 0;
  }
  require(doc->bytes_read() >= 1 && doc->bytes_read() <= size && bytes[doc->bytes_read() - 1] == '.');
  walk(*doc);
  check_snapshot(bytes);
  return 0;
}

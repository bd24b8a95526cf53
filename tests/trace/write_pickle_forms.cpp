// Writes one document in every form PickleWriter has into the directory named by argv[1], one
// file per form (python-4.pickle, python-4-frames-64.pickle, python-5.pickle, plain-4.pickle,
// protocol-2.pickle, protocol-1.pickle): check_pickle_forms.py loads each with Python's own
// unpickler, so the forms the snapshot tests write are pickles Python reads, all alike.
#include <trace/pickle_writer.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>

namespace {

using carve::test::PickleWriter;

// 300 dicts of every kind of value the snapshots hold; the first one's frames list is shared by
// the next nine, the 280th's by the rest (past memo index 255 in Python's form). Containers of
// none, one and (where `large`) 1001 items and 1000 pairs, where the C pickler's batches end
// differently from the pure-Python one's.
std::string document(int protocol, PickleWriter::Form form, std::size_t frame_bytes, bool large) {
  PickleWriter w(protocol, form, frame_bytes);
  w.dict().str("segments").list();
  for (std::int64_t i = 0; i < 300; ++i) {
    w.dict().item("address", std::int64_t{0x7f0000000000} + i * 512).item("size", i * 1000 - 70000);
    w.item("far", -i * 100'000'000'000).item("state", i % 2 == 0 ? "active_allocated" : "inactive");
    w.str("pool")
        .pair(i, -i)
        .str("expandable")
        .boolean(i % 2 == 0)
        .str("fraction")
        .floating(static_cast<double>(i) / 3.0);
    w.str("nothing").none().str("line").unknown_line().str("frames");
    if (i == 0 || i == 279) {
      w.list().dict().item("filename", "train.py").item("line", 42).dict_end().str("??").list_end().put(1);
    } else if (i < 10 || i > 279) { // BINGET of the first list, LONG_BINGET of the second
      w.get(1);
    } else {
      w.list().list_end();
    }
    w.dict_end();
  }
  w.list_end().str("empty").dict().dict_end().str("none").list().list_end();
  w.str("one").list().integer(7).list_end().str("one pair").dict().item("k", 1).dict_end();
  if (large) {
    w.str("1001").list();
    for (std::int64_t i = 0; i < 1001; ++i) {
      w.integer(i * 3);
    }
    w.list_end().str("1000 pairs").dict();
    for (std::int64_t i = 0; i < 1000; ++i) {
      w.item("key " + std::to_string(i), i);
    }
    w.dict_end();
  }
  return w.dict_end().stop();
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_pickle_forms DIRECTORY\n");
    return 2;
  }
  using Form = PickleWriter::Form;
  // The 64-byte frames are checked against the pure-Python pickler, which batches the large
  // containers differently: that file leaves them out.
  for (const auto& [name, protocol, form, frame, large] :
       {std::tuple{"python-4", 4, Form::python, std::size_t{64} << 10, true},
        {"python-4-frames-64", 4, Form::python, 64, false},
        {"python-5", 5, Form::python, std::size_t{64} << 10, true},
        {"plain-4", 4, Form::plain, 0, true},
        {"protocol-2", 2, Form::plain, 0, true},
        {"protocol-1", 1, Form::plain, 0, true}}) {
    std::ofstream out(std::string(argv[1]) + "/" + name + ".pickle", std::ios::binary);
    out << document(protocol, form, frame, large);
    if (!out) {
      std::fprintf(stderr, "write_pickle_forms: cannot write %s/%s.pickle\n", argv[1], name);
      return 1;
    }
  }
  return 0;
}

// The safe pickle reader: pickles that Python's own pickle module wrote, protocols 0 to 5, read to
// the values they hold; memo sharing, mutation through a memo reference and cycles; every refusal
// and error with its exact message; and, where the repository's shared traces are present, a real
// PyTorch memory snapshot. Each pickle's comment gives the Python expression that wrote it (Python
// 3.11), or, for one written by hand, what `pickle.loads` reads it as.
#include <carve/trace/pickle_reader.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_pickle_reader {

using carve::Errc;
using carve::trace::PickleDocument;
using carve::trace::read_pickle;
using Id = PickleDocument::Id;
using Kind = PickleDocument::Kind;
using namespace std::string_view_literals;

namespace {

PickleDocument read(std::string_view bytes) {
  auto doc = read_pickle(bytes, "t.pickle");
  REQUIRE_MESSAGE(doc, (doc ? "" : doc.error().message));
  return std::move(*doc);
}

// The message read_pickle fails with (checking the code); "" when it reads the input.
std::string error(std::string_view bytes) {
  const auto doc = read_pickle(bytes, "t.pickle");
  if (doc) {
    return "";
  }
  CHECK(doc.error().code == Errc::bad_message);
  return doc.error().message;
}

// `v` as Python's repr writes it, sets being the lists they read as; a container met again inside
// itself is written as Python writes it: [...], (...), {...}.
std::string show(const PickleDocument& d, Id v, std::vector<Id>& path) {
  const auto again = std::find(path.begin(), path.end(), v) != path.end();
  std::string out;
  switch (d.kind(v)) {
  case Kind::none:
    return "None";
  case Kind::boolean:
    return d.boolean(v) ? "True" : "False";
  case Kind::integer:
    return std::to_string(d.integer(v));
  case Kind::big_integer: // its value is not kept
    return d.big_negative(v) ? "<below -2**63>" : "<above 2**63-1>";
  case Kind::floating: {
    char text[64];
    const auto end = std::to_chars(text, text + sizeof text, d.floating(v)).ptr;
    out.assign(text, end);
    return out.find_first_of(".eina") == std::string::npos ? out + ".0" : out;
  }
  case Kind::string:
    return "'" + std::string(d.text(v)) + "'";
  case Kind::bytes:
    return "b'" + std::string(d.text(v)) + "'";
  case Kind::list:
  case Kind::tuple: {
    const bool list = d.kind(v) == Kind::list;
    if (again) {
      return list ? "[...]" : "(...)";
    }
    path.push_back(v);
    for (const Id item : d.items(v)) {
      out += (out.empty() ? "" : ", ") + show(d, item, path);
    }
    path.pop_back();
    return list ? "[" + out + "]" : "(" + out + (d.items(v).size() == 1 ? ",)" : ")");
  }
  case Kind::dict:
    if (again) {
      return "{...}";
    }
    path.push_back(v);
    for (const auto& [key, value] : d.entries(v)) {
      out += (out.empty() ? "" : ", ") + show(d, key, path) + ": " + show(d, value, path);
    }
    path.pop_back();
    return "{" + out + "}";
  }
  return "?";
}

std::string show(std::string_view bytes) {
  const PickleDocument d = read(bytes);
  std::vector<Id> path;
  return show(d, d.root(), path);
}

} // namespace

TEST_CASE("protocols 0 to 5 read Python's scalars") {
  // pickle.dumps([None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31-1, 2**31,
  //               2**63-1, -2**63, 1.5, -0.0, 'h\xe9\u20ac\U0001f600', ''], protocol=p), p = 0 .. 5
  const std::string_view pickles[] = {
      // INT (with "01" and "00"), LONG, FLOAT, UNICODE, MARK, LIST, APPEND, PUT
      "(lp0\nNaI01\naI00\naI0\naI1\naI-1\naI255\naI256\naI65535\naI65536\naI-2147483648\naI2147483647\naL2147483648L\n"
      "aL9223372036854775807L\naL-9223372036854775808L\naF1.5\naF-0.0\naVh\xe9\\u20ac\\U0001f600\np1\naV\np2\na."sv,
      // BININT, BININT1, BININT2, INT, LONG, BINFLOAT, BINUNICODE, EMPTY_LIST, APPENDS, BINPUT
      "]q\x00(NI01\nI00\nK\x00K\x01J\xff\xff\xff\xffK\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\x00\x00\x00\x80J\xff\xff"
      "\xff\x7fL2147483648L\nL9223372036854775807L\nL-9223372036854775808L\nG?\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00"
      "\x00\x00\x00\x00\x00X\n\x00\x00\x00h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80q\x01X\x00\x00\x00\x00q\x02"
      "e."sv,
      // PROTO, NEWTRUE, NEWFALSE, LONG1
      "\x80\x02]q\x00("
      "N\x88\x89K\x00K\x01J\xff\xff\xff\xffK\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\x00\x00\x00\x80J\xff"
      "\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08\x00\x00\x00\x00\x00\x00"
      "\x00\x80G?\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00\x00X\n\x00\x00\x00h\xc3\xa9\xe2\x82\xac\xf0"
      "\x9f\x98\x80q\x01X\x00\x00\x00\x00q\x02"
      "e."sv,
      "\x80\x03]q\x00("
      "N\x88\x89K\x00K\x01J\xff\xff\xff\xffK\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\x00\x00\x00\x80J\xff"
      "\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08\x00\x00\x00\x00\x00\x00"
      "\x00\x80G?\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00\x00X\n\x00\x00\x00h\xc3\xa9\xe2\x82\xac\xf0"
      "\x9f\x98\x80q\x01X\x00\x00\x00\x00q\x02"
      "e."sv,
      // FRAME, MEMOIZE, SHORT_BINUNICODE
      "\x80\x04\x95"
      "e\x00\x00\x00\x00\x00\x00\x00]\x94(N\x88\x89K\x00K\x01J\xff\xff\xff\xffK\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J"
      "\x00\x00\x00\x80J\xff\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08"
      "\x00"
      "\x00\x00\x00\x00\x00\x00\x80G?"
      "\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00\x00\x8c\nh\xc3\xa9\xe2\x82"
      "\xac\xf0\x9f\x98\x80\x94\x8c\x00\x94"
      "e."sv,
      "\x80\x05\x95"
      "e\x00\x00\x00\x00\x00\x00\x00]\x94(N\x88\x89K\x00K\x01J\xff\xff\xff\xffK\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J"
      "\x00\x00\x00\x80J\xff\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08"
      "\x00"
      "\x00\x00\x00\x00\x00\x00\x80G?"
      "\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00\x00\x8c\nh\xc3\xa9\xe2\x82"
      "\xac\xf0\x9f\x98\x80\x94\x8c\x00\x94"
      "e."sv};
  for (int p = 0; p <= 5; ++p) {
    CAPTURE(p);
    const std::string_view bytes = pickles[p];
    CHECK(show(bytes) ==
          "[None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 2147483648, "
          "9223372036854775807, -9223372036854775808, 1.5, -0.0, 'h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80',"
          " '']");
    const PickleDocument d = read(bytes);
    CHECK(d.bytes_read() == bytes.size());
    CHECK(std::signbit(d.floating(d.items(d.root())[16])));
  }
}

TEST_CASE("protocols 0 to 5 read Python's lists, tuples and dicts") {
  // pickle.dumps({'a': [1, 2], 'b': (3,), 'c': (), 'd': (1, 2), 'e': (1, 2, 3), 'f': (1, 2, 3, 4), 'g': {}},
  //              protocol=p), p = 0 .. 5
  const std::string_view pickles[] = {// DICT, SETITEM, TUPLE, GET-free PUT
                                      "(dp0\nVa\np1\n(lp2\nI1\naI2\nasVb\np3\n(I3\ntp4\nsVc\np5\n(tsVd\np6\n("
                                      "I1\nI2\ntp7\nsVe\np8\n(I1\nI2\nI3\ntp9\nsVf"
                                      "\np10\n(I1\nI2\nI3\nI4\ntp11\nsVg\np12\n(dp13\ns."sv,
                                      // EMPTY_DICT, SETITEMS, EMPTY_TUPLE
                                      "}q\x00(X\x01\x00\x00\x00"
                                      "aq\x01]q\x02(K\x01K\x02"
                                      "eX\x01\x00\x00\x00"
                                      "bq\x03(K\x03tq\x04X\x01\x00\x00\x00"
                                      "cq\x05)X\x01\x00\x00\x00"
                                      "dq\x06(K\x01K\x02tq\x07X\x01\x00\x00\x00"
                                      "eq\x08(K\x01K\x02K\x03tq\x09X\x01\x00\x00\x00"
                                      "fq\n(K\x01K\x02K\x03K\x04tq\x0bX\x01\x00\x00\x00gq\x0c}q\x0du."sv,
                                      // TUPLE1, TUPLE2, TUPLE3
                                      "\x80\x02}q\x00(X\x01\x00\x00\x00"
                                      "aq\x01]q\x02(K\x01K\x02"
                                      "eX\x01\x00\x00\x00"
                                      "bq\x03K\x03\x85q\x04X\x01\x00\x00\x00"
                                      "cq\x05)X\x01\x00\x00\x00"
                                      "dq\x06K\x01K\x02\x86q\x07X\x01\x00\x00\x00"
                                      "eq\x08K\x01K\x02K\x03\x87q\x09X\x01\x00\x00\x00"
                                      "fq\n(K\x01K\x02K\x03K\x04tq\x0bX\x01\x00\x00\x00gq\x0c}q\x0du."sv,
                                      "\x80\x03}q\x00(X\x01\x00\x00\x00"
                                      "aq\x01]q\x02(K\x01K\x02"
                                      "eX\x01\x00\x00\x00"
                                      "bq\x03K\x03\x85q\x04X\x01\x00\x00\x00"
                                      "cq\x05)X\x01\x00\x00\x00"
                                      "dq\x06K\x01K\x02\x86q\x07X\x01\x00\x00\x00"
                                      "eq\x08K\x01K\x02K\x03\x87q\x09X\x01\x00\x00\x00"
                                      "fq\n(K\x01K\x02K\x03K\x04tq\x0bX\x01\x00\x00\x00gq\x0c}q\x0du."sv,
                                      "\x80\x04\x95I\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
                                      "a\x94]\x94(K\x01K\x02"
                                      "e\x8c\x01"
                                      "b\x94K\x03\x85\x94\x8c\x01"
                                      "c\x94)\x8c\x01"
                                      "d\x94K\x01K\x02\x86\x94\x8c\x01"
                                      "e\x94K\x01K\x02K\x03\x87\x94\x8c\x01"
                                      "f\x94(K\x01K\x02K\x03K\x04t\x94\x8c\x01g\x94}\x94u."sv,
                                      "\x80\x05\x95I\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
                                      "a\x94]\x94(K\x01K\x02"
                                      "e\x8c\x01"
                                      "b\x94K\x03\x85\x94\x8c\x01"
                                      "c\x94)\x8c\x01"
                                      "d\x94K\x01K\x02\x86\x94\x8c\x01"
                                      "e\x94K\x01K\x02K\x03\x87\x94\x8c\x01"
                                      "f\x94(K\x01K\x02K\x03K\x04t\x94\x8c\x01g\x94}\x94u."sv};
  for (int p = 0; p <= 5; ++p) {
    CAPTURE(p);
    CHECK(show(pickles[p]) ==
          "{'a': [1, 2], 'b': (3,), 'c': (), 'd': (1, 2), 'e': (1, 2, 3), 'f': (1, 2, 3, 4), 'g': {}}");
    const PickleDocument d = read(pickles[p]);
    CHECK(d.kind(*d.find(d.root(), "b")) == Kind::tuple);
    CHECK(d.items(*d.find(d.root(), "f")).size() == 4);
    CHECK(d.entries(*d.find(d.root(), "g")).empty());
    CHECK(!d.find(d.root(), "h"));
  }
}

TEST_CASE("protocol 0's text arguments: floats, escaped str, Python 2 strings") {
  // pickle.dumps([float('inf'), float('nan'), float('-inf'), 1e300, 5e-324, 0.1], 0)
  CHECK(show("(lp0\nFinf\naFnan\naF-inf\naF1e+300\naF5e-324\naF0.1\na."sv) == "[inf, nan, -inf, 1e+300, 5e-324, 0.1]");
  // pickle.dumps('a\\b\nc\r\x1a\x00\u1234\U00012345', 0): pickle escapes the backslash and the
  // line breaks as \u escapes
  const PickleDocument s = read("Va\\u005cb\\u000ac\\u000d\\u001a\\u0000\\u1234\\U00012345\np0\n."sv);
  CHECK(s.text(s.root()) == "a\\b\nc\r\x1a\0\xe1\x88\xb4\xf0\x92\x8d\x85"sv);
  // By hand; pickle.loads reads '\\\\u0041\\x': a backslash before anything but u or U stands
  // for itself, the character after it too
  CHECK(read("V\\\\u0041\\x\n."sv).text(0) == "\\\\u0041\\x"sv);
  // By hand; pickle.loads reads '\ud800', a lone surrogate, kept as its three UTF-8 bytes (as
  // BINUNICODE carries it)
  CHECK(show("V\\ud800\n."sv) == "'\xed\xa0\x80'");
  CHECK(show("X\x03\x00\x00\x00\xed\xa0\x80."sv) == "'\xed\xa0\x80'");
  // By hand; pickle.loads reads 'aA\n\'A\\q"' (an unknown escape keeps its backslash) and "it's"
  CHECK(read("S'a\\x41\\n\\'\\101\\q\"'\n."sv).text(0) == "aA\n'A\\q\"");
  CHECK(show("S\"it's\"\n."sv) == "'it's'");
  // By hand: BINSTRING, SHORT_BINSTRING; pickle.loads reads 'abc'
  CHECK(show("T\x03\x00\x00\x00"
             "abc."sv) == "'abc'");
  CHECK(show("U\x03"
             "abc."sv) == "'abc'");
  // By hand: INT and LONG, negative; pickle.loads reads -5 and -5
  CHECK(show("I-5\n."sv) == "-5");
  CHECK(show("L-5\n."sv) == "-5");
}

TEST_CASE("text integers beyond 64-bit signed read as big_integer, as binary ones do") {
  // pickle.dumps([2**64 - 1, -2**63 - 1, 2**63, 2**31, 7, -2**63], 0): LONG text for each int
  // beyond 32 bits, INT for the rest
  const std::string_view p0 =
      "(lp0\nL18446744073709551615L\naL-9223372036854775809L\naL9223372036854775808L\naL2147483648L\n"
      "aI7\naL-9223372036854775808L\na."sv;
  const std::string want = "[<above 2**63-1>, <below -2**63>, <above 2**63-1>, 2147483648, 7, -9223372036854775808]";
  CHECK(show(p0) == want);
  // The same list, pickle.dumps(..., 1): LONG text in a binary protocol
  CHECK(show("]q\x00(L18446744073709551615L\nL-9223372036854775809L\nL9223372036854775808L\nL2147483648L\nK\x07"
             "L-9223372036854775808L\ne."sv) == want);
  // By hand; pickle.loads reads 2**63, -2**63 - 1 (INT beyond 64 bits, as CPython's unpicklers
  // read it) and 10**40 (LONG without Python 2's 'L')
  CHECK(show("I9223372036854775808\n."sv) == "<above 2**63-1>");
  CHECK(show("I-9223372036854775809\n."sv) == "<below -2**63>");
  CHECK(show("L10000000000000000000000000000000000000000\n."sv) == "<above 2**63-1>");
  // pickle.dumps({'line': 2**64 - 1}, 1): what a C++ frame's unknown line is in protocol 1
  const PickleDocument d = read("}q\x00X\x04\x00\x00\x00lineq\x01L18446744073709551615L\ns."sv);
  REQUIRE(d.find(d.root(), "line"));
  CHECK(d.kind(*d.find(d.root(), "line")) == Kind::big_integer);
  CHECK(d.integer(*d.find(d.root(), "line")) == 0);
  // A container operation onto one is refused with its type named, as for a binary one.
  CHECK(error("L18446744073709551615L\n(K\x01"
              "e."sv) == "t.pickle: byte 26: APPENDS onto an int, not a list");
}

TEST_CASE("bytes, bytearrays, sets and frozensets") {
  // pickle.dumps([b'', b'ab', bytearray(b'cd')], 5): SHORT_BINBYTES, BYTEARRAY8
  CHECK(show("\x80\x05\x95\x19\x00\x00\x00\x00\x00\x00\x00]\x94(C\x00\x94"
             "C\x02"
             "ab\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00"
             "cd\x94"
             "e."sv) == "[b'', b'ab', b'cd']");
  // By hand; pickle.loads reads b'\x00\x01' and 'hi' and b'hi': BINBYTES, BINUNICODE8, BINBYTES8
  CHECK(read("B\x02\x00\x00\x00\x00\x01."sv).text(0) == "\0\x01"sv);
  CHECK(show("\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi."sv) == "'hi'");
  CHECK(show("\x8e\x02\x00\x00\x00\x00\x00\x00\x00hi."sv) == "b'hi'");
  // pickle.dumps([{1, 2}, frozenset({3})], 4): EMPTY_SET, ADDITEMS, FROZENSET, read as lists
  CHECK(show("\x80\x04\x95\x12\x00\x00\x00\x00\x00\x00\x00]\x94(\x8f\x94(K\x01K\x02\x90(K\x03\x91\x94"
             "e."sv) == "[[1, 2], [3]]");
  // pickle.dumps([b'', b'ab', bytearray(b'cd')], 3): below protocol 5 a bytearray is a call
  CHECK(error("\x80\x03]q\x00(C\x00q\x01"
              "C\x02"
              "abq\x02"
              "cbuiltins\nbytearray\nq\x03"
              "C\x02"
              "cdq\x04\x85q\x05Rq\x06"
              "e."sv) == "t.pickle: byte 16: opcode GLOBAL (0x63) refused: a pickle of plain data names no code");
}

TEST_CASE("the less common opcodes: LONG4, LONG1 at its limits, LIST, DICT, SETITEM, POP, POP_MARK, DUP") {
  // By hand; pickle.loads reads 256, 0, -2**63 and 2**63 - 1 (nine bytes, the last all sign)
  CHECK(show("\x8b\x02\x00\x00\x00\x00\x01."sv) == "256");
  CHECK(show("\x8a\x00."sv) == "0");
  CHECK(show("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff."sv) == "-9223372036854775808");
  CHECK(show("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\x00."sv) == "9223372036854775807");
  CHECK(show("\x8a\x01\xff."sv) == "-1");
  // Beyond 64-bit signed: pickle.loads reads 2**63, 2**64 - 1 (PyTorch's line of a C++ frame with
  // no line), -2**63 - 1 and 2**72; carve keeps their sign
  CHECK(show("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."sv) == "<above 2**63-1>");
  CHECK(show("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."sv) == "<above 2**63-1>");
  CHECK(show("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff."sv) == "<below -2**63>");
  CHECK(show("\x8b\x0a\x00\x00\x00"
             "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01."sv) == "<above 2**63-1>");
  // By hand; pickle.loads reads [1, 2], {1: 2, 3: 4}, {1: 2}, (1, 3) (POP_MARK), (1,) (POP of a MARK)
  CHECK(show("(K\x01K\x02l."sv) == "[1, 2]");
  CHECK(show("(K\x01K\x02K\x03K\x04"
             "d."sv) == "{1: 2, 3: 4}");
  CHECK(show("}K\x01K\x02s."sv) == "{1: 2}");
  CHECK(show("K\x01(K\x02"
             "1K\x03\x86."sv) == "(1, 3)");
  CHECK(show("K\x01(0\x85."sv) == "(1,)");
  // By hand; pickle.loads reads [[...]]: DUP pushes the same list, not a copy
  const PickleDocument dup = read("\x80\x02]2a."sv);
  CHECK(dup.items(dup.root()).size() == 1);
  CHECK(dup.items(dup.root())[0] == dup.root());
  // By hand; pickle.loads reads (7, 7) through LONG_BINPUT and LONG_BINGET
  CHECK(show("K\x07r\x00\x00\x01\x00j\x00\x00\x01\x00\x86."sv) == "(7, 7)");
  // By hand: memo index 2^32 - 1. CPython's unpickler sizes its memo by the index and fails with
  // MemoryError; a hash map holds the one entry.
  CHECK(show("K\x07r\xff\xff\xff\xff"
             "0j\xff\xff\xff\xff."sv) == "7");
}

TEST_CASE("memo references share one value, which changes seen through every reference") {
  // x = [1]; pickle.dumps([x, x], p) for p = 0 (PUT, GET), 2 (BINPUT, BINGET), 4 (MEMOIZE)
  for (const std::string_view bytes : {"(lp0\n(lp1\nI1\naag1\na."sv,
                                       "\x80\x02]q\x00(]q\x01K\x01"
                                       "ah\x01"
                                       "e."sv,
                                       "\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x01"
                                       "ah\x01"
                                       "e."sv}) {
    const PickleDocument d = read(bytes);
    CHECK(show(bytes) == "[[1], [1]]");
    REQUIRE(d.items(d.root()).size() == 2);
    CHECK(d.items(d.root())[0] == d.items(d.root())[1]);
    CHECK(d.size() == 3); // the outer list, the inner one, the 1
  }
  // By hand; pickle.loads reads {1: 2}: the dict, memoised, is set through the reference GET
  // pushed, and the original (the one left after POP) has the item
  CHECK(show("}\x94h\x00K\x01K\x02s0."sv) == "{1: 2}");
}

TEST_CASE("containers extended in turn keep their items in order; the memo's near and far indices") {
  // By hand; pickle.loads reads ([2, 4], [1, 3]) and ({2: 12, 4: 14}, {1: 11, 3: 13}): two
  // containers, memoised, appended to in turn through BINGET
  CHECK(show("\x80\x02]q\x00]q\x01K\x01"
             "a0K\x02"
             "ah\x01K\x03"
             "a0K\x04"
             "ah\x01\x86."sv) == "([2, 4], [1, 3])");
  CHECK(show("\x80\x02}q\x00}q\x01K\x01K\x0bs0K\x02K\x0csh\x01K\x03K\x0ds0K\x04K\x0esh\x01\x86."sv) ==
        "({2: 12, 4: 14}, {1: 11, 3: 13})");
  // By hand; pickle.loads reads [(1, 2), (3, 4)] and {1: 2, 3: 4}: a tuple's items (a list's
  // pairs) between two batches of a list's items (a dict's pairs)
  CHECK(show("\x80\x02](K\x01K\x02\x86"
             "e(K\x03K\x04\x86"
             "e."sv) == "[(1, 2), (3, 4)]");
  CHECK(show("\x80\x02}(K\x01K\x02u](K\x05K\x06\x86"
             "e0(K\x03K\x04u."sv) == "{1: 2, 3: 4}");
  // By hand; Python's unpickler (the pure-Python one: the C one sizes its memo by the largest
  // index) reads 7, 7 and 8: LONG_BINPUT to an index below the input's size and above it, and
  // MEMOIZE after an index of 2^32 - 1, which stores at index 1, the memo's size
  CHECK(show("K\x07r\x05\x00\x00\x00"
             "0h\x05."sv) == "7");
  CHECK(show("K\x07r\x00\x01\x00\x00"
             "0j\x00\x01\x00\x00."sv) == "7");
  CHECK(show("K\x07r\xff\xff\xff\xff"
             "0K\x08\x94"
             "0h\x01."sv) == "8");
  CHECK(error("K\x07r\x05\x00\x00\x00"
              "0h\x03."sv) == "t.pickle: byte 8: BINGET of memo index 3, where nothing was stored");
}

TEST_CASE("cycles: a list holding itself, a tuple through a list, a dict holding itself") {
  // l = []; l.append(l); l.append(1); pickle.dumps(l, p) for p = 0, 2, 4: the list is memoised
  // before its items are appended, one of them a GET of itself
  for (const std::string_view bytes : {"(lp0\ng0\naI1\na."sv,
                                       "\x80\x02]q\x00(h\x00K\x01"
                                       "e."sv,
                                       "\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00]\x94(h\x00K\x01"
                                       "e."sv}) {
    const PickleDocument d = read(bytes);
    CHECK(show(bytes) == "[[...], 1]");
    CHECK(d.items(d.root())[0] == d.root());
    CHECK(d.items(d.items(d.root())[0]).size() == 2);
  }
  // l = []; t = (l,); l.append(t); pickle.dumps(t, p) for p = 0 (POP) and 2 (TUPLE1, POP);
  // l = []; t = (l, 1, 2, 3); l.append(t); pickle.dumps(t, p) for p = 0 (POP x5) and 2 (POP_MARK)
  CHECK(show("((lp0\n(g0\ntp1\na00g1\n."sv) == "([(...)],)");
  CHECK(show("\x80\x02]q\x00h\x00\x85q\x01"
             "a0h\x01."sv) == "([(...)],)");
  CHECK(show("((lp0\n(g0\nI1\nI2\nI3\ntp1\naI1\nI2\nI3\n00000g1\n."sv) == "([(...)], 1, 2, 3)");
  CHECK(show("\x80\x02(]q\x00(h\x00K\x01K\x02K\x03tq\x01"
             "aK\x01K\x02K\x03"
             "1h\x01."sv) == "([(...)], 1, 2, 3)");
  // d = {}; d['me'] = d; pickle.dumps(d, 2)
  const PickleDocument d = read("\x80\x02}q\x00X\x02\x00\x00\x00meq\x01h\x00s."sv);
  CHECK(d.find(d.root(), "me") == d.root());
}

TEST_CASE("accessors asked about another kind answer the neutral value") {
  // By hand; pickle.loads reads [None, 1, 'a', {}]
  const PickleDocument d = read("](NK\x01X\x01\x00\x00\x00"
                                "a}e."sv);
  const auto items = d.items(d.root());
  REQUIRE(items.size() == 4);
  const Id none = items[0], one = items[1], a = items[2], dict = items[3];
  CHECK(d.kind(none) == Kind::none);
  CHECK(!d.boolean(one));
  CHECK(d.integer(a) == 0);
  CHECK(d.floating(one) == 0.0);
  CHECK(d.text(one).empty());
  CHECK(d.items(dict).empty());
  CHECK(d.entries(d.root()).empty());
  CHECK(!d.find(d.root(), "a"));
  CHECK(!d.find(dict, "a"));
  // An Id outside the arena reads as None, empty everything.
  const Id outside = static_cast<Id>(d.size());
  CHECK(d.kind(outside) == Kind::none);
  CHECK(d.integer(outside) == 0);
  CHECK(d.text(outside).empty());
  CHECK(d.items(outside).empty());
  CHECK(d.entries(outside).empty());
}

TEST_CASE("the bytes after STOP are not read") {
  const PickleDocument d = read("N.trailing"sv);
  CHECK(d.kind(d.root()) == Kind::none);
  CHECK(d.bytes_read() == 2);
  // Two pickles end to end, as pickle.dump writes them to one file: the second read from where
  // the first stopped.
  const std::string_view two = "K\x01.K\x02."sv;
  const PickleDocument first = read(two);
  CHECK(show(two.substr(first.bytes_read())) == "2");
}

TEST_CASE("every opcode that names code is refused, and every byte that is no opcode") {
  // GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1,
  // EXT2, EXT4, NEXT_BUFFER, READONLY_BUFFER
  const std::string_view code = "c\x93RbioP\x81\x92Q\x82\x83\x84\x97\x98"sv;
  int refused = 0, unknown = 0;
  for (int b = 0; b < 256; ++b) {
    const auto op = static_cast<unsigned char>(b);
    const std::string_view name = carve::trace::detail::pickle_opcode_name(op);
    const std::string input(1, static_cast<char>(op));
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", b);
    if (code.find(static_cast<char>(op)) != std::string_view::npos) {
      ++refused;
      CHECK(error(input) == "t.pickle: byte 0: opcode " + std::string(name) + " (" + hex +
                                ") refused: a pickle of plain data names no code");
    } else if (name.empty()) {
      ++unknown;
      CHECK(error(input) == "t.pickle: byte 0: unknown opcode " + std::string(hex));
    }
  }
  CHECK(refused == 15);
  CHECK(unknown == 256 - 68); // pickletools knows 68 opcodes
  CHECK(carve::trace::detail::pickle_opcode_name(0x63) == "GLOBAL");
  CHECK(carve::trace::detail::pickle_opcode_name(0x98) == "READONLY_BUFFER");
  // The classic: os.system('echo hi') through GLOBAL and REDUCE, refused before anything is read.
  CHECK(error("cos\nsystem\n(S'echo hi'\ntR."sv) ==
        "t.pickle: byte 0: opcode GLOBAL (0x63) refused: a pickle of plain data names no code");
  // pickle.dumps(collections.OrderedDict(a=1), 2)
  CHECK(error("\x80\x02\x63"
              "collections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00"
              "aq\x02K\x01s."sv) ==
        "t.pickle: byte 2: opcode GLOBAL (0x63) refused: a pickle of plain data names no code");
  // pickle.dumps(complex(1, 2), 4) names the class with STACK_GLOBAL
  CHECK(error("\x80\x04\x95.\x00\x00\x00\x00\x00\x00\x00\x8c\x08"
              "builtins\x94\x8c\x07"
              "complex\x94\x93\x94G?\xf0\x00\x00\x00\x00\x00\x00G@\x00\x00\x00\x00\x00\x00\x00\x86\x94R\x94."sv) ==
        "t.pickle: byte 32: opcode STACK_GLOBAL (0x93) refused: a pickle of plain data names no code");
  CHECK(error("\x80\x06."sv) == "t.pickle: byte 0: protocol 6, beyond 5, the highest there is");
}

TEST_CASE("malformed pickles: each error with its message") {
  struct Case {
    std::string_view bytes;
    std::string_view message; // after "t.pickle: "
  };
  const Case cases[] = {
      // Truncated: a missing STOP, an argument cut short, a length beyond the input.
      {""sv, "byte 0: truncated: the input ends before STOP"},
      {"N"sv, "byte 1: truncated: the input ends before STOP"},
      {"K"sv, "byte 0: truncated: BININT1 needs 1 byte, and 0 are left"},
      {"J\x01\x02."sv, "byte 0: truncated: BININT needs 4 bytes, and 3 are left"},
      {"X\x05\x00\x00\x00"
       "ab."sv,
       "byte 0: truncated: BINUNICODE needs 5 bytes, and 3 are left"},
      {"\x8e\xff\xff\xff\xff\xff\xff\xff\xff."sv,
       "byte 0: truncated: BINBYTES8 needs 18446744073709551615 bytes, and 1 is left"},
      {"\x95\x10\x00\x00\x00\x00\x00\x00\x00N."sv, "byte 0: truncated: FRAME needs 16 bytes, and 2 are left"},
      {"I12"sv, "byte 0: truncated: INT's argument has no newline before the end of the input"},
      // The stack and its MARKs.
      {"."sv, "byte 0: STOP with 0 values on the stack, not 1"},
      {"NN."sv, "byte 2: STOP with 2 values on the stack, not 1"},
      {"(N."sv, "byte 2: STOP with a MARK still open"},
      {"a."sv, "byte 0: stack underflow: APPEND takes 2 values, and there are 0"},
      {"0."sv, "byte 0: stack underflow: POP takes 1 value, and there are 0"},
      {"2."sv, "byte 0: stack underflow: DUP takes 1 value, and there are 0"},
      {"q\x00."sv, "byte 0: stack underflow: BINPUT takes 1 value, and there are 0"},
      {"K\x01(\x85."sv, "byte 3: stack underflow: TUPLE1 takes 1 value above the last MARK, and there are 0"},
      {"K\x01(K\x02\x87."sv, "byte 5: stack underflow: TUPLE3 takes 3 values above the last MARK, and there is 1"},
      {"K\x01t."sv, "byte 2: MARK missing: TUPLE takes the values above a MARK, and none is open"},
      {"1."sv, "byte 0: MARK missing: POP_MARK takes the values above a MARK, and none is open"},
      {"]K\x01"
       "e."sv,
       "byte 3: MARK missing: APPENDS takes the values above a MARK, and none is open"},
      {"(K\x01"
       "e."sv,
       "byte 3: stack underflow: APPENDS finds no container below its MARK"},
      {"]((K\x01"
       "e."sv,
       "byte 5: stack underflow: APPENDS finds no container below its MARK"},
      // Containers of the wrong type.
      {"}K\x01"
       "a."sv,
       "byte 3: APPEND onto a dict, not a list"},
      {")(K\x01"
       "e."sv,
       "byte 4: APPENDS onto a tuple, not a list"},
      {"\x8f(K\x01"
       "e."sv,
       "byte 4: APPENDS onto a set, not a list"},
      {"]K\x01K\x02s."sv, "byte 5: SETITEM onto a list, not a dict"},
      {"K\x05(K\x01K\x02u."sv, "byte 7: SETITEMS onto an int, not a dict"},
      {"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00(K\x01"
       "e."sv,
       "byte 14: APPENDS onto an int, not a list"},
      {"](K\x01\x90."sv, "byte 4: ADDITEMS onto a list, not a set"},
      {"(\x91(K\x01\x90."sv, "byte 5: ADDITEMS onto a frozenset, not a set"},
      {"(K\x01"
       "d."sv,
       "byte 3: DICT with an odd number of items (1): keys and values come in pairs"},
      {"}(K\x01K\x02K\x03u."sv, "byte 8: SETITEMS with an odd number of items (3): keys and values come in pairs"},
      // The memo.
      {"h\x05."sv, "byte 0: BINGET of memo index 5, where nothing was stored"},
      {"g5\n."sv, "byte 0: GET of memo index 5, where nothing was stored"},
      {"j\x00\x00\x01\x00."sv, "byte 0: LONG_BINGET of memo index 65536, where nothing was stored"},
      {"Np-1\n."sv, "byte 1: PUT of a negative memo index"},
      {"Np1x\n."sv, "byte 1: PUT text \"1x\" is not a decimal integer"},
      // Negative lengths, a memo index beyond 64-bit signed, and malformed number text.
      {"\x8b\xff\xff\xff\xff."sv, "byte 0: LONG4 with a negative length"},
      {"T\x00\x00\x00\x80."sv, "byte 0: BINSTRING with a negative length"},
      {"Np99999999999999999999\n."sv, "byte 1: PUT integer 99999999999999999999 beyond 64-bit signed"},
      {"g-9223372036854775809\n."sv, "byte 0: GET integer -9223372036854775809 beyond 64-bit signed"},
      {"L0123L\n."sv, "byte 0: LONG text \"0123\" has a leading zero, which Python's unpicklers read differently"},
      {"L18446744073709551615x\n."sv, "byte 0: LONG text \"18446744073709551615x\" is not a decimal integer"},
      {"I010\n."sv, "byte 0: INT text \"010\" has a leading zero, which Python's unpicklers read differently"},
      {"I-0\n."sv, "byte 0: INT text \"-0\" has a leading zero, which Python's unpicklers read differently"},
      {"I1.5\n."sv, "byte 0: INT text \"1.5\" is not a decimal integer"},
      {"I\n."sv, "byte 0: INT text \"\" is not a decimal integer"},
      {"LL\n."sv, "byte 0: LONG text \"\" is not a decimal integer"},
      {"Fabc\n."sv, "byte 0: FLOAT text \"abc\" is not a number within a double's range"},
      {"F1e999\n."sv, "byte 0: FLOAT text \"1e999\" is not a number within a double's range"},
      // Malformed text.
      {"Sabc\n."sv, "byte 0: STRING text is not quoted"},
      {"S'abc\"\n."sv, "byte 0: STRING text is not quoted"},
      {"S'\n."sv, "byte 0: STRING text is not quoted"},
      {"S'\\'\n."sv, "byte 0: STRING text ends in a lone backslash"},
      {"S'\\x4'\n."sv, "byte 0: STRING text has a \\x escape without two hex digits or an octal one above \\377"},
      {"S'\\400'\n."sv, "byte 0: STRING text has a \\x escape without two hex digits or an octal one above \\377"},
      {"S'\xe9'\n."sv, "byte 0: STRING holds byte 0xe9, and a Python 2 string is ASCII"},
      {"S'\\xe9'\n."sv, "byte 0: STRING holds byte 0xe9, and a Python 2 string is ASCII"},
      {"U\x01\xe9."sv, "byte 0: SHORT_BINSTRING holds byte 0xe9, and a Python 2 string is ASCII"},
      {"V\\u12\n."sv, "byte 0: UNICODE text has a \\u or \\U escape without its hex digits"},
      {"V\\u12g4\n."sv, "byte 0: UNICODE text has a \\u or \\U escape without its hex digits"},
      {"V\\U00110000\n."sv, "byte 0: UNICODE text escapes a code point beyond U+10FFFF"},
      {"X\x02\x00\x00\x00\xc0\x80."sv, "byte 0: BINUNICODE text is not UTF-8 (a bad sequence at its byte 0)"},
      {"\x8c\x02"
       "a\xff."sv,
       "byte 0: SHORT_BINUNICODE text is not UTF-8 (a bad sequence at its byte 1)"},
      {"\x8c\x02\xe2\x82."sv, "byte 0: SHORT_BINUNICODE text is not UTF-8 (a bad sequence at its byte 0)"},
      {"\x8c\x04\xf4\x90\x80\x80."sv, "byte 0: SHORT_BINUNICODE text is not UTF-8 (a bad sequence at its byte 0)"},
      {"\x8c\x03\xe0\x80\x80."sv, "byte 0: SHORT_BINUNICODE text is not UTF-8 (a bad sequence at its byte 0)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.bytes);
    CHECK(error(c.bytes) == "t.pickle: " + std::string(c.message));
  }
}

TEST_CASE("depth and size cost no C++ stack and no memory beyond the input's") {
  // A million lists, each appended to the one before: [[[...]]] a million deep.
  constexpr std::size_t depth = 1'000'000;
  const std::string nested = std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
  const PickleDocument d = read(nested);
  CHECK(d.size() == depth);
  std::size_t levels = 1;
  for (Id v = d.root(); !d.items(v).empty(); v = d.items(v)[0]) {
    ++levels;
  }
  CHECK(levels == depth);
  // A million MARKs, never closed.
  CHECK(error(std::string(depth, '(') + "N.") == "t.pickle: byte 1000001: STOP with a MARK still open");
  // 100,000 memo indices far beyond the input's size, 4 KiB apart, each stored and read back into
  // one list: the far memo is ordered, so no choice of indices makes a PUT or GET cost more than
  // log n (a hash map's buckets can be filled by a pickle that picks its indices).
  constexpr std::uint32_t far = 100'000;
  const auto le32 = [](std::uint32_t v) {
    return std::string{static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
                       static_cast<char>((v >> 16) & 0xff), static_cast<char>(v >> 24)};
  };
  const auto index = [](std::uint32_t i) { return (std::uint32_t{1} << 30) + i * 4096; };
  std::string many;
  for (std::uint32_t i = 0; i < far; ++i) {
    many += "J" + le32(i) + "r" + le32(index(i)) + "0"; // BININT i, LONG_BINPUT, POP
  }
  many += "](";
  for (std::uint32_t i = far; i-- > 0;) {
    many += "j" + le32(index(i)); // LONG_BINGET, last stored first
  }
  many += "e.";
  const PickleDocument m = read(many);
  REQUIRE(m.items(m.root()).size() == far);
  CHECK(m.integer(m.items(m.root())[0]) == far - 1);
  CHECK(m.integer(m.items(m.root())[far - 1]) == 0);
  // A length field of 2^63 is compared with the bytes left, not allocated.
  CHECK(error("\x8d\x00\x00\x00\x00\x00\x00\x00\x80."sv) ==
        "t.pickle: byte 0: truncated: BINUNICODE8 needs 9223372036854775808 bytes, and 1 is left");
}

TEST_CASE("a real PyTorch memory snapshot") {
  const std::filesystem::path file = CARVE_PICKLE_SNAPSHOT;
  if (!std::filesystem::exists(file)) {
    MESSAGE("no " << file.string() << ": the real snapshot is not checked");
    return;
  }
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto start = std::chrono::steady_clock::now();
  const auto read_back = read_pickle(bytes, file.filename().string());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_MESSAGE(read_back, (read_back ? "" : read_back.error().message));
  const PickleDocument& d = *read_back;
  MESSAGE(bytes.size() << " bytes read to " << d.size() << " values in " << ms << " ms");
  CHECK(d.bytes_read() == bytes.size());
  REQUIRE(d.kind(d.root()) == Kind::dict);
  CHECK(d.entries(d.root()).size() == 2);

  const auto segments = d.find(d.root(), "segments");
  REQUIRE(segments);
  REQUIRE(d.kind(*segments) == Kind::list);
  CHECK(d.items(*segments).size() == 215);
  for (const Id s : d.items(*segments)) {
    CHECK(d.kind(s) == Kind::dict);
    CHECK(d.integer(d.find(s, "total_size").value_or(s)) > 0);
    CHECK(d.kind(d.find(s, "segment_pool_id").value_or(s)) == Kind::tuple);
    CHECK(d.kind(d.find(s, "is_expandable").value_or(s)) == Kind::boolean);
    CHECK(d.kind(d.find(s, "blocks").value_or(s)) == Kind::list);
  }

  const auto traces = d.find(d.root(), "device_traces");
  REQUIRE(traces);
  REQUIRE(d.items(*traces).size() == 1);
  const auto events = d.items(d.items(*traces)[0]);
  REQUIRE(events.size() == 10307);
  for (const Id e : events) {
    CHECK(d.kind(e) == Kind::dict);
  }
  // The first event, as Python reads it: {'action': 'alloc', 'addr': 139936756924416, 'size': 8192000, ...}
  CHECK(d.text(*d.find(events[0], "action")) == "alloc");
  CHECK(d.integer(*d.find(events[0], "addr")) == 139936756924416);
  CHECK(d.integer(*d.find(events[0], "size")) == 8192000);
  CHECK(d.text(*d.find(d.items(*d.find(events[0], "frames"))[0], "name")) == "torch::unwind::unwind()");
}

} // namespace test_pickle_reader

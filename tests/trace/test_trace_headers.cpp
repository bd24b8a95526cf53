// The trace headers explain themselves: every file or folder their comments name is in this
// repository, so that a reader never needs a document the repository does not have (a format is
// described where it is read, not by pointing at another project's source).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_trace_headers {

namespace {

// The comments of `header`, their slashes taken off and lines joined: with nothing between them
// where a line ends in '/' (a path broken across lines), else with a space.
std::string comment_text(const std::filesystem::path& header) {
  std::ifstream in(header);
  std::string text;
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("//");
    if (at == std::string::npos || line.find_first_not_of(' ') != at) {
      continue;
    }
    const auto body = line.find_first_not_of("/ ", at);
    if (body == std::string::npos) {
      continue;
    }
    if (!text.empty() && text.back() != '/') {
      text += ' ';
    }
    text += line.substr(body);
  }
  return text;
}

} // namespace

TEST_CASE("every path a trace header's comments name is in the repository") {
  const std::filesystem::path root = std::filesystem::path(CARVE_TEST_DATA_DIR).parent_path().parent_path();
  const std::filesystem::path dir = root / "include" / "carve" / "trace";
  REQUIRE(std::filesystem::is_directory(dir));
  // A path: names joined by '/', ending in a source or document file's extension or in '/'.
  const std::regex path_like(R"([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*(\.(hpp|h|cpp|cu|cuh|py|md|txt|cmake)\b|/))");
  std::size_t headers = 0;
  std::size_t paths = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".hpp") {
      continue;
    }
    ++headers;
    const std::string text = comment_text(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), path_like), end; it != end; ++it) {
      const std::string path = it->str();
      if (it->position() > 0 && text[static_cast<std::size_t>(it->position()) - 1] == '/') {
        continue; // an absolute path (/dev/zero) names the system's file, not a document
      }
      ++paths;
      const bool here = std::filesystem::exists(root / path) || std::filesystem::exists(root / "include" / path) ||
                        std::filesystem::exists(dir / path);
      CHECK_MESSAGE(here, entry.path().filename().string() << " names " << path << ", which is not in the repository");
    }
  }
  CHECK(headers >= 8);
  CHECK(paths > 0); // the headers name one another, so the pattern finds something
}

} // namespace test_trace_headers

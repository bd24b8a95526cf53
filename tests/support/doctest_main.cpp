// The main of every doctest executable. Several test files share an executable and each ctest
// test picks its file's cases with --source-file (tests/CMakeLists.txt), so a filter that picks
// nothing, a misspelt file or pattern, must fail rather than pass having run no case at all.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

unsigned cases_run = 0;
bool run_ended = false;

// Only test_run_end matters; doctest calls it once per run, and never for a query (--list-test-cases, --help).
struct CasesRunCounter : doctest::IReporter {
  explicit CasesRunCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    cases_run = stats.numTestCasesPassingFilters;
    run_ended = true;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

} // namespace

REGISTER_LISTENER("carve_cases_run", 1, CasesRunCounter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit() || result != 0) {
    return result;
  }
  if (run_ended && cases_run == 0) {
    std::fprintf(stderr, "no test case matched the filters given: nothing was tested\n");
    return 1;
  }
  return 0;
}

// The embedding-lookup pipeline (examples/embedding_lookup) on a small generated dataset: every
// accepted query gets exactly one result, sums and outputs equal those computed directly from
// the table formula, bad queries (unknown table, empty, row past the end, truncated file) get an
// error while the rest are served, a shard migrates mid-run; with pread, O_DIRECT, io_uring and
// with one FIFO in place of the tiers. Also the command-line flags the example and the latency
// benchmark share (options.hpp).
#include "support/errors.hpp"
#include <options.hpp>
#include <pipeline.hpp>
#include <workload.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_embedding_pipeline {

using namespace embedding;

namespace {

using TieredQueue = carve::SizeTieredQueue<Query, QueryVectors>;

std::vector<float> direct_sum(const TableSpec& spec, const std::vector<std::uint64_t>& rows) {
  std::vector<float> sum(spec.dim, 0.0f);
  for (const std::uint64_t r : rows) {
    for (std::uint32_t c = 0; c < spec.dim; ++c) {
      sum[c] += table_value(spec.id, r, c);
    }
  }
  return sum;
}

struct Run {
  std::size_t accepted = 0;
  std::map<std::uint64_t, std::vector<std::uint64_t>> rows; // query id -> rows, as submitted
  std::map<std::uint64_t, std::uint32_t> tables;
  std::map<std::uint64_t, std::string> expected_errors; // query id -> part of the message
  std::vector<Result> results;
};

std::unique_ptr<TieredQueue> make_queue(bool fifo) {
  if (fifo) {
    return std::make_unique<TieredQueue>(fifo_thresholds(), 4096);
  }
  return std::make_unique<TieredQueue>(carve::TierThresholds{128, 512}, 4096);
}

Run run_pipeline(IoMode io, bool direct, bool fifo) {
  const TempDir dir(std::filesystem::temp_directory_path());
  DatasetConfig cfg;
  cfg.root = dir.path();
  cfg.devices = 2;
  cfg.tables = 8;
  cfg.table_bytes = 192 << 10;
  cfg.direct_io = direct;
  auto map = generate_dataset(cfg);

  // Table 1 is sharded over both devices; cut its second shard's file in half.
  const TablePlacement t1 = *map->find(1);
  REQUIRE(t1.copies.size() == 1);
  REQUIRE(t1.copies[0].size() == 2);
  const Shard cut = t1.copies[0][1];
  const std::uint64_t kept_rows = cut.rows / 2;
  std::filesystem::resize_file(cut.file->path(), kept_rows * t1.spec.row_bytes() + 10);

  Run run;
  std::mutex mutex;
  PipelineConfig pc;
  pc.loaders_per_device = 2;
  pc.in_flight = 4;
  pc.processing_elements = 2;
  pc.io = io;
  Pipeline<TieredQueue> pipeline(make_queue(fifo), *map, cfg.devices, pc, [&](Result&& r) {
    const std::lock_guard lock(mutex);
    run.results.push_back(std::move(r));
  });
  const auto submit = [&](Query q) {
    const bool reads_lost_row = q.table == 1 && std::any_of(q.rows.begin(), q.rows.end(), [&](std::uint64_t r) {
                                  return r >= cut.first_row + kept_rows && r < cut.first_row + cut.rows;
                                });
    if (reads_lost_row && !run.expected_errors.contains(q.id)) {
      run.expected_errors[q.id] = "truncated file"; // generated queries can land there too
    }
    run.rows[q.id] = q.rows;
    run.tables[q.id] = q.table;
    q.arrival = Clock::now();
    REQUIRE(pipeline.submit(std::move(q)));
    ++run.accepted;
  };

  QueryGenerator gen(map->specs(), QuerySizes{}, 42);
  std::uint64_t id = 100000;
  for (int i = 0; i < 240; ++i) {
    submit(gen.next());
    if (i == 80) { // a shard of table 0 moves to the other device while queries run
      const Shard s = map->find(0)->copies[0][0];
      CHECK(pipeline.migrate(0, 0, 0, 1 - s.device, cfg.root, cfg.direct_io) == s.device);
      CHECK(map->find(0)->copies[0][0].device == 1 - s.device);
      CHECK_FALSE(std::filesystem::exists(s.file->path()));
    }
    if (i % 40 == 0) {
      // Bad queries between good ones.
      submit(Query{id, 99, {1, 2, 3}, {}});
      run.expected_errors[id++] = "unknown table 99";
      submit(Query{id, 2, {}, {}});
      run.expected_errors[id++] = "at least one vector";
      const std::uint64_t rows2 = map->find(2)->spec.rows;
      submit(Query{id, 2, {0, rows2, 5}, {}});
      run.expected_errors[id++] = "row " + std::to_string(rows2) + " is past the end of table 2";
      const std::uint64_t lost = cut.first_row + kept_rows + 3; // in the cut-off half
      submit(Query{id++, 1, {0, lost}, {}});
      submit(Query{id, 1, {0, 1, cut.first_row, cut.first_row + kept_rows - 1}, {}}); // all still on disk
      ++id;
    }
  }
  pipeline.finish();
  CHECK(pipeline.delivered() == run.accepted);
  CHECK_FALSE(pipeline.submit(Query{id, 0, {1}, {}})); // finished: not accepted

  // The parts went to every loader, and every element computed something.
  for (const std::uint64_t n : pipeline.parts_per_loader()) {
    CHECK(n > 0);
  }
  for (const std::uint64_t n : pipeline.requests_per_element()) {
    CHECK(n > 0);
  }
  if (io == IoMode::io_uring && io_uring_available()) {
    CHECK(pipeline.io_mode() == IoMode::io_uring);
  }
  return run;
}

void check_results(const Run& run, const DeviceMap* = nullptr) {
  REQUIRE(run.results.size() == run.accepted);
  std::set<std::uint64_t> seen;
  std::size_t errors = 0;
  for (const Result& r : run.results) {
    CAPTURE(r.query_id);
    CHECK(seen.insert(r.query_id).second); // exactly one result per query
    const auto expected = run.expected_errors.find(r.query_id);
    if (expected != run.expected_errors.end()) {
      CHECK_FALSE(r.ok);
      CHECK(r.error.find(expected->second) != std::string::npos);
      ++errors;
      continue;
    }
    CAPTURE(r.error);
    REQUIRE(r.ok);
    const auto& rows = run.rows.at(r.query_id);
    const TableSpec spec{r.table, 0, table_dim(r.table)};
    const std::vector<float> sum = direct_sum(spec, rows);
    CHECK(r.sum == sum); // exact: the values add without rounding in any order
    CHECK(r.output == post_process(sum, static_cast<std::uint32_t>(rows.size()), 16));
    CHECK(r.vectors == rows.size());
    CHECK(r.done >= r.arrival);
  }
  CHECK(errors == run.expected_errors.size());
  CHECK(seen.size() == run.accepted);
}

} // namespace

TEST_CASE("pipeline with SizeTieredQueue and pread") { check_results(run_pipeline(IoMode::pread, false, false)); }

TEST_CASE("pipeline with O_DIRECT reads (cold page cache)") { check_results(run_pipeline(IoMode::pread, true, false)); }

TEST_CASE("pipeline with io_uring where the kernel allows it") {
  check_results(run_pipeline(IoMode::io_uring, true, false));
}

TEST_CASE("pipeline with one FIFO instead of tiers") { check_results(run_pipeline(IoMode::pread, false, true)); }

TEST_CASE("the dataset: formula values on disk, replicated and sharded tables, bad configurations") {
  const TempDir dir(std::filesystem::temp_directory_path());
  DatasetConfig cfg;
  cfg.root = dir.path();
  cfg.tables = 4;
  cfg.table_bytes = 64 << 10;
  const auto map = generate_dataset(cfg);
  CHECK(map->specs().size() == 4);
  const TablePlacement replicated = *map->find(3);
  CHECK(replicated.copies.size() == 2);
  CHECK(replicated.copies[0][0].device != replicated.copies[1][0].device);
  const TablePlacement sharded = *map->find(2);
  REQUIRE(sharded.copies.size() == 1);
  CHECK(sharded.copies[0].size() == 2);
  CHECK(sharded.copies[0][0].rows + sharded.copies[0][1].rows == sharded.spec.rows);
  // Read one row back by hand.
  VectorReader reader(IoMode::pread);
  std::vector<float> sum(sharded.spec.dim, 0.0f);
  const std::uint64_t row = sharded.copies[0][1].first_row + 7;
  const std::uint64_t rows[] = {row};
  CHECK_FALSE(reader.add_rows(sharded.spec, sharded.copies[0][1], rows, sum));
  CHECK(sum == direct_sum(sharded.spec, {row}));
  CHECK_FALSE(map->find(17).has_value());

  DatasetConfig one = cfg;
  one.devices = 1;
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, generate_dataset(one));
  std::filesystem::path kept;
  {
    const TempDir gone(std::filesystem::temp_directory_path());
    kept = gone.path();
    CHECK(std::filesystem::exists(kept));
  }
  CHECK_FALSE(std::filesystem::exists(kept));
}

TEST_CASE("the example's and the benchmark's flags: values, forms, and errors that name the flag") {
  const auto parse = [](WorkloadOptions& o, std::vector<const char*> args, std::string* policy = nullptr) {
    Flags flags("prog", "test");
    add_workload_flags(flags, o, "qps");
    std::string ignored_policy = "strict-aging";
    flags.choice("--policy", policy != nullptr ? *policy : ignored_policy, {"strict-aging", "round-robin", "fifo"},
                 "policy");
    flags.ignore_prefix("--benchmark_");
    args.insert(args.begin(), "prog");
    return flags.parse(static_cast<int>(args.size()), args.data());
  };
  const auto error = [&](std::vector<const char*> args) -> std::string {
    WorkloadOptions o;
    try {
      (void)parse(o, std::move(args));
    } catch (const FlagError& e) {
      return e.what();
    }
    return "accepted";
  };

  WorkloadOptions o;
  std::string policy = "strict-aging";
  CHECK(parse(o,
              {"--tables", "3", "--table-mib=2048", "--devices", "4", "--qps", "1500.5", "--median", "60", "--sigma",
               "0.5", "--max-vectors", "512", "--policy", "fifo", "--benchmark_filter=x", "--io", "io_uring"},
              &policy));
  CHECK(o.tables == 3);
  CHECK(o.table_bytes() == std::uint64_t{2} << 30); // a 2 GiB table
  CHECK(o.devices == 4);
  CHECK(o.qps == 1500.5);
  CHECK(o.sizes.median == 60);
  CHECK(o.sizes.sigma == 0.5);
  CHECK(o.sizes.max == 512);
  CHECK(o.io_mode() == IoMode::io_uring);
  CHECK(policy == "fifo");
  CHECK(o.dataset("/x").table_bytes == std::uint64_t{2} << 30);
  CHECK(o.pipeline().io == IoMode::io_uring);
  CHECK(o.pipeline().processing_elements == 2); // the default

  WorkloadOptions e;
  Flags counted("prog", "test");
  add_workload_flags(counted, e, "qps");
  const char* args[] = {"prog", "--elements", "3", "--tables=4"};
  CHECK(counted.parse(4, args));
  CHECK(e.pipeline().processing_elements == 3);
  CHECK(counted.given("--elements")); // what the demo asks to tell a closed loop from --qps
  CHECK(counted.given("--tables"));
  CHECK_FALSE(counted.given("--qps"));

  WorkloadOptions help;
  CHECK_FALSE(parse(help, {"--tables", "0", "--help"})); // --help wins, nothing is checked
  CHECK(help.tables == 8);

  CHECK(error({"--tables", "abc"}) == "--tables 'abc': expected a whole number from 1 to 1024");
  CHECK(error({"--tables", "-1"}).find("--tables '-1'") == 0);
  CHECK(error({"--tables", "2.5"}).find("--tables '2.5'") == 0);
  CHECK(error({"--table-mib", "0"}).find("--table-mib '0'") == 0);
  CHECK(error({"--devices", "1"}).find("--devices '1': expected a whole number from 2") == 0);
  CHECK(error({"--qps", "-3"}).find("--qps '-3'") == 0);
  CHECK(error({"--sigma", "inf"}).find("--sigma 'inf'") == 0);
  CHECK(error({"--median", ""}).find("--median ''") == 0);
  CHECK(error({"--max-vectors", "100000"}).find("--max-vectors '100000'") == 0);
  CHECK(error({"--policy", "lifo"}) == "--policy 'lifo': expected one of strict-aging, round-robin, fifo");
  CHECK(error({"--io", "mmap"}).find("--io 'mmap'") == 0);
  CHECK(error({"--dir="}) == "--dir: expected a non-empty value");
  CHECK(error({"--seed"}) == "--seed needs a value");
  CHECK(error({"--frobnicate"}).find("unknown flag '--frobnicate'") == 0);
  CHECK(error({"--max-vectors", "50"}) == "--median 100 is above --max-vectors 50");
  CHECK(error({"--max-vectors", "50", "--median", "20"}) == "accepted");
}

} // namespace test_embedding_pipeline

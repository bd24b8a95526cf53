// embedding_lookup: the size-tiered embedding-lookup system end to end, on a dataset it
// generates in a temporary directory (by default 8 tables of 4 MiB over two "storage devices"):
// Poisson-arriving queries are sorted into three tiers by vector count (at most 128, 129-512,
// more), drained by strict priority with aging (the policy to choose for a latency target),
// split per device, read with pread and summed, post-processed by a second-level compute
// scheduler. Midway a shard migrates, and three bad queries (an unknown table, a row past the
// end of its table, a row in a truncated file) get errors while the rest are served. Prints
// latency per size class and the queue's statistics, and checks sums against the table formula.
//
//   embedding_lookup [--queries 3000] [--qps 2000] [--tables 8] [--table-mib 4] [--devices 2]
//                    [--median 100] [--sigma 1] [--max-vectors 1024]
//                    [--policy strict-aging|round-robin|fifo] [--aging-ms 50] ... (--help: all)
//
// Tables of 1-4 GiB: --table-mib 1024 to 4096 (every table is written before queries start).
// Exit status: 0 when every query got exactly one result and every checked sum is right, 1 when
// not, 2 for a bad command line.
#include "options.hpp"
#include "pipeline.hpp"
#include "workload.hpp"

#include <carve/carve.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

using namespace embedding;

namespace {

struct Options {
  WorkloadOptions w;
  std::uint64_t queries = 3000;
  std::string policy = "strict-aging";
};

// Sums of the first this many generated queries are checked against the table formula.
constexpr std::uint64_t checked_queries = 200;

// One more table, outside the generated workload, whose only file is cut in half: a query that
// reads a row from the lost half shows what a truncated file does (an error for that query only).
TableSpec add_truncated_table(DeviceMap& map, const DatasetConfig& cfg) {
  const TableSpec spec{cfg.tables, 256, 64};
  const auto path = device_dir(cfg.root, 0) / shard_name(spec.id, 0, 0);
  write_rows(path, spec, 0, spec.rows);
  std::filesystem::resize_file(path, spec.bytes() / 2);
  map.add(TablePlacement{spec, {{Shard{0, 0, spec.rows, std::make_shared<ShardFile>(path, cfg.direct_io)}}}});
  return spec;
}

template <class Queue>
int run(const Options& o, std::unique_ptr<Queue> queue, const std::string& label) {
  const TempDir dir(o.w.dir);
  const DatasetConfig cfg = o.w.dataset(dir.path());
  std::printf("%u tables x %llu MiB on %u devices; %llu queries at %s q/s, vectors per query lognormal "
              "(median %s, sigma %s, at most %u); %s\n",
              o.w.tables, static_cast<unsigned long long>(o.w.table_mib), o.w.devices,
              static_cast<unsigned long long>(o.queries), o.w.qps > 0 ? flag_number(o.w.qps).c_str() : "unlimited",
              flag_number(o.w.sizes.median).c_str(), flag_number(o.w.sizes.sigma).c_str(), o.w.sizes.max,
              label.c_str());
  auto map = generate_dataset(cfg);
  QueryGenerator gen(map->specs(), o.w.sizes, o.w.seed);
  const TableSpec truncated = add_truncated_table(*map, cfg);

  std::vector<Result> results;
  std::mutex mutex;
  Pipeline<Queue> pipeline(std::move(queue), *map, cfg.devices, o.w.pipeline(), [&](Result&& r) {
    const std::lock_guard lock(mutex);
    results.push_back(std::move(r));
  });

  std::map<std::uint64_t, Query> kept; // the queries whose sums are checked
  const auto submit = [&](Query q) {
    if (q.id < checked_queries) {
      kept.emplace(q.id, Query{q.id, q.table, q.rows, {}});
    }
    (void)pipeline.submit(std::move(q));
  };
  const auto t0 = Clock::now();
  submit_poisson(gen, o.queries / 2, o.w.qps, submit);
  const Shard moving = map->find(0)->copies[0][0];
  const std::uint32_t to = (moving.device + 1) % cfg.devices;
  const std::uint32_t from = pipeline.migrate(0, 0, 0, to, cfg.root, cfg.direct_io);
  std::printf("migrated table 0 shard 0: device %u -> %u while queries ran\n", from, to);
  const std::uint64_t bad = std::max<std::uint64_t>(1'000'000, o.queries);     // ids no generated query has
  submit(Query{bad, cfg.tables + 1, {1, 2, 3}, Clock::now()});                 // no such table
  submit(Query{bad + 1, 0, {0, map->find(0)->spec.rows}, Clock::now()});       // row past the end
  submit(Query{bad + 2, truncated.id, {1, truncated.rows - 1}, Clock::now()}); // row lost from the file
  submit_poisson(gen, o.queries - o.queries / 2, o.w.qps, submit);
  pipeline.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const carve::TierThresholds classes{128, 512};
  print_summary(summarize(label, results, classes, seconds), classes);
  bool right = results.size() == pipeline.submitted();
  std::size_t checked = 0;
  for (const Result& r : results) {
    if (!r.ok) {
      std::printf("query %llu: %s\n", static_cast<unsigned long long>(r.query_id), r.error.c_str());
      right = right && r.query_id >= bad; // only the three bad queries may fail
      continue;
    }
    const auto q = kept.find(r.query_id);
    if (q == kept.end()) {
      continue;
    }
    std::vector<float> sum(table_dim(r.table), 0.0f);
    for (const std::uint64_t row : q->second.rows) {
      for (std::uint32_t c = 0; c < sum.size(); ++c) {
        sum[c] += table_value(r.table, row, c);
      }
    }
    ++checked;
    right = right && r.sum == sum; // exact: the values add without rounding in any order
  }
  std::printf("\n%s", carve::format_stats(pipeline.queue().stats(), pipeline.queue().thresholds()).c_str());
  std::printf("\n%zu sums checked against the table formula; %llu queries, %zu results: %s\n", checked,
              static_cast<unsigned long long>(pipeline.submitted()), results.size(),
              right ? "all as expected" : "WRONG");
  return right ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  Options o;
  o.w.table_mib = 4;
  o.w.qps = 2000;
  o.w.aging_ms = 50;
  o.w.seed = 7;
  o.w.dir = std::filesystem::temp_directory_path().string();
  Flags flags("embedding_lookup", "The embedding-lookup pipeline on a generated dataset, queries sorted into tiers "
                                  "of at most 128, 129-512 and more vectors.");
  flags.integer("--queries", o.queries, 1, 10'000'000, "queries to send");
  add_workload_flags(flags, o.w, "queries per second, Poisson arrivals (0: as fast as possible)");
  flags.choice("--policy", o.policy, {"strict-aging", "round-robin", "fifo"},
               "how the request queue drains: strict priority with aging (for latency targets), round-robin "
               "over tiers, or one FIFO without tiers");
  if (const std::optional<int> status = flags.parse_or_exit(argc, argv)) {
    return *status;
  }

  using Tiered = carve::SizeTieredQueue<Query, QueryVectors>;
  using Prioritised = carve::SizeTieredQueue<Query, QueryVectors, carve::RingLanes<>, carve::StrictPriority>;
  constexpr std::size_t capacity = 4096; // per tier
  if (o.policy == "round-robin") {
    return run(o, std::make_unique<Tiered>(carve::TierThresholds{128, 512}, capacity), "SizeTieredQueue, round-robin");
  }
  if (o.policy == "fifo") {
    return run(o, std::make_unique<Tiered>(fifo_thresholds(), capacity), "one FIFO");
  }
  return run(o,
             std::make_unique<Prioritised>(carve::TierThresholds{128, 512}, capacity,
                                           carve::StrictPriority::with_aging(o.w.aging_ns())),
             "SizeTieredQueue, strict priority + aging " + flag_number(o.w.aging_ms) + " ms");
}

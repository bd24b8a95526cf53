// embedding_lookup: the size-tiered embedding-lookup system end to end, on a small dataset it
// generates in a temporary directory (8 tables of 4 MiB over two "storage devices"):
// Poisson-arriving queries are sorted into three tiers by vector count, drained by strict
// priority with aging, split per device, read with pread and summed, post-processed by a
// second-level compute scheduler. Midway a shard migrates, and two bad queries get errors
// while the rest are served. Prints latency per size class and the queue's statistics.
//
//   embedding_lookup [queries (default 3000)] [queries per second (default 2000)]
#include "pipeline.hpp"
#include "workload.hpp"

#include <carve/carve.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

using namespace embedding;

int main(int argc, char** argv) {
  const std::uint64_t queries = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3000;
  const double qps = argc > 2 ? std::strtod(argv[2], nullptr) : 2000;

  const TempDir dir(std::filesystem::temp_directory_path());
  DatasetConfig cfg;
  cfg.root = dir.path();
  cfg.table_bytes = 4 << 20;
  auto map = generate_dataset(cfg);

  using Queue = carve::SizeTieredQueue<Query, QueryVectors, carve::RingLanes<>, carve::StrictPriority>;
  std::vector<Result> results;
  std::mutex mutex;
  Pipeline<Queue> pipeline(Queue::make({128, 512}, 4096, carve::StrictPriority::with_aging(50'000'000)), *map,
                           cfg.devices, PipelineConfig{}, [&](Result&& r) {
                             const std::lock_guard lock(mutex);
                             results.push_back(std::move(r));
                           });

  QueryGenerator gen(map->specs(), QuerySizes{}, 7);
  const auto t0 = Clock::now();
  const auto submit = [&](Query q) { (void)pipeline.submit(std::move(q)); };
  submit_poisson(gen, queries / 2, qps, submit);
  const Shard moving = map->find(0)->copies[0][0];
  const std::uint32_t from = pipeline.migrate(0, 0, 0, 1 - moving.device, cfg.root, cfg.direct_io);
  std::printf("migrated table 0 shard 0: device %u -> %u while queries ran\n", from, 1 - moving.device);
  submit(Query{1'000'000, 42, {1, 2, 3}, Clock::now()});                   // no such table
  submit(Query{1'000'001, 0, {0, map->find(0)->spec.rows}, Clock::now()}); // row past the end
  submit_poisson(gen, queries - queries / 2, qps, submit);
  pipeline.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const auto classes = pipeline.queue().thresholds();
  print_summary(summarize("strict priority + aging 50 ms", results, classes, seconds), classes);
  for (const Result& r : results) {
    if (!r.ok) {
      std::printf("query %llu: %s\n", static_cast<unsigned long long>(r.query_id), r.error.c_str());
    }
  }
  std::printf("\n%s", carve::format_stats(pipeline.queue().stats(), classes).c_str());

  // Check a few sums against the table formula.
  std::size_t checked = 0;
  for (const Result& r : results) {
    if (!r.ok || checked == 5) {
      continue;
    }
    ++checked;
    std::printf("query %llu: %u vectors of table %u, sum[0] = %.4f (output[0] = %.4f)\n",
                static_cast<unsigned long long>(r.query_id), r.vectors, r.table, static_cast<double>(r.sum[0]),
                static_cast<double>(r.output[0]));
  }
  return results.size() == pipeline.submitted() ? 0 : 1;
}

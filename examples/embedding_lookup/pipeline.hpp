// The embedding-lookup system, end to end, with carve's SizeTieredQueue at its front:
//
//   submit(query) -> request queue (sorted into tiers by #vectors)
//     -> manager: takes a query when the I/O stage has room, looks its table up in the device
//        map, splits it per storage device (choosing the least busy copy of a replicated table)
//        into parts of at most chunk_rows rows, and hands each part to the device's loader with
//        the fewest rows queued
//     -> loaders (>= 1 per device): read the rows (pread / io_uring) and add them up. Each
//        loader's queue is a queue of the same kind as the request queue (same thresholds, same
//        drain policy, classifying a part by its query's size), so a small query's parts do
//        not wait behind a large query's either
//     -> compute scheduler: per-processing-element queues, a ready queue on which elements
//        report completion, the next request always to an element that said it is idle
//     -> processing elements: post-processing (mean, a dense layer, ReLU) -> result
//
// Every accepted query produces exactly one Result: an error for an unknown table, an empty
// query, a row past the end of its table or a failed read (a truncated file), else the sum and
// the output. The request queue type is a template parameter so the same system runs with one
// FIFO for comparison (fifo_thresholds()).
#pragma once

#include "dataset.hpp"
#include "vector_reader.hpp"

#include <carve/queue.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

namespace embedding {

using Clock = std::chrono::steady_clock;

struct Query {
  std::uint64_t id = 0;
  std::uint32_t table = 0;
  std::vector<std::uint64_t> rows;
  Clock::time_point arrival{};
};

// A query's size for the scheduler: the number of vectors it reads.
struct QueryVectors {
  std::uint64_t operator()(const Query& q) const noexcept { return q.rows.size(); }
};

struct Result {
  std::uint64_t query_id = 0;
  std::uint32_t table = 0;
  std::uint32_t tier = 0;
  std::uint32_t vectors = 0;
  bool ok = false;
  std::string error;
  std::vector<float> sum;    // sparse-length sum of the rows
  std::vector<float> output; // after post-processing
  Clock::time_point arrival{};
  Clock::time_point done{};
};

// The post-processing every element runs: ReLU(W * (sum / vectors)), W fixed and small.
inline float dense_weight(std::uint32_t out, std::uint32_t in) {
  return static_cast<float>(static_cast<int>((out * 31 + in * 17) % 13) - 6) / 8.0f;
}
inline std::vector<float> post_process(const std::vector<float>& sum, std::uint32_t vectors, std::uint32_t outputs) {
  std::vector<float> y(outputs, 0.0f);
  const float scale = 1.0f / static_cast<float>(vectors);
  for (std::uint32_t j = 0; j < outputs; ++j) {
    float acc = 0.0f;
    for (std::uint32_t c = 0; c < sum.size(); ++c) {
      acc += dense_weight(j, c) * (sum[c] * scale);
    }
    y[j] = std::max(acc, 0.0f);
  }
  return y;
}

// The thresholds of "one FIFO": a single threshold above every size puts every query in tier 0.
inline carve::TierThresholds fifo_thresholds() {
  return carve::TierThresholds{std::numeric_limits<std::uint64_t>::max()};
}

struct PipelineConfig {
  std::uint32_t loaders_per_device = 1;
  std::uint32_t in_flight = 4; // queries the manager lets into the I/O stage at once
  std::uint32_t processing_elements = 2;
  std::uint32_t outputs = 16; // width of the post-processing layer
  IoMode io = IoMode::pread;
  std::size_t part_queue_capacity = 256;
  std::uint32_t chunk_rows = 64; // rows per part at most: large queries spread over the loaders
};

template <class RequestQueue>
class Pipeline {
public:
  using Sink = std::function<void(Result&&)>;

  Pipeline(std::unique_ptr<RequestQueue> queue, DeviceMap& map, std::uint32_t devices, PipelineConfig cfg, Sink sink)
      : queue_(std::move(queue)), map_(map), cfg_(cfg), sink_(std::move(sink)), in_flight_(cfg.in_flight),
        compute_(*this) {
    if (cfg_.loaders_per_device == 0 || cfg_.in_flight == 0 || cfg_.processing_elements == 0 || cfg_.chunk_rows == 0) {
      throw carve::Exception(carve::Errc::invalid_argument,
                             "a pipeline needs at least one loader per device, one query in flight, one "
                             "processing element and parts of at least one row");
    }
    for (std::uint32_t d = 0; d < devices; ++d) {
      for (std::uint32_t k = 0; k < cfg_.loaders_per_device; ++k) {
        loaders_.push_back(std::make_unique<Loader>(d, *queue_, cfg_.part_queue_capacity));
      }
    }
    for (auto& loader : loaders_) {
      loader->thread = std::thread([this, l = loader.get()] { load(*l); });
    }
    compute_.start();
    manager_ = std::thread([this] { manage(); });
  }

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  ~Pipeline() { finish(); }

  // The scheduler: classifies the query into its tier and queues it, waiting while that tier is
  // full. False once the pipeline is finishing (the query was not accepted).
  bool submit(Query q) {
    ++submitted_;
    if (queue_->push(std::move(q))) {
      return true;
    }
    --submitted_;
    return false;
  }

  // Drains everything accepted so far, then stops all threads. Idempotent.
  void finish() {
    if (finished_.exchange(true)) {
      return;
    }
    queue_->close();
    manager_.join();
    for (auto& loader : loaders_) {
      loader->parts->close();
    }
    for (auto& loader : loaders_) {
      loader->thread.join();
    }
    compute_.stop();
  }

  // Moves a shard while queries run: the manager sees the new device from its next lookup.
  std::uint32_t migrate(std::uint32_t table, std::size_t copy, std::size_t shard, std::uint32_t device,
                        const std::filesystem::path& root, bool direct_io) {
    return map_.migrate(table, copy, shard, device, root, direct_io);
  }

  const RequestQueue& queue() const { return *queue_; }
  std::uint64_t delivered() const { return delivered_.load(); }
  std::uint64_t submitted() const { return submitted_.load(); }
  std::vector<std::uint64_t> parts_per_loader() const {
    std::vector<std::uint64_t> out;
    for (const auto& l : loaders_) {
      out.push_back(l->parts_done.load());
    }
    return out;
  }
  std::vector<std::uint64_t> requests_per_element() const { return compute_.served(); }
  IoMode io_mode() const { return loaders_.empty() ? cfg_.io : loaders_.front()->mode.load(); }

private:
  // One accepted query on its way through the I/O stage; its parts share it.
  struct Lookup {
    Query query;
    TableSpec spec{};
    std::uint32_t tier = 0;
    std::mutex mutex;
    std::vector<float> sum;
    std::optional<std::string> error;
    std::atomic<std::uint32_t> parts_left{0};
  };

  struct Part {
    std::shared_ptr<Lookup> lookup;
    Shard shard;
    std::vector<std::uint64_t> rows;
    std::uint64_t query_vectors = 0;
  };
  // A part is classified by the size of its query, with the request queue's thresholds.
  struct PartQueryVectors {
    std::uint64_t operator()(const Part& p) const noexcept { return p.query_vectors; }
  };
  using PartQueue = carve::SizeTieredQueue<Part, PartQueryVectors, carve::RingLanes<>,
                                           typename RequestQueue::drain_policy, typename RequestQueue::clock>;

  struct Loader {
    Loader(std::uint32_t d, const RequestQueue& like, std::size_t capacity)
        : device(d), parts(std::make_unique<PartQueue>(like.thresholds(), capacity, like.drain())) {}
    std::uint32_t device;
    std::unique_ptr<PartQueue> parts;
    std::atomic<std::uint64_t> queued_rows{0};
    std::atomic<std::uint64_t> parts_done{0};
    std::atomic<IoMode> mode{IoMode::pread};
    std::thread thread;
  };

  // The second-level scheduler: each processing element has its own queue; an element that
  // finishes puts its id on the ready queue, and the scheduler hands the next request to it.
  class Compute {
  public:
    explicit Compute(Pipeline& p) : p_(p) {}

    void start() {
      const std::uint32_t n = p_.cfg_.processing_elements;
      ready_ = std::make_unique<IdQueue>(fifo_thresholds(), n);
      pending_ = std::make_unique<LookupQueue>(fifo_thresholds(), 1 << 14);
      for (std::uint32_t e = 0; e < n; ++e) {
        elements_.push_back(std::make_unique<Element>());
        (void)ready_->try_push(std::uint32_t{e}); // every element starts idle
      }
      for (std::uint32_t e = 0; e < n; ++e) {
        elements_[e]->thread = std::thread([this, e] { run_element(e); });
      }
      scheduler_ = std::thread([this] { schedule(); });
    }

    void submit(std::shared_ptr<Lookup> l) { (void)pending_->push(std::move(l)); }

    void stop() {
      pending_->close();
      scheduler_.join();
      for (auto& e : elements_) {
        e->work->close();
      }
      for (auto& e : elements_) {
        e->thread.join();
      }
    }

    std::vector<std::uint64_t> served() const {
      std::vector<std::uint64_t> out;
      for (const auto& e : elements_) {
        out.push_back(e->served.load());
      }
      return out;
    }

  private:
    struct One {
      template <class T>
      std::uint64_t operator()(const T&) const noexcept {
        return 1;
      }
    };
    using IdQueue = carve::SizeTieredQueue<std::uint32_t, One>;
    using LookupQueue = carve::SizeTieredQueue<std::shared_ptr<Lookup>, One>;

    struct Element {
      std::unique_ptr<LookupQueue> work = std::make_unique<LookupQueue>(fifo_thresholds(), 2);
      std::atomic<std::uint64_t> served{0};
      std::thread thread;
    };

    void schedule() {
      for (;;) {
        auto l = pending_->pop();
        if (!l) {
          return; // closed and drained
        }
        const auto idle = ready_->pop(); // an element that reported completion
        (void)elements_[*idle]->work->push(std::move(*l));
      }
    }

    void run_element(std::uint32_t e) {
      Element& me = *elements_[e];
      for (;;) {
        auto l = me.work->pop();
        if (!l) {
          return;
        }
        Lookup& lookup = **l;
        Result r = p_.result_for(lookup);
        r.ok = true;
        r.sum = std::move(lookup.sum);
        r.output = post_process(r.sum, r.vectors, p_.cfg_.outputs);
        ++me.served;
        p_.deliver(std::move(r));
        (void)ready_->push(std::uint32_t{e});
      }
    }

    Pipeline& p_;
    std::unique_ptr<IdQueue> ready_;
    std::unique_ptr<LookupQueue> pending_;
    std::vector<std::unique_ptr<Element>> elements_;
    std::thread scheduler_;
  };

  Result result_for(const Lookup& l) const {
    Result r;
    r.query_id = l.query.id;
    r.table = l.query.table;
    r.tier = l.tier;
    r.vectors = static_cast<std::uint32_t>(l.query.rows.size());
    r.arrival = l.query.arrival;
    return r;
  }

  void deliver(Result&& r) {
    r.done = Clock::now();
    sink_(std::move(r));
    ++delivered_;
  }

  void fail(const Lookup& l, std::string error) {
    Result r = result_for(l);
    r.error = std::move(error);
    deliver(std::move(r));
  }

  void manage() {
    for (;;) {
      in_flight_.acquire(); // the I/O stage has room for one more query
      auto q = queue_->pop();
      if (!q) {
        in_flight_.release();
        return; // closed and drained
      }
      dispatch(std::move(*q));
    }
  }

  void dispatch(Query&& q) {
    auto lookup = std::make_shared<Lookup>();
    lookup->tier = queue_->tier_of(q);
    lookup->query = std::move(q);
    const Query& query = lookup->query;
    const std::optional<TablePlacement> placement = map_.find(query.table);
    std::string error;
    if (!placement) {
      error = "unknown table " + std::to_string(query.table);
    } else if (query.rows.empty()) {
      error = "a query must name at least one vector";
    } else if (const auto past = std::find_if(query.rows.begin(), query.rows.end(),
                                              [&](std::uint64_t r) { return r >= placement->spec.rows; });
               past != query.rows.end()) {
      error = "row " + std::to_string(*past) + " is past the end of table " + std::to_string(query.table) + " (" +
              std::to_string(placement->spec.rows) + " rows)";
    }
    if (!error.empty()) {
      fail(*lookup, std::move(error));
      in_flight_.release();
      return;
    }
    lookup->spec = placement->spec;
    lookup->sum.assign(placement->spec.dim, 0.0f);

    // A replicated table: read from the copy whose devices have the fewest rows queued.
    const std::vector<Shard>* copy = &placement->copies.front();
    std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
    for (const auto& c : placement->copies) {
      std::uint64_t load = 0;
      for (const Shard& s : c) {
        load += device_load(s.device);
      }
      if (load < best) {
        best = load;
        copy = &c;
      }
    }
    std::vector<Part> parts;
    for (const Shard& s : *copy) {
      Part part{lookup, s, {}, query.rows.size()};
      for (const std::uint64_t r : query.rows) {
        if (!s.holds(r)) {
          continue;
        }
        part.rows.push_back(r);
        if (part.rows.size() == cfg_.chunk_rows) {
          parts.push_back(part);
          part.rows.clear();
        }
      }
      if (!part.rows.empty()) {
        parts.push_back(std::move(part));
      }
    }
    std::vector<Loader*> chosen;
    for (const Part& part : parts) {
      chosen.push_back(least_loaded(part.shard.device));
      if (chosen.back() != nullptr) {
        chosen.back()->queued_rows += part.rows.size(); // so the next part sees this one
      } else {
        for (std::size_t i = 0; i + 1 < chosen.size(); ++i) {
          chosen[i]->queued_rows -= parts[i].rows.size();
        }
        fail(*lookup, "no loader serves device " + std::to_string(part.shard.device));
        in_flight_.release();
        return;
      }
    }
    lookup->parts_left.store(static_cast<std::uint32_t>(parts.size()));
    for (std::size_t i = 0; i < parts.size(); ++i) {
      (void)chosen[i]->parts->push(std::move(parts[i]));
    }
  }

  std::uint64_t device_load(std::uint32_t device) const {
    std::uint64_t load = 0;
    for (const auto& l : loaders_) {
      if (l->device == device) {
        load += l->queued_rows.load(std::memory_order_relaxed);
      }
    }
    return load;
  }

  // The device's loader with the fewest rows queued; null for a device no loader serves.
  Loader* least_loaded(std::uint32_t device) {
    Loader* best = nullptr;
    for (auto& l : loaders_) {
      if (l->device == device && (best == nullptr || l->queued_rows.load() < best->queued_rows.load())) {
        best = l.get();
      }
    }
    return best;
  }

  void load(Loader& me) {
    VectorReader reader(cfg_.io);
    me.mode = reader.mode();
    std::vector<float> partial;
    for (;;) {
      auto part = me.parts->pop();
      if (!part) {
        return;
      }
      Lookup& lookup = *part->lookup;
      partial.assign(lookup.spec.dim, 0.0f);
      std::optional<std::string> error = reader.add_rows(lookup.spec, part->shard, part->rows, partial);
      {
        const std::lock_guard lock(lookup.mutex);
        if (error && !lookup.error) {
          lookup.error = std::move(error);
        } else if (!error) {
          for (std::size_t c = 0; c < partial.size(); ++c) {
            lookup.sum[c] += partial[c];
          }
        }
      }
      me.queued_rows -= part->rows.size();
      ++me.parts_done;
      if (lookup.parts_left.fetch_sub(1) == 1) {
        in_flight_.release();
        if (lookup.error) {
          fail(lookup, *lookup.error);
        } else {
          compute_.submit(std::move(part->lookup));
        }
      }
    }
  }

  std::unique_ptr<RequestQueue> queue_;
  DeviceMap& map_;
  PipelineConfig cfg_;
  Sink sink_;
  std::counting_semaphore<> in_flight_;
  std::vector<std::unique_ptr<Loader>> loaders_;
  Compute compute_;
  std::thread manager_;
  std::atomic<bool> finished_{false};
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> delivered_{0};
};

} // namespace embedding

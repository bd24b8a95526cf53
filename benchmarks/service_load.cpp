// carve-served under load and faults: N client processes for S seconds of mixed allocate, free
// and trim, clients SIGKILLed at random (and replaced), and the server stopped and started again
// half way. At the end every client is gone and the server's books must balance: no live region,
// no lease, every card's memory back, its tables consistent. Prints calls/s and latencies.
//
//   bench_service_load [--clients 16] [--seconds 30] [--kill-every-ms 250] [--no-restart]
//
// Each client mixes the two ways to use the service: small blocks (64 B to 64 KiB) from a
// CachingPool over its leases, which calls the server only for a new lease or a trim, and large
// regions (1 to 4 MiB) allocated and freed by round trips. When the server goes away a client
// sees `disconnected`, drops its pool and regions (orphans: still mapped, freed locally) and
// reconnects: nothing of a session survives a server restart, the memory of the old server's
// regions included.
//
// Exit status: 0 when the books balance, 1 otherwise.
#include "service/service_process.hpp"

#include <carve/mr.hpp>
#include <carve/service.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace carve::service;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct Settings {
  int clients = 16;
  double seconds = 30;
  int kill_every_ms = 250;
  bool restart = true;
};

// What one client process did, written to a file when its time is up.
struct ClientReport {
  std::uint64_t pooled_calls = 0;
  std::uint64_t server_calls = 0;
  std::uint64_t refused = 0;
  std::uint64_t reconnects = 0;
};

double percentile(std::vector<float>& v, double p) {
  if (v.empty()) {
    return 0.0;
  }
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

template <class F>
float timed_us(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<float, std::micro>(clock_type::now() - t0).count();
}

// One client process: works until `deadline`, then writes its report and latencies.
int client_main(const std::filesystem::path& socket, unsigned seed, clock_type::time_point deadline,
                const std::filesystem::path& out) {
  std::mt19937 rng(seed);
  ClientReport report;
  std::vector<float> pooled_us;
  std::vector<float> server_us;
  const int card = static_cast<int>(seed % 8);
  while (clock_type::now() < deadline) {
    auto client = AllocationClient::connect(ClientOptions{socket, "load", 5s, card});
    if (!client) {
      std::this_thread::sleep_for(5ms); // the server is restarting
      continue;
    }
    ++report.reconnects;
    carve::CachingPool pool(carve::ref(*client), {.granularity = 64, .segment_size = 1 * MiB});
    std::vector<std::pair<void*, std::size_t>> small;
    std::vector<void*> large;
    bool lost = false;
    while (!lost && clock_type::now() < deadline) {
      const auto dice = static_cast<unsigned>(rng() % 100);
      if (dice < 42) {
        const std::size_t bytes = std::size_t{64} << (rng() % 11);
        cuda::std::expected<void*, carve::Errc> p = cuda::std::unexpected(carve::Errc::no_space);
        pooled_us.push_back(timed_us([&] { p = pool.try_allocate(bytes, 64); }));
        ++report.pooled_calls;
        if (p) {
          std::memset(*p, 0x5a, 64);
          small.emplace_back(*p, bytes);
        } else {
          ++report.refused;
          lost = !client->connected();
        }
      } else if (dice < 84) {
        if (!small.empty()) {
          const std::size_t k = rng() % small.size();
          pooled_us.push_back(timed_us([&] { pool.deallocate(small[k].first, small[k].second, 64); }));
          ++report.pooled_calls;
          small[k] = small.back();
          small.pop_back();
        }
      } else if (dice < 92) {
        std::optional<carve::Result<Region>> r;
        server_us.push_back(timed_us([&] { r = client->lease((1 + rng() % 4) * MiB, card, 256); }));
        ++report.server_calls;
        if (*r) {
          std::memset((*r)->ptr, 0xa5, 4 * KiB);
          large.push_back((*r)->ptr);
        } else {
          ++report.refused;
          lost = (*r).error().code == carve::Errc::disconnected;
        }
      } else if (dice < 99) {
        if (!large.empty()) {
          const std::size_t k = rng() % large.size();
          std::optional<carve::Result<void>> r;
          server_us.push_back(timed_us([&] { r = client->free(large[k]); }));
          ++report.server_calls;
          lost = !*r && (*r).error().code == carve::Errc::disconnected;
          large[k] = large.back();
          large.pop_back();
        }
      } else {
        server_us.push_back(timed_us([&] { pool.trim(); }));
        ++report.server_calls;
      }
    }
    // Done, or the server went away: give everything back (locally, for orphans).
    for (const auto& [p, bytes] : small) {
      pool.deallocate(p, bytes, 64);
    }
    for (void* p : large) {
      (void)client->free(p);
    }
  }
  std::ofstream f(out, std::ios::binary);
  const auto put = [&](const void* p, std::size_t n) { f.write(static_cast<const char*>(p), static_cast<long>(n)); };
  put(&report, sizeof report);
  for (std::vector<float>* v : {&pooled_us, &server_us}) {
    const std::uint64_t n = v->size();
    put(&n, sizeof n);
    put(v->data(), n * sizeof(float));
  }
  return f ? 0 : 2;
}

std::vector<std::string> server_args(const std::string& topology) {
  return {"--topology", "nvidia-smi:" + topology, "--card-memory", "512MiB", "--max-clients", "64"};
}

} // namespace

int main(int argc, char** argv) try {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) {
        throw carve::Exception(carve::Errc::invalid_argument, arg + " needs a value");
      }
      return std::string(argv[++i]);
    };
    if (arg == "--clients") {
      settings.clients = std::stoi(value());
    } else if (arg == "--seconds") {
      settings.seconds = std::stod(value());
    } else if (arg == "--kill-every-ms") {
      settings.kill_every_ms = std::stoi(value());
    } else if (arg == "--no-restart") {
      settings.restart = false;
    } else {
      throw carve::Exception(carve::Errc::invalid_argument, "unknown argument " + arg);
    }
  }
  if (settings.clients < 1 || settings.clients > 60 || !(settings.seconds > 0) || settings.kill_every_ms < 1) {
    throw carve::Exception(carve::Errc::invalid_argument, "want 1-60 clients, seconds > 0, kill-every-ms >= 1");
  }

  carve::test::TempDir dir;
  const std::filesystem::path socket = dir.path() / "served.sock";
  const std::string topology = CARVE_BENCH_TOPOLOGY;
  std::optional<carve::test::ServedProcess> server(std::in_place, server_args(topology), socket);
  if (!server->listening()) {
    std::fprintf(stderr, "carve-served did not start:\n%s\n", server->output().c_str());
    return 1;
  }
  const auto start = clock_type::now();
  const auto deadline =
      start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(settings.seconds));
  std::mt19937 rng(1);
  unsigned next_seed = 0;
  const auto spawn = [&] {
    const unsigned seed = next_seed++;
    return carve::test::fork_child(
        [&, seed] { return client_main(socket, seed, deadline, dir.path() / ("client-" + std::to_string(seed))); });
  };
  std::vector<pid_t> running;
  for (int k = 0; k < settings.clients; ++k) {
    running.push_back(spawn());
  }
  int killed = 0;
  bool restarted = false;
  auto next_kill = start + std::chrono::milliseconds(settings.kill_every_ms);
  while (clock_type::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    const auto now = clock_type::now();
    if (settings.restart && !restarted && now >= start + (deadline - start) / 2) {
      restarted = true;
      if (server->stop() != 0) {
        std::fprintf(stderr, "carve-served did not stop cleanly:\n%s\n", server->output().c_str());
        return 1;
      }
      server.emplace(server_args(topology), socket);
      if (!server->listening()) {
        std::fprintf(stderr, "carve-served did not start again:\n%s\n", server->output().c_str());
        return 1;
      }
    }
    if (now >= next_kill && now + 500ms < deadline) {
      next_kill += std::chrono::milliseconds(settings.kill_every_ms);
      const std::size_t k = rng() % running.size();
      ::kill(running[k], SIGKILL);
      carve::test::wait_exit(running[k]);
      running[k] = spawn();
      ++killed;
    }
  }
  int failed_clients = 0;
  for (const pid_t p : running) {
    failed_clients += carve::test::wait_exit(p) != 0 ? 1 : 0;
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();

  ClientReport total;
  std::vector<float> pooled_us;
  std::vector<float> server_us;
  for (unsigned seed = 0; seed < next_seed; ++seed) {
    std::ifstream f(dir.path() / ("client-" + std::to_string(seed)), std::ios::binary);
    ClientReport r;
    if (!f.read(reinterpret_cast<char*>(&r), sizeof r)) {
      continue; // killed before it could report
    }
    total.pooled_calls += r.pooled_calls;
    total.server_calls += r.server_calls;
    total.refused += r.refused;
    total.reconnects += r.reconnects;
    for (std::vector<float>* v : {&pooled_us, &server_us}) {
      std::uint64_t n = 0;
      f.read(reinterpret_cast<char*>(&n), sizeof n);
      const std::size_t at = v->size();
      v->resize(at + n);
      f.read(reinterpret_cast<char*>(v->data() + at), static_cast<long>(n * sizeof(float)));
    }
  }

  // Every client is gone: the server must have taken everything back.
  auto observer = AllocationClient::connect(ClientOptions{socket, "observer", 10s});
  if (!observer) {
    std::fprintf(stderr, "cannot connect to check the books: %s\n", observer.error().message.c_str());
    return 1;
  }
  std::optional<StatsReply> books;
  for (const auto until = clock_type::now() + 10s; clock_type::now() < until;) {
    auto s = observer->stats();
    if (s && s->clients == 1 && s->live_regions == 0) {
      books = *s;
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  bool balanced = books && books->consistent && books->leased_segments == 0 && books->retired_segments == 0;
  for (const CardStats& card : books ? books->cards : std::vector<CardStats>{}) {
    balanced = balanced && card.free_bytes == card.capacity && card.bytes_in_use == 0;
  }

  std::printf("%d client processes for %.1f s, %d killed and replaced, server restarted: %s\n", settings.clients,
              seconds, killed, restarted ? "yes" : "no");
  std::printf("  pooled calls  %10llu  %9.0f calls/s  p50 %7.2f us  p99 %7.2f us  p999 %8.2f us\n",
              static_cast<unsigned long long>(total.pooled_calls), static_cast<double>(total.pooled_calls) / seconds,
              percentile(pooled_us, 0.5), percentile(pooled_us, 0.99), percentile(pooled_us, 0.999));
  std::printf("  server calls  %10llu  %9.0f calls/s  p50 %7.2f us  p99 %7.2f us  p999 %8.2f us\n",
              static_cast<unsigned long long>(total.server_calls), static_cast<double>(total.server_calls) / seconds,
              percentile(server_us, 0.5), percentile(server_us, 0.99), percentile(server_us, 0.999));
  std::printf("  refused %llu, sessions %llu (reconnects after a restart included), clients failed %d\n",
              static_cast<unsigned long long>(total.refused), static_cast<unsigned long long>(total.reconnects),
              failed_clients);
  std::printf("  books: %s (live regions %llu, leased segments %llu, consistent %s)\n",
              balanced ? "balanced" : "NOT BALANCED", static_cast<unsigned long long>(books ? books->live_regions : 0),
              static_cast<unsigned long long>(books ? books->leased_segments : 0),
              books && books->consistent ? "yes" : "no");
  return balanced && failed_clients == 0 && server->stop() == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_service_load: %s\n", e.what());
  return 1;
}

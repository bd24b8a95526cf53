// carve-served: one process owns the cards' memory; applications borrow it through
// carve::AllocationClient. Settings: see carve/service/server_config.hpp, or --help.
//
//   carve-served --topology nvidia-smi:topo.txt --card-memory 16GiB --strategy weighted-score
//
// SIGTERM or SIGINT stops it cleanly: every client is disconnected, every region reclaimed,
// the memory returned to the cards and the socket removed.
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/service/server_config.hpp>
#include <carve/topology/cuda_discovery.hpp>

#include <csignal>
#include <cstdio>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage = R"(usage: carve-served [--key value]...
  --config FILE           settings from a file (one "key value" per line)
  --socket PATH           where to listen (default $CARVE_SOCKET, $XDG_RUNTIME_DIR/carve/served.sock
                          or /tmp/carve-UID/served.sock)
  --topology SOURCE       nvidia-smi:FILE | description:FILE | cuda
  --bandwidth TYPE=GBPS   per link, for nvidia-smi text (nvlink, pcie, inter_socket)
  --max-hops N            links on a path
  --backend NAME          shared-memory (simulated cards) | cuda
  --card-memory SIZE      every simulated card; or N=SIZE for card N
  --strategy TEXT         largest-bandwidth | threshold-most-free[:threshold=G,strict]
                          | weighted-score[:free=W,bandwidth=W,history=W]
  --history-window N      borrows the weighted strategy remembers
  --max-clients N         connections at once
)";

void (*stop_server)(void*) = nullptr;
void* running_server = nullptr;

extern "C" void on_signal(int) {
  if (stop_server != nullptr) {
    stop_server(running_server); // AllocationServer::request_stop: one write(2) to an eventfd
  }
}

template <class Upstream>
int serve(const carve::service::ServerConfig& config, const carve::Topology& topology, std::vector<Upstream> cards) {
  carve::AllocationServer<Upstream> server(topology, std::move(cards), config.server_options());
  running_server = &server;
  stop_server = [](void* s) { static_cast<carve::AllocationServer<Upstream>*>(s)->request_stop(); };
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::printf("carve-served: listening on %s: %d cards, %s backend, strategy %s\n", server.socket_path().c_str(),
              topology.gpu_count(), carve::to_string(Upstream::export_kind),
              carve::to_string(config.service.strategy).c_str());
  std::fflush(stdout);
  server.run();
  const auto stats = server.service().stats();
  std::printf("carve-served: stopping: disconnecting %llu clients, reclaiming %llu regions\n",
              static_cast<unsigned long long>(stats.clients), static_cast<unsigned long long>(stats.live_regions));
  stop_server = nullptr;
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (const std::string_view a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
  }
  try {
    const auto config = carve::service::parse_server_args(args);
    if (config.backend == carve::service::Backend::cuda) {
#if __has_include(<cuda_runtime_api.h>) // built with the CUDA runtime (CUDA::cudart)
      const carve::Topology topology =
          config.topology == "cuda" ? carve::discover_topology() : carve::service::load_topology(config);
      std::vector<carve::CudaDeviceResource> gpus;
      for (int g = 0; g < topology.gpu_count(); ++g) {
        gpus.emplace_back(g);
      }
      return serve(config, topology, std::move(gpus));
#else
      throw carve::Exception(carve::Errc::unsupported, "this carve-served was built without the CUDA runtime");
#endif
    }
    if (config.topology == "cuda") {
      throw carve::Exception(carve::Errc::invalid_argument, "topology cuda needs --backend cuda");
    }
    const carve::Topology topology = carve::service::load_topology(config);
    return serve(config, topology, carve::service::shared_memory_cards(config, topology));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "carve-served: %s\n", e.what());
    return 1;
  }
}

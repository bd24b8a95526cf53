// carve-served: one process owns the cards' memory; applications borrow it through
// carve::AllocationClient. Settings: see carve/service/server_config.hpp, or --help.
//
//   carve-served --topology nvidia-smi:topo.txt --card-memory 16GiB --strategy weighted-score
//
// Readiness, once the socket listens: "READY=1" to the service manager when $NOTIFY_SOCKET is set
// (systemd Type=notify; see examples/carve-served.service), a line on --ready-fd, the pid in
// --pidfile. SIGTERM or SIGINT stops it cleanly: no new connections (the socket goes at once),
// requests that already arrived are answered and owed replies sent (for at most --drain-timeout),
// then every client is disconnected, every region reclaimed, the memory returned to the cards,
// and it exits 0.
//
// Every segment of the shared-memory and host-vmm backends keeps its memfd open (the server must be able to
// export it to the next client, and a mapping cannot be turned back into a descriptor without
// CAP_CHECKPOINT_RESTORE), so the server raises its soft descriptor limit to the hard one.
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/service/server_config.hpp>
#include <carve/topology/cuda_discovery.hpp>
#include <carve/vmm.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
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
  --backend NAME          shared-memory (simulated cards) | host-vmm (simulated cards, VMM host twin)
                          | cuda (GPUs, CUDA VMM) | cuda-ipc (GPUs, cudaMalloc + legacy CUDA IPC)
  --card-memory SIZE      every simulated card; or N=SIZE for card N
  --strategy TEXT         largest-bandwidth | threshold-most-free[:threshold=G,strict]
                          | weighted-score[:free=W,bandwidth=W,history=W]
  --history-window N      borrows the weighted strategy remembers
  --max-clients N         connections at once
  --max-unread-descriptors N
                          per client, descriptors sent and not yet read before the next waits
  --handshake-timeout T   a connection must say Hello within T (default 5s; 0: no limit)
  --idle-timeout T        close clients that hold no memory and sent nothing for T (default 0: never)
  --drain-timeout T       after SIGTERM, how long owed replies may take (default 2s)
  --pidfile PATH          write the pid there once listening (removed on exit)
  --ready-fd N            write "READY=1" and a newline to descriptor N once listening, then close it
Times: 200ms, 5s, 10min. Under systemd (NOTIFY_SOCKET set) it reports READY=1 and STOPPING=1.
)";

// What the signal handler reads: lock-free atomics, which a handler may read (plain globals it
// may not), set before the handler is installed.
std::atomic<void (*)(void*)> stop_server{nullptr};
std::atomic<void*> running_server{nullptr};
std::atomic<int> notify_fd{-1}; // the service manager's socket, or -1

extern "C" void on_signal(int) {
  const int saved = errno; // the code the signal interrupted may be about to read it
  if (const auto stop = stop_server.load()) {
    (void)carve::service::notify_service_manager(notify_fd.load(), "STOPPING=1"); // one send(2)
    stop(running_server.load()); // AllocationServer::request_stop: one write(2) to an eventfd
  }
  errno = saved;
}

// The soft limit up to the hard one: a descriptor per live segment adds up, and the hard limit
// is what the administrator allows (systemd's LimitNOFILE=, or ulimit -Hn).
rlim_t raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) {
    return 0;
  }
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      r = raised;
    }
  }
  return r.rlim_cur;
}

// Writes the pid to `path` (replacing the file whole, so a reader never sees half of it).
void write_pidfile(const std::filesystem::path& path) {
  const std::filesystem::path temp = path.string() + ".tmp";
  const std::string text = std::to_string(::getpid()) + "\n";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) {
    ::close(fd);
  }
  if (!ok || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    throw carve::Exception(carve::Errc::io_error, "pidfile " + path.string() + ": " + std::strerror(e));
  }
}

// Removes the pidfile if it still names this process (another instance may have replaced it).
void remove_pidfile(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  long pid = 0;
  if (f != nullptr) {
    const bool read = std::fscanf(f, "%ld", &pid) == 1;
    std::fclose(f);
    if (read && pid == static_cast<long>(::getpid())) {
      ::unlink(path.c_str());
    }
  }
}

template <class Upstream>
int serve(const carve::service::ServerConfig& config, const carve::Topology& topology, std::vector<Upstream> cards) {
  if (config.ready_fd && ::fcntl(*config.ready_fd, F_GETFD) < 0) {
    throw carve::Exception(carve::Errc::invalid_argument,
                           "ready-fd " + std::to_string(*config.ready_fd) + " is not an open descriptor");
  }
  const rlim_t descriptors = raise_descriptor_limit();
  auto notify = carve::service::connect_notify_socket();
  if (!notify) { // an environment left over from elsewhere must not keep the server from running
    std::fprintf(stderr, "carve-served: not notifying the service manager: %s\n", notify.error().message.c_str());
    notify = carve::service::UniqueFd{};
  }
  carve::AllocationServer<Upstream> server(topology, std::move(cards), config.server_options());
  running_server = &server;
  notify_fd = notify->get();
  stop_server = [](void* s) { static_cast<carve::AllocationServer<Upstream>*>(s)->request_stop(); };
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  if (!config.pidfile.empty()) {
    write_pidfile(config.pidfile);
  }
  std::printf("carve-served: listening on %s: %d cards, %s backend, strategy %s, up to %llu descriptors\n",
              server.socket_path().c_str(), topology.gpu_count(), carve::to_string(Upstream::export_kind),
              carve::to_string(config.service.strategy).c_str(), static_cast<unsigned long long>(descriptors));
  std::fflush(stdout);
  if (config.ready_fd) {
    constexpr std::string_view ready = "READY=1\n";
    const bool written = ::write(*config.ready_fd, ready.data(), ready.size()) == static_cast<ssize_t>(ready.size());
    const int e = errno;
    ::close(*config.ready_fd);
    if (!written) {
      throw carve::Exception(carve::Errc::io_error,
                             "ready-fd " + std::to_string(*config.ready_fd) + ": " + std::strerror(e));
    }
  }
  if (*notify) {
    const std::string ready = "READY=1\nMAINPID=" + std::to_string(::getpid());
    if (const int e = carve::service::notify_service_manager(notify->get(), ready); e != 0) {
      std::fprintf(stderr, "carve-served: cannot tell the service manager it is ready: %s\n", std::strerror(e));
    }
  }
  server.run();
  stop_server = nullptr;
  notify_fd = -1;
  const auto stats = server.service().stats();
  std::printf("carve-served: stopping: disconnecting %llu clients, reclaiming %llu regions\n",
              static_cast<unsigned long long>(stats.clients), static_cast<unsigned long long>(stats.live_regions));
  if (!config.pidfile.empty()) {
    remove_pidfile(config.pidfile);
  }
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
    using carve::service::Backend;
    if (config.backend == Backend::cuda || config.backend == Backend::cuda_ipc) {
#if __has_include(<cuda_runtime_api.h>) && __has_include(<cuda.h>) // built with the CUDA runtime (CUDA::cudart)
      const carve::Topology topology =
          config.topology == "cuda" ? carve::discover_topology() : carve::service::load_topology(config);
      if (config.backend == Backend::cuda_ipc) { // the fallback: cudaMalloc memory, legacy CUDA IPC
        std::vector<carve::CudaDeviceResource> gpus;
        for (int g = 0; g < topology.gpu_count(); ++g) {
          gpus.emplace_back(g);
        }
        return serve(config, topology, std::move(gpus));
      }
      std::vector<carve::VmmCard<carve::CudaMemoryMapper>> gpus;
      for (int g = 0; g < topology.gpu_count(); ++g) {
        gpus.emplace_back(carve::CudaMemoryMapper{}, g, carve::CudaDeviceResource(g).capacity());
      }
      return serve(config, topology, std::move(gpus));
#else
      throw carve::Exception(carve::Errc::unsupported, "this carve-served was built without the CUDA runtime");
#endif
    }
    if (config.topology == "cuda") {
      throw carve::Exception(carve::Errc::invalid_argument, "topology cuda needs --backend cuda or cuda-ipc");
    }
    if (config.backend == Backend::host_vmm) {
      const carve::Topology topology = carve::service::load_topology(config);
      return serve(config, topology, carve::service::host_vmm_cards(config, topology));
    }
    const carve::Topology topology = carve::service::load_topology(config);
    return serve(config, topology, carve::service::shared_memory_cards(config, topology));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "carve-served: %s\n", e.what());
    return 1;
  }
}

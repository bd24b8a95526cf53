// Real processes for the allocation service's tests and benchmark: carve-served started with
// fork/exec in a private directory, child processes running client code, and a raw connection
// for sending whatever bytes a test wants.
#pragma once

#include <carve/mr/segment_export.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/unix_socket.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace carve::test {

// A fresh directory under the system's temporary directory, mode 0700, removed by its owner.
class TempDir {
public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "carve-test-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    path_ = templ;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

private:
  std::filesystem::path path_;
};

// Waits for a child; its exit code, 128 + signal when killed.
inline int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return -1;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs `body` in a forked child; the child exits with its return value (or 99 on any exception:
// nothing may unwind into the test runner's frames, which the child shares).
inline pid_t fork_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "child: an exception that is not a std::exception\n");
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

// Runs a program with fork/exec, its output going to `log`. `in_child` runs in the child before
// exec (set limits, environment, descriptors); it must not throw.
inline pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log,
                   const std::function<void()>& in_child = {}) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    if (in_child) {
      in_child();
    }
    std::vector<char*> args;
    for (const std::string& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  return pid;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// carve-served's arguments for the DGX-1 topology in `data_dir` (the tests' data), with 16 MiB
// simulated cards, followed by `extra`.
inline std::vector<std::string> served_on_dgx1(const std::string& data_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--topology", "nvidia-smi:" + data_dir + "/topology/dgx1_v100.txt", "--card-memory",
                                "16MiB"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// carve-served running as a child process. The socket goes in a private directory unless the
// arguments name one.
class ServedProcess {
public:
  explicit ServedProcess(std::vector<std::string> args, std::filesystem::path socket = {},
                         const std::function<void()>& in_child = {})
      : socket_(socket.empty() ? dir_.path() / "served.sock" : std::move(socket)), log_(dir_.path() / "served.log") {
    std::vector<std::string> argv{CARVE_SERVED, "--socket", socket_.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = spawn(argv, log_, in_child);
    wait_until_ready();
  }
  ServedProcess(const ServedProcess&) = delete;
  ServedProcess& operator=(const ServedProcess&) = delete;
  ~ServedProcess() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      wait_exit(pid_);
    }
  }

  // Sends `signal` and waits: the exit code.
  int stop(int signal = SIGTERM) {
    ::kill(pid_, signal);
    const int code = wait_exit(pid_);
    pid_ = -1;
    return code;
  }
  // The exit code of a server that stops by itself (e.g. refused to start).
  int wait() {
    if (pid_ > 0) {
      exit_code_ = wait_exit(pid_);
      pid_ = -1;
    }
    return exit_code_;
  }

  bool running() const noexcept { return pid_ > 0; }
  bool listening() const noexcept { return listening_; }
  pid_t pid() const noexcept { return pid_; }
  const std::filesystem::path& socket() const noexcept { return socket_; }
  const std::filesystem::path& directory() const noexcept { return dir_.path(); }
  std::string output() const { return read_text(log_); }

private:
  void wait_until_ready() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) { // it gave up
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pid_ = -1;
        return;
      }
      if (read_text(log_).find("carve-served: listening on") != std::string::npos) {
        listening_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL); // the destructor of an object whose constructor throws never runs
    wait_exit(pid_);
    pid_ = -1;
    throw std::runtime_error("carve-served did not start within 20 s:\n" + read_text(log_));
  }

  TempDir dir_;
  std::filesystem::path socket_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
  bool listening_ = false;
};

// A connection that sends raw bytes and reads raw replies, for bad-input tests.
class RawConnection {
public:
  explicit RawConnection(const std::filesystem::path& socket) {
    auto fd = service::connect_to(socket);
    if (!fd) {
      throw std::runtime_error(fd.error().message);
    }
    fd_ = std::move(*fd);
  }
  bool send(const std::vector<std::uint8_t>& bytes, int pass_fd = -1) {
    return service::send_message(fd_.get(), bytes, pass_fd) == 0;
  }
  bool send(const service::Request& r, std::uint32_t seq) { return send(service::encode(r, seq)); }
  // The next message, or nullopt when the server closed the connection (or 5 s passed); the
  // descriptors that came with it are counted into `descriptors` when given, and closed.
  std::optional<service::Decoded<service::Reply>> receive(std::size_t* descriptors = nullptr) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) {
      return std::nullopt;
    }
    std::vector<std::uint8_t> buffer(service::max_message_size);
    std::vector<service::UniqueFd> fds;
    const auto r = service::receive_message(fd_.get(), buffer, fds);
    if (r.closed || r.error != 0) {
      return std::nullopt;
    }
    if (descriptors != nullptr) {
      *descriptors += fds.size();
    }
    auto d = service::decode_reply(std::span<const std::uint8_t>(buffer.data(), r.size));
    if (!d) {
      throw std::runtime_error("undecodable reply: " + d.error().message);
    }
    return std::move(*d);
  }
  // True when the server has closed the connection (after any replies are read).
  bool closed_by_server() {
    for (int i = 0; i < 8; ++i) {
      if (!receive()) {
        return true;
      }
    }
    return false;
  }
  int fd() const noexcept { return fd_.get(); }

private:
  service::UniqueFd fd_;
};

// An exportable card whose exports must not outlive the memory and need the CUDA runtime to map
// (as with CUDA IPC), played by host memory: the lease rules and a CUDA-less client's error path
// without a GPU.
class CudaIpcLikeCard {
public:
  static constexpr ExportKind export_kind = ExportKind::cuda_ipc;
  static constexpr bool release_while_mapped = false;
  explicit CudaIpcLikeCard(std::size_t capacity) : card_(capacity) {}
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return card_.try_allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { card_.deallocate(p, bytes, alignment); }
  std::size_t free_bytes() const noexcept { return card_.free_bytes(); }
  std::size_t capacity() const noexcept { return card_.capacity(); }
  std::optional<SegmentExport> export_segment(void*, std::size_t bytes) const {
    SegmentExport e;
    e.kind = export_kind;
    e.size = bytes;
    e.device = 0;
    return e;
  }
  // Host memory: no GPU to name (a real CUDA card names its own).
  Result<DeviceUuid> device_uuid() const { return no_device_uuid; }

private:
  SimulatedCard card_;
};
static_assert(ExportableResource<CudaIpcLikeCard>);

} // namespace carve::test

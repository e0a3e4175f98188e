// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/observe/stats_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string_view>
#include <thread>

#include "cqd/stats_format.h"
#include "runtime/base/pinning.h"

namespace cqd::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kRequestWait{200};   // for a request line
constexpr std::chrono::milliseconds kStallLimit{1000};   // without progress on a write
constexpr std::chrono::milliseconds kClientLimit{5000};  // for one client in all
constexpr int kBackoffMs = 100;                          // after a failed accept
constexpr size_t kMaxRequest = 4096;                     // HTTP headers included

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());  // CheckPath: it fits, with its NUL
  return addr;
}

int Remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(left.count()) + 1;
}

std::string HttpResponse(std::string_view status, std::string_view type, std::string_view body) {
  std::string out = "HTTP/1.0 ";
  out += status;
  out += "\r\nContent-Type: ";
  out += type;
  out += "\r\nContent-Length: " + std::to_string(body.size());
  out += "\r\nConnection: close\r\n\r\n";
  out += body;
  return out;
}

constexpr std::string_view kPrometheusType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

Status StatsServer::CheckPath(const std::string& path) {
  constexpr size_t kMax = sizeof(sockaddr_un::sun_path) - 1;
  if (path.size() > kMax) {
    return InvalidArgument("stats_socket is " + std::to_string(path.size()) +
                           " bytes long; a Unix socket path holds at most " + std::to_string(kMax));
  }
  if (path.find('\0') != std::string::npos) {
    return InvalidArgument("stats_socket contains a NUL byte");
  }
  return Status::Ok();
}

StatsServer::StatsServer(std::string path, std::function<Stats()> snapshot, const Logger& log)
    : path_(std::move(path)), snapshot_(std::move(snapshot)), log_(log) {}

Result<std::unique_ptr<StatsServer>> StatsServer::Start(const std::string& path, uint32_t mode,
                                                        std::function<Stats()> snapshot,
                                                        const Logger& log) {
  if (Status s = CheckPath(path); !s.ok()) return s;
  if (path.empty()) return InvalidArgument("stats_socket is empty");
  std::unique_ptr<StatsServer> server(new StatsServer(path, std::move(snapshot), log));
  const std::string what = "stats_socket " + path;
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) return ErrnoStatus(what + ": eventfd", errno);
  server->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) return ErrnoStatus(what + ": socket", errno);
  const sockaddr_un addr = Address(path);
  const auto* sa = reinterpret_cast<const sockaddr*>(&addr);
  // The file bind creates takes the socket's mode (less the umask): set it first, so that no
  // other user can connect in between; chmod after bind then sets exactly `mode`.
  if (fchmod(server->listen_fd_, mode) != 0) return ErrnoStatus(what + ": fchmod", errno);
  if (bind(server->listen_fd_, sa, sizeof(addr)) != 0) {
    const int err = errno;
    if (err != EADDRINUSE) return ErrnoStatus(what + ": bind", err);
    // Something is there. Replace it only if it is a socket nobody listens on (a runtime that
    // did not shut down, e.g. a crashed process).
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) return ErrnoStatus(what + ": bind", err);
    if (!S_ISSOCK(st.st_mode)) {
      return AlreadyExists(what + ": a file that is not a socket is in the way");
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) return ErrnoStatus(what + ": socket", errno);
    const int connected = connect(probe, sa, sizeof(addr));
    const int connect_err = errno;
    close(probe);
    if (connected == 0 || connect_err != ECONNREFUSED) {
      return AlreadyExists(what + ": another process serves this socket");
    }
    if (unlink(path.c_str()) != 0) return ErrnoStatus(what + ": unlink (stale socket)", errno);
    if (bind(server->listen_fd_, sa, sizeof(addr)) != 0) return ErrnoStatus(what + ": bind", errno);
    log.Info(what + ": replaced a stale socket file");
  }
  if (chmod(path.c_str(), mode) != 0) {
    Status s = ErrnoStatus(what + ": chmod", errno);
    server->Stop();  // removes the file
    return s;
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    server->dev_ = st.st_dev;
    server->ino_ = st.st_ino;
  }
  if (listen(server->listen_fd_, 64) != 0) {
    Status s = ErrnoStatus(what + ": listen", errno);
    server->Stop();  // removes the file
    return s;
  }
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  log.Info(what + ": serving stats");
  return server;
}

StatsServer::~StatsServer() { Stop(); }

void StatsServer::Stop() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_seq_cst);
    uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    // Remove the file only if it is still the one we bound.
    struct stat st;
    if (ino_ != 0 && stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      unlink(path_.c_str());
    }
    close(listen_fd_);
    listen_fd_ = -1;
  }
  if (wake_fd_ >= 0) {
    close(wake_fd_);
    wake_fd_ = -1;
  }
}

int StatsServer::Wait(int fd, short events, int timeout_ms) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd, events, 0}};
  const int n = poll(fds, fd < 0 ? 1 : 2, timeout_ms);
  if (stop_.load(std::memory_order_acquire) || (n > 0 && fds[0].revents != 0)) return -1;
  if (n < 0) return errno == EINTR ? 0 : -1;
  return n;
}

void StatsServer::Run() {
  PinAndNameThread(-1, "cqd-stats");
  bool failing = false;  // accept is failing: logged once per streak
  while (!stop_.load(std::memory_order_acquire)) {
    if (Wait(listen_fd_, POLLIN, -1) < 0) {
      if (stop_.load(std::memory_order_acquire)) return;
      // poll itself failed (ENOMEM): back off without it
      std::this_thread::sleep_for(std::chrono::milliseconds(kBackoffMs));
      continue;
    }
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      if (!failing && log_.enabled()) {
        log_.Warning("stats_socket " + path_ + ": accept: " + strerror(err) + "; retrying every " +
                     std::to_string(kBackoffMs) + " ms");
      }
      failing = true;
      Wait(-1, 0, kBackoffMs);
      continue;
    }
    failing = false;
    Serve(fd);
    close(fd);
    served_.fetch_add(1, std::memory_order_relaxed);
  }
}

void StatsServer::Serve(int fd) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point client_deadline = start + kClientLimit;
  // Read the request: a line, or an HTTP request line and headers.
  std::string request;
  const Clock::time_point request_deadline = start + kRequestWait;
  bool http = false;
  bool complete = false;
  char buf[512];
  while (!complete && request.size() < kMaxRequest) {
    const ssize_t got = recv(fd, buf, sizeof(buf), 0);
    if (got > 0) {
      request.append(buf, static_cast<size_t>(got));
      const size_t nl = request.find('\n');
      if (nl == std::string::npos) continue;
      http = request.find(" HTTP/1.") < nl;
      complete = !http || request.find("\r\n\r\n") != std::string::npos ||
                 request.find("\n\n") != std::string::npos;
      continue;
    }
    if (got == 0) break;  // the client is done sending
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;  // gone
    const int ready = Wait(fd, POLLIN, Remaining(request_deadline));
    if (ready < 0) return;                                      // stopping
    if (ready == 0 && Clock::now() >= request_deadline) break;  // nothing more: answer now
  }
  std::string line = request.substr(0, request.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();

  std::string response;
  try {
    if (http) {
      const size_t sp1 = line.find(' ');
      const size_t sp2 = line.find(' ', sp1 + 1);
      const std::string method = line.substr(0, sp1);
      std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      target = target.substr(0, target.find('?'));
      if (method != "GET") {
        response = HttpResponse("405 Method Not Allowed", "text/plain", "only GET\n");
      } else if (target == "/metrics") {
        response = HttpResponse("200 OK", kPrometheusType, StatsToPrometheus(snapshot_()));
      } else if (target == "/" || target == "/json") {
        response = HttpResponse("200 OK", "application/json", StatsToJson(snapshot_()) + "\n");
      } else {
        response =
            HttpResponse("404 Not Found", "text/plain", "not found: try /metrics or /json\n");
      }
    } else if (line.empty() || line == "json") {
      response = StatsToJson(snapshot_()) + "\n";
    } else if (line == "prometheus") {
      response = StatsToPrometheus(snapshot_());
    } else {
      response = "error: unknown request (json|prometheus)\n";
    }
  } catch (const std::exception& e) {  // out of memory: drop this client, keep serving
    if (log_.enabled()) log_.Error("stats_socket " + path_ + ": " + e.what());
    return;
  }

  // Write it without blocking on a client that does not read.
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;  // the client went away
    const Clock::time_point stall_deadline = std::min(Clock::now() + kStallLimit, client_deadline);
    const int ready = Wait(fd, POLLOUT, Remaining(stall_deadline));
    if (ready < 0) return;
    if (ready == 0 && Clock::now() >= stall_deadline) {
      if (log_.enabled()) {
        log_.Log(LogLevel::kDebug, "stats_socket " + path_ + ": dropped a client that read " +
                                       std::to_string(sent) + " of " +
                                       std::to_string(response.size()) + " bytes in time");
      }
      return;
    }
  }
}

}  // namespace cqd::internal

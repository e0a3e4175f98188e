// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_server.cc: the stats endpoint's set-up and tear-down (stats_server.h):
// checking stats_socket and stats_tcp, Start, binding and listening on the Unix socket (a stale
// one replaced) and the TCP address, and Stop, which removes only the socket file it bound.
#include "runtime/observe/stats_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace cqd::internal {
namespace {

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());  // CheckPath: it fits, with its NUL
  return addr;
}

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

namespace {

// A parsed RuntimeOptions::stats_tcp.
struct TcpAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool loopback = false;
};

Result<TcpAddress> ParseTcp(const std::string& text) {
  const std::string what = "stats_tcp \"" + text + "\"";
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument(what + ": an IPv6 address is written [ADDRESS]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgument(what + ": expected ADDRESS:PORT, e.g. 127.0.0.1:9464");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return InvalidArgument(what + ": an IPv6 address is written [ADDRESS]:PORT");
    }
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return InvalidArgument(what + ": the port must be a number from 1 to 65535");
  }
  TcpAddress out;
  const uint16_t net_port = htons(static_cast<uint16_t>(std::stoi(port)));
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&out.addr);
    sin->sin_family = AF_INET;
    sin->sin_port = net_port;
    sin->sin_addr = v4;
    out.len = sizeof(sockaddr_in);
    out.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out.addr);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = net_port;
    sin6->sin6_addr = v6;
    out.len = sizeof(sockaddr_in6);
    out.loopback =
        IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  } else {
    return InvalidArgument(
        what + ": \"" + host +
        "\" is not a numeric IPv4 or IPv6 address (host names are not looked up)");
  }
  return out;
}

}  // namespace

Status StatsServer::CheckTcp(const std::string& address, bool allow_remote) {
  Result<TcpAddress> parsed = ParseTcp(address);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->loopback && !allow_remote) {
    return InvalidArgument("stats_tcp \"" + address +
                           "\" is not a loopback address: whoever can reach it reads the stats, "
                           "unauthenticated; set stats_tcp_allow_remote to serve it anyway");
  }
  return Status::Ok();
}

StatsServer::StatsServer(const StatsEndpointOptions& options, std::function<Stats()> snapshot,
                         const Logger& log)
    : path_(options.unix_path),
      what_(options.tcp.empty() ? "stats_socket " + options.unix_path
            : options.unix_path.empty()
                ? "stats_tcp " + options.tcp
                : "stats_socket " + options.unix_path + " and stats_tcp " + options.tcp),
      per_cq_(options.per_cq),
      snapshot_(std::move(snapshot)),
      log_(log) {}

Result<std::unique_ptr<StatsServer>> StatsServer::Start(const StatsEndpointOptions& options,
                                                        std::function<Stats()> snapshot,
                                                        const Logger& log) {
  if (options.unix_path.empty() && options.tcp.empty()) {
    return InvalidArgument("stats endpoint: neither stats_socket nor stats_tcp is set");
  }
  if (!options.unix_path.empty()) {
    if (Status s = CheckPath(options.unix_path); !s.ok()) return s;
  }
  if (!options.tcp.empty()) {
    if (Status s = CheckTcp(options.tcp, options.tcp_allow_remote); !s.ok()) return s;
  }
  std::unique_ptr<StatsServer> server(new StatsServer(options, std::move(snapshot), log));
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) return ErrnoStatus(server->what_ + ": eventfd", errno);
  if (!options.unix_path.empty()) {
    if (Status s = server->ListenUnix(options.unix_mode); !s.ok()) {
      server->Stop();  // removes the file if it made one
      return s;
    }
  }
  if (!options.tcp.empty()) {
    if (Status s = server->ListenTcp(options.tcp); !s.ok()) {
      server->Stop();
      return s;
    }
  }
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

Status StatsServer::ListenUnix(uint32_t mode) {
  const std::string& path = path_;
  const std::string what = "stats_socket " + path;
  unix_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (unix_fd_ < 0) return ErrnoStatus(what + ": socket", errno);
  const sockaddr_un addr = Address(path);
  const auto* sa = reinterpret_cast<const sockaddr*>(&addr);
  // The file bind creates takes the socket's mode (less the umask): set it first, so that no
  // other user can connect in between; chmod after bind then sets exactly `mode`.
  if (fchmod(unix_fd_, mode) != 0) return ErrnoStatus(what + ": fchmod", errno);
  if (bind(unix_fd_, sa, sizeof(addr)) != 0) {
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
    if (bind(unix_fd_, sa, sizeof(addr)) != 0) return ErrnoStatus(what + ": bind", errno);
    log_.Info(what + ": replaced a stale socket file");
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {  // ours from here on: Stop removes it
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  // A relative path names a file in this directory, wherever the process goes meanwhile: Stop
  // removes it through this handle.
  if (path[0] != '/') dir_fd_ = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (chmod(path.c_str(), mode) != 0) return ErrnoStatus(what + ": chmod", errno);
  if (listen(unix_fd_, 64) != 0) return ErrnoStatus(what + ": listen", errno);
  log_.Info(what + ": serving stats");
  return Status::Ok();
}

Status StatsServer::ListenTcp(const std::string& address) {
  const std::string what = "stats_tcp " + address;
  Result<TcpAddress> parsed = ParseTcp(address);
  if (!parsed.ok()) return parsed.status();
  tcp_fd_ = socket(parsed->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (tcp_fd_ < 0) return ErrnoStatus(what + ": socket", errno);
  const int one = 1;
  // A restarted engine binds again at once, past its old connections' TIME_WAIT.
  (void)setsockopt(tcp_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(tcp_fd_, reinterpret_cast<const sockaddr*>(&parsed->addr), parsed->len) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) return AlreadyExists(what + ": the address is in use");
    return ErrnoStatus(what + ": bind", err);
  }
  if (listen(tcp_fd_, 64) != 0) {
    const int err = errno;  // with SO_REUSEADDR a racing bind can succeed twice
    if (err == EADDRINUSE) return AlreadyExists(what + ": the address is in use");
    return ErrnoStatus(what + ": listen", err);
  }
  log_.Info(what + ": serving stats");
  return Status::Ok();
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
  // Remove the file only if it is still the one we bound.
  struct stat st;
  const int dir = dir_fd_ >= 0 ? dir_fd_ : AT_FDCWD;
  if (ino_ != 0 && fstatat(dir, path_.c_str(), &st, 0) == 0 && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    unlinkat(dir, path_.c_str(), 0);
  }
  ino_ = 0;
  if (dir_fd_ >= 0) close(dir_fd_);
  dir_fd_ = -1;
  for (int* fd : {&unix_fd_, &tcp_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  if (wake_fd_ >= 0) {
    close(wake_fd_);
    wake_fd_ = -1;
  }
}

}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_server_thread.cc: the stats endpoint's thread (stats_server.h): accepting
// clients one at a time, reading a request line or an HTTP request, answering it with JSON or
// Prometheus text, writing without blocking, and lingering until the client closes.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "cqd/stats_format.h"
#include "runtime/base/pinning.h"
#include "runtime/observe/stats_server.h"

namespace cqd::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kRequestWait{200};   // for a request line
constexpr std::chrono::milliseconds kStallLimit{1000};   // without progress on a write
constexpr std::chrono::milliseconds kClientLimit{5000};  // for one client in all
constexpr int kBackoffMs = 100;                          // after a failed accept
constexpr size_t kMaxRequest = 4096;                     // HTTP headers included

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

// Returns true if `request` starts as an HTTP request line does: a method in capitals, a space.
// (The line protocol's requests are lower case.)
bool LooksLikeHttp(std::string_view request) {
  size_t i = 0;
  while (i < request.size() && request[i] >= 'A' && request[i] <= 'Z') ++i;
  return i > 0 && i < request.size() && request[i] == ' ';
}

}  // namespace

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
    pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {unix_fd_, POLLIN, 0}, {tcp_fd_, POLLIN, 0}};
    const int n = poll(fds, 3, -1);  // a negative fd is ignored
    if (stop_.load(std::memory_order_acquire) || (n > 0 && fds[0].revents != 0)) return;
    if (n < 0) {
      // poll itself failed (ENOMEM): back off without it
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(kBackoffMs));
      continue;
    }
    for (int k = 1; k < 3; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      const int fd = accept4(fds[k].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
        if (!failing && log_.enabled()) {
          log_.Warning(what_ + ": accept: " + strerror(err) + "; retrying every " +
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
  const size_t nl = request.find('\n');
  std::string line = request.substr(0, nl);
  if (!line.empty() && line.back() == '\r') line.pop_back();

  std::string response;
  try {
    if (http) {
      const size_t sp1 = line.find(' ');
      const size_t sp2 = line.find(' ', sp1 + 1);
      const std::string method = line.substr(0, sp1);
      std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      target = target.substr(0, target.find('?'));
      if (method != "GET" && method != "HEAD") {
        response = HttpResponse("405 Method Not Allowed", "text/plain", "only GET and HEAD\n");
      } else if (target == "/metrics") {
        response = HttpResponse("200 OK", kPrometheusType,
                                StatsToPrometheus(snapshot_(), {.per_cq = per_cq_}));
      } else if (target == "/" || target == "/json") {
        response = HttpResponse("200 OK", "application/json", StatsToJson(snapshot_()) + "\n");
      } else {
        response =
            HttpResponse("404 Not Found", "text/plain", "not found: try /metrics or /json\n");
      }
      // HEAD: the same headers, Content-Length included, and no body (RFC 9110, 9.3.2).
      if (method == "HEAD") response.erase(response.find("\r\n\r\n") + 4);
    } else if (nl == std::string::npos && LooksLikeHttp(request)) {
      // An HTTP request line that did not end within the limits: an HTTP error, not the line
      // protocol's.
      response =
          request.size() >= kMaxRequest
              ? HttpResponse("414 URI Too Long", "text/plain",
                             "the request line is over " + std::to_string(kMaxRequest) + " bytes\n")
              : HttpResponse("408 Request Timeout", "text/plain",
                             "no whole request line within " +
                                 std::to_string(kRequestWait.count()) + " ms\n");
    } else if (line.empty() || line == "json") {
      response = StatsToJson(snapshot_()) + "\n";
    } else if (line == "prometheus") {
      response = StatsToPrometheus(snapshot_(), {.per_cq = per_cq_});
    } else {
      response = "error: unknown request (json|prometheus)\n";
    }
  } catch (const std::exception& e) {  // out of memory: drop this client, keep serving
    if (log_.enabled()) log_.Error(what_ + ": " + e.what());
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
        log_.Log(LogLevel::kDebug, what_ + ": dropped a client that read " + std::to_string(sent) +
                                       " of " + std::to_string(response.size()) + " bytes in time");
      }
      return;
    }
  }
  // All of it is out: say so (a FIN behind it), then read whatever the client still sends until
  // it closes. Closing with unread bytes (headers past kMaxRequest, a request sent after the
  // first) would reset the connection, and a reset makes the client's kernel throw away the
  // part of the response it has not read yet.
  shutdown(fd, SHUT_WR);
  const Clock::time_point linger_deadline = std::min(Clock::now() + kRequestWait, client_deadline);
  for (;;) {
    const ssize_t got = recv(fd, buf, sizeof(buf), 0);
    if (got == 0) return;  // the client closed
    if (got > 0) continue;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    const int ready = Wait(fd, POLLIN, Remaining(linger_deadline));
    if (ready < 0) return;
    if (ready == 0 && Clock::now() >= linger_deadline) return;
  }
}

}  // namespace cqd::internal

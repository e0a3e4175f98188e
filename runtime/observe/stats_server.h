// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_server.h: the opt-in stats endpoint (RuntimeOptions::stats_socket and
// stats_tcp).
//
// A thread of its own ("cqd-stats") listens on a Unix stream socket, a TCP socket, or both, and
// answers one client at a time, then closes the connection. The data path never waits for it: it
// takes a snapshot with Runtime::GetStats (relaxed loads, plus the control mutex for the CQ part)
// and formats it with cqd/stats_format.h.
//
// Protocol. The client may send one request line (at most 255 bytes, "\n" or "\r\n" ended):
//   "json" or an empty line   -> the JSON of StatsToJson, then "\n"
//   "prometheus"              -> the Prometheus text of StatsToPrometheus
//   "GET <path> HTTP/1.x" and headers up to the blank line (curl --unix-socket) -> an HTTP/1.0
//                               response: /metrics is Prometheus, / and /json are JSON, else 404;
//                               HEAD: the same headers and no body; other methods: 405
//   anything else             -> "error: unknown request (json|prometheus)\n"
// A client that sends nothing gets JSON once it closes its sending side or 200 ms have passed,
// so `socat - UNIX-CONNECT:<path> </dev/null` works. The server then writes without blocking and
// drops a client that takes no data for 1 s, or 5 s in all.
//
// Errors on the listening socket (a file-descriptor limit reached) go to the log sink and are
// retried after 100 ms; the server never exits on its own. Stop() removes the socket file,
// unless something else has replaced it since.
//
// Threading: Start and Stop on the control path (Runtime::Create, Shutdown), not concurrently.
#ifndef CQD_RUNTIME_OBSERVE_STATS_SERVER_H_
#define CQD_RUNTIME_OBSERVE_STATS_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cqd/stats.h"
#include "cqd/status.h"
#include "runtime/base/log.h"

namespace cqd::internal {

// Where and how the endpoint serves (RuntimeOptions::stats_*).
struct StatsEndpointOptions {
  std::string unix_path;  // empty: no Unix socket
  uint32_t unix_mode = 0600;
  std::string tcp;  // "ADDRESS:PORT", numeric; empty: no TCP listener
  bool tcp_allow_remote = false;
  bool per_cq = true;  // the Prometheus text's per-CQ families (PrometheusOptions::per_cq)
};

class StatsServer {
 public:
  // Returns kInvalidArgument when `unix_path` cannot be a Unix socket path (too long, a NUL in
  // it) or `tcp` is not a numeric address and port (CheckTcp), kAlreadyExists when a file that
  // is not a stale socket is at the path, another process serves it, or the TCP address is in
  // use, and an errno status (kInternal, naming the call) when a socket cannot be made (a
  // missing or unwritable directory, an address not on this machine). The socket file gets
  // exactly `unix_mode` (no other user can connect before it has it). `snapshot` runs on the
  // server thread.
  static Result<std::unique_ptr<StatsServer>> Start(const StatsEndpointOptions& options,
                                                    std::function<Stats()> snapshot,
                                                    const Logger& log);
  // Checks only what can be checked without touching the file system (for Validate).
  static Status CheckPath(const std::string& path);
  // Checks RuntimeOptions::stats_tcp: IPv4 "a.b.c.d:PORT" or IPv6 "[addr]:PORT", PORT 1..65535,
  // and a loopback address unless `allow_remote`.
  static Status CheckTcp(const std::string& address, bool allow_remote);
  ~StatsServer();  // Stop()
  StatsServer(const StatsServer&) = delete;
  StatsServer& operator=(const StatsServer&) = delete;

  // Stops serving (a client being served is dropped), joins, and removes the socket file.
  // Idempotent.
  void Stop();
  const std::string& path() const { return path_; }
  // Connections accepted and closed so far, answered or dropped.
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }

 private:
  StatsServer(const StatsEndpointOptions& options, std::function<Stats()> snapshot,
              const Logger& log);
  Status ListenUnix(uint32_t mode);
  Status ListenTcp(const std::string& address);
  void Run();
  void Serve(int fd);
  // Waits until `fd` is ready for `events` (POLLIN/POLLOUT) or `timeout_ms` passes or Stop is
  // called; returns >0 ready, 0 timeout, <0 stopping or error.
  int Wait(int fd, short events, int timeout_ms);

  const std::string path_;  // the Unix socket's, or empty
  const std::string what_;  // names the endpoint in log messages
  const bool per_cq_;
  const std::function<Stats()> snapshot_;
  const Logger& log_;
  int unix_fd_ = -1;
  int tcp_fd_ = -1;
  int wake_fd_ = -1;
  dev_t dev_ = 0;  // of the socket file we bound, to remove only ours
  ino_t ino_ = 0;
  int dir_fd_ = -1;  // a relative path's directory, as it was at Start (O_PATH)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_OBSERVE_STATS_SERVER_H_

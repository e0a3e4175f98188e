// SPDX-License-Identifier: BSD-2-Clause
// echo_server: an RC request/response server on cqd, driven by its own epoll loop.
//
//   echo_server [--addr=0.0.0.0] [--port=7471] [--device=NAME] [--pollers=2] [--exit-after=N]
//               [--exit-when-told]
//               [--keepalive-ms=500] [--stats-json=FILE|-] [--stats-socket=PATH]
//               [--stats-tcp=ADDR:PORT] [--latency]
//               [--owned]
//
// The runtime's pollers drain the CQs; the server's one consumer is engine-driven: this thread
// waits in epoll on the consumer's NotifyFd and calls Drain, so every handler (connection
// events included: the CM channel's CmHandler runs on the same consumer) runs here, with no lock.
// With --owned the consumer is a runtime-owned thread instead (kOwnedThread): the handlers run
// there, and this thread only ticks (keepalives, reaping, stopping). Both then hold the server's
// mutex while they touch its state, and this thread lets go of it around the control calls that
// may wait for the QP's handler call (TeardownQp, Unregister: runtime.h), since that handler may
// be waiting for the mutex.
// Each request (one SEND of up to 64 bytes) is echoed back with one SEND from the same slot, and
// the slot's receive is posted again once the echo completed. A connection ends on DISCONNECTED
// or on its first error (a dead peer: keepalives to idle connections fail with retries
// exhausted) with a drained TeardownQp, and is destroyed once the teardown is done.
//
// Prints "cqd-ready" once listening. With --exit-after=N it exits after N connections were
// established and none is left, printing one summary line and the runtime's stats; exit code 0
// unless something could not be set up. With --exit-when-told as well, it also waits for SIGUSR1
// (no more clients will come), so that a gap between one client's connections cannot end it.
#include <signal.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>

#include "cqd/runtime.h"
#include "examples/common/cm_util.h"
#include "examples/common/echo_slots.h"
#include "examples/common/keepalive.h"
#include "examples/common/stats_out.h"

namespace cqd::examples {
namespace {

volatile sig_atomic_t told_no_more_clients = 0;  // SIGUSR1, with --exit-when-told

using Clock = std::chrono::steady_clock;

struct Totals {
  uint64_t connections = 0;  // connect requests accepted
  uint64_t established = 0;
  uint64_t echoed = 0;
  uint64_t failed = 0;  // ended by an error rather than a disconnect
  uint64_t teardowns_ok = 0;
  uint64_t teardowns_late = 0;
  uint64_t cm_other = 0;  // events on the listener's channel for no live connection
};

class Server;

class Conn : public QpHandler {
 public:
  Conn(Server& server, rdma_cm_id* id) : server_(server), id_(id) {}
  bool Setup(ConsumerId consumer);
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;
  // Starts the drained teardown once; a `failure` (nullptr for a clean end) is counted and shown.
  // `held`: the server's lock, when the caller is the main thread of an --owned server (it is
  // released around the control calls); nullptr on the consumer's thread or without --owned.
  void End(const char* failure, std::unique_lock<std::mutex>* held = nullptr) noexcept;
  // Called by the main loop every few milliseconds (holding `held` as End).
  // `caught_up`: the consumer holds nothing undelivered (CaughtUp), so a keepalive may judge.
  void Tick(Clock::time_point now, bool caught_up, std::unique_lock<std::mutex>* held) noexcept;
  bool reapable() const { return ending_ && (unregistered_ || teardown_.done()); }
  void Reap(Totals& totals);

 private:
  Server& server_;
  rdma_cm_id* id_;
  EchoSlots slots_;
  Registration registration_;
  Teardown teardown_;
  bool established_ = false;
  bool ending_ = false;
  bool unregistered_ = false;  // TeardownQp was refused: unregistered the plain way
  Clock::time_point born_ = Clock::now();
  Keepalive keepalive_;  // probes while idle; ends the connection if nobody answers
};

class Server : public CmHandler {
 public:
  explicit Server(const Flags& flags) : flags_(flags) {}
  int Run();
  void OnCmEvent(const CmEvent& event) noexcept override;

  // Taken by handlers and the main loop only with --owned (then they run on different threads).
  std::unique_lock<std::mutex> LockIfOwned() {
    return owned_ ? std::unique_lock<std::mutex>(mu_) : std::unique_lock<std::mutex>();
  }

  Engine engine;
  Totals totals;
  std::chrono::milliseconds keepalive{500};
  bool stopping = false;  // SIGINT/SIGTERM came (under the lock with --owned)

 private:
  const Flags& flags_;
  bool owned_ = false;
  std::mutex mu_;  // --owned: accepted_, totals, stopping and each Conn's state
  std::list<std::unique_ptr<Conn>> accepted_;  // by the CmHandler; moved to conns_ at each tick
  std::list<std::unique_ptr<Conn>> conns_;     // the main loop's only: walked while End unlocks
};

bool Conn::Setup(ConsumerId consumer) {
  Engine& e = server_.engine;
  if (!CreateQp(id_, e.pd, e.CqFor(server_.totals.connections), EchoSlots::Shape())) return false;
  if (!slots_.Setup(e.pd, id_->qp)) return false;
  auto registration = e.runtime->RegisterQp(id_, *this, consumer);
  if (!registration.ok()) {
    fprintf(stderr, "echo_server: %s\n", registration.status().ToString().c_str());
    return false;
  }
  registration_ = std::move(registration).value();
  return true;
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  const auto lock = server_.LockIfOwned();
  const Clock::time_point now = Clock::now();
  for (const ibv_wc& wc : wcs) {
    if (ending_) continue;  // flushed by the teardown
    if (wc.status != IBV_WC_SUCCESS) {
      End(ibv_wc_status_str(wc.status));  // the first error; flushes follow it
      continue;
    }
    EchoSlots::Outcome outcome;
    if (const char* failed = slots_.OnSuccess(id_->qp, wc, &outcome)) {
      End(failed);
      continue;
    }
    keepalive_.Heard(now, outcome == EchoSlots::Outcome::kKeepaliveDone);
    if (outcome == EchoSlots::Outcome::kEchoed) {
      ++server_.totals.echoed;
    }
  }
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  const auto lock = server_.LockIfOwned();
  switch (event.type) {
    case RDMA_CM_EVENT_ESTABLISHED:
      established_ = true;
      ++server_.totals.established;
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      End(nullptr);
      break;
    default:  // CONNECT_ERROR, UNREACHABLE, DEVICE_REMOVAL...
      End(rdma_event_str(event.type));
      break;
  }
}

void Conn::End(const char* failure, std::unique_lock<std::mutex>* held) noexcept {
  if (ending_) return;
  ending_ = true;  // from here the handler touches nothing else of this Conn
  if (failure != nullptr) {
    ++server_.totals.failed;
    printf("echo_server: connection qp %u failed: %s\n", id_->qp ? id_->qp->qp_num : 0, failure);
    fflush(stdout);
  }
  rdma_disconnect(id_);  // answers a peer's disconnect, or starts ours; fails if never connected
  if (held != nullptr) held->unlock();
  auto teardown = server_.engine.runtime->TeardownQp(registration_);
  if (!teardown.ok()) {
    fprintf(stderr, "echo_server: TeardownQp: %s\n", teardown.status().ToString().c_str());
    registration_.Unregister();  // the plain way: the handler is never called again
  }
  if (held != nullptr) held->lock();
  if (teardown.ok()) {
    teardown_ = *teardown;
  } else {
    unregistered_ = true;
  }
}

void Conn::Tick(Clock::time_point now, bool caught_up,
                std::unique_lock<std::mutex>* held) noexcept {
  if (ending_) return;
  if (!established_) {
    if (now - born_ > std::chrono::seconds(15)) End("not established within 15 s", held);
    return;
  }
  const std::string reason = keepalive_.Tick(
      now, server_.keepalive, [&] { return EchoSlots::PostKeepalive(id_->qp); }, caught_up);
  if (!reason.empty()) End(reason.c_str(), held);
}

void Conn::Reap(Totals& totals) {
  if (teardown_.done()) {
    if (teardown_.Wait().ok()) {
      ++totals.teardowns_ok;
    } else {
      ++totals.teardowns_late;
    }
  }
  rdma_destroy_qp(id_);
  rdma_destroy_id(id_);
}

void Server::OnCmEvent(const CmEvent& event) noexcept {
  const auto lock = LockIfOwned();
  if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    ++totals.cm_other;  // TIMEWAIT_EXIT of ended connections, and the like
    return;
  }
  if (stopping) {  // SIGINT/SIGTERM: no new connections
    static constexpr char kWhy[] = "echo_server: stopping";
    rdma_reject(event.id, kWhy, sizeof(kWhy));
    rdma_destroy_id(event.id);
    return;
  }
  auto conn = std::make_unique<Conn>(*this, event.id);
  if (!conn->Setup(/*consumer=*/0)) {
    rdma_reject(event.id, nullptr, 0);
    if (event.id->qp != nullptr) rdma_destroy_qp(event.id);
    rdma_destroy_id(event.id);
    return;
  }
  rdma_conn_param param{};
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.rnr_retry_count = 7;
  ++totals.connections;
  if (rdma_accept(event.id, &param) != 0) {
    perror("rdma_accept");
    conn->End("rdma_accept failed");
  }
  accepted_.push_back(std::move(conn));
}

int Server::Run() {
  RuntimeOptions options;
  options.pollers = static_cast<int>(flags_.Int("pollers", 2));
  owned_ = flags_.Has("owned");
  options.consumers[0].kind = owned_ ? ConsumerKind::kOwnedThread : ConsumerKind::kEngineDriven;
  options.consumers[0].name = "echo";
  options.consumers[0].record_latency = flags_.Has("latency");
  options.stats_socket = flags_.Str("stats-socket", "");
  options.stats_tcp = flags_.Str("stats-tcp", "");
  if (!engine.Start(options, 4096, flags_.Str("device", ""))) return 1;
  keepalive = std::chrono::milliseconds(flags_.Int("keepalive-ms", 500));
  Runtime& rt = *engine.runtime;
  if (!engine.WatchCm(*this, 0)) return 1;
  sockaddr_storage addr;
  const auto port = static_cast<uint16_t>(flags_.Int("port", 7471));
  if (!ResolveAddress(flags_.Str("addr", "0.0.0.0"), port, /*passive=*/true, &addr)) return 1;
  rdma_cm_id* listener = Listen(engine.channel, addr, 128);
  if (listener == nullptr) return 1;
  printf("cqd-ready echo_server listening on %s\n", AddressText(addr).c_str());
  fflush(stdout);

  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (!owned_) {  // --owned: nothing to wait for but the next tick
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, rt.NotifyFd(0).value(), &ev);
  }
  const uint64_t exit_after = static_cast<uint64_t>(flags_.Int("exit-after", 0));
  const bool wait_to_be_told = flags_.Has("exit-when-told");
  if (wait_to_be_told) signal(SIGUSR1, [](int) { told_no_more_clients = 1; });
  InstallStopSignals();
  Clock::time_point next_tick = Clock::now();
  Clock::time_point stop_deadline{};
  for (;;) {
    epoll_event ready;
    epoll_wait(epoll_fd, &ready, 1, 10);
    while (!owned_ && rt.Drain(0, 256) == 256) {
    }
    const Clock::time_point now = Clock::now();
    if (now < next_tick) continue;
    next_tick = now + std::chrono::milliseconds(10);
    auto lock = LockIfOwned();  // End may let go of it: conns_ is this thread's alone
    std::unique_lock<std::mutex>* held = owned_ ? &lock : nullptr;
    conns_.splice(conns_.end(), accepted_);
    const bool caught_up = CaughtUp(rt.GetStats(), 0);
    for (auto it = conns_.begin(); it != conns_.end();) {
      (*it)->Tick(now, caught_up, held);
      if ((*it)->reapable()) {
        (*it)->Reap(totals);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    if (exit_after > 0 && totals.established >= exit_after && conns_.empty() && accepted_.empty() &&
        (!wait_to_be_told || told_no_more_clients != 0)) {
      break;
    }
    if (StopRequested() && !stopping) {
      stopping = true;                         // from here the CmHandler accepts none
      conns_.splice(conns_.end(), accepted_);  // one accepted while a Tick's End let go of the lock
      stop_deadline = now + std::chrono::seconds(10);  // past every teardown's deadline
      printf("echo_server: stopping (signal): ending %zu connections\n", conns_.size());
      fflush(stdout);
      for (auto& conn : conns_) conn->End(nullptr, held);
    }
    if (stopping && ((conns_.empty() && accepted_.empty()) || now > stop_deadline)) break;
  }
  auto lock = LockIfOwned();  // the owned consumer runs until Shutdown
  printf("echo_server: connections=%" PRIu64 " established=%" PRIu64 " echoed=%" PRIu64
         " failed=%" PRIu64 " teardowns_ok=%" PRIu64 " teardowns_late=%" PRIu64 "\n",
         totals.connections, totals.established, totals.echoed, totals.failed, totals.teardowns_ok,
         totals.teardowns_late);
  if (lock.owns_lock()) lock.unlock();
  WriteStats(rt, flags_.Str("stats-json", ""));
  rdma_destroy_id(listener);
  (void)rt.Shutdown();
  close(epoll_fd);
  return 0;
}

}  // namespace
}  // namespace cqd::examples

int main(int argc, char** argv) {
  cqd::examples::Flags flags(
      argc, argv,
      "echo_server: an RC echo server on cqd (examples/echo/README.md). Each connection's 64-byte\n"
      "requests come back as they came, from one thread running its own epoll loop.\n\n"
      "usage: echo_server [flags]",
      {
          {"addr", "ADDRESS", "address to listen on (default 0.0.0.0)"},
          {"port", "PORT", "port to listen on, 1-65535 (default 7471)", 1, 65535},
          {"device", "NAME", "RDMA device (default: librdmacm's first)"},
          {"pollers", "N", "poller threads, 1-256 (default 2)", 1, 256},
          {"keepalive-ms", "MS", "idle time before a keepalive probes a connection (default 500)",
           1, 3600000},
          {"exit-after", "N", "exit after N connections came and went (default: run until killed)",
           0, 1099511627776},
          {"exit-when-told", nullptr, "with --exit-after, also wait for SIGUSR1"},
          {"stats-json", "FILE|-", "write the runtime's stats as JSON there at exit"},
          {"stats-socket", "PATH", "serve live stats on this Unix socket (tools/cqd_top)"},
          {"stats-tcp", "ADDR:PORT",
           "serve live stats over HTTP there too, for Prometheus (loopback only)"},
          {"latency", nullptr, "record poll-to-dispatch latency"},
          {"owned", nullptr,
           "run the handlers on a runtime-owned consumer thread instead of this thread's loop"},
      });
  cqd::examples::Server server(flags);
  return server.Run();
}

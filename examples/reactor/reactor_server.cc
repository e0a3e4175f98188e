// SPDX-License-Identifier: BSD-2-Clause
// reactor_server: echo_server's protocol served by one reactor thread per core, each the poller
// of its own engine-driven shard (Seastar-style: poll while there is work, sleep when idle).
//
//   reactor_server [--addr=0.0.0.0] [--port=7471] [--device=NAME] [--threads=N] [--budget=64]
//                  [--idle-spin-us=50] [--no-pin] [--keepalive-ms=500] [--exit-after=N]
//                  [--exit-when-told] [--stats-json=FILE|-] [--stats-socket=PATH]
//                  [--stats-tcp=ADDR:PORT]
//
// The runtime has N shards, every one engine-driven (RuntimeOptions::engine_shards), and N
// run-to-completion consumers, consumer i on shard i. Reactor thread i owns shard i: its loop
// calls Runtime::PollShard(i), which polls the shard's CQ and runs consumer i's handlers right
// there, on this thread. One epoll set per thread holds Runtime::ShardFd(i), a timerfd (a tick
// every 10 ms: keepalives, reaping ended connections, the exit checks) and an eventfd (the
// thread's mailbox: other threads post messages to it). When a pass finds nothing to do for
// --idle-spin-us, the thread calls TrySleepShard(i) and sleeps in epoll_wait only if that
// returned 1 (or, for 2, for at most a millisecond). See examples/reactor/README.md.
//
// Connections: the CM channel's CmHandler runs on consumer 0, so on reactor 0 (inside its
// PollShard). On CONNECT_REQUEST it picks a reactor (round robin) and posts the id to that
// reactor's mailbox; that reactor, in its own loop and outside PollShard, creates the QP on its
// shard's CQ, registers it on its consumer and accepts. From then on every completion and CM
// event of the connection runs on that thread, with no lock. The wire protocol is echo_server's:
// 32 receive slots of 64 bytes, each request echoed with one SEND from the same slot, the
// receive posted again once the echo completed; ended by DISCONNECTED or the first error with a
// drained TeardownQp; a zero-length RDMA WRITE keepalive after --keepalive-ms of silence.
//
// Prints "cqd-ready" once listening. With --exit-after=N it exits after N connections were
// established and none is left (with --exit-when-told, also after SIGUSR1); SIGINT or SIGTERM end
// it cleanly (new connections refused, live ones ended with drained teardowns). At exit: one
// summary line, a line per reactor thread, the runtime's stats. Exit code 0 unless something
// could not be set up, or a handler ran on a thread other than its reactor's.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "examples/common/cm_util.h"
#include "examples/common/echo_slots.h"
#include "examples/common/keepalive.h"
#include "examples/common/stats_out.h"

namespace cqd::examples {
namespace {

volatile sig_atomic_t told_no_more_clients = 0;  // SIGUSR1, with --exit-when-told

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(10);
// epoll_event.data.u32 of each fd in a reactor's set.
constexpr uint32_t kShardTag = 1;
constexpr uint32_t kMailTag = 2;
constexpr uint32_t kTimerTag = 3;

// Which reactor thread this is (-1: not one), and whether it is inside its PollShard or
// TrySleepShard: the handlers check where they run.
thread_local int tls_reactor = -1;
thread_local int tls_in = 0;                     // 0: neither, 1: PollShard, 2: TrySleepShard
std::atomic<uint64_t> handlers_off_thread{0};    // a handler ran on another reactor's thread
std::atomic<uint64_t> handlers_outside_poll{0};  // ... on its own thread, but not in PollShard

// Per reactor thread, written by that thread only; read by main after joining it.
struct Totals {
  uint64_t connections = 0;  // connections accepted here
  uint64_t established = 0;
  uint64_t echoed = 0;
  uint64_t failed = 0;  // ended by an error rather than a disconnect
  uint64_t teardowns_ok = 0;
  uint64_t teardowns_late = 0;
  uint64_t refused = 0;  // handed here while stopping, or the setup failed: rejected
};

struct LoopStats {
  uint64_t polls = 0;          // PollShard calls
  uint64_t busy_polls = 0;     // ... that did work
  uint64_t work = 0;           // what they returned, added up
  uint64_t sleep_tries = 0;    // TrySleepShard calls
  uint64_t sleep_refused = 0;  // ... that said "poll again" (0)
  uint64_t sleeps = 0;         // epoll_wait calls after TrySleepShard said 1 or 2
  uint64_t wake_shard = 0;     // the shard's fd was readable when epoll_wait returned
  uint64_t wake_mail = 0;      // ... the mailbox
  uint64_t wake_timer = 0;     // ... the timer
  uint64_t empty_wakes = 0;    // woken by the shard fd alone, and the next PollShard found nothing
  uint64_t messages = 0;
  uint64_t ticks = 0;
  uint64_t cpu_ns = 0;  // the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), at its end
};

struct Message {
  enum class Kind { kAccept, kStop, kQuit };
  Kind kind = Kind::kQuit;
  rdma_cm_id* id = nullptr;  // kAccept: a CONNECT_REQUEST's new id
};

// A reactor's inbox: any thread posts, the reactor takes. The eventfd is in the reactor's epoll
// set; `pending_` spares the reactor a lock (and a read of the eventfd) on every pass.
class Mailbox {
 public:
  ~Mailbox() {
    if (fd_ >= 0) close(fd_);
  }
  bool Open() {
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) perror("eventfd");
    return fd_ >= 0;
  }
  int fd() const { return fd_; }
  // Any thread. The eventfd is written after `pending_` is set: a reactor that saw nothing
  // pending and then sleeps is woken by the write.
  void Post(const Message& message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(message);
    }
    pending_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    if (write(fd_, &one, sizeof(one)) < 0 && errno != EAGAIN) perror("mailbox write");
  }
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // The reactor: everything posted so far (a message posted meanwhile leaves pending() set).
  std::vector<Message> Take() {
    pending_.store(false, std::memory_order_relaxed);
    uint64_t count = 0;
    if (read(fd_, &count, sizeof(count)) < 0 && errno != EAGAIN) perror("mailbox read");
    std::vector<Message> taken;
    std::lock_guard<std::mutex> lock(mu_);
    taken.swap(queue_);
    return taken;
  }

 private:
  int fd_ = -1;
  std::atomic<bool> pending_{false};
  std::mutex mu_;
  std::vector<Message> queue_;
};

class Server;
class Reactor;

class Conn : public QpHandler {
 public:
  Conn(Reactor& reactor, rdma_cm_id* id) : reactor_(reactor), id_(id) {}
  bool Setup();
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;
  // Starts the drained teardown once; a `failure` (nullptr for a clean end) is counted and shown.
  void End(const char* failure) noexcept;
  // The reactor's tick (its thread, outside PollShard).
  // `caught_up`: the reactor's consumer holds nothing undelivered (CaughtUp): a keepalive may
  // judge.
  void Tick(Clock::time_point now, bool caught_up) noexcept;
  bool ending() const { return ending_; }
  bool reapable() const { return ending_ && (unregistered_ || teardown_.done()); }
  // Destroys the QP and the id of an ended connection.
  void Reap(Totals& totals);

 private:
  void CheckThread() const noexcept;

  Reactor& reactor_;
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

class Reactor {
 public:
  Reactor(Server& server, int index) : server_(server), index_(index) {}
  ~Reactor();
  // Main thread, before the threads start: the mailbox, the timer, the epoll set.
  bool Open();
  // The thread's body: loops until told to quit.
  void Run(int cpu);
  // Any thread.
  void Post(const Message& message) { mailbox_.Post(message); }

  int index() const { return index_; }
  Server& server() { return server_; }
  Totals totals;
  LoopStats loop;
  size_t left_at_exit = 0;  // connections still there when the loop ended (the stop deadline)

 private:
  void TakeMessages();
  void Accept(rdma_cm_id* id);
  void Tick(Clock::time_point now);
  void Reap();

  Server& server_;
  const int index_;
  Mailbox mailbox_;
  int timer_fd_ = -1;
  int epoll_fd_ = -1;
  std::list<std::unique_ptr<Conn>> conns_;
  bool quit_ = false;
};

class Server : public CmHandler {
 public:
  explicit Server(const Flags& flags) : flags_(flags) {}
  int Run();
  // The CM channel's CmHandler: consumer 0, so reactor 0's thread, inside its PollShard.
  void OnCmEvent(const CmEvent& event) noexcept override;
  // Reactor 0's tick: the exit conditions.
  void Coordinate(Clock::time_point now);
  void Broadcast(Message::Kind kind);

  Engine engine;
  std::vector<std::unique_ptr<Reactor>> reactors;
  std::chrono::milliseconds keepalive{500};
  std::chrono::microseconds idle_spin{50};
  int budget = 64;
  std::atomic<bool> stopping{false};        // SIGINT/SIGTERM came: no new connections
  std::atomic<uint64_t> established{0};     // over all reactors
  std::atomic<uint64_t> live{0};            // handed to a reactor and not yet reaped
  std::atomic<uint64_t> setup_failures{0};  // the runtime refused something a reactor needed

 private:
  const Flags& flags_;
  // Reactor 0 only.
  uint64_t next_reactor_ = 0;
  uint64_t cm_other_ = 0;  // events on the listener's channel for no live connection
  uint64_t rejected_ = 0;  // connect requests refused while stopping
  uint64_t exit_after_ = 0;
  bool wait_to_be_told_ = false;
  bool quit_sent_ = false;
  Clock::time_point stop_deadline_{};
};

// ---- Conn: runs on its reactor's thread ----

bool Conn::Setup() {
  Engine& e = reactor_.server().engine;
  if (!CreateQp(id_, e.pd, e.cqs[reactor_.index()], EchoSlots::Shape())) return false;
  if (!slots_.Setup(e.pd, id_->qp)) return false;
  auto registration = e.runtime->RegisterQp(id_, *this, /*consumer=*/reactor_.index());
  if (!registration.ok()) {
    fprintf(stderr, "reactor_server: %s\n", registration.status().ToString().c_str());
    return false;
  }
  registration_ = std::move(registration).value();
  return true;
}

void Conn::CheckThread() const noexcept {
  if (tls_reactor != reactor_.index()) {
    handlers_off_thread.fetch_add(1, std::memory_order_relaxed);
  } else if (tls_in != 1) {
    handlers_outside_poll.fetch_add(1, std::memory_order_relaxed);
  }
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  CheckThread();
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
      ++reactor_.totals.echoed;
    }
  }
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  CheckThread();
  switch (event.type) {
    case RDMA_CM_EVENT_ESTABLISHED:
      established_ = true;
      ++reactor_.totals.established;
      reactor_.server().established.fetch_add(1, std::memory_order_relaxed);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      End(nullptr);
      break;
    default:  // CONNECT_ERROR, UNREACHABLE, DEVICE_REMOVAL...
      End(rdma_event_str(event.type));
      break;
  }
}

void Conn::End(const char* failure) noexcept {
  if (ending_) return;
  ending_ = true;
  if (failure != nullptr) {
    ++reactor_.totals.failed;
    printf("reactor_server: reactor %d: connection qp %u failed: %s\n", reactor_.index(),
           id_->qp ? id_->qp->qp_num : 0, failure);
    fflush(stdout);
  }
  rdma_disconnect(id_);  // answers a peer's disconnect, or starts ours; fails if never connected
  auto teardown = reactor_.server().engine.runtime->TeardownQp(registration_);
  if (teardown.ok()) {
    teardown_ = *teardown;
  } else {
    fprintf(stderr, "reactor_server: TeardownQp: %s\n", teardown.status().ToString().c_str());
    registration_.Unregister();  // the plain way: the handler is never called again
    unregistered_ = true;
  }
}

void Conn::Tick(Clock::time_point now, bool caught_up) noexcept {
  if (ending_) return;
  if (!established_) {
    if (now - born_ > std::chrono::seconds(15)) End("not established within 15 s");
    return;
  }
  const std::string reason = keepalive_.Tick(
      now, reactor_.server().keepalive, [&] { return EchoSlots::PostKeepalive(id_->qp); },
      caught_up);
  if (!reason.empty()) End(reason.c_str());
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

// ---- Reactor ----

Reactor::~Reactor() {
  if (timer_fd_ >= 0) close(timer_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

bool Reactor::Open() {
  auto shard_fd = server_.engine.runtime->ShardFd(index_);
  if (!shard_fd.ok()) {
    fprintf(stderr, "reactor_server: %s\n", shard_fd.status().ToString().c_str());
    return false;
  }
  if (!mailbox_.Open()) return false;
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (timer_fd_ < 0 || epoll_fd_ < 0) {
    perror("timerfd_create/epoll_create1");
    return false;
  }
  itimerspec period{};
  period.it_interval.tv_nsec = std::chrono::nanoseconds(kTick).count();
  period.it_value = period.it_interval;
  if (timerfd_settime(timer_fd_, 0, &period, nullptr) != 0) {
    perror("timerfd_settime");
    return false;
  }
  const std::pair<int, uint32_t> fds[] = {
      {*shard_fd, kShardTag}, {mailbox_.fd(), kMailTag}, {timer_fd_, kTimerTag}};
  for (const auto& [fd, tag] : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;  // level-triggered: each fd is read by whoever it belongs to
    ev.data.u32 = tag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      perror("epoll_ctl");
      return false;
    }
  }
  return true;
}

void Reactor::Run(int cpu) {
  tls_reactor = index_;
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
      fprintf(stderr, "reactor_server: reactor %d: could not pin to CPU %d\n", index_, cpu);
    }
  }
  char name[16];
  snprintf(name, sizeof(name), "reactor%d", index_);
  pthread_setname_np(pthread_self(), name);

  Runtime& rt = *server_.engine.runtime;
  const int budget = server_.budget;
  const auto idle_spin = server_.idle_spin;
  Clock::time_point next_tick = Clock::now() + kTick;
  Clock::time_point idle_since{};
  bool idle = false;   // the passes since idle_since found nothing
  bool woken = false;  // the last sleep was ended by the shard's fd alone
  // The last sleep was ended by the timer alone: when that tick brings no work, the thread goes
  // back to sleep without spinning (an idle reactor costs a few syscalls per tick, no more).
  bool quiet_wake = false;
  while (!quit_) {
    // 1. The shard: poll its CQ, run consumer i's handlers on what it found.
    tls_in = 1;
    const int done = rt.PollShard(index_, budget);
    tls_in = 0;
    ++loop.polls;
    if (done < 0) {
      fprintf(stderr, "reactor_server: reactor %d: PollShard: %s\n", index_, strerror(-done));
      server_.setup_failures.fetch_add(1);
      break;
    }
    if (woken && done == 0) ++loop.empty_wakes;
    woken = false;
    bool busy = done > 0;
    if (busy) {
      ++loop.busy_polls;
      loop.work += static_cast<uint64_t>(done);
    }
    // 2. The mailbox: connections to accept, stop and quit.
    if (mailbox_.pending()) {
      TakeMessages();
      busy = true;
    }
    // 3. The tick, by the clock while busy (the timerfd wakes a sleeping thread).
    const Clock::time_point now = Clock::now();
    if (now >= next_tick) {
      Tick(now);
      next_tick = now + kTick;
    }
    if (busy) {
      idle = false;
      quiet_wake = false;
      continue;
    }
    // 4. Idle: keep polling for idle_spin (work often follows work), then try to sleep.
    if (!idle) {
      idle = true;
      idle_since = now;
      if (!quiet_wake) continue;
    }
    if (!quiet_wake && now - idle_since < idle_spin) continue;
    ++loop.sleep_tries;
    tls_in = 2;
    const int may_sleep = rt.TrySleepShard(index_);
    tls_in = 0;
    if (may_sleep < 0) {
      fprintf(stderr, "reactor_server: reactor %d: TrySleepShard: %s\n", index_,
              strerror(-may_sleep));
      server_.setup_failures.fetch_add(1);
      break;
    }
    if (may_sleep == 0) {  // it found work (routed, to run in the next PollShard)
      ++loop.sleep_refused;
      idle = false;
      quiet_wake = false;
      continue;
    }
    if (mailbox_.pending()) continue;
    ++loop.sleeps;
    epoll_event events[3];
    // 1: until an fd is readable; 2: at most a millisecond (a full consumer, a failed arm).
    const int n = epoll_wait(epoll_fd_, events, 3, may_sleep == 1 ? -1 : 1);
    if (n < 0 && errno != EINTR) {
      perror("epoll_wait");
      break;
    }
    bool by_shard = false;
    bool by_other = false;
    for (int k = 0; k < n; ++k) {
      switch (events[k].data.u32) {
        case kShardTag:
          ++loop.wake_shard;
          by_shard = true;
          break;
        case kMailTag:
          ++loop.wake_mail;
          by_other = true;
          break;
        case kTimerTag:
          ++loop.wake_timer;
          by_other = true;
          Tick(Clock::now());
          next_tick = Clock::now() + kTick;
          break;
      }
    }
    woken = by_shard && !by_other;
    quiet_wake = !by_shard && !mailbox_.pending();
    idle = false;
  }
  // The loop ended: quit (every connection gone, or the stop deadline passed), or an error.
  Reap();
  left_at_exit = conns_.size();
  for (auto& conn : conns_) {
    // Past the stop deadline every teardown has ended (its deadline is shorter); one that was
    // never started is started now, and Shutdown cancels it if it does not drain in time.
    conn->End(nullptr);
  }
  timespec cpu_time{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_time);
  loop.cpu_ns = static_cast<uint64_t>(cpu_time.tv_sec) * 1000000000ull +
                static_cast<uint64_t>(cpu_time.tv_nsec);
}

void Reactor::TakeMessages() {
  for (const Message& message : mailbox_.Take()) {
    ++loop.messages;
    switch (message.kind) {
      case Message::Kind::kAccept:
        Accept(message.id);
        break;
      case Message::Kind::kStop:
        for (auto& conn : conns_) conn->End(nullptr);
        break;
      case Message::Kind::kQuit:
        quit_ = true;
        break;
    }
  }
}

// A CONNECT_REQUEST reactor 0 handed here: the QP goes on this reactor's shard and consumer.
void Reactor::Accept(rdma_cm_id* id) {
  if (server_.stopping.load(std::memory_order_acquire)) {
    static constexpr char kWhy[] = "reactor_server: stopping";
    rdma_reject(id, kWhy, sizeof(kWhy));
    rdma_destroy_id(id);
    ++totals.refused;
    server_.live.fetch_sub(1, std::memory_order_release);
    return;
  }
  auto conn = std::make_unique<Conn>(*this, id);
  if (!conn->Setup()) {
    rdma_reject(id, nullptr, 0);
    // The QP before the Conn: its posted receives point into the Conn's slots, whose MR goes
    // with it. (A failed Setup registered nothing: RegisterQp is its last step.)
    if (id->qp != nullptr) rdma_destroy_qp(id);
    conn.reset();
    rdma_destroy_id(id);
    ++totals.refused;
    server_.live.fetch_sub(1, std::memory_order_release);
    return;
  }
  rdma_conn_param param{};
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.rnr_retry_count = 7;
  ++totals.connections;
  if (rdma_accept(id, &param) != 0) {
    perror("rdma_accept");
    conn->End("rdma_accept failed");
  }
  conns_.push_back(std::move(conn));
}

void Reactor::Reap() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->reapable()) {
      (*it)->Reap(totals);
      it = conns_.erase(it);
      server_.live.fetch_sub(1, std::memory_order_release);
    } else {
      ++it;
    }
  }
}

void Reactor::Tick(Clock::time_point now) {
  ++loop.ticks;
  uint64_t expirations = 0;  // read whatever expired, so the level-triggered fd goes quiet
  if (read(timer_fd_, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN) {
    perror("timerfd read");
  }
  if (!conns_.empty()) {
    const bool caught_up =
        CaughtUp(server_.engine.runtime->GetStats(), static_cast<ConsumerId>(index_));
    for (auto& conn : conns_) conn->Tick(now, caught_up);
  }
  Reap();
  if (index_ == 0) server_.Coordinate(now);
}

// ---- Server ----

void Server::OnCmEvent(const CmEvent& event) noexcept {
  if (tls_reactor != 0) handlers_off_thread.fetch_add(1, std::memory_order_relaxed);
  if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    ++cm_other_;  // TIMEWAIT_EXIT of ended connections, and the like
    return;
  }
  if (stopping.load(std::memory_order_acquire)) {  // SIGINT/SIGTERM: no new connections
    static constexpr char kWhy[] = "reactor_server: stopping";
    rdma_reject(event.id, kWhy, sizeof(kWhy));
    rdma_destroy_id(event.id);
    ++rejected_;
    return;
  }
  // Counted live before it is handed over, so that no exit check sees it nowhere.
  live.fetch_add(1, std::memory_order_acq_rel);
  Reactor& to = *reactors[next_reactor_++ % reactors.size()];
  to.Post(Message{Message::Kind::kAccept, event.id});
}

void Server::Broadcast(Message::Kind kind) {
  for (auto& reactor : reactors) reactor->Post(Message{kind, nullptr});
}

void Server::Coordinate(Clock::time_point now) {
  if (quit_sent_) return;
  const uint64_t left = live.load(std::memory_order_acquire);
  if (exit_after_ > 0 && established.load() >= exit_after_ && left == 0 &&
      (!wait_to_be_told_ || told_no_more_clients != 0)) {
    quit_sent_ = true;
  }
  if (StopRequested() && !stopping.load()) {
    stopping.store(true, std::memory_order_release);
    stop_deadline_ = now + std::chrono::seconds(10);  // past every teardown's deadline
    printf("reactor_server: stopping (signal): ending %" PRIu64 " connections\n", left);
    fflush(stdout);
    Broadcast(Message::Kind::kStop);
  }
  if (stopping.load() && (left == 0 || now > stop_deadline_)) quit_sent_ = true;
  if (quit_sent_) Broadcast(Message::Kind::kQuit);
}

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  return cpus;
}

int Server::Run() {
  const std::vector<int> cpus = AllowedCpus();
  const int threads =
      static_cast<int>(flags_.Int("threads", cpus.empty() ? 1 : static_cast<long>(cpus.size())));
  budget = static_cast<int>(flags_.Int("budget", 64));
  idle_spin = std::chrono::microseconds(flags_.Int("idle-spin-us", 50));
  keepalive = std::chrono::milliseconds(flags_.Int("keepalive-ms", 500));
  exit_after_ = static_cast<uint64_t>(flags_.Int("exit-after", 0));
  wait_to_be_told_ = flags_.Has("exit-when-told");
  // One thread per core: pinned, one to each CPU, when there are enough of them.
  const bool pin = !flags_.Has("no-pin") && static_cast<size_t>(threads) <= cpus.size();

  RuntimeOptions options;
  options.pollers = threads;
  options.consumers.clear();
  for (int i = 0; i < threads; ++i) {
    options.engine_shards.push_back(i);
    ConsumerOptions consumer;
    consumer.kind = ConsumerKind::kRunToCompletion;
    consumer.poller = i;
    consumer.name = "reactor" + std::to_string(i);
    options.consumers.push_back(consumer);
  }
  options.stats_socket = flags_.Str("stats-socket", "");
  options.stats_tcp = flags_.Str("stats-tcp", "");
  if (!engine.Start(options, 4096, flags_.Str("device", ""))) return 1;
  for (int i = 0; i < threads; ++i) {
    reactors.push_back(std::make_unique<Reactor>(*this, i));
    if (!reactors.back()->Open()) return 1;
  }
  if (!engine.WatchCm(*this, /*consumer=*/0)) return 1;
  sockaddr_storage addr;
  const auto port = static_cast<uint16_t>(flags_.Int("port", 7471));
  if (!ResolveAddress(flags_.Str("addr", "0.0.0.0"), port, /*passive=*/true, &addr)) return 1;
  rdma_cm_id* listener = Listen(engine.channel, addr, 128);
  if (listener == nullptr) return 1;
  if (wait_to_be_told_) signal(SIGUSR1, [](int) { told_no_more_clients = 1; });
  InstallStopSignals();

  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    const int cpu = pin ? cpus[i] : -1;
    workers.emplace_back([this, i, cpu] { reactors[i]->Run(cpu); });
  }
  printf("cqd-ready reactor_server listening on %s (%d reactor threads%s)\n",
         AddressText(addr).c_str(), threads, pin ? ", pinned" : "");
  fflush(stdout);
  for (std::thread& worker : workers) worker.join();

  Totals all;
  size_t left = 0;
  for (const auto& reactor : reactors) {
    const Totals& t = reactor->totals;
    all.connections += t.connections;
    all.established += t.established;
    all.echoed += t.echoed;
    all.failed += t.failed;
    all.teardowns_ok += t.teardowns_ok;
    all.teardowns_late += t.teardowns_late;
    all.refused += t.refused;
    left += reactor->left_at_exit;
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double cpu_ms = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
                        (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
  printf("reactor_server: connections=%" PRIu64 " established=%" PRIu64 " echoed=%" PRIu64
         " failed=%" PRIu64 " teardowns_ok=%" PRIu64 " teardowns_late=%" PRIu64 " refused=%" PRIu64
         " rejected=%" PRIu64 " cm_other=%" PRIu64 " left=%zu\n",
         all.connections, all.established, all.echoed, all.failed, all.teardowns_ok,
         all.teardowns_late, all.refused, rejected_, cm_other_, left);
  printf(
      "reactor_server: threads=%d cpu_ms=%.1f (process, getrusage) cpu_us_per_echo=%.2f "
      "handlers_off_thread=%" PRIu64 " handlers_outside_poll=%" PRIu64 "\n",
      threads, cpu_ms, all.echoed > 0 ? cpu_ms * 1e3 / static_cast<double>(all.echoed) : 0.0,
      handlers_off_thread.load(), handlers_outside_poll.load());
  for (const auto& reactor : reactors) {
    const LoopStats& l = reactor->loop;
    const Totals& t = reactor->totals;
    printf("reactor_server: reactor %d: connections=%" PRIu64 " echoed=%" PRIu64
           " cpu_ms=%.1f polls=%" PRIu64 " busy_polls=%" PRIu64 " work=%" PRIu64
           " sleep_tries=%" PRIu64 " sleep_refused=%" PRIu64 " sleeps=%" PRIu64
           " wakeups=shard:%" PRIu64 ",mail:%" PRIu64 ",timer:%" PRIu64 " empty_wakes=%" PRIu64
           " messages=%" PRIu64 " ticks=%" PRIu64 "\n",
           reactor->index(), t.connections, t.echoed, static_cast<double>(l.cpu_ns) / 1e6, l.polls,
           l.busy_polls, l.work, l.sleep_tries, l.sleep_refused, l.sleeps, l.wake_shard,
           l.wake_mail, l.wake_timer, l.empty_wakes, l.messages, l.ticks);
  }
  WriteStats(*engine.runtime, flags_.Str("stats-json", ""));
  rdma_destroy_id(listener);
  (void)engine.runtime->Shutdown();
  const bool ok = setup_failures.load() == 0 && handlers_off_thread.load() == 0;
  if (handlers_off_thread.load() != 0) {
    fprintf(stderr, "reactor_server: %" PRIu64 " handler calls ran off their reactor's thread\n",
            handlers_off_thread.load());
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cqd::examples

int main(int argc, char** argv) {
  cqd::examples::Flags flags(
      argc, argv,
      "reactor_server: echo_server's protocol from one reactor thread per core, each driving its\n"
      "own engine-driven shard (examples/reactor/README.md).\n\n"
      "usage: reactor_server [flags]",
      {
          {"addr", "ADDRESS", "address to listen on (default 0.0.0.0)"},
          {"port", "PORT", "port to listen on, 1-65535 (default 7471)", 1, 65535},
          {"device", "NAME", "RDMA device (default: librdmacm's first)"},
          {"threads", "N", "reactor threads = shards, 1-256 (default: the CPUs it may use)", 1,
           256},
          {"budget", "N", "completions per PollShard call, 1-65536 (default 64)", 1, 65536},
          {"idle-spin-us", "US", "poll this long without work before trying to sleep (default 50)",
           0, 1000000},
          {"no-pin", nullptr, "do not pin reactor i to the i-th CPU the process may use"},
          {"keepalive-ms", "MS", "idle time before a keepalive probes a connection (default 500)",
           1, 3600000},
          {"exit-after", "N", "exit after N connections came and went (default: run until killed)",
           0, 1099511627776},
          {"exit-when-told", nullptr, "with --exit-after, also wait for SIGUSR1"},
          {"stats-json", "FILE|-", "write the runtime's stats as JSON there at exit"},
          {"stats-socket", "PATH", "serve live stats on this Unix socket (tools/cqd_top)"},
          {"stats-tcp", "ADDR:PORT",
           "serve live stats over HTTP there too, for Prometheus (loopback only)"},
      });
  cqd::examples::Server server(flags);
  return server.Run();
}

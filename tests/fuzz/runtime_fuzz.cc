// SPDX-License-Identifier: BSD-2-Clause
// libFuzzer target: the input is a program of operations on one Runtime and one SimDevice, run on
// the fuzzer's thread (which is also the engine thread of the engine-driven consumer) while the
// runtime's pollers, event thread, teardown thread and (optionally) owned consumer run as usual.
// At the end everything is torn down and the invariants are checked; a violation prints
// "runtime_fuzz: INVARIANT: ..." and aborts. A hang (any wait of an input past 10 s) aborts with
// "runtime_fuzz: HANG: ...".
//
// Input: 3 configuration bytes, then operations of 3 bytes each (opcode, a, b); at most kMaxOps.
//   config[0]: bit0 pollers 1/2; bit1 consumers {engine} / {owned, engine}; bit2 engine fd
//              edge-triggered; bits3-4 ack_threshold {1,2,4,64}; bit5 idle_budget 0/20us;
//              bits6-7 poll_batch {1,2,4,32}
//   config[1]: bits0-2 queue_capacity {1,2,3,4,8,16,64,1024}; bits3-5 dispatch_batch
//              {1,2,3,4,8,16,64,256}; bit6 max_registrations 3 (else 64); bit7 with config[2]'s
//              bit7 (the high bit) the arena's linger {200,0,1,10000}us
//   config[2]: bits0-1 spill_capacity {1,2,8,4096}; bit2 the device raises no LAST_WQE_REACHED
//              (as rxe); bit3 DEVICE_FATAL at the start of the final teardown; bit4 the other
//              consumer (with two) runs to completion on poller 0 instead of on its own thread;
//              bit5 shard 0 is engine-driven (RuntimeOptions::engine_shards): a reactor thread
//              of the fuzzer drives it (PollShard, TrySleepShard, epoll on ShardFd); bit6 the
//              engine-driven consumer is hosted in a oneTBB arena of two threads
//              (cqd::ArenaConsumers, cqd/tbb.h) instead of drained by the fuzzer's thread;
//              bit7 see config[1]
//   operations: see enum Op below (opcode % kOpCount).
//
// A QP incarnation (one SimQp, kMaxQps over an input's life; the device reuses qp_nums) tags its
// wr_ids: wr_id = kMagic | incarnation << 48 | flags | seq, so that a completion of an earlier QP
// with the same qp_num is told apart, and a teardown marker (a wr_id without kMagic) too.
//
// Invariants checked:
//   - every injected completion (including completions of unknown qp_nums) reaches a handler or
//     the orphan handler exactly once, unless it was left in a CQ nobody can poll any more (an
//     overflowed CQ, an adopted CQ that was released): those must be exactly what the CQ held
//     when it was destroyed (less the teardown markers), and a tail of each QP's stream on it;
//   - per QP per CQ, a handler receives one contiguous run of wr_ids in order, and each
//     registration's run comes after the previous one's;
//   - no handler call (completions or async event) after Unregister returned or after a teardown
//     ended; no completion or event delivered to another QP's handler; no marker reaches a
//     handler; a QP that reuses a qp_num gets no completion of its predecessor when that one
//     ended, whatever ended it, and whenever the predecessor completed them (also after its
//     registration ended, before it was destroyed), unless the runtime released their CQ in
//     between (an adopted CQ adopted again carries no history: runtime.h, DestroyCq);
//   - TeardownQp: a teardown that returns OK delivered every completion injected for the QP
//     before TeardownQp was called to the handler (not to the orphan handler); one whose
//     consumer was not drained meanwhile cannot return OK; one drained until it ends, with a
//     deadline past the input's limit, on a working device and CQs, returns OK; kCancelled only
//     after Shutdown, kUnavailable only after DEVICE_FATAL; on_done reports the result Wait()
//     returns; after DEVICE_FATAL a teardown with no deadline ends UNAVAILABLE (if it had not
//     drained) and every control call and Wait returns (a hang is the input watchdog's HANG);
//     Teardown::Wait from a handler of any consumer kind (every 32nd completion) or from on_done
//     never blocks (refused, or the teardown had ended); a Wait on another thread across
//     Shutdown returns;
//   - async events of a QP reach its handler after every completion injected for it before the
//     event was raised (RaiseQpEvent, a teardown's LAST_WQE_REACHED, CQ overflow, DEVICE_FATAL),
//     and every one raised for a registration still live at the end (before DEVICE_FATAL and
//     Shutdown) has reached it by then: none is lost;
//   - control calls succeed or fail as documented (RegisterQp twice is kAlreadyExists, a CQ
//     that cannot hold the QPs' work requests grows or is kResourceExhausted, CreateCq after
//     Shutdown is kFailedPrecondition, a stale CqHandle is kNotFound and another runtime's is
//     kInvalidArgument, Drain of an owned consumer is -EINVAL, ...);
//   - while an engine-driven consumer has work queued, its notify fd reports it (epoll, level- or
//     edge-triggered): otherwise the final wait runs into the 10 s limit;
//   - Stats: queue high water <= queue_capacity and spill high water <= spill_capacity until
//     Shutdown; cq_acked_events == cq_events once every CQ is destroyed (read once the event
//     thread has counted its last ack) and after Shutdown; delivered and orphan counts equal the
//     handler-side counts.
#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/tbb.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxOps = 400;
constexpr int kMaxCqs = 4;
constexpr int kMaxQps = 16;               // QP incarnations over an input's life
constexpr uint32_t kMaxPerStream = 1024;  // completions per QP per CQ
constexpr uint64_t kSendBit = uint64_t{1} << 32;
constexpr uint64_t kSelfUnregisterBit = uint64_t{1} << 40;  // the handler unregisters its QP
constexpr int kTagShift = 48;  // bits 48-55: the incarnation (strays: 0x80 + CQ)
constexpr uint64_t kMagic = uint64_t{0xa5} << 56;  // no user-space pointer has it: no marker
constexpr uint64_t kMagicMask = uint64_t{0xff} << 56;
constexpr int kStrayTag = 0x80;
constexpr uint32_t kStrayQpNum = 0xfff000;  // + CQ index: completions of no QP
constexpr auto kInputLimit = std::chrono::seconds(10);
constexpr auto kPastInputLimit = std::chrono::minutes(10);  // a teardown deadline never reached

std::atomic<const char*> g_current_op{""};  // for messages: the op running
std::atomic<int> g_current_index{0};

[[noreturn]] void Fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "runtime_fuzz: INVARIANT: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " [op #%d %s]\n", g_current_index.load(), g_current_op.load());
  va_end(ap);
  fflush(stderr);
  abort();
}
#define CHECK(cond, ...)            \
  do {                              \
    if (!(cond)) Fail(__VA_ARGS__); \
  } while (0)

// ---- watchdog: every wait of an input is bounded by kInputLimit in all ----

std::atomic<int64_t> g_deadline_ns{0};  // 0: no input running

void StartWatchdog() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::thread([] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        int64_t deadline = g_deadline_ns.load();
        if (deadline != 0 && Clock::now().time_since_epoch().count() > deadline) {
          fprintf(stderr, "runtime_fuzz: HANG: input still running after %lld s, in op #%d (%s)\n",
                  static_cast<long long>(kInputLimit.count()), g_current_index.load(),
                  g_current_op.load());
          fflush(stderr);
          abort();
        }
      }
    }).detach();
  });
}

bool PastDeadline() {
  return Clock::now().time_since_epoch().count() > g_deadline_ns.load() - 1'000'000'000;
}

// ---- the books ----

struct Stream {
  int cq = -1;  // index into State::cqs
  std::atomic<uint32_t> injected{0};
  std::atomic<uint32_t> delivered{0};  // to a handler of this incarnation or of a successor
  std::atomic<uint32_t> orphaned{0};
  std::atomic<int64_t> last_delivered{-1};
  // 0 not yet, 1 delivered, 2 orphaned, 3 delivered to a later QP with the same qp_num
  std::array<std::atomic<uint8_t>, kMaxPerStream> marks{};
  uint32_t accounted() const { return delivered.load() + orphaned.load(); }
};

struct QpEnt;
struct State;

// An async event the device was asked to raise for a QP, with what had been injected for the QP
// by then: the event must reach the handler after all of that.
class FuzzHandler;

struct EventExpect {
  ibv_event_type type;
  uint32_t floor[2];
  bool matched = false;
  // The registration live when it was raised (nullptr: none). Should that registration still be
  // live at the end, the event must have reached it (CheckEventsArrived).
  const FuzzHandler* registration = nullptr;
};

class FuzzHandler final : public cqd::QpHandler {
 public:
  FuzzHandler(State* st, QpEnt* q) : st_(st), q_(q) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnAsyncEvent(const cqd::AsyncEvent& event) noexcept override;
  // Takes this registration's CQ commitments off the books (once).
  void ReleaseCommit() noexcept;

  std::atomic<bool> unregistered{false};
  std::atomic<uint32_t> events{0};
  uint32_t reg_injected[2] = {0, 0};  // injected per stream when this registration began
  int commit_cq[2] = {-1, -1};        // send CQ, recv CQ
  int commit[2] = {0, 0};
  std::atomic<bool> commit_released{false};

 private:
  void SelfUnregister() noexcept;
  void TryWaitFromHandler() noexcept;
  State* st_;
  QpEnt* q_;
  int64_t last_[2] = {-1, -1};  // this registration's last wr_id per stream (its consumer only)
  uint32_t floor_[2] = {0, 0};  // completions below this were injected before an event it got
};

// What a teardown's on_done callback saw (it runs on the runtime's teardown thread).
struct TdRecord {
  FuzzHandler* handler = nullptr;
  bool wants_on_done = false;
  int wait_code = -1;  // what Wait() returned (fuzzer thread)
  std::atomic<bool> called{false};
  std::atomic<int> calls{0};
  std::atomic<int> code{-1};
};

struct QpEnt {
  int idx = 0;  // the incarnation: its tag in wr_ids
  bool exists = false;
  cqd::SimQp* sim = nullptr;  // nullptr once destroyed (or never, for strays)
  std::atomic<uint32_t> qp_num{0};
  int send_cq = -1, recv_cq = -1;
  cqd::SimQpOptions opts;
  Stream streams[2];  // 0: recv CQ (and the send CQ when it is the same), 1: send
  // `reg` and `handlers` are used by the fuzzer thread and, to unregister from inside a handler,
  // by a consumer thread; both hold reg_mu. A handler only try_locks it: the fuzzer thread may
  // hold it while Unregister waits for that handler's batch.
  std::mutex reg_mu;
  cqd::Registration reg;
  cqd::ConsumerId consumer = 0;
  std::vector<std::unique_ptr<FuzzHandler>> handlers;  // kept: a late call must find it

  // Teardowns (fuzzer thread only, except the atomics).
  bool no_inject = false;  // a teardown started: the QP is in the error state
  bool td_active = false;  // started and not yet settled by the fuzzer
  cqd::Teardown td;
  std::shared_ptr<TdRecord> td_rec;
  FuzzHandler* td_handler = nullptr;
  uint32_t td_injected[2] = {0, 0};    // injected before TeardownQp was called
  bool td_strict[2] = {false, false};  // OK must mean all of them reached the handler
  bool td_engine_idle = false;         // Wait() without draining the engine consumer
  std::vector<std::shared_ptr<TdRecord>> all_td_recs;
  // What each stream had injected when its last registration was retired (plain Unregister, or
  // TeardownQp started): none of those may reach a successor, whatever ended the registration
  // (README "QP lifecycle"). -1: never retired. What it completed later, before it was destroyed,
  // may not either, unless the stream's CQ was released by the runtime since (an adopted CQ
  // adopted again carries no history: runtime.h, DestroyCq): releases_at_retire is that CQ's
  // CqEnt::releases at the retire.
  std::atomic<int64_t> retired_at[2] = {-1, -1};
  std::atomic<uint32_t> releases_at_retire[2] = {0, 0};

  std::mutex ev_mu;
  std::vector<EventExpect> expected_events;
};

struct CqEnt {
  bool exists = false;         // created (by the runtime, or by us for adoption)
  bool polled = false;         // the runtime polls it now
  bool sim_destroyed = false;  // gone from the device
  bool adopted = false;
  bool solicited_only = false;
  bool grow = true;
  bool overflowed = false;
  int shard = 0;
  cqd::CqHandle handle;
  std::optional<cqd::CqHandle> stale;  // a handle the runtime no longer knows
  cqd::SimCq* sim = nullptr;
  int64_t stranded = -1;  // what it held when it was destroyed on the device
  int markers = 0;        // teardown markers that may have gone into it
  // Registrations on it retired by a plain Unregister or a teardown that did not drain: their
  // fences keep a commitment on it (fences.h) until polled, so RegisterQp's guard may refuse what
  // our books would admit. Raised by the fuzzer thread and by self-unregistering handlers.
  std::atomic<int> undrained_ends{0};
  std::atomic<int64_t> committed{0};  // work requests of registrations on it (RegisterQp's guard)
  std::atomic<uint32_t> releases{0};  // times the runtime released it (an adopted CQ's DestroyCq)
  // Numbers whose registration on it ended (or whose teardown started) and that have not
  // registered on it since: only such a number may be refused with UNAVAILABLE there (a fence,
  // or the catch-up of runtime/core/retired_numbers.h). Emptied when the runtime starts polling
  // it (a new record there). Under retired_mu: the fuzzer thread and self-unregistering handlers.
  std::mutex retired_mu;
  std::unordered_set<uint32_t> retired;
  void NoteRetired(uint32_t qp_num) {
    std::lock_guard<std::mutex> lock(retired_mu);
    retired.insert(qp_num);
  }
  bool Retired(uint32_t qp_num) {
    std::lock_guard<std::mutex> lock(retired_mu);
    return retired.contains(qp_num);
  }
  void NoteRegistered(uint32_t qp_num) {
    std::lock_guard<std::mutex> lock(retired_mu);
    retired.erase(qp_num);
  }
  // A new record in the runtime (created, adopted, adopted again): no fences, no retired numbers.
  // No QP is registered on it yet, so no handler raises undrained_ends meanwhile.
  void NotePolledAfresh() {
    std::lock_guard<std::mutex> lock(retired_mu);
    retired.clear();
    undrained_ends.store(0);
  }
};

struct State;
State* g_state = nullptr;  // for the orphan handler

class FuzzOrphans final : public cqd::OrphanHandler {
 public:
  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override;
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> markers{0};
};

class FuzzDeviceEvents final : public cqd::DeviceEventHandler {
 public:
  void OnDeviceEvent(const cqd::AsyncEvent&) noexcept override { count.fetch_add(1); }
  std::atomic<uint64_t> count{0};
};

struct State {
  // Configuration.
  int pollers = 1;
  int consumers = 1;
  int engine = 0;             // the engine-driven consumer's index
  bool rtc = false;           // consumer 0 (of two) is kRunToCompletion on poller 0
  bool engine_shard = false;  // shard 0 is engine-driven, polled by `reactor`
  bool arena = false;         // the engine consumer is drained as tasks of `tbb_arena`
  // This thread has drained the engine consumer (Drain with max > 0): it is an engine thread of
  // the runtime, whose Teardown::Wait is refused for every QP (runtime.h).
  bool drains_engine = false;
  std::unique_ptr<::tbb::task_arena> tbb_arena;
  std::unique_ptr<cqd::ArenaConsumers> hosted;
  bool edge = false;
  size_t queue_capacity = 1;
  size_t spill_capacity = 4096;
  uint32_t max_registrations = 64;
  bool last_wqe_device = true;
  bool fatal_at_end = false;

  FuzzOrphans orphans;
  FuzzDeviceEvents device_events;
  std::unique_ptr<cqd::Runtime> rt;
  std::shared_ptr<cqd::SimDevice> sim;
  cqd::DeviceId dev = 0;
  bool shut_down = false;
  bool fatal = false;
  std::atomic<int> registered{0};  // registrations live now (handlers may end theirs)
  int epoll_fd = -1;
  int notify_fd = -1;
  bool edge_pending = false;
  int teardowns_started = 0;
  int teardown_results[10] = {};              // by StatusCode, settled teardowns
  int teardown_refused = 0;                   // TeardownQp calls that returned an error
  int qp_num_reuses = 0;                      // new QPs registered with a torn-down QP's qp_num
  std::atomic<uint64_t> stale_deliveries{0};  // completions of a predecessor (plain Unregister)
  // The engine-driven shard's reactor thread: PollShard while there is work, else TrySleepShard
  // and epoll_wait on the shard fd and `reactor_stop_fd`.
  std::thread reactor;
  int reactor_stop_fd = -1;
  std::atomic<bool> reactor_stop{false};
  std::atomic<int> reactor_errors{0};
  std::atomic<uint64_t> reactor_sleeps{0};
  std::atomic<uint64_t> events_matched{0};  // events checked against a recorded floor
  std::atomic<uint64_t> handler_waits{0};   // Teardown::Wait calls from handlers and on_done
  std::mutex latest_mu;
  cqd::Teardown latest_td;  // guarded by latest_mu: the teardown started last

  std::array<CqEnt, kMaxCqs> cqs;
  std::array<QpEnt, kMaxQps> qps;
  std::array<QpEnt, kMaxCqs> strays;  // completions of no QP, per CQ

  ~State() {
    if (epoll_fd >= 0) close(epoll_fd);
  }

  // Any thread (the orphan handler): the incarnation a tagged completion belongs to.
  QpEnt* FindQp(const ibv_wc& wc) {
    const int tag = static_cast<int>((wc.wr_id >> kTagShift) & 0xff);
    if (tag < kMaxQps) return qps[tag].exists ? &qps[tag] : nullptr;
    if (tag >= kStrayTag && tag < kStrayTag + kMaxCqs) {
      return strays[tag - kStrayTag].exists ? &strays[tag - kStrayTag] : nullptr;
    }
    return nullptr;
  }
};

int StreamOf(uint64_t wr_id) { return (wr_id & kSendBit) ? 1 : 0; }

// The fuzzer thread or a self-unregistering handler: q's registration ended (or its teardown
// started) now.
void NoteRetire(State& st, QpEnt& q) {
  for (int s = 0; s < 2; ++s) {
    q.retired_at[s].store(q.streams[s].injected.load());
    const int cq = q.streams[s].cq;
    q.releases_at_retire[s].store(cq >= 0 ? st.cqs[cq].releases.load() : 0);
  }
}
int TagOf(uint64_t wr_id) { return static_cast<int>((wr_id >> kTagShift) & 0xff); }

void FuzzHandler::ReleaseCommit() noexcept {
  if (commit_released.exchange(true)) return;
  for (int k = 0; k < 2; ++k) {
    if (commit_cq[k] >= 0) st_->cqs[commit_cq[k]].committed.fetch_sub(commit[k]);
  }
}

void FuzzHandler::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  CHECK(!unregistered.load(),
        "OnCompletions after Unregister returned or the teardown ended "
        "(qp_num 0x%x)",
        q_->qp_num.load());
  CHECK(!wcs.empty(), "OnCompletions with no completions");
  for (const ibv_wc& wc : wcs) {
    CHECK(wc.qp_num == q_->qp_num.load(), "completion of qp_num 0x%x delivered to 0x%x", wc.qp_num,
          q_->qp_num.load());
    CHECK((wc.wr_id & kMagicMask) == kMagic,
          "a teardown marker (wr_id 0x%llx, status %d) reached the handler of qp_num 0x%x",
          static_cast<unsigned long long>(wc.wr_id), wc.status, wc.qp_num);
    const int s = StreamOf(wc.wr_id);
    const int64_t seq = static_cast<int64_t>(wc.wr_id & 0xffffffff);
    const int tag = TagOf(wc.wr_id);
    if (tag != q_->idx) {
      // A completion of an earlier QP that had this qp_num.
      CHECK(tag < kMaxQps && st_->qps[tag].exists && st_->qps[tag].qp_num.load() == wc.qp_num,
            "qp 0x%x (incarnation %d) got wr_id 0x%llx of incarnation %d", wc.qp_num, q_->idx,
            static_cast<unsigned long long>(wc.wr_id), tag);
      QpEnt& old = st_->qps[tag];
      CHECK(seq >= old.retired_at[s].load(),
            "qp 0x%x (incarnation %d) got wr_id %lld (stream %d) of incarnation %d, injected "
            "before that incarnation's registration was retired",
            wc.qp_num, q_->idx, static_cast<long long>(seq), s, tag);
      // Completed after the retire, before the old QP was destroyed: the orphan handler's too
      // (README "QP lifecycle"), unless the runtime released the CQ since (no history then). A
      // QP that was never registered is not judged: the runtime never knew its number (README,
      // "Reuse of a number").
      const int old_cq = old.streams[s].cq;
      CHECK(old.retired_at[s].load() < 0 || old_cq < 0 ||
                st_->cqs[old_cq].releases.load() != old.releases_at_retire[s].load(),
            "qp 0x%x (incarnation %d) got wr_id %lld (stream %d) of incarnation %d, completed "
            "after that incarnation's registration was retired, from a CQ the runtime polled "
            "throughout",
            wc.qp_num, q_->idx, static_cast<long long>(seq), s, tag);
      Stream& ost = old.streams[s];
      CHECK(seq < ost.injected.load(), "qp 0x%x: old wr_id %lld was never injected", wc.qp_num,
            static_cast<long long>(seq));
      uint8_t was = ost.marks[seq].exchange(3);
      CHECK(was == 0,
            "qp 0x%x stream %d of incarnation %d: wr_id %lld reached a successor "
            "after being %s",
            wc.qp_num, s, tag, static_cast<long long>(seq),
            was == 2 ? "orphaned" : "delivered (duplicate)");
      ost.delivered.fetch_add(1);
      st_->stale_deliveries.fetch_add(1);
      continue;
    }
    Stream& st = q_->streams[s];
    CHECK(seq < st.injected.load(), "qp 0x%x stream %d: wr_id %lld was never injected", wc.qp_num,
          s, static_cast<long long>(seq));
    CHECK(seq >= floor_[s],
          "qp 0x%x stream %d: wr_id %lld reached the handler after an async event that was "
          "raised when %u completions had been injected",
          wc.qp_num, s, static_cast<long long>(seq), floor_[s]);
    uint8_t was = st.marks[seq].exchange(1);
    CHECK(was == 0, "qp 0x%x stream %d: wr_id %lld delivered after being %s", wc.qp_num, s,
          static_cast<long long>(seq), was == 2 ? "orphaned" : "delivered (duplicate)");
    if (last_[s] >= 0) {
      CHECK(seq == last_[s] + 1, "qp 0x%x stream %d: handler got wr_id %lld after %lld", wc.qp_num,
            s, static_cast<long long>(seq), static_cast<long long>(last_[s]));
    } else {
      CHECK(seq > st.last_delivered.load(),
            "qp 0x%x stream %d: new registration got wr_id %lld, an earlier one got %lld",
            wc.qp_num, s, static_cast<long long>(seq),
            static_cast<long long>(st.last_delivered.load()));
    }
    last_[s] = seq;
    st.last_delivered.store(seq);
    st.delivered.fetch_add(1);
    if (wc.wr_id & kSelfUnregisterBit) SelfUnregister();
    if ((seq & 31) == 31) TryWaitFromHandler();
  }
}

// Teardown::Wait of the latest teardown from a handler (of any consumer kind) or from on_done
// never blocks: it is refused, or the teardown had ended. A block shows as the watchdog's HANG.
void CheckWaitDoesNotBlock(State& st, const char* where) {
  cqd::Teardown td;
  {
    std::lock_guard<std::mutex> lock(st.latest_mu);  // its holders wait for nobody
    td = st.latest_td;
  }
  const bool was_over = td.done();
  const cqd::Status r = td.Wait();
  CHECK(r.code() == cqd::StatusCode::kFailedPrecondition || td.done(),
        "Teardown::Wait from %s returned %s for a teardown still running", where,
        r.ToString().c_str());
  // An ended teardown's result comes back on any thread (runtime.h), and a teardown never ends
  // FAILED_PRECONDITION: that code is a refusal, which only a teardown still running may give.
  CHECK(!was_over || r.code() != cqd::StatusCode::kFailedPrecondition,
        "Teardown::Wait from %s refused a teardown that had ended: %s", where,
        r.ToString().c_str());
  st.handler_waits.fetch_add(1);
}

void FuzzHandler::TryWaitFromHandler() noexcept { CheckWaitDoesNotBlock(*st_, "a handler"); }

void FuzzHandler::OnAsyncEvent(const cqd::AsyncEvent& event) noexcept {
  CHECK(!unregistered.load(),
        "OnAsyncEvent (type %d) after Unregister returned or the teardown "
        "ended (qp_num 0x%x)",
        event.type, q_->qp_num.load());
  CHECK(event.qp_num == q_->qp_num.load(), "async event of qp_num 0x%x delivered to 0x%x",
        event.qp_num, q_->qp_num.load());
  events.fetch_add(1);
  // The earliest expectation of this type not yet met: it was raised no later than this event,
  // so its floor is no higher than this event's.
  std::lock_guard<std::mutex> lock(q_->ev_mu);
  for (EventExpect& e : q_->expected_events) {
    if (e.matched || e.type != event.type) continue;
    e.matched = true;
    st_->events_matched.fetch_add(1);
    for (int s = 0; s < 2; ++s) floor_[s] = std::max(floor_[s], e.floor[s]);
    break;
  }
}

// Records that an event of `type` is about to be raised for q (before it can be delivered).
// `registration`: the registration it must reach if that is still live at the end (nullptr: none
// to check).
void ExpectEvent(QpEnt& q, ibv_event_type type, const FuzzHandler* registration) {
  std::lock_guard<std::mutex> lock(q.ev_mu);
  EventExpect e{type, {q.streams[0].injected.load(), q.streams[1].injected.load()}};
  e.registration = registration;
  q.expected_events.push_back(e);
}

// The last `count` events recorded for q were not raised after all: none must arrive.
void NotRaised(QpEnt& q, size_t count) {
  std::lock_guard<std::mutex> lock(q.ev_mu);
  for (size_t i = q.expected_events.size() - count; i < q.expected_events.size(); ++i) {
    q.expected_events[i].registration = nullptr;
  }
}

// The handler of q's live registration, or nullptr. Not with q.reg_mu held.
const FuzzHandler* LiveRegistration(QpEnt& q) {
  std::lock_guard<std::mutex> lock(q.reg_mu);
  return q.reg.registered() && !q.handlers.empty() ? q.handlers.back().get() : nullptr;
}

// A handler unregistering its own QP (allowed from a handler: runtime.h). The rest of this call's
// completions are still this handler's; nothing after this call is.
void FuzzHandler::SelfUnregister() noexcept {
  if (!q_->reg_mu.try_lock()) return;
  if (!q_->handlers.empty() && q_->handlers.back().get() == this && q_->reg.registered()) {
    q_->reg.Unregister();
    CHECK(!q_->reg.registered(), "Unregister from a handler left it registered");
    NoteRetire(*st_, *q_);
    ++st_->cqs[q_->send_cq].undrained_ends;
    ++st_->cqs[q_->recv_cq].undrained_ends;
    st_->cqs[q_->send_cq].NoteRetired(q_->qp_num.load());
    st_->cqs[q_->recv_cq].NoteRetired(q_->qp_num.load());
    unregistered.store(true);
    ReleaseCommit();
    st_->registered.fetch_sub(1);
  }
  q_->reg_mu.unlock();
}

void FuzzOrphans::OnOrphans(std::span<const ibv_wc> wcs) noexcept {
  for (const ibv_wc& wc : wcs) {
    count.fetch_add(1);
    // A teardown's markers are the runtime's: its fences take those a retired QP left behind.
    CHECK((wc.wr_id & kMagicMask) == kMagic,
          "orphan 0x%llx of qp_num 0x%x (status %d) is not ours: a teardown marker reached the "
          "OrphanHandler",
          static_cast<unsigned long long>(wc.wr_id), wc.qp_num, wc.status);
    QpEnt* q = g_state->FindQp(wc);
    CHECK(q != nullptr && q->qp_num.load() == wc.qp_num,
          "orphan of qp_num 0x%x (wr_id 0x%llx) that was never made", wc.qp_num,
          static_cast<unsigned long long>(wc.wr_id));
    Stream* st = &q->streams[TagOf(wc.wr_id) >= kStrayTag ? 0 : StreamOf(wc.wr_id)];
    const uint32_t seq = static_cast<uint32_t>(wc.wr_id & 0xffffffff);
    CHECK(seq < st->injected.load(), "orphan qp 0x%x wr_id %u was never injected", wc.qp_num, seq);
    uint8_t was = st->marks[seq].exchange(2);
    CHECK(was == 0, "qp 0x%x wr_id 0x%llx orphaned after being %s", wc.qp_num,
          static_cast<unsigned long long>(wc.wr_id),
          was == 2 ? "orphaned (duplicate)" : "delivered");
    st->orphaned.fetch_add(1);
  }
}

// ---- input ----

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t Byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

enum Op : uint8_t {
  kCreateCq,
  kAdoptCq,
  kDestroyCq,
  kCreateQp,
  kRegisterQp,
  kUnregister,
  kDestroyQp,
  kInject,
  kInjectStray,
  kSpurious,
  kFailGetEvent,
  kFailGetAsyncEvent,
  kRaiseQpEvent,
  kRaiseDeviceEvent,
  kEpollDrain,
  kRawDrain,
  kGetStats,
  kSleep,
  kQuiesce,
  kShutdown,
  kTeardownQp,
  kFailRequestNotify,
  kBadHandles,
  kOpCount
};

const char* OpName(int op) {
  static const char* names[] = {
      "CreateCq",     "AdoptCq",           "DestroyCq",    "CreateQp",         "RegisterQp",
      "Unregister",   "DestroyQp",         "Inject",       "InjectStray",      "Spurious",
      "FailGetEvent", "FailGetAsyncEvent", "RaiseQpEvent", "RaiseDeviceEvent", "EpollDrain",
      "RawDrain",     "GetStats",          "Sleep",        "Quiesce",          "Shutdown",
      "TeardownQp",   "FailRequestNotify", "BadHandles"};
  static_assert(sizeof(names) / sizeof(names[0]) == kOpCount);
  return op < kOpCount ? names[op] : "teardown";
}

void ExpectCode(const cqd::Status& s, cqd::StatusCode want, const char* what) {
  CHECK(s.code() == want, "%s: got %s, expected code %d", what, s.ToString().c_str(),
        static_cast<int>(want));
}

// ---- the engine-driven shard ----

void ReactorLoop(State& st) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  auto fd = st.rt->ShardFd(0);
  if (ep < 0 || !fd.ok()) {
    st.reactor_errors.fetch_add(1);
    return;
  }
  for (int watched : {*fd, st.reactor_stop_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    epoll_ctl(ep, EPOLL_CTL_ADD, watched, &ev);
  }
  while (!st.reactor_stop.load(std::memory_order_acquire)) {
    const int n = st.rt->PollShard(0, 1 + static_cast<int>(st.reactor_sleeps.load() % 64));
    if (n < 0) st.reactor_errors.fetch_add(1);
    if (n != 0) continue;
    const int verdict = st.rt->TrySleepShard(0);
    if (verdict < 0) st.reactor_errors.fetch_add(1);
    if (verdict != 1 && verdict != 2) continue;
    st.reactor_sleeps.fetch_add(1, std::memory_order_relaxed);
    epoll_event events[2];
    // 1: no timeout (a lost wakeup hangs the input); 2: at most a millisecond.
    (void)epoll_wait(ep, events, 2, verdict == 1 ? -1 : 1);
  }
  close(ep);
}

void StartReactor(State& st) {
  st.reactor_stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  CHECK(st.reactor_stop_fd >= 0, "eventfd");
  st.reactor = std::thread([&st] { ReactorLoop(st); });
}

void StopReactor(State& st) {
  if (!st.reactor.joinable()) return;
  st.reactor_stop.store(true, std::memory_order_release);
  uint64_t one = 1;
  CHECK(write(st.reactor_stop_fd, &one, sizeof(one)) == sizeof(one), "write(reactor stop)");
  st.reactor.join();
  close(st.reactor_stop_fd);
  CHECK(st.reactor_errors.load() == 0, "PollShard or TrySleepShard failed %d times",
        st.reactor_errors.load());
}

// ---- the engine-driven consumer ----

// Waits up to `timeout_ms` for the notify fd; Drains once if it reported work. Returns what Drain
// returned, or 0.
int EngineStep(State& st, int timeout_ms, int max) {
  if (st.arena) {  // the arena drains it; this thread must not
    if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    return 0;
  }
  epoll_event ev;
  int n;
  do {
    n = epoll_wait(st.epoll_fd, &ev, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n > 0) st.edge_pending = true;
  if (!st.edge_pending) return 0;
  st.edge_pending = false;  // level-triggered: it reports again while work is left
  st.drains_engine = true;  // also a Drain of nothing (max 0): it names the drainer
  int got = st.rt->Drain(st.engine, max);
  CHECK(got >= 0, "Drain(engine consumer) returned %d", got);
  return got;
}

bool NotifyFdReadable(const State& st) {
  pollfd p{st.notify_fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// A CQ the pollers still take completions from.
bool Pollable(const State& st, const CqEnt& cq) {
  return cq.polled && !st.shut_down && !cq.overflowed;
}

void DescribeAndFail(State& st, const char* what) {
  cqd::Stats s = st.rt->GetStats();
  fprintf(stderr, "runtime_fuzz: %s; notify fd %s, edge_pending %d; consumers:", what,
          NotifyFdReadable(st) ? "readable" : "not readable", st.edge_pending);
  for (const auto& c : s.consumers) {
    fprintf(stderr, " %s depth %llu spill %llu stalls %llu delivered %llu;", c.name.c_str(),
            static_cast<unsigned long long>(c.queue_depth),
            static_cast<unsigned long long>(c.spill_depth),
            static_cast<unsigned long long>(c.stalls),
            static_cast<unsigned long long>(c.delivered));
  }
  fprintf(stderr, " CQs:");
  for (const CqEnt& cq : st.cqs) {
    if (cq.exists && !cq.sim_destroyed) {
      fprintf(stderr, " [shard %d polled %d size %d solicited_only %d]", cq.shard, cq.polled,
              cq.sim->size(), cq.solicited_only);
    }
  }
  for (const auto& p : s.pollers) {
    fprintf(stderr, " poller sleeps %llu arms %llu arm_failures %llu stalls %llu;",
            static_cast<unsigned long long>(p.sleeps), static_cast<unsigned long long>(p.arms),
            static_cast<unsigned long long>(p.arm_failures),
            static_cast<unsigned long long>(p.backpressure_stalls));
  }
  fprintf(stderr, " teardowns:");
  for (const QpEnt& q : st.qps) {
    if (q.td_active) {
      fprintf(stderr, " [qp 0x%x done %d]", q.qp_num.load(), static_cast<int>(q.td.done()));
    }
  }
  fprintf(stderr, "\n");
  Fail("%s", what);
}

// Drives the engine consumer (only through its notify fd) until `done` holds. A solicited-only CQ
// holding completions that raise no event (S8) is nudged with a spurious event, as an engine would
// have to; nothing else is.
template <typename Done>
void WaitUntil(State& st, Done done, const char* what) {
  Clock::time_point start = Clock::now();
  int rounds = 0;
  while (!done()) {
    if (PastDeadline()) DescribeAndFail(st, what);
    EngineStep(st, 1, 64);
    if (++rounds % 4 == 0) {
      for (CqEnt& cq : st.cqs) {
        if (Pollable(st, cq) && cq.solicited_only && cq.sim->size() > 0) {
          st.sim->AddSpuriousEvent(cq.sim);
        }
      }
    }
    if (Clock::now() - start > std::chrono::milliseconds(2)) std::this_thread::yield();
  }
}

// ---- teardowns ----

void SettleTeardown(State& st, QpEnt& q);

// A new registration or teardown of the same QP replaces the fuzzer's record of the last
// teardown: that one must have ended (it does by its deadline) and be checked first.
void SettleEarlierTeardown(State& st, QpEnt& q) {
  if (!q.td_active) return;
  WaitUntil(
      st, [&] { return q.td.done(); }, "HANG: a teardown did not end by its deadline");
  SettleTeardown(st, q);
}

// The fuzzer's side of a teardown that has ended: checks its result and takes it off the books.
void SettleTeardown(State& st, QpEnt& q) {
  if (!q.td_active) return;
  CHECK(q.td.done(), "SettleTeardown of a running teardown");
  const cqd::Status r = q.td.Wait();
  using C = cqd::StatusCode;
  CHECK(r.code() == C::kOk || r.code() == C::kDeadlineExceeded || r.code() == C::kCancelled ||
            r.code() == C::kUnavailable,
        "Teardown::Wait returned %s", r.ToString().c_str());
  CHECK(r.code() != C::kCancelled || st.shut_down, "teardown CANCELLED without Shutdown: %s",
        r.ToString().c_str());
  CHECK(r.code() != C::kUnavailable || st.fatal, "teardown UNAVAILABLE without DEVICE_FATAL: %s",
        r.ToString().c_str());
  if (q.td_engine_idle) {
    // Nobody drained the engine consumer while it ran: the markers cannot have been reached.
    CHECK(r.code() != C::kOk,
          "teardown of qp 0x%x returned OK although its (engine-driven) "
          "consumer never drained meanwhile",
          q.qp_num.load());
  }
  FuzzHandler* h = q.td_handler;
  h->unregistered.store(true);  // done: the QP was unregistered before
  q.td_rec->wait_code = static_cast<int>(r.code());
  ++st.teardown_results[static_cast<int>(r.code())];
  if (r.ok()) {
    for (int s = 0; s < 2; ++s) {
      if (!q.td_strict[s]) continue;
      Stream& stream = q.streams[s];
      // An overflowed CQ holds its completions for good (S11): nothing can drain them.
      if (st.cqs[stream.cq].overflowed) continue;
      // What was injected while this registration was live must have reached its handler;
      // what came before may have gone to an earlier registration or the orphan handler.
      for (uint32_t k = h->reg_injected[s]; k < q.td_injected[s]; ++k) {
        const uint8_t m = stream.marks[k].load();
        CHECK(m == 1,
              "teardown of qp 0x%x returned OK, but wr_id %u of stream %d (injected "
              "before TeardownQp) was %s",
              q.qp_num.load(), k, s,
              m == 0   ? "not delivered"
              : m == 2 ? "orphaned"
                       : "delivered to another QP");
      }
    }
  }
  if (!r.ok() && r.code() != C::kUnavailable) {
    // Ended without draining: its fences count against the CQs until polled.
    ++st.cqs[q.send_cq].undrained_ends;
    ++st.cqs[q.recv_cq].undrained_ends;
  }
  h->ReleaseCommit();
  st.registered.fetch_sub(1);
  q.td_active = false;
  q.td_handler = nullptr;
}

// Settles every teardown that has ended; with `wait`, first waits for all of them, draining the
// engine consumer meanwhile.
void SettleTeardowns(State& st, bool wait) {
  for (QpEnt& q : st.qps) {
    if (!q.td_active) continue;
    if (wait) {
      WaitUntil(
          st, [&] { return q.td.done(); }, "HANG: a teardown does not end");
    }
    if (q.td.done()) SettleTeardown(st, q);
  }
}

// Waits until every completion injected into a CQ the pollers still poll reached a handler or the
// orphan handler, and every teardown ended.
void Quiesce(State& st) {
  auto all_accounted = [&] {
    for (QpEnt* set : {st.qps.data(), st.strays.data()}) {
      int count = set == st.qps.data() ? kMaxQps : kMaxCqs;
      for (int i = 0; i < count; ++i) {
        QpEnt& q = set[i];
        if (!q.exists) continue;
        for (Stream& s : q.streams) {
          if (s.cq < 0 || !Pollable(st, st.cqs[s.cq])) continue;
          if (s.accounted() != s.injected.load()) return false;
        }
      }
    }
    return true;
  };
  SettleTeardowns(st, /*wait=*/true);
  WaitUntil(st, all_accounted, "HANG: completions neither delivered nor orphaned");
}

// ---- operations ----

int FreeCq(State& st) {
  for (int i = 0; i < kMaxCqs; ++i) {
    if (!st.cqs[i].exists) return i;
  }
  return -1;
}

void DoCreateCq(State& st, uint8_t a, uint8_t b) {
  int i = FreeCq(st);
  if (i < 0) return;
  const int shard = (a & 0x80) ? st.pollers : (a % st.pollers);  // now and then a bad shard
  cqd::CqOptions options;
  options.depth = 1 + b % 16;
  options.solicited_only = (b >> 4) & 1;
  options.grow = !((b >> 5) & 1);
  auto cq = st.rt->CreateCq(st.dev, shard, options);
  if (st.shut_down)
    return ExpectCode(cq.status(), cqd::StatusCode::kFailedPrecondition, "CreateCq after Shutdown");
  if (shard >= st.pollers)
    return ExpectCode(cq.status(), cqd::StatusCode::kInvalidArgument, "CreateCq on a bad shard");
  if (st.fatal) {
    CHECK(!cq.ok(), "CreateCq on a failed device succeeded");
    return;
  }
  CHECK(cq.ok(), "CreateCq: %s", cq.status().ToString().c_str());
  CqEnt& e = st.cqs[i];
  e.exists = e.polled = true;
  e.NotePolledAfresh();
  e.sim_destroyed = e.adopted = e.overflowed = false;
  e.solicited_only = options.solicited_only;
  e.grow = options.grow;
  e.shard = shard;
  e.handle = *cq;
  e.stale.reset();
  e.sim = cq->sim();
  e.stranded = -1;
  e.markers = 0;
  e.committed.store(0);
}

void DoAdoptCq(State& st, uint8_t a, uint8_t b) {
  // Re-adopt a released CQ, or make a new one on a shard's channel and adopt it.
  const int shard = a % st.pollers;
  const bool wrong_shard = (a & 0x40) && st.pollers == 2;
  const bool grow = !((b >> 5) & 1);
  int i = -1;
  for (int k = 0; k < kMaxCqs; ++k) {
    CqEnt& c = st.cqs[k];
    if ((b & 0x80) && c.exists && c.adopted && !c.polled && !c.sim_destroyed) i = k;
  }
  if (i >= 0) {
    CqEnt& e = st.cqs[i];
    auto cq = st.rt->AdoptCq(st.dev, wrong_shard ? 1 - e.shard : e.shard, e.sim,
                             {.solicited_only = e.solicited_only, .grow = grow});
    if (st.shut_down)
      return ExpectCode(cq.status(), cqd::StatusCode::kFailedPrecondition,
                        "AdoptCq after Shutdown");
    // The runtime learns of a device failure from its DEVICE_FATAL event, a moment later.
    if (st.fatal && cq.status().code() == cqd::StatusCode::kUnavailable) return;
    if (wrong_shard)
      return ExpectCode(cq.status(), cqd::StatusCode::kInvalidArgument,
                        "AdoptCq on the wrong shard");
    CHECK(cq.ok(), "re-AdoptCq: %s", cq.status().ToString().c_str());
    e.polled = true;
    e.NotePolledAfresh();
    e.grow = grow;
    if (e.handle.valid()) e.stale = e.handle;  // the released handle is stale now
    e.handle = *cq;
    e.committed.store(0);
    return;
  }
  i = FreeCq(st);
  if (i < 0 || st.shut_down || st.fatal) return;
  auto channel = st.rt->SimChannelFor(st.dev, shard);
  CHECK(channel.ok(), "SimChannelFor: %s", channel.status().ToString().c_str());
  const int depth = 1 + b % 16;
  auto sim_cq = st.sim->CreateCq(depth, *channel);
  CHECK(sim_cq.ok(), "SimDevice::CreateCq: %s", sim_cq.status().ToString().c_str());
  CqEnt& e = st.cqs[i];
  e.exists = e.adopted = true;
  e.polled = e.sim_destroyed = e.overflowed = false;
  e.shard = shard;
  e.solicited_only = (b >> 4) & 1;
  e.grow = grow;
  e.sim = *sim_cq;
  e.handle = cqd::CqHandle{};
  e.stale.reset();
  e.stranded = -1;
  e.markers = 0;
  e.committed.store(0);
  auto cq = st.rt->AdoptCq(st.dev, wrong_shard ? 1 - shard : shard, e.sim,
                           {.solicited_only = e.solicited_only, .grow = grow});
  if (wrong_shard) {
    ExpectCode(cq.status(), cqd::StatusCode::kInvalidArgument, "AdoptCq on the wrong shard");
    return;  // kept as a released CQ: it may be adopted properly later
  }
  CHECK(cq.ok(), "AdoptCq: %s", cq.status().ToString().c_str());
  auto again = st.rt->AdoptCq(st.dev, shard, e.sim);
  ExpectCode(again.status(), cqd::StatusCode::kAlreadyExists, "AdoptCq twice");
  e.polled = true;
  e.NotePolledAfresh();
  e.handle = *cq;
}

// Registrations on CQ i: live ones, and teardowns not yet settled (`pending`).
int RegisteredQpsOn(State& st, int cq, int* pending) {
  int n = 0;
  *pending = 0;
  for (QpEnt& q : st.qps) {
    if (!q.exists || (q.send_cq != cq && q.recv_cq != cq)) continue;
    if (q.reg.registered()) ++n;
    if (q.td_active) ++*pending;
  }
  return n;
}
int SimQpsOn(State& st, int cq) {
  int n = 0;
  for (QpEnt& q : st.qps) {
    if (q.exists && q.sim != nullptr && (q.send_cq == cq || q.recv_cq == cq)) ++n;
  }
  return n;
}

// Destroys a CQ on the device (an adopted one after the runtime released it).
void SimDestroyCq(State& st, CqEnt& e) {
  e.stranded = e.sim->size();
  cqd::Status s = st.sim->DestroyCq(e.sim);
  CHECK(s.ok(), "SimDevice::DestroyCq: %s", s.ToString().c_str());
  e.sim_destroyed = true;
}

void DoDestroyCq(State& st, int i) {
  CqEnt& e = st.cqs[i];
  if (!e.exists || e.sim_destroyed) return;
  if (!e.polled) {  // released (adopted): the engine destroys it once its QPs are gone
    if (SimQpsOn(st, i) == 0) SimDestroyCq(st, e);
    return;
  }
  SettleTeardowns(st, /*wait=*/false);
  // No handler may end its registration from here on (they only try_lock).
  std::vector<std::unique_lock<std::mutex>> locks;
  for (QpEnt& q : st.qps) locks.emplace_back(q.reg_mu);
  int pending = 0;
  const int registered = RegisteredQpsOn(st, i, &pending);
  const int64_t size_before = e.sim->size();
  cqd::Status s = st.rt->DestroyCq(e.handle);
  if (registered > 0) {
    ExpectCode(s, cqd::StatusCode::kFailedPrecondition, "DestroyCq with registered QPs");
    return;
  }
  if (pending > 0 && s.code() == cqd::StatusCode::kFailedPrecondition) return;  // still draining
  if (!e.adopted && SimQpsOn(st, i) > 0) {
    CHECK(!s.ok(), "DestroyCq of a CQ that QPs use succeeded");
    return;  // still polled (what it held went to the orphan handler)
  }
  CHECK(s.ok(), "DestroyCq: %s", s.ToString().c_str());
  e.polled = false;
  e.stale = e.handle;
  if (e.adopted) {
    e.releases.fetch_add(1);
    if (SimQpsOn(st, i) == 0) SimDestroyCq(st, e);
  } else {
    // DestroyCq polls the CQ empty into the orphan handler first, unless it overflowed.
    e.stranded = e.overflowed ? size_before : 0;
    e.sim_destroyed = true;
  }
}

QpEnt* PickQp(State& st, uint8_t a) {
  QpEnt& q = st.qps[a % kMaxQps];
  return q.exists ? &q : nullptr;
}

// Makes a QP incarnation in slot i; returns false if the device refused.
bool MakeQp(State& st, int i, int recv, int send, const cqd::SimQpOptions& opts) {
  auto qp = st.sim->CreateQp(st.cqs[send].sim, st.cqs[recv].sim, opts);
  if (st.fatal && !qp.ok()) return false;
  CHECK(qp.ok(), "SimDevice::CreateQp: %s", qp.status().ToString().c_str());
  QpEnt& q = st.qps[i];
  q.idx = i;
  q.sim = *qp;
  q.opts = opts;
  q.send_cq = send;
  q.recv_cq = recv;
  q.streams[0].cq = recv;
  q.streams[1].cq = send;
  q.qp_num.store((*qp)->qp_num());
  q.exists = true;
  return true;
}

int FreeQp(State& st) {
  for (int k = 0; k < kMaxQps; ++k) {
    if (!st.qps[k].exists) return k;
  }
  return -1;
}

void DoCreateQp(State& st, uint8_t a, uint8_t b) {
  static const int kWrs[] = {0, 1, 2, 3, 4, 8, 16, 0};
  const int i = FreeQp(st);
  if (i < 0 || st.fatal) return;
  const int recv = a % kMaxCqs, send = (b & 1) ? recv : (b >> 1) % kMaxCqs;
  for (int c : {recv, send}) {
    if (!st.cqs[c].exists || st.cqs[c].sim_destroyed) return;
  }
  cqd::SimQpOptions opts;
  opts.srq = (b >> 3) & 1;
  opts.max_send_wr = kWrs[(b >> 4) & 7];
  opts.max_recv_wr = kWrs[(a >> 2) & 7];
  MakeQp(st, i, recv, send, opts);
}

// RegisterQp with QpOptions from `b` (bits 1-3 send_wrs, bits 4-6 recv_wrs), checking the result
// against the CQ capacity guard.
void DoRegister(State& st, QpEnt* q, cqd::ConsumerId consumer, uint8_t b) {
  static const int kOpt[] = {-1, 0, 1, 2, 4, 16, -2, -1};
  if (q == nullptr || q->sim == nullptr) return;
  SettleEarlierTeardown(st, *q);
  cqd::QpOptions options;
  options.send_wrs = kOpt[(b >> 1) & 7];
  options.recv_wrs = kOpt[(b >> 4) & 7];
  auto handler = std::make_unique<FuzzHandler>(&st, q);
  std::lock_guard<std::mutex> lock(q->reg_mu);
  const int live = st.registered.load();  // handlers of other QPs may still lower it
  // The guard's arithmetic: what this registration commits on each CQ. Our books never hold less
  // than the runtime's (we take commitments off after the runtime did).
  const bool srq = q->opts.srq;
  const int64_t send_wrs = (options.send_wrs >= 0 ? options.send_wrs : q->opts.max_send_wr) + 1;
  const int64_t recv_wrs =
      srq ? 0 : (options.recv_wrs >= 0 ? options.recv_wrs : q->opts.max_recv_wr) + 1;
  CqEnt& scq = st.cqs[q->send_cq];
  CqEnt& rcq = st.cqs[q->recv_cq];
  bool fits = true, could_fit = true;
  auto judge = [&](CqEnt& cq, int64_t wrs) {
    if (cq.grow) return;
    const int64_t depth = cq.sim->depth();
    if (cq.committed.load() + wrs > depth) fits = false;
    if (wrs > depth) could_fit = false;  // even with every other registration gone
  };
  if (q->send_cq == q->recv_cq) {
    judge(scq, send_wrs + recv_wrs);
  } else {
    judge(scq, send_wrs);
    judge(rcq, recv_wrs);
  }
  auto reg = st.rt->RegisterQp(*q->sim, *handler, consumer, options);
  using C = cqd::StatusCode;
  if (st.shut_down)
    return ExpectCode(reg.status(), C::kFailedPrecondition, "RegisterQp after Shutdown");
  if (consumer >= static_cast<cqd::ConsumerId>(st.consumers))
    return ExpectCode(reg.status(), C::kInvalidArgument, "RegisterQp on a bad consumer");
  if (!scq.polled || !rcq.polled)
    return ExpectCode(reg.status(), C::kNotFound, "RegisterQp on an unpolled CQ");
  if (st.rtc && consumer == 0 && (scq.shard != 0 || rcq.shard != 0))
    return ExpectCode(reg.status(), C::kInvalidArgument,
                      "RegisterQp on a run-to-completion consumer with a CQ on another shard");
  if (q->reg.registered()) return ExpectCode(reg.status(), C::kAlreadyExists, "RegisterQp twice");
  // Still draining: kAlreadyExists (or it just ended: the teardown unregisters before it says
  // it is done, and the checks below apply).
  if (q->td_active && reg.status().code() == C::kAlreadyExists) return;
  if (options.send_wrs < -1 || options.recv_wrs < -1)
    return ExpectCode(reg.status(), C::kInvalidArgument, "RegisterQp with bad QpOptions");
  if (!could_fit)
    return ExpectCode(reg.status(), C::kResourceExhausted,
                      "RegisterQp on a CQ that can never hold its work requests");
  // "Later" comes before the refusals that a later state may lift too (the CQ's room, the
  // registrations in use): the runtime checks a retired number's catch-up first.
  if (!reg.ok() && reg.status().code() == C::kUnavailable &&
      (scq.Retired(q->qp_num.load()) || rcq.Retired(q->qp_num.load()))) {
    return;  // a retired QP with this number may have left completions it cannot poll out yet
  }
  if (!fits && !reg.ok())
    return ExpectCode(reg.status(), C::kResourceExhausted, "RegisterQp past the CQ's capacity");
  if (live >= static_cast<int>(st.max_registrations) && !reg.ok())
    return ExpectCode(reg.status(), C::kResourceExhausted, "RegisterQp past max_registrations");
  if (st.fatal && !reg.ok() && reg.status().code() == C::kResourceExhausted) return;  // no resize
  // Fences of retired registrations still count against a CQ that may not grow (one that may
  // grows past them: README "QP lifecycle").
  if (!reg.ok() && reg.status().code() == C::kResourceExhausted &&
      ((!scq.grow && scq.undrained_ends > 0) || (!rcq.grow && rcq.undrained_ends > 0))) {
    return;
  }
  CHECK(reg.ok(), "RegisterQp: %s", reg.status().ToString().c_str());
  scq.NoteRegistered(q->qp_num.load());
  rcq.NoteRegistered(q->qp_num.load());
  CHECK(reg->qp_num() == q->qp_num.load(), "Registration::qp_num");
  // The CQs hold what the QPs registered on them may have outstanding.
  auto committed = [&](CqEnt& cq, int64_t wrs) {
    cq.committed.fetch_add(wrs);
    // A growable CQ grew at least to hold this registration's share.
    CHECK(cq.sim->depth() >= wrs, "RegisterQp: CQ depth %d < the %lld work requests of qp 0x%x",
          cq.sim->depth(), static_cast<long long>(wrs), q->qp_num.load());
  };
  handler->commit_cq[0] = q->send_cq;
  handler->commit_cq[1] = q->recv_cq;
  if (q->send_cq == q->recv_cq) {
    handler->commit[0] = static_cast<int>(send_wrs + recv_wrs);
    handler->commit_cq[1] = -1;
    committed(scq, send_wrs + recv_wrs);
  } else {
    handler->commit[0] = static_cast<int>(send_wrs);
    handler->commit[1] = static_cast<int>(recv_wrs);
    committed(scq, send_wrs);
    committed(rcq, recv_wrs);
  }
  handler->reg_injected[0] = q->streams[0].injected.load();
  handler->reg_injected[1] = q->streams[1].injected.load();
  q->reg = std::move(reg).value();
  q->consumer = consumer;
  q->handlers.push_back(std::move(handler));
  st.registered.fetch_add(1);
}

void DoRegisterOp(State& st, uint8_t a, uint8_t b) {
  const cqd::ConsumerId consumer = (b & 0x80) ? st.consumers : (b & 1) % st.consumers;
  DoRegister(st, PickQp(st, a), consumer, b);
}

void Unregister(State& st, QpEnt& q) {
  std::lock_guard<std::mutex> lock(q.reg_mu);
  if (!q.reg.registered()) return;
  q.reg.Unregister();
  CHECK(!q.reg.registered(), "Unregister from the fuzzer thread left it registered");
  NoteRetire(st, q);
  // Its fences hold its commitment until what it left in the CQs is polled.
  ++st.cqs[q.send_cq].undrained_ends;
  ++st.cqs[q.recv_cq].undrained_ends;
  st.cqs[q.send_cq].NoteRetired(q.qp_num.load());
  st.cqs[q.recv_cq].NoteRetired(q.qp_num.load());
  q.handlers.back()->unregistered.store(true);
  q.handlers.back()->ReleaseCommit();
  st.registered.fetch_sub(1);
}

// Whether q is registered now (a handler may end its registration meanwhile).
bool IsRegistered(QpEnt& q) {
  std::lock_guard<std::mutex> lock(q.reg_mu);
  return q.reg.registered();
}

// Destroys the QP on the device; not while it is registered or being torn down (an engine keeps
// a registered QP alive: runtime.h). Once unregistered, it stays so: only this thread registers.
bool DoDestroyQp(State& st, QpEnt& q) {
  if (q.sim == nullptr || IsRegistered(q)) return false;
  if (q.td_active) {
    if (!q.td.done()) return false;
    SettleTeardown(st, q);
  }
  cqd::Status s = st.sim->DestroyQp(q.sim);
  CHECK(s.ok(), "SimDevice::DestroyQp: %s", s.ToString().c_str());
  q.sim = nullptr;
  return true;
}

// Injects up to `n` completions into stream `s` of `q` (a QP, or the strays of a CQ). flags:
// bits 0-1 which are errors (none, the first, the last, all), bit 2 solicited, bits 3-6 all set
// overflow (S11), bit 7 the last one asks its handler to unregister its own QP.
void InjectInto(State& st, QpEnt& q, int s, int tag, int n, uint8_t flags) {
  Stream& stream = q.streams[s];
  CqEnt& cq = st.cqs[stream.cq];
  if (!cq.exists || cq.sim_destroyed || q.no_inject) return;
  // A device completes nothing for a QP that is gone (what it left in its CQs stays there).
  if (tag < kStrayTag && q.sim == nullptr) return;
  const uint32_t first = stream.injected.load();
  n = std::min<int>(n, static_cast<int>(kMaxPerStream - first));
  if (n <= 0) return;
  ibv_wc wcs[16];
  for (int i = 0; i < n; ++i) {
    ibv_wc& wc = wcs[i];
    wc = ibv_wc{};
    wc.wr_id = kMagic | (uint64_t(tag) << kTagShift) | (first + i) | (s == 1 ? kSendBit : 0);
    if ((flags & 0x80) && i == n - 1) wc.wr_id |= kSelfUnregisterBit;  // flags bit 7
    wc.qp_num = q.qp_num.load();
    wc.opcode = s == 1 ? IBV_WC_SEND : IBV_WC_RECV;
    wc.byte_len = 64;
    // flags bits 0-1: none, the first, the last, all of them are errors
    const int errors = flags & 3;
    const bool error = (errors == 1 && i == 0) || (errors == 2 && i == n - 1) || errors == 3;
    wc.status = error ? (i == 0 ? IBV_WC_REM_ACCESS_ERR : IBV_WC_WR_FLUSH_ERR) : IBV_WC_SUCCESS;
  }
  const bool solicited = (flags >> 2) & 1;
  // Overflow (S11) is rare: only when bits 3-6 are all set.
  const bool overflow = ((flags >> 3) & 0xf) == 0xf;
  std::vector<QpEnt*> expecting;  // the QPs whose overflow events are recorded below
  if (overflow) {
    // The device raises CQ_ERR and QP_FATAL for every QP of the CQ: record them first.
    for (QpEnt& other : st.qps) {
      if (other.exists && (other.send_cq == stream.cq || other.recv_cq == stream.cq)) {
        ExpectEvent(other, IBV_EVENT_CQ_ERR, LiveRegistration(other));
        ExpectEvent(other, IBV_EVENT_QP_FATAL, LiveRegistration(other));
        expecting.push_back(&other);
      }
    }
  }
  const bool failed_before = cq.sim->failed();
  // The CQ's ring must not be written past what we counted as injected: publish the count first
  // (the handler checks wr_id < injected), then inject, then take back what did not fit.
  stream.injected.store(first + n);
  int added = cq.sim->Inject({wcs, static_cast<size_t>(n)}, solicited, overflow);
  if (added >= 0 || failed_before) {
    // It fit, or the CQ (or the device) had failed already: no event was raised.
    for (QpEnt* other : expecting) NotRaised(*other, 2);
  }
  if (added < 0) {
    CHECK(cq.sim->failed(), "Inject returned -1 on a CQ that has not failed");
    if (overflow && !st.fatal) cq.overflowed = true;
    added = 0;
  }
  CHECK(added <= n, "Inject added more than asked");
  stream.injected.store(first + added);
}

void DoInject(State& st, uint8_t a, uint8_t b) {
  QpEnt* q = PickQp(st, a);
  if (q == nullptr) return;
  const int s = (a >> 4) & 1;
  const int n = 1 + (a >> 5) * 2;  // 1..15
  if (s == 1 && q->send_cq == q->recv_cq) {
    InjectInto(st, *q, 0, q->idx, n, b);  // one CQ: one stream
  } else {
    InjectInto(st, *q, s, q->idx, n, b);
  }
}

void DoInjectStray(State& st, uint8_t a, uint8_t b) {
  const int c = a % kMaxCqs;
  if (!st.cqs[c].exists || st.cqs[c].sim_destroyed) return;
  QpEnt& q = st.strays[c];
  if (!q.exists) {
    q.exists = true;
    q.idx = kStrayTag + c;
    q.qp_num.store(kStrayQpNum + c);
    q.streams[0].cq = c;
  } else if (q.streams[0].cq != c) {
    return;
  }
  InjectInto(st, q, 0, kStrayTag + c, 1 + (a >> 4), b & ~0x78);  // no overflow here
}

void DoFailGetEvent(State& st, uint8_t a, uint8_t b) {
  if (st.shut_down) return;
  auto channel = st.rt->SimChannelFor(st.dev, a % st.pollers);
  if (!channel.ok()) return;  // e.g. the device failed
  st.sim->FailGetEvent(*channel, (b & 1) ? EINTR : EAGAIN, 1 + (b >> 1) % 32);
}

void DoFailRequestNotify(State& st, uint8_t a, uint8_t b) {
  static const int kErr[] = {EINVAL, EIO, ENOMEM, EAGAIN};
  CqEnt& cq = st.cqs[a % kMaxCqs];
  if (!cq.exists || cq.sim_destroyed) return;
  st.sim->FailRequestNotify(cq.sim, kErr[b & 3], 1 + (b >> 2) % 32);
}

void DoRaiseQpEvent(State& st, uint8_t a, uint8_t b) {
  static const ibv_event_type kTypes[] = {IBV_EVENT_COMM_EST,     IBV_EVENT_SQ_DRAINED,
                                          IBV_EVENT_PATH_MIG,     IBV_EVENT_QP_FATAL,
                                          IBV_EVENT_QP_REQ_ERR,   IBV_EVENT_QP_ACCESS_ERR,
                                          IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_QP_LAST_WQE_REACHED};
  QpEnt* q = PickQp(st, a);
  if (q == nullptr || q->sim == nullptr) return;
  const ibv_event_type type = kTypes[b % 8];
  ExpectEvent(*q, type, LiveRegistration(*q));
  cqd::Status s = st.sim->RaiseQpEvent(q->sim, type);
  CHECK(s.ok(), "RaiseQpEvent: %s", s.ToString().c_str());
}

void RaiseDeviceFatal(State& st) {
  if (st.fatal) return;
  for (QpEnt& q : st.qps) {
    if (q.exists) ExpectEvent(q, IBV_EVENT_DEVICE_FATAL, LiveRegistration(q));
  }
  st.sim->RaiseDeviceFatal();
  st.fatal = true;
}

void DoRaiseDeviceEvent(State& st, uint8_t a, uint8_t b) {
  static const ibv_event_type kTypes[] = {IBV_EVENT_PORT_ACTIVE,       IBV_EVENT_PORT_ERR,
                                          IBV_EVENT_LID_CHANGE,        IBV_EVENT_PKEY_CHANGE,
                                          IBV_EVENT_GID_CHANGE,        IBV_EVENT_SM_CHANGE,
                                          IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_SRQ_LIMIT_REACHED};
  if (a == 0xfd && b == 0xfd) return RaiseDeviceFatal(st);  // rare: the device fails
  cqd::Status s = st.sim->RaiseDeviceEvent(kTypes[b % 8], 1);
  CHECK(s.ok(), "RaiseDeviceEvent: %s", s.ToString().c_str());
}

// TeardownQp of q. a: bit4 call it on an unregistered QP too (kInvalidArgument), bit5 then destroy
// the QP and make a new one (it gets the same qp_num) on the same CQs and consumer, bit6 on_done.
// b: bits0-1 timeout {1, 20, 2000, 2000} ms (the fourth: past the input's limit where the fuzzer
// drains until the teardown ends on a healthy device), bits2-3 last_wqe_grace {0, 1, 5, 200} ms,
// bits4-5 how to wait {drain the engine until done, Wait() without draining, leave it running,
// drain}, bit6 on_done tries Teardown::Wait of the latest teardown.
void DoTeardown(State& st, uint8_t a, uint8_t b) {
  static const int kTimeoutMs[] = {1, 20, 2000, 2000};
  static const int kGraceMs[] = {0, 1, 5, 200};
  QpEnt* q = PickQp(st, a);
  if (q == nullptr) return;
  SettleEarlierTeardown(st, *q);
  const int mode = (b >> 4) & 3;
  CqEnt& scq = st.cqs[q->send_cq];
  CqEnt& rcq = st.cqs[q->recv_cq];
  // Drained until it ends, with no deadline inside the input, on CQs that work: it must end OK,
  // or UNAVAILABLE once the device failed. Whether a teardown ends by a deadline of seconds
  // depends on the machine's speed; this one has none to miss, so a lost wakeup, or a teardown
  // that waits on a dead device, shows as the watchdog's HANG instead.
  const bool unbounded =
      (b & 3) == 3 && (mode == 0 || mode == 3) && !scq.overflowed && !rcq.overflowed;
  std::unique_lock<std::mutex> lock(q->reg_mu);
  if (!q->reg.registered()) {
    if (!(a & 0x10)) return;
    cqd::Registration none;
    auto td = st.rt->TeardownQp(none);
    return ExpectCode(td.status(), cqd::StatusCode::kInvalidArgument,
                      "TeardownQp of no registration");
  }
  cqd::TeardownOptions options;
  options.timeout = std::chrono::milliseconds(kTimeoutMs[b & 3]);
  if (unbounded) options.timeout = kPastInputLimit;
  options.last_wqe_grace = std::chrono::milliseconds(kGraceMs[(b >> 2) & 3]);
  // Wait() without draining: keep it short (it runs into the deadline on the engine consumer).
  // So too where only the deadline can end it (an overflowed CQ is never polled again): several
  // such teardowns of 2 s would add up to the input's limit.
  if (mode == 1 || scq.overflowed || rcq.overflowed) {
    options.timeout = std::min(options.timeout, std::chrono::milliseconds(20));
  }
  auto rec = std::make_shared<TdRecord>();
  rec->handler = q->handlers.back().get();
  rec->wants_on_done = (a & 0x40) != 0;
  const bool wait_in_on_done = (b & 0x40) != 0;
  if (a & 0x40) {
    options.on_done = [rec, wait_in_on_done](const cqd::Status& s) {
      if (wait_in_on_done) CheckWaitDoesNotBlock(*g_state, "on_done");
      rec->handler->unregistered.store(true);  // it runs after the QP was unregistered
      rec->code.store(static_cast<int>(s.code()));
      rec->calls.fetch_add(1);
      rec->called.store(true);
    };
  }
  // Will the markers fit? Only this thread injects, but the runtime may flush into the CQ
  // meanwhile: the move to error before the send marker flushes what this QP still has
  // outstanding (an earlier teardown's markers that found no room), and the teardown thread's
  // redrive of another QP's teardown flushes that QP's. Room for all of them and the marker is
  // room for the marker whatever the order; the poller only frees room.
  const bool srq = q->opts.srq;
  const int send_room = scq.sim->depth() - scq.sim->size();
  int ahead = 0;  // what may be flushed into the send CQ before the marker
  for (const QpEnt& other : st.qps) {
    if (!other.exists || other.sim == nullptr) continue;
    if (other.send_cq == q->send_cq) ahead += other.sim->outstanding(false);
    if (other.recv_cq == q->send_cq) ahead += other.sim->outstanding(true);
  }
  // The send marker flushes inside its post; the receive marker, at the move to error after it,
  // waits in the receive queue if the CQ has no room for it then.
  const bool send_fits = !scq.sim->failed() && send_room >= 1 + ahead;
  const uint32_t injected[2] = {q->streams[0].injected.load(), q->streams[1].injected.load()};
  if (srq && st.last_wqe_device) {
    // Under reg_mu; the registration ends with the teardown, so there is none to check.
    ExpectEvent(*q, IBV_EVENT_QP_LAST_WQE_REACHED, nullptr);
  }
  auto td = st.rt->TeardownQp(q->reg, options);
  ++st.teardowns_started;
  if (st.shut_down) {
    ExpectCode(td.status(), cqd::StatusCode::kFailedPrecondition, "TeardownQp after Shutdown");
    CHECK(q->reg.registered(), "a refused TeardownQp unregistered the QP");
    return;
  }
  if (!td.ok()) {
    CHECK(!send_fits || st.fatal,
          "TeardownQp of qp 0x%x (not in error, room for its markers) failed: %s", q->qp_num.load(),
          td.status().ToString().c_str());
    CHECK(q->reg.registered(), "a failed TeardownQp unregistered the QP: %s",
          td.status().ToString().c_str());
    ++st.teardown_refused;
    return;
  }
  CHECK(!q->reg.registered(), "TeardownQp left the Registration registered");
  scq.NoteRetired(q->qp_num.load());  // it ends, whatever its result
  rcq.NoteRetired(q->qp_num.load());
  scq.markers += 1;
  if (!srq) rcq.markers += 1;
  q->no_inject = true;  // the QP is in the error state: the device completes nothing new
  q->td_active = true;
  q->td = *td;
  q->td_rec = rec;
  q->all_td_recs.push_back(rec);
  q->td_handler = rec->handler;
  q->td_injected[0] = injected[0];
  q->td_injected[1] = injected[1];
  // The send stream (and a receive stream on the send CQ) flushes ahead of the send marker.
  // A receive stream on its own CQ: ahead of the receive marker, or of LAST_WQE_REACHED; with
  // neither (an SRQ QP on a device that never raises it, or no room for the receive marker) the
  // runtime ends after last_wqe_grace, which only bounds how late a receive may come.
  q->td_strict[1] = true;
  q->td_strict[0] = true;
  for (int s = 0; s < 2; ++s) {
    q->retired_at[s].store(injected[s]);
    const int cq = q->streams[s].cq;
    q->releases_at_retire[s].store(cq >= 0 ? st.cqs[cq].releases.load() : 0);
  }
  {
    std::lock_guard<std::mutex> latest(st.latest_mu);
    st.latest_td = *td;  // for waits from handlers and on_done
  }
  q->td_engine_idle =
      mode == 1 && q->consumer == static_cast<cqd::ConsumerId>(st.engine) && !st.arena;
  lock.unlock();
  switch (mode) {
    case 0:
    case 3: {
      WaitUntil(
          st, [&] { return q->td.done(); }, "HANG: a teardown does not end");
      if (unbounded) {
        // No deadline inside the input: it ended drained, or (the device failed) by the
        // DEVICE_FATAL, not by waiting for what a dead device never sends.
        const cqd::Status r = q->td.Wait();
        CHECK(r.ok() || (st.fatal && r.code() == cqd::StatusCode::kUnavailable),
              "teardown of qp 0x%x (the engine drained meanwhile, no deadline%s) returned %s",
              q->qp_num.load(), st.fatal ? ", after DEVICE_FATAL" : "", r.ToString().c_str());
      }
      break;
    }
    case 1: {
      const cqd::Status r = q->td.Wait();
      if (r.code() == cqd::StatusCode::kFailedPrecondition && !q->td.done()) {
        // This thread drains the engine consumer: the markers may wait behind what it delivers
        // (the QP's consumer, or a full one sharing its CQs).
        CHECK(st.drains_engine,
              "Teardown::Wait refused on the fuzzer thread, which never drained, for a QP of "
              "consumer %u: %s",
              q->consumer, r.ToString().c_str());
        q->td_engine_idle = false;  // WaitUntil drains it
        WaitUntil(
            st, [&] { return q->td.done(); }, "HANG: a teardown does not end");
      }
      CHECK(q->td.done(), "Wait() returned before the teardown was done");
      break;
    }
    case 2:
      return;  // settled later (Quiesce, DestroyQp, the final teardown)
  }
  SettleTeardown(st, *q);
  if (!(a & 0x20) || st.fatal) return;
  // Destroy it and make a new QP on the same CQs: the device hands out the qp_num just freed.
  const uint32_t old_num = q->qp_num.load();
  const cqd::ConsumerId consumer = q->consumer;
  const cqd::SimQpOptions opts = q->opts;
  if (!DoDestroyQp(st, *q)) return;
  const int i = FreeQp(st);
  if (i < 0) return;
  for (int c : {q->recv_cq, q->send_cq}) {
    if (!st.cqs[c].exists || st.cqs[c].sim_destroyed) return;
  }
  if (!MakeQp(st, i, q->recv_cq, q->send_cq, opts)) return;
  CHECK(st.qps[i].qp_num.load() == old_num, "SimDevice did not reuse qp_num 0x%x (got 0x%x)",
        old_num, st.qps[i].qp_num.load());
  ++st.qp_num_reuses;
  DoRegister(st, &st.qps[i], consumer, 0);
}

// Handles the runtime must refuse: empty, stale (destroyed or released), another runtime's.
void DoBadHandles(State& st, uint8_t a, uint8_t b) {
  using C = cqd::StatusCode;
  ExpectCode(st.rt->DestroyCq(cqd::CqHandle{}), C::kInvalidArgument,
             "DestroyCq of an empty handle");
  const CqEnt& e = st.cqs[a % kMaxCqs];
  if (e.stale) {
    ExpectCode(st.rt->DestroyCq(*e.stale), C::kNotFound, "DestroyCq of a stale handle");
  }
  ExpectCode(cqd::Teardown{}.Wait(), C::kFailedPrecondition, "Wait of an empty Teardown");
  if (!(b & 1)) return;
  // Another runtime: its handles and CQs are not ours.
  cqd::RuntimeOptions options;
  options.consumers = {cqd::ConsumerOptions{}};
  auto other = cqd::Runtime::Create(options);
  CHECK(other.ok(), "second Runtime::Create: %s", other.status().ToString().c_str());
  auto sim2 = cqd::SimDevice::Create({.name = "sim1"});
  auto dev2 = (*other)->AddSimDevice(sim2);
  CHECK(dev2.ok(), "AddSimDevice on the second runtime: %s", dev2.status().ToString().c_str());
  auto cq2 = (*other)->CreateCq(*dev2, 0, {.depth = 4});
  CHECK(cq2.ok(), "CreateCq on the second runtime: %s", cq2.status().ToString().c_str());
  ExpectCode(st.rt->DestroyCq(*cq2), C::kInvalidArgument, "DestroyCq of another runtime's CQ");
  auto qp2 = sim2->CreateQp(cq2->sim(), cq2->sim());
  CHECK(qp2.ok(), "CreateQp on the second device");
  FuzzHandler h(&st, &st.strays[0]);
  auto reg = st.rt->RegisterQp(**qp2, h, 0);
  CHECK(!reg.ok(), "RegisterQp of another runtime's QP succeeded");
  if (!st.shut_down) {
    ExpectCode(reg.status(), C::kNotFound, "RegisterQp of a QP on another runtime's CQ");
  }
  CHECK(sim2->DestroyQp(*qp2).ok(), "DestroyQp on the second device");
  CHECK((*other)->DestroyCq(*cq2).ok(), "DestroyCq on the second runtime");
}

void DoGetStats(State& st) {
  cqd::Stats s = st.rt->GetStats();
  CHECK(s.pollers.size() == static_cast<size_t>(st.pollers), "Stats: pollers");
  CHECK(s.consumers.size() == static_cast<size_t>(st.consumers), "Stats: consumers");
  CHECK(s.cq_acked_events <= s.cq_events, "Stats: more CQ events acked (%llu) than read (%llu)",
        static_cast<unsigned long long>(s.cq_acked_events),
        static_cast<unsigned long long>(s.cq_events));
  uint64_t acked = 0, events = 0;
  for (const auto& c : s.cqs) {
    CHECK(c.acked_events <= c.events, "Stats: CQ %u acked %llu of %llu events", c.id,
          static_cast<unsigned long long>(c.acked_events),
          static_cast<unsigned long long>(c.events));
    acked += c.acked_events;
    events += c.events;
  }
  CHECK(acked <= s.cq_acked_events && events <= s.cq_events, "Stats: CQ totals");
  for (const auto& c : s.consumers) {
    // queue_capacity is a hard bound until Shutdown's final hand-over.
    if (!st.shut_down) {
      CHECK(c.high_water <= st.queue_capacity,
            "Stats: consumer %s queued %llu items, capacity "
            "%zu",
            c.name.c_str(), static_cast<unsigned long long>(c.high_water), st.queue_capacity);
    }
    CHECK(c.spill_high_water <= st.spill_capacity,
          "Stats: consumer %s: a poller held %llu "
          "items for it, spill_capacity %zu",
          c.name.c_str(), static_cast<unsigned long long>(c.spill_high_water), st.spill_capacity);
    CHECK(c.spill_depth <= st.pollers * st.spill_capacity, "Stats: consumer %s: spill depth %llu",
          c.name.c_str(), static_cast<unsigned long long>(c.spill_depth));
  }
}

void DoShutdown(State& st) {
  if (st.shut_down) {
    cqd::Status s = st.rt->Shutdown();
    CHECK(s.ok(), "second Shutdown: %s", s.ToString().c_str());
    return;
  }
  // A thread of the engine's waits for a running teardown meanwhile: Shutdown ends it first.
  cqd::Teardown waited;
  for (QpEnt& q : st.qps) {
    if (q.td_active && !q.td.done()) waited = q.td;
  }
  std::atomic<int> waited_code{-1};
  std::thread waiter([&] { waited_code.store(static_cast<int>(waited.Wait().code())); });
  cqd::Status s = st.rt->Shutdown();
  CHECK(s.ok(), "Shutdown: %s", s.ToString().c_str());
  waiter.join();  // a wait Shutdown did not end shows as the watchdog's HANG
  using C = cqd::StatusCode;
  const C code = static_cast<C>(waited_code.load());
  CHECK(code == C::kFailedPrecondition /* none was running */ || code == C::kOk ||
            code == C::kCancelled || code == C::kDeadlineExceeded || code == C::kUnavailable,
        "Teardown::Wait across Shutdown returned code %d", waited_code.load());
  st.shut_down = true;
  // Every teardown ended with Shutdown (drained ones OK, the rest kCancelled).
  for (QpEnt& q : st.qps) {
    if (!q.td_active) continue;
    CHECK(q.td.done(), "a teardown of qp 0x%x is still running after Shutdown returned",
          q.qp_num.load());
    SettleTeardown(st, q);
  }
}

void RunOp(State& st, int op, uint8_t a, uint8_t b) {
  switch (op) {
    case kCreateCq:
      return DoCreateCq(st, a, b);
    case kAdoptCq:
      return DoAdoptCq(st, a, b);
    case kDestroyCq:
      return DoDestroyCq(st, a % kMaxCqs);
    case kCreateQp:
      return DoCreateQp(st, a, b);
    case kRegisterQp:
      return DoRegisterOp(st, a, b);
    case kUnregister:
      if (QpEnt* q = PickQp(st, a)) Unregister(st, *q);
      return;
    case kDestroyQp:
      if (QpEnt* q = PickQp(st, a)) DoDestroyQp(st, *q);
      return;
    case kInject:
      return DoInject(st, a, b);
    case kInjectStray:
      return DoInjectStray(st, a, b);
    case kSpurious: {
      CqEnt& cq = st.cqs[a % kMaxCqs];
      if (cq.exists && !cq.sim_destroyed) st.sim->AddSpuriousEvent(cq.sim);
      return;
    }
    case kFailGetEvent:
      return DoFailGetEvent(st, a, b);
    case kFailGetAsyncEvent:
      st.sim->FailGetAsyncEvent((b & 1) ? EINTR : EAGAIN, 1 + (b >> 1) % 32);
      return;
    case kRaiseQpEvent:
      return DoRaiseQpEvent(st, a, b);
    case kRaiseDeviceEvent:
      return DoRaiseDeviceEvent(st, a, b);
    case kEpollDrain:
      EngineStep(st, 0, 1 + b % 64);
      return;
    case kRawDrain: {
      const int c = a % (st.consumers + 1);
      if (c == st.engine && st.arena) {  // hosted: only a nudge is allowed from here
        CHECK(st.hosted->OnReadable(c), "ArenaConsumers::OnReadable of its consumer failed");
        return;
      }
      if (c == st.engine) st.drains_engine = true;  // max 0 too
      const int got = st.rt->Drain(c, b % 65);
      if (c == st.engine) {
        CHECK(got >= 0, "Drain(engine) returned %d", got);
      } else {
        CHECK(got == -EINVAL, "Drain of a consumer that is not engine-driven returned %d", got);
      }
      if (st.pollers == 2 || !st.engine_shard) {
        const int shard = st.engine_shard ? 1 : 0;
        CHECK(st.rt->PollShard(shard, 8) == -EINVAL, "PollShard of a runtime-owned shard");
      }
      return;
    }
    case kGetStats:
      return DoGetStats(st);
    case kSleep:
      std::this_thread::sleep_for(std::chrono::microseconds(4 * b));
      return;
    case kQuiesce:
      return Quiesce(st);
    case kShutdown:
      return DoShutdown(st);
    case kTeardownQp:
      return DoTeardown(st, a, b);
    case kFailRequestNotify:
      return DoFailRequestNotify(st, a, b);
    case kBadHandles:
      return DoBadHandles(st, a, b);
  }
}

// ---- teardown and the final checks ----

// Stats::cq_events == cq_acked_events once every CQ is gone. Right after the CQs were destroyed,
// the event thread may still be between its last ack and counting it: give it up to a second.
void CheckAckBalance(State& st, const char* when, bool settle) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    cqd::Stats s = st.rt->GetStats();
    if (s.cq_acked_events == s.cq_events) return;
    if (!settle || Clock::now() - start > std::chrono::seconds(1)) {
      Fail("Stats %s: %llu CQ events read, %llu acked", when,
           static_cast<unsigned long long>(s.cq_events),
           static_cast<unsigned long long>(s.cq_acked_events));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Every async event raised for a registration that is still live has reached its handler (once
// the consumers run): none is lost. Not after DEVICE_FATAL or Shutdown, and not for a QP being
// torn down (its registration ends with the teardown).
void CheckEventsArrived(State& st) {
  if (st.fatal || st.shut_down) return;
  for (QpEnt& q : st.qps) {
    if (!q.exists || q.td_active) continue;
    const FuzzHandler* live = LiveRegistration(q);
    if (live == nullptr) continue;
    uint32_t raised = 0;
    {
      std::lock_guard<std::mutex> lock(q.ev_mu);
      for (const EventExpect& e : q.expected_events) raised += e.registration == live;
    }
    WaitUntil(
        st, [&] { return live->unregistered.load() || live->events.load() >= raised; },
        "LOST: an async event raised for a registered QP never reached its handler");
  }
}

void TearDown(State& st) {
  if (st.fatal_at_end) RaiseDeviceFatal(st);
  if (!st.shut_down) Quiesce(st);
  DoGetStats(st);
  CheckEventsArrived(st);
  // Registered QPs: a drained teardown for some (it must succeed while the runtime runs and the
  // device works), a plain Unregister for the rest.
  for (QpEnt& q : st.qps) {
    if (q.exists && q.idx % 2 == 0 && !st.shut_down && IsRegistered(q)) {
      DoTeardown(st, static_cast<uint8_t>(q.idx), 0x0b);  // no deadline, grace 5 ms, drain
    }
  }
  SettleTeardowns(st, /*wait=*/true);
  for (QpEnt& q : st.qps) Unregister(st, q);
  for (QpEnt& q : st.qps) DoDestroyQp(st, q);
  for (int i = 0; i < kMaxCqs; ++i) {
    CqEnt& e = st.cqs[i];
    if (!e.exists || e.sim_destroyed) continue;
    if (e.polled) {
      DoDestroyCq(st, i);
      CHECK(!e.polled, "DestroyCq at teardown left the CQ polled");
    }
    if (!e.sim_destroyed) SimDestroyCq(st, e);  // released adopted CQs
  }
  // Everything is destroyed: every CQ event read was acked.
  CheckAckBalance(st, "after destroying every CQ", /*settle=*/true);
  DoShutdown(st);
  // What is still queued for the engine consumer: drain it through its notify fd.
  WaitUntil(
      st,
      [&] {
        cqd::Stats s = st.rt->GetStats();
        // The engine consumer's queue, and (on an engine-driven shard, whose reactor runs them
        // after Shutdown) the run-to-completion consumer's.
        for (const auto& c : s.consumers) {
          if (c.queue_depth != 0) return false;
        }
        return true;
      },
      "HANG: a consumer's queue does not empty after Shutdown");
  StopReactor(st);
  if (st.hosted != nullptr) {
    const cqd::Status stopped = st.hosted->Stop();
    CHECK(stopped.ok(), "ArenaConsumers::Stop: %s", stopped.ToString().c_str());
  }
  CheckAckBalance(st, "after Shutdown", /*settle=*/false);
  cqd::Stats s = st.rt->GetStats();
  uint64_t delivered = 0, handler_delivered = 0;
  for (const auto& c : s.consumers) delivered += c.delivered;
  for (QpEnt& q : st.qps) {
    for (Stream& stream : q.streams) handler_delivered += stream.delivered.load();
  }
  CHECK(delivered == handler_delivered, "Stats: consumers delivered %llu, handlers got %llu",
        static_cast<unsigned long long>(delivered),
        static_cast<unsigned long long>(handler_delivered));
  CHECK(s.orphans == st.orphans.count.load(), "Stats: %llu orphans, the orphan handler got %llu",
        static_cast<unsigned long long>(s.orphans),
        static_cast<unsigned long long>(st.orphans.count.load()));
  st.rt.reset();  // hands anything left to the orphan handler (nothing should be left)
  CHECK(s.orphans == st.orphans.count.load(), "the runtime's destructor orphaned %llu more",
        static_cast<unsigned long long>(st.orphans.count.load() - s.orphans));

  // on_done ran once for each teardown that asked for it, with the result Wait() gave.
  for (QpEnt& q : st.qps) {
    for (auto& rec : q.all_td_recs) {
      if (!rec->wants_on_done) continue;
      CHECK(rec->calls.load() == 1, "on_done of a teardown of qp 0x%x ran %d times",
            q.qp_num.load(), rec->calls.load());
      CHECK(rec->code.load() == rec->wait_code,
            "on_done of a teardown of qp 0x%x got code %d, "
            "Wait() returned %d",
            q.qp_num.load(), rec->code.load(), rec->wait_code);
    }
  }
  int markers_posted = 0;
  for (const CqEnt& e : st.cqs) markers_posted += e.exists ? e.markers : 0;
  CHECK(st.orphans.markers.load() <= static_cast<uint64_t>(markers_posted),
        "%llu teardown markers orphaned, %d posted",
        static_cast<unsigned long long>(st.orphans.markers.load()), markers_posted);

  if (getenv("CQD_FUZZ_VERBOSE") != nullptr) {
    uint64_t spill_hw = 0, stalls = 0, high_water = 0;
    for (const auto& c : s.consumers) {
      spill_hw = std::max(spill_hw, c.spill_high_water);
      stalls += c.stalls;
      high_water = std::max(high_water, c.high_water);
    }
    fprintf(stderr,
            "runtime_fuzz: delivered %llu orphans %llu (markers %llu) stale %llu; "
            "teardowns %d: ok %d deadline %d cancelled %d unavailable %d refused %d; reuses %d; "
            "events matched %llu, device events %llu, waits from handlers %llu; queue high water "
            "%llu, spill high water "
            "%llu, stalls %llu\n",
            static_cast<unsigned long long>(delivered), static_cast<unsigned long long>(s.orphans),
            static_cast<unsigned long long>(st.orphans.markers.load()),
            static_cast<unsigned long long>(st.stale_deliveries.load()), st.teardowns_started,
            st.teardown_results[0],
            st.teardown_results[static_cast<int>(cqd::StatusCode::kDeadlineExceeded)],
            st.teardown_results[static_cast<int>(cqd::StatusCode::kCancelled)],
            st.teardown_results[static_cast<int>(cqd::StatusCode::kUnavailable)],
            st.teardown_refused, st.qp_num_reuses,
            static_cast<unsigned long long>(st.events_matched.load()),
            static_cast<unsigned long long>(st.device_events.count.load()),
            static_cast<unsigned long long>(st.handler_waits.load()),
            static_cast<unsigned long long>(high_water), static_cast<unsigned long long>(spill_hw),
            static_cast<unsigned long long>(stalls));
  }
  // Exactly once, except a tail of each stream left in a CQ nobody polls.
  int64_t unaccounted[kMaxCqs] = {};
  for (QpEnt* set : {st.qps.data(), st.strays.data()}) {
    int count = set == st.qps.data() ? kMaxQps : kMaxCqs;
    for (int i = 0; i < count; ++i) {
      QpEnt& q = set[i];
      if (!q.exists) continue;
      for (int s_i = 0; s_i < 2; ++s_i) {
        Stream& stream = q.streams[s_i];
        const uint32_t n = stream.injected.load();
        bool tail = false;
        for (uint32_t k = 0; k < n; ++k) {
          if (stream.marks[k].load() == 0) {
            tail = true;
            ++unaccounted[stream.cq];
          } else {
            CHECK(!tail, "qp 0x%x stream %d: wr_id %u accounted after an earlier one was lost",
                  q.qp_num.load(), s_i, k);
          }
        }
      }
    }
  }
  for (int c = 0; c < kMaxCqs; ++c) {
    const CqEnt& e = st.cqs[c];
    const int64_t stranded = e.exists ? e.stranded : 0;
    const int64_t markers = e.exists ? e.markers : 0;
    CHECK(unaccounted[c] <= stranded && stranded <= unaccounted[c] + markers,
          "CQ %d (shard %d, adopted %d, overflowed %d): %lld completions neither delivered nor "
          "orphaned, but %lld were left in it when it was destroyed (%lld teardown markers went "
          "into it)",
          c, e.shard, e.adopted, e.overflowed, static_cast<long long>(unaccounted[c]),
          static_cast<long long>(stranded), static_cast<long long>(markers));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StartWatchdog();
  Reader in(data, size);
  const uint8_t c0 = in.Byte(), c1 = in.Byte(), c2 = in.Byte();

  auto st = std::make_unique<State>();
  g_state = st.get();
  st->pollers = 1 + (c0 & 1);
  st->consumers = 1 + ((c0 >> 1) & 1);
  st->engine = st->consumers - 1;
  st->edge = (c0 >> 2) & 1;
  static const uint32_t kAck[] = {1, 2, 4, 64};
  static const int kPollBatch[] = {1, 2, 4, 32};
  static const size_t kCapacity[] = {1, 2, 3, 4, 8, 16, 64, 1024};
  static const int kDispatch[] = {1, 2, 3, 4, 8, 16, 64, 256};
  static const size_t kSpill[] = {1, 2, 8, 4096};
  st->queue_capacity = kCapacity[c1 & 7];
  st->max_registrations = (c1 & 0x40) ? 3 : 64;
  st->spill_capacity = kSpill[c2 & 3];
  st->last_wqe_device = !((c2 >> 2) & 1);
  st->fatal_at_end = (c2 >> 3) & 1;
  st->rtc = st->consumers == 2 && ((c2 >> 4) & 1);
  st->engine_shard = (c2 >> 5) & 1;
  st->arena = (c2 >> 6) & 1;

  cqd::RuntimeOptions options;
  options.pollers = st->pollers;
  options.ack_threshold = kAck[(c0 >> 3) & 3];
  options.idle_budget = std::chrono::microseconds((c0 & 0x20) ? 20 : 0);
  options.poll_batch = kPollBatch[(c0 >> 6) & 3];
  options.max_registrations = st->max_registrations;
  options.orphan_handler = &st->orphans;
  if (st->engine_shard) options.engine_shards = {0};
  options.consumers.clear();
  for (int c = 0; c < st->consumers; ++c) {
    cqd::ConsumerOptions co;
    co.kind = c == st->engine ? cqd::ConsumerKind::kEngineDriven
              : st->rtc       ? cqd::ConsumerKind::kRunToCompletion
                              : cqd::ConsumerKind::kOwnedThread;
    co.queue_capacity = st->queue_capacity;
    co.spill_capacity = st->spill_capacity;
    co.dispatch_batch = kDispatch[(c1 >> 3) & 7];
    co.idle_spin = std::chrono::microseconds(0);
    options.consumers.push_back(co);
  }

  g_deadline_ns.store((Clock::now() + kInputLimit).time_since_epoch().count());
  g_current_op.store("setup");
  auto rt = cqd::Runtime::Create(options);
  CHECK(rt.ok(), "Runtime::Create: %s", rt.status().ToString().c_str());
  st->rt = std::move(rt).value();
  st->sim = cqd::SimDevice::Create({.last_wqe_reached = st->last_wqe_device});
  auto dev = st->rt->AddSimDevice(st->sim, &st->device_events);
  CHECK(dev.ok(), "AddSimDevice: %s", dev.status().ToString().c_str());
  st->dev = *dev;
  if (st->engine_shard) StartReactor(*st);
  if (st->arena) {
    st->tbb_arena = std::make_unique<::tbb::task_arena>(2);
    cqd::ArenaConsumersOptions arena_options;
    arena_options.consumers = {static_cast<cqd::ConsumerId>(st->engine)};
    arena_options.drain_budget = 1 + c1 % 64;
    // The linger: its default, and its edges (none, the shortest, the longest).
    static const int kLingerUs[] = {200, 0, 1, 10000};
    arena_options.linger =
        std::chrono::microseconds(kLingerUs[((c1 >> 7) & 1) | (((c2 >> 7) & 1) << 1)]);
    auto hosted = cqd::ArenaConsumers::Create(*st->rt, *st->tbb_arena, arena_options);
    CHECK(hosted.ok(), "ArenaConsumers::Create: %s", hosted.status().ToString().c_str());
    st->hosted = std::move(hosted).value();
  }
  auto fd = st->rt->NotifyFd(st->engine);
  CHECK(fd.ok(), "NotifyFd: %s", fd.status().ToString().c_str());
  st->notify_fd = *fd;
  if (st->consumers == 2) {
    CHECK(!st->rt->NotifyFd(0).ok(), "NotifyFd of an owned consumer succeeded");
  }
  st->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  CHECK(st->epoll_fd >= 0, "epoll_create1");
  epoll_event ev{};
  ev.events = EPOLLIN | (st->edge ? static_cast<uint32_t>(EPOLLET) : 0u);
  ev.data.fd = st->notify_fd;
  CHECK(epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, st->notify_fd, &ev) == 0, "epoll_ctl");

  for (int i = 0; i < kMaxOps && in.left() > 0; ++i) {
    const int op = in.Byte() % kOpCount;
    const uint8_t a = in.Byte(), b = in.Byte();
    g_current_op.store(OpName(op));
    g_current_index.store(i);
    RunOp(*st, op, a, b);
  }
  g_current_op.store("teardown");
  g_current_index.store(-1);
  TearDown(*st);
  st.reset();
  g_state = nullptr;
  g_deadline_ns.store(0);
  return 0;
}

// SPDX-License-Identifier: BSD-2-Clause
// cqd soak: a long run of completions through the runtime on the simulated device, with every
// fault the simulated device can inject, checking that each completion is delivered exactly once
// (or orphaned exactly once, after its QP was unregistered) and in order.
//
//   bazel run -c opt //tools:soak -- [--completions=N] [--seconds=S] [flags...]
//
// Shape: 2 shards (pollers), --cqs CQs over them, --qps QPs on 3 consumers: consumer 0 is a
// runtime-owned thread, consumers 1 and 2 are engine-driven, each driven by a thread of this tool
// through NotifyFd() + epoll + Drain() (1: level-triggered, and it pauses its Drain loop for
// --pause_ms every --pause_every seconds; 2: edge-triggered). Every --split_every-th pair of QPs
// has its send CQs on the other shard, so their completions travel on two CQs. With --engine_shard,
// shard 1 has no poller thread: a reactor thread of this tool drives it (PollShard while there is
// work, else TrySleepShard and epoll_wait on ShardFd, no timeout), and consumer 0 runs to
// completion on it (ConsumerKind::kRunToCompletion: its handlers run inside PollShard on the
// reactor); QPs meant for consumer 0 whose CQs are not both on shard 1 go to consumer 1 or 2
// instead, and the last CQ of shard 1 is consumer 0's alone (its QPs are never split and always
// go to consumer 0), so that its polls run the fused pass (handlers called as the poll routes).
// With --arena, consumers 1 and 2 are not drained by threads of this tool but hosted in a oneTBB
// task_arena of two threads (cqd::ArenaConsumers, cqd/tbb.h: a drain task per readable notify fd,
// at most one per consumer at a time); nothing pauses them then.
//
// The tool behaves as a disciplined engine: each QP is created with --qp_wrs work requests per
// queue (SimQpOptions), RegisterQp's capacity guard grows the CQs to hold them, and a QP never has
// more than --qp_wrs completions outstanding per stream (injected, not yet delivered).
//
// Threads of the tool: --injectors injector threads (SimCq::Inject in bursts of 1..32, never
// overflowing a CQ: what did not fit is retried), a churn thread (every --churn_ms it replaces a
// QP while traffic flows: --teardown_permille of the time by a drained teardown, TeardownQp and
// Wait, which must return OK with every completion injected for the QP delivered to its handler
// and none orphaned, then DestroyQp, which frees the qp_num for the next QP, or
// DEADLINE_EXCEEDED (--teardown_timeout_ms) with what it did not deliver orphaned, never
// delivered to the next QP with that qp_num; otherwise by Unregister, keeping the QP until its
// books balance; then a new QP, registered on a random consumer (a RegisterQp refused with
// UNAVAILABLE, while a retired QP's completions with its number are still in a held-back CQ,
// keeps the QP waiting in its slot and is tried again at every churn; --srq_every makes every
// Nth incarnation an SRQ QP); handlers now and then call Wait on
// the latest teardown, which must return at once, refused or over), a chaos
// thread (every --fault_ms: a spurious CQ event, EINTR/EAGAIN storms on a completion channel and
// on the async fd, a QP async event, a port event), the two engine threads, and the main thread
// (progress once per second, then teardown and the verdict).
//
// Checking, with O(1) memory per QP incarnation (no per-completion state, so
// --completions=1000000000 runs in bounded memory): completion k of a QP's stream (one QP on one
// CQ) carries wr_id k (bit 63 marks the send-CQ stream, bits 48..62 the incarnation). The handler
// expects k == next; anything else counts as out of order. Orphans (the OrphanHandler) are counted
// per stream with the sum and sum of squares of their wr_ids: after a QP is unregistered, what it
// did not get must be exactly the orphaned range [delivered, injected). A retired QP's books are
// closed as soon as they balance, so memory does not grow with churn. At the end: lost = injected -
// delivered - orphaned (if positive), duplicated = the excess (if negative), and any orphan-range
// mismatch, late handler call (after Unregister returned), wrong-QP delivery, orphan of a QP that
// was never unregistered, Stats::cq_events != cq_acked_events after the CQs are destroyed, a
// teardown that was refused or returned neither OK nor DEADLINE_EXCEEDED, a handler's Wait that
// returned anything but its refusal or an ended teardown's result, or a consumer queue (spill)
// above queue_capacity (spill_capacity) fails the run. The progress line and the summary show the
// consumers' spill and stall figures (ConsumerStats).
#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/tbb.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSendStream = uint64_t{1} << 63;
// Bits 48..62 of a wr_id: the QP incarnation's tag, so that completions and orphans of two QPs
// that had the same qp_num are told apart (a device reuses numbers at once). Tags wrap; no two
// incarnations with one qp_num hold the same tag while either's books are open (Register).
// --tag_bits narrows the tag so that it wraps often (set once, before any thread starts).
constexpr int kTagShift = 48;
uint64_t g_tag_mask = 0x7fff;
constexpr uint64_t kIndexMask = (uint64_t{1} << kTagShift) - 1;
uint64_t BooksKey(uint32_t qp_num, uint64_t tag) { return uint64_t{qp_num} << 16 | tag; }
constexpr int kConsumers = 3;  // 0 owned, 1 engine (LT, pauses), 2 engine (ET)
constexpr int kPausingConsumer = 1;
constexpr int kMaxBurst = 32;

// ---- flags ----

struct Flags {
  uint64_t completions = 50'000'000;
  double seconds = 0;  // 0: no time limit; else stop injecting after this long
  double rate = 0;     // completions per second in all; 0: as fast as possible
  int qps = 96;
  int cqs = 6;
  int depth = 1024;  // CQ depth
  uint64_t queue_capacity = 8192;
  uint64_t spill_capacity = 4096;
  int qp_wrs = 512;             // work requests per queue of each QP (outstanding completions)
  int teardown_permille = 500;  // churns that tear the QP down drained (TeardownQp)
  int injectors = 2;
  int error_permille = 10;  // error completions per 1000
  int solicited_permille = 100;
  double churn_ms = 5;     // 0: no churn
  double fault_ms = 10;    // 0: no faults
  double pause_every = 4;  // seconds; 0: never pause
  double pause_ms = 1500;
  double teardown_timeout_ms = 0;  // 0: 5000 + pause_ms
  int split_every = 4;             // every Nth pair of QPs: send CQ on the other shard; 0: none
  int srq_every = 0;               // every Nth QP incarnation receives from an SRQ; 0: none
  int tag_bits = 15;               // wr_id bits naming a QP incarnation (1..15)
  double drain_timeout = 60;       // seconds to wait for the last completions
  uint64_t seed = 1;
  bool progress = true;
  bool engine_shard = false;  // shard 1 driven by a reactor thread; consumer 0 runs on it
  bool arena = false;         // consumers 1 and 2 drained as tasks of a oneTBB arena
  int arena_linger_us = -1;   // ArenaConsumersOptions::linger (-1: its default)
};

struct FlagSpec {
  const char* name;
  const char* help;
  enum { kU64, kInt, kDouble, kBool } type;
  void* ptr;
};

std::vector<FlagSpec> Specs(Flags& f) {
  return {
      {"completions", "completions to inject in all", FlagSpec::kU64, &f.completions},
      {"seconds", "stop injecting after S seconds (0: no limit)", FlagSpec::kDouble, &f.seconds},
      {"rate", "completions per second (0: as fast as possible)", FlagSpec::kDouble, &f.rate},
      {"qps", "QPs live at any time", FlagSpec::kInt, &f.qps},
      {"cqs", "CQs (over 2 shards)", FlagSpec::kInt, &f.cqs},
      {"depth", "CQ depth", FlagSpec::kInt, &f.depth},
      {"queue_capacity", "consumer queue capacity", FlagSpec::kU64, &f.queue_capacity},
      {"spill_capacity", "items each poller holds for a full consumer", FlagSpec::kU64,
       &f.spill_capacity},
      {"qp_wrs", "work requests per queue of a QP (completions outstanding at most)",
       FlagSpec::kInt, &f.qp_wrs},
      {"teardown_permille", "churns per 1000 that use a drained TeardownQp", FlagSpec::kInt,
       &f.teardown_permille},
      {"injectors", "injector threads", FlagSpec::kInt, &f.injectors},
      {"error_permille", "error completions per 1000", FlagSpec::kInt, &f.error_permille},
      {"solicited_permille", "solicited bursts per 1000", FlagSpec::kInt, &f.solicited_permille},
      {"churn_ms", "replace a QP every M ms (0: never)", FlagSpec::kDouble, &f.churn_ms},
      {"fault_ms", "inject faults every M ms (0: never)", FlagSpec::kDouble, &f.fault_ms},
      {"pause_every", "pause consumer 1 every S seconds (0: never)", FlagSpec::kDouble,
       &f.pause_every},
      {"pause_ms", "... for M ms", FlagSpec::kDouble, &f.pause_ms},
      {"teardown_timeout_ms", "TeardownOptions::timeout (0: 5000 + pause_ms)", FlagSpec::kDouble,
       &f.teardown_timeout_ms},
      {"split_every", "every Nth pair of QPs has its send CQs on the other shard (0: none; 1: all)",
       FlagSpec::kInt, &f.split_every},
      {"srq_every",
       "every Nth QP incarnation receives from an SRQ (its teardown waits for LAST_WQE_REACHED; "
       "0: none)",
       FlagSpec::kInt, &f.srq_every},
      {"tag_bits",
       "wr_id bits that name a QP incarnation (1..15; fewer make the tags wrap sooner, which the "
       "books must survive)",
       FlagSpec::kInt, &f.tag_bits},
      {"drain_timeout", "seconds to wait for the last completions", FlagSpec::kDouble,
       &f.drain_timeout},
      {"seed", "random seed", FlagSpec::kU64, &f.seed},
      {"progress", "print a progress line every second (0/1)", FlagSpec::kBool, &f.progress},
      {"engine_shard",
       "shard 1 is engine-driven, polled by a reactor thread; consumer 0 runs to completion on it "
       "(0/1); with 4 CQs or more, shard 1's last CQ serves consumer 0 alone (the fused pass)",
       FlagSpec::kBool, &f.engine_shard},
      {"arena",
       "consumers 1 and 2 are hosted in a oneTBB task_arena (cqd::ArenaConsumers) instead of "
       "engine threads (0/1)",
       FlagSpec::kBool, &f.arena},
      {"arena_linger_us",
       "with --arena: ArenaConsumersOptions::linger in microseconds (-1: the default)",
       FlagSpec::kInt, &f.arena_linger_us},
  };
}

// Flags are written with dashes (--queue-capacity=1); the underscore spelling of older command
// lines (--queue_capacity=1) is the same flag.
std::string DashedName(const char* name) {
  std::string dashed(name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  return dashed;
}

void Usage(const std::vector<FlagSpec>& specs, FILE* to = stderr) {
  fprintf(to, "usage: soak [--flag=value ...] (--help, --version)\n");
  for (const FlagSpec& s : specs) fprintf(to, "  --%-20s %s\n", DashedName(s.name).c_str(), s.help);
}

bool ParseFlags(int argc, char** argv, Flags& f) {
  std::vector<FlagSpec> specs = Specs(f);
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      Usage(specs, stdout);
      exit(0);
    }
    if (strcmp(arg, "--version") == 0) {
      printf("soak (cqd) %s\n", cqd::Version().string);
      exit(0);
    }
    const char* eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) != 0 || eq == nullptr) {
      fprintf(stderr, "soak: bad argument '%s'\n", arg);
      Usage(specs);
      return false;
    }
    const std::string name = DashedName(std::string(arg + 2, eq - arg - 2).c_str());
    const char* value = eq + 1;
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      if (name == DashedName(s.name)) spec = &s;
    }
    char* end = nullptr;
    errno = 0;
    bool ok = spec != nullptr && *value != '\0';
    if (ok) {
      switch (spec->type) {
        case FlagSpec::kU64: {
          if (*value == '-') {
            ok = false;
            break;
          }
          // Accepts 1000000000 and 1e9.
          double d = strtod(value, &end);
          ok = *end == '\0' && d >= 0 && d <= 1.8e19;
          if (ok) *static_cast<uint64_t*>(spec->ptr) = static_cast<uint64_t>(d);
          break;
        }
        case FlagSpec::kInt: {
          long v = strtol(value, &end, 10);
          ok = *end == '\0' && errno == 0 && v >= 0 && v <= 1'000'000;
          if (ok) *static_cast<int*>(spec->ptr) = static_cast<int>(v);
          break;
        }
        case FlagSpec::kDouble: {
          double v = strtod(value, &end);
          ok = *end == '\0' && v >= 0;
          if (ok) *static_cast<double*>(spec->ptr) = v;
          break;
        }
        case FlagSpec::kBool:
          ok = strcmp(value, "0") == 0 || strcmp(value, "1") == 0;
          if (ok) *static_cast<bool*>(spec->ptr) = value[0] == '1';
          break;
      }
    }
    if (!ok) {
      fprintf(stderr, "soak: bad flag '%s'\n", arg);
      Usage(specs);
      return false;
    }
  }
  if (f.qps < 1 || f.cqs < 2 || f.depth < kMaxBurst || f.injectors < 1 || f.error_permille > 1000 ||
      f.solicited_permille > 1000 || f.queue_capacity < 1 || f.spill_capacity < 1 ||
      f.spill_capacity > (1 << 20) || f.qp_wrs < 1 || f.teardown_permille > 1000 ||
      f.tag_bits < 1 || f.tag_bits > 15) {
    fprintf(stderr,
            "soak: need --qps>=1, --cqs>=2, --depth>=%d, --injectors>=1, "
            "--queue_capacity>=1, --spill_capacity in 1..2^20, --qp_wrs>=1, --tag_bits in 1..15, "
            "permille values <= 1000\n",
            kMaxBurst);
    Usage(specs);
    return false;
  }
  return true;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sum and sum of squares of k over [a, b), modulo 2^64 (what wrapping uint64 sums give).
uint64_t RangeSum(uint64_t a, uint64_t b) {
  auto s = [](unsigned __int128 n) { return n * (n - (n > 0)) / 2; };  // sum over [0, n)
  return static_cast<uint64_t>(s(b) - s(a));
}
uint64_t RangeSumSq(uint64_t a, uint64_t b) {
  auto s = [](unsigned __int128 n) -> unsigned __int128 {
    if (n == 0) return 0;
    return (n - 1) * n * (2 * n - 1) / 6;  // sum of k^2 over [0, n): < 2^128 for n < 2^40
  };
  return static_cast<uint64_t>(s(b) - s(a));
}

// ---- books ----

// One QP's completions on one CQ.
struct Stream {
  uint64_t injected = 0;          // under QpSlot::mu (the injectors)
  std::atomic<uint64_t> next{0};  // the handler's expected wr_id (its consumer only)
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> out_of_order{0};  // arrivals with wr_id != next
  std::atomic<uint64_t> backwards{0};     // ... of which wr_id < next (duplicate or reordered)
  // Under g_orphans.mu.
  uint64_t orphans = 0, orphan_sum = 0, orphan_sumsq = 0;
};

struct Track;

class SoakHandler final : public cqd::QpHandler {
 public:
  explicit SoakHandler(Track* t) : t_(t) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnAsyncEvent(const cqd::AsyncEvent& event) noexcept override;

 private:
  Track* t_;
};

// One QP incarnation: a SimQp and its registration, from RegisterQp to the close of its books.
struct Track {
  uint32_t qp_num = 0;
  uint64_t tag = 0;  // wr_id bits 48..62
  int streams_used = 1;
  Stream streams[2];
  SoakHandler handler{this};
  cqd::Registration registration;
  std::atomic<bool> unregistering{false};  // set before Unregister: orphans may come from now on
  std::atomic<bool> unregistered{false};   // set after Unregister returned: no handler call
  std::atomic<uint64_t> late_calls{0};
  std::atomic<uint64_t> wrong_qp{0};
  std::atomic<uint64_t> errors{0};  // error completions delivered
  std::atomic<uint64_t> async_events{0};
  // A plainly unregistered QP stays alive until its books balance: destroying it earlier would
  // let the device give its qp_num to a new QP while its completions are still on their way.
  cqd::SimQp* qp_alive = nullptr;
};

// The teardown started last, for handlers to try to wait for: Teardown::Wait from a handler must
// return at once (kFailedPrecondition, or the result of one already over), never block.
struct HandlerWaits {
  std::mutex mu;
  cqd::Teardown latest;  // guarded by mu
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> over{0};   // it had ended: Wait returned its result
  std::atomic<uint64_t> wrong{0};  // neither: Wait returned something else from a handler
  void Try() noexcept {
    static thread_local uint32_t calls = 0;
    if (++calls % 512 != 0) return;  // now and then
    cqd::Teardown td;
    {
      std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
      if (!lock.owns_lock()) return;
      td = latest;
    }
    const bool was_over = td.done();
    const cqd::Status s = td.Wait();
    // A teardown never ends FAILED_PRECONDITION: from an ended one that code is a wrong refusal.
    const bool refusal = s.code() == cqd::StatusCode::kFailedPrecondition;
    if (refusal && !was_over) {
      refused.fetch_add(1, std::memory_order_relaxed);
    } else if (!refusal && td.done()) {
      over.fetch_add(1, std::memory_order_relaxed);
    } else {
      wrong.fetch_add(1, std::memory_order_relaxed);
    }
  }
} g_handler_waits;

void SoakHandler::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  g_handler_waits.Try();
  Track& t = *t_;
  if (t.unregistered.load(std::memory_order_acquire)) t.late_calls.fetch_add(1);
  uint64_t got[2] = {0, 0};
  uint64_t errors = 0;
  for (const ibv_wc& wc : wcs) {
    if (wc.qp_num != t.qp_num || ((wc.wr_id >> kTagShift) & g_tag_mask) != t.tag) {
      t.wrong_qp.fetch_add(1, std::memory_order_relaxed);  // another QP's, or an earlier one's
      continue;
    }
    if (wc.status != IBV_WC_SUCCESS) ++errors;
    const int s = (wc.wr_id & kSendStream) ? 1 : 0;
    const uint64_t k = wc.wr_id & kIndexMask;
    Stream& st = t.streams[s];
    const uint64_t next = st.next.load(std::memory_order_relaxed);
    if (k != next) {
      st.out_of_order.fetch_add(1, std::memory_order_relaxed);
      if (k < next) st.backwards.fetch_add(1, std::memory_order_relaxed);
    }
    if (k >= next) st.next.store(k + 1, std::memory_order_relaxed);
    ++got[s];
  }
  for (int s = 0; s < 2; ++s) {
    if (got[s]) t.streams[s].delivered.fetch_add(got[s], std::memory_order_relaxed);
  }
  if (errors) t.errors.fetch_add(errors, std::memory_order_relaxed);
}

void SoakHandler::OnAsyncEvent(const cqd::AsyncEvent& event) noexcept {
  Track& t = *t_;
  if (t.unregistered.load(std::memory_order_acquire)) t.late_calls.fetch_add(1);
  if (event.qp_num != t.qp_num) t.wrong_qp.fetch_add(1, std::memory_order_relaxed);
  t.async_events.fetch_add(1, std::memory_order_relaxed);
}

// Every QP incarnation whose books are open, by BooksKey, for the orphan handler.
struct OrphanBooks final : public cqd::OrphanHandler {
  std::mutex mu;
  std::unordered_map<uint64_t, Track*> open;
  uint64_t unknown = 0;     // orphans of a qp_num with no open books (closed or never made)
  uint64_t of_live_qp = 0;  // orphans of a QP nobody started to unregister
  std::atomic<uint64_t> total{0};

  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
    total.fetch_add(wcs.size(), std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    for (const ibv_wc& wc : wcs) {
      auto it = open.find(BooksKey(wc.qp_num, (wc.wr_id >> kTagShift) & g_tag_mask));
      if (it == open.end()) {
        ++unknown;
        continue;
      }
      Track& t = *it->second;
      if (!t.unregistering.load(std::memory_order_acquire)) ++of_live_qp;
      const uint64_t k = wc.wr_id & kIndexMask;
      Stream& st = t.streams[(wc.wr_id & kSendStream) ? 1 : 0];
      ++st.orphans;
      st.orphan_sum += k;
      st.orphan_sumsq += k * k;
    }
  }
} g_orphans;

class CountingDeviceEvents final : public cqd::DeviceEventHandler {
 public:
  void OnDeviceEvent(const cqd::AsyncEvent&) noexcept override {
    count.fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<uint64_t> count{0};
} g_device_events;

// Totals of closed books.
struct Verdict {
  uint64_t qps = 0, injected = 0, delivered = 0, orphans = 0, lost = 0, duplicated = 0;
  uint64_t out_of_order = 0, backwards = 0, orphan_mismatch = 0, late_calls = 0, wrong_qp = 0;
  uint64_t errors = 0, async_events = 0;

  // Closes t's books (caller holds g_orphans.mu, and t's injection has ended).
  void Add(const Track& t) {
    ++qps;
    late_calls += t.late_calls.load();
    wrong_qp += t.wrong_qp.load();
    errors += t.errors.load();
    async_events += t.async_events.load();
    for (int s = 0; s < t.streams_used; ++s) {
      const Stream& st = t.streams[s];
      const uint64_t d = st.delivered.load(), n = st.injected;
      injected += n;
      delivered += d;
      orphans += st.orphans;
      out_of_order += st.out_of_order.load();
      backwards += st.backwards.load();
      if (d + st.orphans < n) lost += n - d - st.orphans;
      if (d + st.orphans > n) duplicated += d + st.orphans - n;
      // In order and exactly once, the handler got [0, d) and the orphans are [d, n).
      if (d + st.orphans == n && d <= n &&
          (st.orphan_sum != RangeSum(d, n) || st.orphan_sumsq != RangeSumSq(d, n))) {
        ++orphan_mismatch;
      }
    }
  }
  bool Balanced(const Track& t) const {  // caller holds g_orphans.mu
    for (int s = 0; s < t.streams_used; ++s) {
      const Stream& st = t.streams[s];
      if (st.delivered.load() + st.orphans != st.injected) return false;
    }
    return true;
  }
};

// ---- the run ----

struct QpSlot {
  std::mutex mu;  // injectors, churn and chaos take it to use the QP
  cqd::SimQp* qp = nullptr;
  std::unique_ptr<Track> track;
  int recv_cq = 0, send_cq = 0;
  bool draining = false;  // under mu: a teardown runs, the QP takes no new work
  // Under mu: a QP whose RegisterQp was refused (UNAVAILABLE: a retired QP with its number still
  // has completions in its CQs, held back by a paused consumer); the churn thread registers it
  // again until it is admitted.
  cqd::SimQp* waiting_qp = nullptr;
  cqd::ConsumerId waiting_consumer = 0;
  Clock::time_point waiting_since{};
};

struct Soak {
  Flags flags;
  std::unique_ptr<cqd::Runtime> rt;
  std::shared_ptr<cqd::SimDevice> sim;
  cqd::DeviceId dev = 0;
  std::vector<cqd::CqHandle> cqs;
  std::vector<std::unique_ptr<QpSlot>> slots;

  std::mutex retired_mu;
  std::deque<std::unique_ptr<Track>> retired;  // unregistered, books still open
  Verdict closed;                              // under g_orphans.mu

  Clock::time_point start;
  std::atomic<bool> stop_injecting{false};
  std::atomic<bool> stop_side{false};  // churn and chaos
  std::atomic<bool> stop_engines{false};
  std::atomic<bool> stop_reactor{false};
  int reactor_stop_fd = -1;
  std::atomic<uint64_t> reactor_steps{0};
  std::atomic<uint64_t> reactor_sleeps{0};
  std::atomic<uint64_t> injected{0};
  std::atomic<uint64_t> budget_taken{0};
  std::atomic<uint64_t> full_retries{0};
  std::atomic<uint64_t> wr_waits{0};  // bursts skipped: all of a QP's work requests outstanding
  std::atomic<uint64_t> inject_failures{0};  // Inject returned -1: must never happen
  std::atomic<uint64_t> churns{0};
  std::atomic<uint64_t> next_tag{0};
  std::atomic<uint64_t> teardowns{0};             // drained teardowns that returned OK
  std::atomic<uint64_t> teardowns_undrained{0};   // ended at the deadline (DEADLINE_EXCEEDED)
  std::atomic<uint64_t> teardown_failures{0};     // refused, or Wait() neither OK nor the deadline
  std::atomic<uint64_t> teardown_retries{0};      // refused for want of room for a marker: retried
  std::atomic<uint64_t> register_refusals{0};     // RegisterQp said UNAVAILABLE: retried
  std::atomic<uint64_t> tag_waits{0};             // no free tag for the qp_num yet: retried
  std::atomic<uint64_t> srq_draw{0};              // incarnations made, for --srq_every
  std::atomic<uint64_t> register_wait_max_ns{0};  // the longest a refused QP waited
  std::atomic<uint64_t> teardown_undelivered{0};  // completions an OK teardown did not deliver
  std::atomic<uint64_t> teardown_wait_ns{0};
  std::atomic<uint64_t> teardown_wait_max_ns{0};
  std::atomic<uint64_t> faults{0};
  std::atomic<uint64_t> pauses{0};
  std::atomic<bool> paused{false};
  std::atomic<uint64_t> engine_wakeups[kConsumers] = {};
  std::atomic<uint64_t> engine_timeouts[kConsumers] = {};
  std::atomic<uint64_t> control_errors{0};

  void ControlError(const char* what, const cqd::Status& s) {
    control_errors.fetch_add(1);
    fprintf(stderr, "\nsoak: %s: %s\n", what, s.ToString().c_str());
  }

  // With --engine_shard, the last CQ of shard 1 (odd indexes): only consumer 0's QPs use it, so
  // its polls run the fused pass. -1 without, or with fewer than 4 CQs (shard 1 keeps one shared).
  int OwnCq() const {
    if (!flags.engine_shard || flags.cqs < 4) return -1;
    return flags.cqs % 2 == 0 ? flags.cqs - 1 : flags.cqs - 2;
  }

  // Makes a QP on slot i's CQs and registers it on `consumer`. Caller holds the slot's mutex.
  bool NewQp(QpSlot& slot, cqd::ConsumerId consumer) {
    if (flags.engine_shard && consumer == 0 && (slot.send_cq % 2 != 1 || slot.recv_cq % 2 != 1)) {
      consumer = 1 + slot.recv_cq % 2;  // run to completion needs both CQs on its shard
    }
    if (slot.recv_cq == OwnCq()) consumer = 0;  // its CQ serves consumer 0 alone (the fused pass)
    const bool srq = flags.srq_every > 0 &&
                     srq_draw.fetch_add(1, std::memory_order_relaxed) % flags.srq_every == 0;
    auto qp = sim->CreateQp(cqs[slot.send_cq].sim(), cqs[slot.recv_cq].sim(),
                            {.max_send_wr = flags.qp_wrs, .max_recv_wr = flags.qp_wrs, .srq = srq});
    if (!qp.ok()) {
      ControlError("CreateQp", qp.status());
      return false;
    }
    slot.waiting_since = Clock::now();
    return Register(slot, *qp, consumer);
  }

  // Registers `qp` on `consumer` as slot's QP, or, if the runtime refuses it for now
  // (UNAVAILABLE) or no incarnation tag is free for its qp_num, keeps it waiting in the slot.
  // Returns false on any other error. Caller holds the slot's mutex.
  bool Register(QpSlot& slot, cqd::SimQp* qp, cqd::ConsumerId consumer) {
    auto t = std::make_unique<Track>();
    t->qp_num = qp->qp_num();
    t->streams_used = slot.send_cq == slot.recv_cq ? 1 : 2;
    {
      // Tags wrap (every refused registration takes one too), so skip any tag that an incarnation
      // with this qp_num still has open books under: sharing one would merge two QPs' books and
      // hide a completion that reached the wrong one of them.
      std::lock_guard<std::mutex> lock(g_orphans.mu);
      bool free = false;
      for (uint64_t tries = 0; tries <= g_tag_mask && !free; ++tries) {
        t->tag = next_tag.fetch_add(1, std::memory_order_relaxed) & g_tag_mask;
        free = !g_orphans.open.contains(BooksKey(t->qp_num, t->tag));
      }
      if (!free) {  // every tag is open under this qp_num (a narrow --tag_bits): try later
        tag_waits.fetch_add(1, std::memory_order_relaxed);
        slot.waiting_qp = qp;
        slot.waiting_consumer = consumer;
        return true;
      }
      g_orphans.open[BooksKey(t->qp_num, t->tag)] = t.get();
    }
    auto reg = rt->RegisterQp(*qp, t->handler, consumer);
    if (!reg.ok()) {
      {
        std::lock_guard<std::mutex> lock(g_orphans.mu);
        g_orphans.open.erase(BooksKey(t->qp_num, t->tag));
      }
      if (reg.status().code() != cqd::StatusCode::kUnavailable) {
        ControlError("RegisterQp", reg.status());
        return false;
      }
      register_refusals.fetch_add(1, std::memory_order_relaxed);
      slot.waiting_qp = qp;
      slot.waiting_consumer = consumer;
      return true;
    }
    const uint64_t waited = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - slot.waiting_since)
            .count());
    if (slot.waiting_qp != nullptr && waited > register_wait_max_ns.load()) {
      register_wait_max_ns.store(waited);  // the churn thread's alone
    }
    slot.waiting_qp = nullptr;
    t->registration = std::move(reg).value();
    slot.qp = qp;
    slot.track = std::move(t);
    return true;
  }

  // Churn thread: registers the QPs that were refused, where the runtime admits them now.
  bool RegisterWaiting() {
    for (auto& slot : slots) {
      std::lock_guard<std::mutex> lock(slot->mu);
      if (slot->waiting_qp == nullptr) continue;
      if (!Register(*slot, slot->waiting_qp, slot->waiting_consumer)) return false;
    }
    return true;
  }

  // Unregisters and destroys slot's QP; its books stay open until they balance. Caller holds the
  // slot's mutex.
  void RetireQp(QpSlot& slot) {
    if (slot.track == nullptr) return;
    Track& t = *slot.track;
    t.unregistering.store(true, std::memory_order_release);
    t.registration.Unregister();
    t.unregistered.store(true, std::memory_order_release);
    // Completions still in the CQ become orphans when polled (unknown qp_num). The QP is
    // destroyed once they are all accounted for (CloseBooks), so that its qp_num stays its own.
    t.qp_alive = slot.qp;
    slot.qp = nullptr;
    std::lock_guard<std::mutex> lock(retired_mu);
    retired.push_back(std::move(slot.track));
  }

  // Takes slot's QP out of service with a drained teardown, then destroys it (its qp_num is free
  // for the next QP). Every completion injected for it must have reached its handler. Returns
  // false if the teardown was refused; `*retry` says whether it may be tried again later (no room
  // for its marker yet). Caller does not hold the slot's mutex.
  bool DrainQp(QpSlot& slot, bool* retry) {
    *retry = false;
    Track* t;
    cqd::Result<cqd::Teardown> td = cqd::Status(cqd::StatusCode::kInternal, "not started");
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      if (slot.track == nullptr) return true;
      t = slot.track.get();
      slot.draining = true;  // the QP goes to the error state: no new work
      // Orphans are possible from here on only if the teardown does not drain.
      t->unregistering.store(true, std::memory_order_release);
      const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(
          flags.teardown_timeout_ms > 0 ? flags.teardown_timeout_ms
                                        : 5000 + flags.pause_ms));  // a pause ends first
      cqd::TeardownOptions options;
      options.timeout = timeout;
      td = rt->TeardownQp(t->registration, options);
    }
    if (td.ok()) {
      std::lock_guard<std::mutex> lock(g_handler_waits.mu);
      g_handler_waits.latest = *td;
    }
    if (!td.ok()) {
      std::lock_guard<std::mutex> lock(slot.mu);
      slot.draining = false;
      t->unregistering.store(false, std::memory_order_release);
      if (td.status().code() == cqd::StatusCode::kResourceExhausted) {
        // No room for the marker in the CQ. The capacity guard reserves a marker per registered
        // queue, but an SRQ's receives are the engine's to size (README, "Register"), and this
        // soak does not size for them: only its rows with SRQ QPs have shown this. The
        // registration stands, and TeardownQp may be tried again later, as runtime.h says.
        teardown_retries.fetch_add(1, std::memory_order_relaxed);
        *retry = true;
        return false;
      }
      teardown_failures.fetch_add(1);
      ControlError("TeardownQp", td.status());
      return false;
    }
    const Clock::time_point start = Clock::now();
    const cqd::Status r = td->Wait();
    const uint64_t waited = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    teardown_wait_ns.fetch_add(waited, std::memory_order_relaxed);
    uint64_t max = teardown_wait_max_ns.load();
    while (waited > max && !teardown_wait_max_ns.compare_exchange_weak(max, waited)) {
    }
    t->unregistered.store(true, std::memory_order_release);  // it ended: unregistered
    if (r.code() == cqd::StatusCode::kDeadlineExceeded) {
      // What the QP left in its CQs must reach no later QP, also one that gets its qp_num at
      // once (destroyed below, as the README allows): it comes to the orphan handler, where its
      // tag closes these books.
      teardowns_undrained.fetch_add(1, std::memory_order_relaxed);
    } else if (!r.ok()) {
      teardown_failures.fetch_add(1);
      fprintf(stderr, "\nsoak: teardown of qp 0x%x: %s\n", t->qp_num, r.ToString().c_str());
    } else {
      teardowns.fetch_add(1, std::memory_order_relaxed);
      // OK: everything the QP completed reached the handler, nothing was orphaned.
      for (int s = 0; s < t->streams_used; ++s) {
        std::lock_guard<std::mutex> lock(slot.mu);
        const Stream& st = t->streams[s];
        const uint64_t d = st.delivered.load();
        if (d < st.injected) teardown_undelivered.fetch_add(st.injected - d);
      }
    }
    std::lock_guard<std::mutex> lock(slot.mu);
    if (cqd::Status s = sim->DestroyQp(slot.qp); !s.ok()) ControlError("DestroyQp", s);
    slot.qp = nullptr;
    slot.draining = false;
    std::lock_guard<std::mutex> retired_lock(retired_mu);
    retired.push_back(std::move(slot.track));
    return true;
  }

  // Closes the books of retired QPs that balance (or all of them, at the end).
  // Destroys the QPs whose books closed (without the books' locks: DestroyQp waits for the
  // event thread to ack the QP's async events).
  void CloseBooks(bool all) {
    std::vector<cqd::SimQp*> to_destroy;
    {
      std::lock_guard<std::mutex> lock(retired_mu);
      std::lock_guard<std::mutex> orphans_lock(g_orphans.mu);
      for (auto it = retired.begin(); it != retired.end();) {
        if (all || closed.Balanced(**it)) {
          closed.Add(**it);
          auto open = g_orphans.open.find(BooksKey((*it)->qp_num, (*it)->tag));
          if (open != g_orphans.open.end() && open->second == it->get()) {
            g_orphans.open.erase(open);
          }
          if ((*it)->qp_alive != nullptr) to_destroy.push_back((*it)->qp_alive);
          it = retired.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (cqd::SimQp* qp : to_destroy) {
      if (cqd::Status s = sim->DestroyQp(qp); !s.ok()) ControlError("DestroyQp", s);
    }
  }

  // At the end, before the CQs go: destroys the QPs of retired books still open.
  void DestroyRetiredQps() {
    std::vector<cqd::SimQp*> to_destroy;
    {
      std::lock_guard<std::mutex> lock(retired_mu);
      for (auto& t : retired) {
        if (t->qp_alive != nullptr) to_destroy.push_back(std::exchange(t->qp_alive, nullptr));
      }
    }
    for (cqd::SimQp* qp : to_destroy) {
      if (cqd::Status s = sim->DestroyQp(qp); !s.ok()) ControlError("DestroyQp", s);
    }
  }

  bool Setup() {
    cqd::RuntimeOptions options;
    options.pollers = 2;
    options.poll_batch = 32;
    options.idle_budget = std::chrono::microseconds(20);
    options.ack_threshold = 16;
    options.orphan_handler = &g_orphans;
    options.consumers.resize(kConsumers);
    const char* names[kConsumers] = {flags.engine_shard ? "rtc0-shard1" : "owned0",
                                     flags.arena ? "arena1" : "engine1-lt",
                                     flags.arena ? "arena2" : "engine2-et"};
    if (flags.engine_shard) options.engine_shards = {1};
    for (int c = 0; c < kConsumers; ++c) {
      options.consumers[c].name = names[c];
      options.consumers[c].queue_capacity = flags.queue_capacity;
      options.consumers[c].spill_capacity = flags.spill_capacity;
      options.consumers[c].kind =
          c == 0 ? cqd::ConsumerKind::kOwnedThread : cqd::ConsumerKind::kEngineDriven;
    }
    if (flags.engine_shard) {
      options.consumers[0].kind = cqd::ConsumerKind::kRunToCompletion;
      options.consumers[0].poller = 1;
    }
    auto rt_or = cqd::Runtime::Create(options);
    if (!rt_or.ok()) {
      ControlError("Runtime::Create", rt_or.status());
      return false;
    }
    rt = std::move(rt_or).value();
    sim = cqd::SimDevice::Create();
    auto dev_or = rt->AddSimDevice(sim, &g_device_events);
    if (!dev_or.ok()) {
      ControlError("AddSimDevice", dev_or.status());
      return false;
    }
    dev = *dev_or;
    for (int i = 0; i < flags.cqs; ++i) {
      auto cq = rt->CreateCq(dev, i % 2, cqd::CqOptions{.depth = flags.depth});
      if (!cq.ok()) {
        ControlError("CreateCq", cq.status());
        return false;
      }
      cqs.push_back(*cq);
    }
    for (int i = 0; i < flags.qps; ++i) {
      auto slot = std::make_unique<QpSlot>();
      slot->recv_cq = i % flags.cqs;
      // The neighbouring CQ is on the other shard. Slots are counted in pairs, so that both
      // shards keep QPs with both CQs on them (with --engine_shard, consumer 0 takes only QPs
      // whose CQs are both on shard 1; counting single slots, --split_every=2 split them all).
      bool split = flags.split_every > 0 && (i / 2) % flags.split_every == flags.split_every - 1;
      // Consumer 0's own CQ (--engine_shard) takes no split QP, on either side.
      if (slot->recv_cq == OwnCq() || (i + 1) % flags.cqs == OwnCq()) split = false;
      slot->send_cq = split ? (i + 1) % flags.cqs : slot->recv_cq;
      std::lock_guard<std::mutex> lock(slot->mu);
      if (!NewQp(*slot, static_cast<cqd::ConsumerId>(i % kConsumers))) return false;
      slots.push_back(std::move(slot));
    }
    return true;
  }

  // Takes up to `want` completions of the budget; returns how many.
  uint64_t TakeBudget(uint64_t want) {
    uint64_t taken = budget_taken.load(std::memory_order_relaxed);
    for (;;) {
      if (taken >= flags.completions) return 0;
      uint64_t n = std::min(want, flags.completions - taken);
      if (budget_taken.compare_exchange_weak(taken, taken + n, std::memory_order_relaxed)) {
        return n;
      }
    }
  }
  void ReturnBudget(uint64_t n) { budget_taken.fetch_sub(n, std::memory_order_relaxed); }

  void Injector(int index) {
    std::mt19937_64 rng(flags.seed * 1000 + index);
    ibv_wc wcs[kMaxBurst];
    // Each injector serves the slots i with i % injectors == index.
    std::vector<QpSlot*> mine;
    for (size_t i = index; i < slots.size(); i += flags.injectors) mine.push_back(slots[i].get());
    if (mine.empty()) return;
    size_t at = 0;
    uint32_t misses = 0;
    uint64_t mine_injected = 0;
    const double my_rate = flags.rate / flags.injectors;
    while (!stop_injecting.load(std::memory_order_relaxed)) {
      if (my_rate > 0 && mine_injected >= my_rate * Since(start)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      QpSlot& slot = *mine[at];
      at = (at + 1) % mine.size();
      const uint64_t r = rng();
      int burst = 1 + static_cast<int>(r % kMaxBurst);
      const bool solicited = (r >> 8) % 1000 < static_cast<uint64_t>(flags.solicited_permille);
      const int err_draw = static_cast<int>((r >> 20) % 1000);
      uint64_t budget = TakeBudget(burst);
      if (budget == 0) break;
      burst = static_cast<int>(budget);
      int added = 0;
      {
        std::lock_guard<std::mutex> lock(slot.mu);
        if (slot.draining || slot.track == nullptr) {
          ReturnBudget(burst);
          continue;
        }
        Track& t = *slot.track;
        const int s = t.streams_used == 2 ? static_cast<int>((r >> 40) & 1) : 0;
        Stream& st = t.streams[s];
        // No more completions outstanding than the QP has work requests (the capacity guard
        // sized the CQs for that).
        const uint64_t outstanding = st.injected - st.delivered.load(std::memory_order_relaxed);
        const uint64_t room =
            outstanding >= static_cast<uint64_t>(flags.qp_wrs) ? 0 : flags.qp_wrs - outstanding;
        if (room < static_cast<uint64_t>(burst)) {
          ReturnBudget(burst - room);
          burst = static_cast<int>(room);
        }
        if (burst == 0) {
          added = -2;  // every work request of the stream is outstanding
        }
        for (int i = 0; i < burst; ++i) {
          ibv_wc& wc = wcs[i];
          wc = ibv_wc{};
          wc.wr_id = (st.injected + i) | t.tag << kTagShift | (s == 1 ? kSendStream : 0);
          wc.qp_num = t.qp_num;
          wc.opcode = s == 1 ? IBV_WC_SEND : IBV_WC_RECV;
          wc.byte_len = s == 1 ? 0 : 64;
          // Mostly one error in a burst, now and then a run of flush errors.
          wc.status = IBV_WC_SUCCESS;
          if (err_draw < flags.error_permille) {
            wc.status = i == 0 ? IBV_WC_LOC_PROT_ERR : IBV_WC_WR_FLUSH_ERR;
          }
        }
        cqd::SimCq* cq = cqs[s == 1 ? slot.send_cq : slot.recv_cq].sim();
        if (burst > 0) {
          added = cq->Inject({wcs, static_cast<size_t>(burst)}, solicited, /*overflow=*/false);
        }
        if (added > 0) st.injected += added;
      }
      if (added == -2) {  // wait for the consumer: the QP has nothing more posted
        wr_waits.fetch_add(1, std::memory_order_relaxed);
        if (++misses > 64) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
          std::this_thread::yield();
        }
        continue;
      }
      if (added < 0) {
        inject_failures.fetch_add(1);
        ReturnBudget(burst);
        break;
      }
      if (added < burst) {
        ReturnBudget(burst - added);  // the CQ is full: the rest is retried
        full_retries.fetch_add(1, std::memory_order_relaxed);
        if (++misses > 64) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
          std::this_thread::yield();
        }
      } else {
        misses = 0;
      }
      if (added > 0) {
        injected.fetch_add(added, std::memory_order_relaxed);
        mine_injected += added;
      }
    }
  }

  void Churn() {
    std::mt19937_64 rng(flags.seed * 7777);
    auto period = std::chrono::duration<double, std::milli>(flags.churn_ms);
    Clock::time_point next = Clock::now();
    while (!stop_side.load()) {
      next = std::max(next + std::chrono::duration_cast<Clock::duration>(period),
                      Clock::now());  // a teardown may have waited for a paused consumer
      std::this_thread::sleep_until(next);
      if (!RegisterWaiting()) {
        stop_injecting.store(true);
        return;
      }
      QpSlot& slot = *slots[rng() % slots.size()];
      const bool drained = rng() % 1000 < static_cast<uint64_t>(flags.teardown_permille);
      {
        std::lock_guard<std::mutex> lock(slot.mu);
        if (slot.waiting_qp != nullptr) continue;  // not registered yet: nothing to churn
      }
      bool retry = false;
      if (drained && !DrainQp(slot, &retry)) {
        if (retry) continue;  // that QP keeps running; another churn comes
        stop_injecting.store(true);
        return;
      }
      {
        std::lock_guard<std::mutex> lock(slot.mu);
        if (!drained) RetireQp(slot);
        if (!NewQp(slot, static_cast<cqd::ConsumerId>(rng() % kConsumers))) {
          stop_injecting.store(true);
          return;
        }
      }
      churns.fetch_add(1, std::memory_order_relaxed);
      CloseBooks(false);
    }
  }

  void Chaos() {
    std::mt19937_64 rng(flags.seed * 31337);
    auto period = std::chrono::duration<double, std::milli>(flags.fault_ms);
    Clock::time_point next = Clock::now();
    static const ibv_event_type kQpEvents[] = {IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED,
                                               IBV_EVENT_PATH_MIG, IBV_EVENT_QP_LAST_WQE_REACHED,
                                               IBV_EVENT_QP_REQ_ERR};
    static const ibv_event_type kPortEvents[] = {IBV_EVENT_PORT_ACTIVE, IBV_EVENT_LID_CHANGE,
                                                 IBV_EVENT_PORT_ERR, IBV_EVENT_GID_CHANGE};
    while (!stop_side.load()) {
      next += std::chrono::duration_cast<Clock::duration>(period);
      std::this_thread::sleep_until(next);
      const uint64_t r = rng();
      switch (r % 6) {
        case 0:
        case 1:  // extra events, a few at a time
          for (int i = 0; i < 1 + static_cast<int>((r >> 8) % 4); ++i) {
            sim->AddSpuriousEvent(cqs[(r >> 16) % cqs.size()].sim());
          }
          break;
        case 2: {  // EINTR/EAGAIN storm on a completion channel
          auto ch = rt->SimChannelFor(dev, static_cast<int>((r >> 8) % 2));
          if (!ch.ok()) {
            ControlError("SimChannelFor", ch.status());
            break;
          }
          sim->FailGetEvent(*ch, (r >> 12) & 1 ? EINTR : EAGAIN,
                            1 + static_cast<int>((r >> 16) % 64));
          break;
        }
        case 3:  // ... on the async fd
          sim->FailGetAsyncEvent((r >> 12) & 1 ? EINTR : EAGAIN,
                                 1 + static_cast<int>((r >> 16) % 64));
          break;
        case 4: {  // a QP async event
          QpSlot& slot = *slots[(r >> 8) % slots.size()];
          std::lock_guard<std::mutex> lock(slot.mu);
          // Between a drained teardown's end and the churn's next QP the slot holds none.
          if (slot.qp == nullptr) break;
          cqd::Status s = sim->RaiseQpEvent(slot.qp, kQpEvents[(r >> 32) % 5]);
          if (!s.ok()) ControlError("RaiseQpEvent", s);
          break;
        }
        case 5: {
          cqd::Status s = sim->RaiseDeviceEvent(kPortEvents[(r >> 8) % 4], 1);
          if (!s.ok()) ControlError("RaiseDeviceEvent", s);
          break;
        }
      }
      faults.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Drives an engine-driven consumer: one Drain per readiness report of its notify fd, and never
  // a Drain on a timeout, so that a lost wakeup shows as completions that never arrive.
  void Engine(int consumer, bool edge) {
    auto fd = rt->NotifyFd(consumer);
    if (!fd.ok()) {
      ControlError("NotifyFd", fd.status());
      return;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN | (edge ? static_cast<uint32_t>(EPOLLET) : 0u);
    ev.data.fd = *fd;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, *fd, &ev) != 0) {
      perror("soak: epoll");
      std::abort();
    }
    uint64_t pauses_done = 0;
    while (!stop_engines.load(std::memory_order_relaxed)) {
      if (consumer == kPausingConsumer && flags.pause_every > 0 &&
          !stop_injecting.load(std::memory_order_relaxed) &&
          Since(start) >= flags.pause_every * (pauses_done + 1)) {
        // Stop draining for a while: the queue fills, the pollers stall, nothing may be lost.
        ++pauses_done;
        pauses.fetch_add(1);
        paused.store(true);
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(flags.pause_ms));
        paused.store(false);
      }
      epoll_event got;
      int n = epoll_wait(ep, &got, 1, 50);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        engine_timeouts[consumer].fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      engine_wakeups[consumer].fetch_add(1, std::memory_order_relaxed);
      int r = rt->Drain(consumer, 256);
      if (r < 0) {
        fprintf(stderr, "\nsoak: Drain(%d) returned %d\n", consumer, r);
        control_errors.fetch_add(1);
        return;
      }
    }
    close(ep);
  }

  // --engine_shard: the reactor of shard 1, until stop_reactor (after Shutdown: it runs what the
  // run-to-completion consumer still holds).
  void Reactor() {
    auto fd = rt->ShardFd(1);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (!fd.ok() || ep < 0) {
      control_errors.fetch_add(1);
      return;
    }
    for (int watched : {*fd, reactor_stop_fd}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = watched;
      epoll_ctl(ep, EPOLL_CTL_ADD, watched, &ev);
    }
    while (!stop_reactor.load(std::memory_order_acquire)) {
      const int n = rt->PollShard(1, 64);
      reactor_steps.fetch_add(1, std::memory_order_relaxed);
      if (n < 0) {
        fprintf(stderr, "\nsoak: PollShard(1) returned %d\n", n);
        control_errors.fetch_add(1);
        return;
      }
      if (n > 0) continue;
      const int verdict = rt->TrySleepShard(1);
      if (verdict < 0) {
        fprintf(stderr, "\nsoak: TrySleepShard(1) returned %d\n", verdict);
        control_errors.fetch_add(1);
        return;
      }
      if (verdict != 1 && verdict != 2) continue;
      reactor_sleeps.fetch_add(1, std::memory_order_relaxed);
      epoll_event got[2];
      // 1: no timeout (a lost wakeup shows as STUCK); 2: at most a millisecond.
      (void)epoll_wait(ep, got, 2, verdict == 1 ? -1 : 1);
    }
    close(ep);
  }

  // Sums of the books of live and retired QPs (racy snapshot, for progress and waiting).
  void Count(uint64_t* delivered, uint64_t* orphans, uint64_t* injected_so_far) {
    uint64_t d = 0, o = 0, n = 0;
    for (auto& slot : slots) {
      std::lock_guard<std::mutex> lock(slot->mu);
      std::lock_guard<std::mutex> orphans_lock(g_orphans.mu);
      if (slot->track == nullptr) continue;
      for (int s = 0; s < slot->track->streams_used; ++s) {
        d += slot->track->streams[s].delivered.load();
        o += slot->track->streams[s].orphans;
        n += slot->track->streams[s].injected;
      }
    }
    {
      std::lock_guard<std::mutex> lock(retired_mu);
      std::lock_guard<std::mutex> orphans_lock(g_orphans.mu);
      for (auto& t : retired) {
        for (int s = 0; s < t->streams_used; ++s) {
          d += t->streams[s].delivered.load();
          o += t->streams[s].orphans;
          n += t->streams[s].injected;
        }
      }
      d += closed.delivered;
      o += closed.orphans;
      n += closed.injected;
    }
    *delivered = d;
    *orphans = o;
    *injected_so_far = n;
  }

  void Progress(double elapsed, uint64_t delivered, uint64_t last, double interval) {
    cqd::Stats s = rt->GetStats();
    uint64_t stalls = 0;
    for (const auto& p : s.pollers) stalls += p.backpressure_stalls;
    printf("%6.1fs inj %11" PRIu64 " dlv %11" PRIu64 " %7.3f M/s orph %8" PRIu64 " q[", elapsed,
           injected.load(), delivered, (delivered - last) / interval / 1e6, s.orphans);
    for (size_t c = 0; c < s.consumers.size(); ++c) {
      printf("%s%" PRIu64, c ? " " : "", s.consumers[c].queue_depth);
    }
    // Spill now per consumer, and the stalls (a poller's spill for the consumer full) begun.
    printf("] spill[");
    for (size_t c = 0; c < s.consumers.size(); ++c) {
      printf("%s%" PRIu64, c ? " " : "", s.consumers[c].spill_depth);
    }
    printf("] cstalls[");
    for (size_t c = 0; c < s.consumers.size(); ++c) {
      printf("%s%" PRIu64, c ? " " : "", s.consumers[c].stalls);
    }
    printf("] pstalls %9" PRIu64 " churn %6" PRIu64 " td %5" PRIu64 " faults %6" PRIu64
           " ev %8" PRIu64 "/%8" PRIu64 "%s\n",
           stalls, churns.load(), teardowns.load(), faults.load(), s.cq_acked_events, s.cq_events,
           paused.load() ? " PAUSED" : "");
    fflush(stdout);
  }
};

// Aborts the process if the teardown hangs.
void Watchdog(std::atomic<bool>* done, double seconds, const char* what) {
  Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(seconds));
  while (!done->load()) {
    if (Clock::now() > deadline) {
      fprintf(stderr, "\nsoak: HANG: %s did not finish in %.0f s\n", what, seconds);
      fflush(stderr);
      _exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Soak soak;
  if (!ParseFlags(argc, argv, soak.flags)) return 2;
  const Flags& f = soak.flags;
  g_tag_mask = (uint64_t{1} << f.tag_bits) - 1;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  char engine_text[160];
  if (f.arena) {
    snprintf(engine_text, sizeof(engine_text),
             "engine-driven 1 and 2 drained in a oneTBB arena of 2");
  } else {
    snprintf(engine_text, sizeof(engine_text), "engine LT pausing %.0f ms every %.1f s, engine ET",
             f.pause_ms, f.pause_every);
  }
  printf(
      "soak: %" PRIu64
      " completions%s%s, %d QPs on %d CQs over 2 shards%s, 3 consumers "
      "(%s, %s), %d injectors, CQ depth %d "
      "(grown to hold %d WRs per QP queue), queue capacity %" PRIu64 ", spill capacity %" PRIu64
      ", errors %d/1000, churn every %.1f ms (%d/1000 drained teardowns, deadline %s), faults "
      "every %.1f ms, split CQs every %d QP pairs, SRQ every %d QPs, incarnation tags of %d bits\n",
      f.completions,
      f.seconds > 0 ? (" or " + std::to_string(f.seconds).substr(0, 8) + " s").c_str() : "",
      f.rate > 0 ? (" at " + std::to_string(static_cast<uint64_t>(f.rate)) + "/s").c_str() : "",
      f.qps, f.cqs, f.engine_shard ? " (shard 1 engine-driven, by a reactor thread)" : "",
      f.engine_shard ? (f.cqs >= 4 ? "run to completion on shard 1, alone on its last CQ"
                                   : "run to completion on shard 1")
                     : "owned",
      engine_text, f.injectors, f.depth, f.qp_wrs, f.queue_capacity, f.spill_capacity,
      f.error_permille, f.churn_ms, f.teardown_permille,
      f.teardown_timeout_ms > 0
          ? (std::to_string(f.teardown_timeout_ms).substr(0, 6) + " ms").c_str()
          : "5 s + pause",
      f.fault_ms, f.split_every, f.srq_every, f.tag_bits);
  if (!soak.Setup()) return 1;

  soak.start = Clock::now();
  std::vector<std::thread> engines;
  ::tbb::task_arena arena(2);
  std::unique_ptr<cqd::ArenaConsumers> hosted;
  if (f.arena) {
    cqd::ArenaConsumersOptions arena_options;
    arena_options.consumers = {1, 2};
    if (f.arena_linger_us >= 0) arena_options.linger = std::chrono::microseconds(f.arena_linger_us);
    auto created = cqd::ArenaConsumers::Create(*soak.rt, arena, arena_options);
    if (!created.ok()) {
      soak.ControlError("ArenaConsumers::Create", created.status());
      return 1;
    }
    hosted = std::move(created).value();
  } else {
    engines.emplace_back([&] { soak.Engine(1, /*edge=*/false); });
    engines.emplace_back([&] { soak.Engine(2, /*edge=*/true); });
  }
  std::thread reactor;
  if (f.engine_shard) {
    soak.reactor_stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    reactor = std::thread([&] { soak.Reactor(); });
  }
  std::vector<std::thread> injectors;
  for (int i = 0; i < f.injectors; ++i) injectors.emplace_back([&, i] { soak.Injector(i); });
  std::vector<std::thread> side;
  if (f.churn_ms > 0) side.emplace_back([&] { soak.Churn(); });
  if (f.fault_ms > 0) side.emplace_back([&] { soak.Chaos(); });

  // Injection phase, with a progress line about once per second.
  uint64_t last = 0;
  Clock::time_point last_t = soak.start;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bool budget_done =
        soak.budget_taken.load() >= f.completions && soak.injected.load() >= f.completions;
    bool time_done = f.seconds > 0 && Since(soak.start) >= f.seconds;
    bool failed = soak.inject_failures.load() > 0 || soak.control_errors.load() > 0;
    if (Since(last_t) >= 1.0 || budget_done || time_done || failed) {
      uint64_t d, o, n;
      soak.Count(&d, &o, &n);
      double interval = Since(last_t);
      if (f.progress) soak.Progress(Since(soak.start), d, last, interval);
      last = d;
      last_t = Clock::now();
    }
    if (budget_done || time_done || failed) break;
  }
  soak.stop_injecting.store(true);
  for (auto& t : injectors) t.join();
  soak.stop_side.store(true);
  for (auto& t : side) t.join();
  const double inject_seconds = Since(soak.start);

  // Wait for every injected completion to be delivered or orphaned.
  bool stuck = false;
  {
    Clock::time_point wait_start = Clock::now();
    uint64_t d = 0, o = 0, n = 0;
    for (;;) {
      soak.Count(&d, &o, &n);
      if (d + o >= n) break;
      if (Since(wait_start) > f.drain_timeout) {
        stuck = true;
        cqd::Stats s = soak.rt->GetStats();
        fprintf(stderr,
                "\nsoak: STUCK: %" PRIu64 " of %" PRIu64
                " completions neither delivered nor orphaned after %.0f s; queue depths",
                n - d - o, n, f.drain_timeout);
        for (const auto& c : s.consumers)
          fprintf(stderr, " %s=%" PRIu64, c.name.c_str(), c.queue_depth);
        fprintf(stderr, "; CQ sizes");
        for (const auto& cq : soak.cqs) fprintf(stderr, " %d", cq.sim()->size());
        fprintf(stderr, "\n  spills (depth/stall ms)");
        for (const auto& c : s.consumers) {
          fprintf(stderr, " %s=%" PRIu64 "/%.0f", c.name.c_str(), c.spill_depth,
                  static_cast<double>(c.stall_ns) / 1e6);
        }
        fprintf(stderr, "; pollers (asleep, parked CQs, sleeps, stalls)");
        for (const auto& p : s.pollers) {
          fprintf(stderr, " [%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "]", p.asleep,
                  p.parked_cqs, p.sleeps, p.backpressure_stalls);
        }
        fprintf(stderr, "; CQ (shard, events/acked)");
        for (const auto& c : s.cqs) {
          fprintf(stderr, " %u:(%d, %" PRIu64 "/%" PRIu64 ")", c.id, c.shard, c.events,
                  c.acked_events);
        }
        fprintf(stderr, "\n");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const double drain_seconds = Since(soak.start);

  // Teardown, under a watchdog: unregister everything, destroy QPs and CQs, shut down.
  std::atomic<bool> teardown_done{false};
  std::thread watchdog([&] { Watchdog(&teardown_done, 60, "teardown"); });
  soak.stop_engines.store(true);
  for (auto& t : engines) t.join();
  cqd::ArenaStats arena_stats;
  if (hosted != nullptr) {
    if (cqd::Status s = hosted->Stop(); !s.ok()) soak.ControlError("ArenaConsumers::Stop", s);
    arena_stats = hosted->GetStats();
  }
  if (stuck) {
    // Take what is queued for the engine-driven consumers so the books say what was lost.
    for (int c = 1; c < kConsumers; ++c) {
      while (soak.rt->Drain(c, 1024) > 0) {
      }
    }
  }
  for (auto& slot : soak.slots) {
    std::lock_guard<std::mutex> lock(slot->mu);
    soak.RetireQp(*slot);
    if (slot->waiting_qp != nullptr) {  // never registered: nothing of it to account for
      if (cqd::Status s = soak.sim->DestroyQp(slot->waiting_qp); !s.ok()) {
        soak.ControlError("DestroyQp", s);
      }
      slot->waiting_qp = nullptr;
    }
  }
  // Anything still arriving now is an orphan; give the pollers a moment to finish.
  for (int i = 0; i < 200; ++i) {
    bool empty = true;
    for (const auto& cq : soak.cqs) empty = empty && cq.sim()->size() == 0;
    if (empty) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  soak.DestroyRetiredQps();
  for (const auto& cq : soak.cqs) {
    if (cqd::Status s = soak.rt->DestroyCq(cq); !s.ok()) soak.ControlError("DestroyCq", s);
  }
  cqd::Stats after_destroy = soak.rt->GetStats();
  if (cqd::Status s = soak.rt->Shutdown(); !s.ok()) soak.ControlError("Shutdown", s);
  if (reactor.joinable()) {
    soak.stop_reactor.store(true, std::memory_order_release);
    uint64_t one = 1;
    if (write(soak.reactor_stop_fd, &one, sizeof(one)) != sizeof(one)) perror("soak: write");
    reactor.join();
    while (soak.rt->PollShard(1, 1024) > 0) {  // what the run-to-completion consumer still holds
    }
  }
  cqd::Stats after_shutdown = soak.rt->GetStats();
  uint64_t runtime_orphans = after_shutdown.orphans;
  soak.rt.reset();  // hands anything left in engine-driven queues to the orphan handler
  teardown_done.store(true);
  watchdog.join();
  soak.CloseBooks(/*all=*/true);

  const Verdict& v = soak.closed;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const bool ack_ok = after_destroy.cq_events == after_destroy.cq_acked_events &&
                      after_shutdown.cq_events == after_shutdown.cq_acked_events;
  uint64_t stalls = 0, sleeps = 0;
  for (const auto& p : after_shutdown.pollers) {
    stalls += p.backpressure_stalls;
    sleeps += p.sleeps;
  }
  printf("\nsoak: injected %.2f s (%.3f M/s), all accounted for after %.2f s\n", inject_seconds,
         v.injected / inject_seconds / 1e6, drain_seconds);
  printf("  completions injected    %14" PRIu64 "\n", v.injected);
  printf("  delivered               %14" PRIu64 "  (%" PRIu64 " with error status)\n", v.delivered,
         v.errors);
  printf("  orphans                 %14" PRIu64 "  (runtime counted %" PRIu64 ")\n", v.orphans,
         runtime_orphans);
  printf("  lost                    %14" PRIu64 "\n", v.lost);
  printf("  duplicated              %14" PRIu64 "\n", v.duplicated);
  printf("  out of order            %14" PRIu64 "  (%" PRIu64 " backwards)\n", v.out_of_order,
         v.backwards);
  printf("  orphan range mismatches %14" PRIu64 "\n", v.orphan_mismatch);
  printf("  wrong-QP deliveries     %14" PRIu64 "\n", v.wrong_qp);
  printf("  handler calls after Unregister %7" PRIu64 "\n", v.late_calls);
  printf("  orphans of live QPs     %14" PRIu64 "\n", g_orphans.of_live_qp);
  printf("  orphans of unknown QPs  %14" PRIu64 "\n", g_orphans.unknown);
  printf("  QP incarnations         %14" PRIu64 "  (%" PRIu64 " churned)\n", v.qps,
         soak.churns.load());
  printf("  QP async events         %14" PRIu64 "  (device events %" PRIu64 ")\n", v.async_events,
         g_device_events.count.load());
  printf("  faults injected         %14" PRIu64 "  (%" PRIu64 " consumer pauses)\n",
         soak.faults.load(), soak.pauses.load());
  const uint64_t ended =
      soak.teardowns.load() + soak.teardowns_undrained.load() + soak.teardown_failures.load();
  printf("  drained teardowns       %14" PRIu64 "  (ended at the deadline %" PRIu64
         ", failed %" PRIu64 ", put off for a full CQ %" PRIu64
         ", completions not delivered by an OK one %" PRIu64 "; Wait %.2f ms mean, %.2f ms max)\n",
         soak.teardowns.load(), soak.teardowns_undrained.load(), soak.teardown_failures.load(),
         soak.teardown_retries.load(), soak.teardown_undelivered.load(),
         ended ? soak.teardown_wait_ns.load() / 1e6 / ended : 0.0,
         soak.teardown_wait_max_ns.load() / 1e6);
  printf("  registrations refused   %14" PRIu64
         "  (UNAVAILABLE: a retired QP with the number may have left completions in a held-back "
         "CQ; longest wait %.2f ms; "
         "waited for a free tag %" PRIu64 ")\n",
         soak.register_refusals.load(), soak.register_wait_max_ns.load() / 1e6,
         soak.tag_waits.load());
  printf(
      "  waits from handlers     %14" PRIu64 "  (refused %" PRIu64 ", of one over %" PRIu64
      ", wrong %" PRIu64 ")\n",
      g_handler_waits.refused.load() + g_handler_waits.over.load() + g_handler_waits.wrong.load(),
      g_handler_waits.refused.load(), g_handler_waits.over.load(), g_handler_waits.wrong.load());
  printf("  full-CQ retries         %14" PRIu64 "  (all WRs outstanding: %" PRIu64 ")\n",
         soak.full_retries.load(), soak.wr_waits.load());
  printf("  backpressure stalls     %14" PRIu64 "  (poller sleeps %" PRIu64 ")\n", stalls, sleeps);
  printf("  engine wakeups          %14" PRIu64 " / %" PRIu64 "  (epoll timeouts %" PRIu64
         " / %" PRIu64 ")\n",
         soak.engine_wakeups[1].load(), soak.engine_wakeups[2].load(),
         soak.engine_timeouts[1].load(), soak.engine_timeouts[2].load());
  if (f.arena) {
    printf("  arena drain tasks       %14" PRIu64 "  (dispatched %" PRIu64
           ", enqueue failures %" PRIu64 ", lingers %" PRIu64 " of which %" PRIu64
           " found an entry)\n",
           arena_stats.drain_tasks, arena_stats.dispatched, arena_stats.enqueue_failures,
           arena_stats.lingers, arena_stats.linger_hits);
  }
  if (f.engine_shard) {
    printf("  reactor (shard 1)       %14" PRIu64 " steps  (sleeps %" PRIu64 ")\n",
           soak.reactor_steps.load(), soak.reactor_sleeps.load());
  }
  printf("  ack balance             %14s  (after DestroyCq: events %" PRIu64 " acked %" PRIu64
         "; after Shutdown: events %" PRIu64 " acked %" PRIu64 ")\n",
         ack_ok ? "ok" : "IMBALANCED", after_destroy.cq_events, after_destroy.cq_acked_events,
         after_shutdown.cq_events, after_shutdown.cq_acked_events);
  printf("  peak RSS                %14ld KiB\n", usage.ru_maxrss);

  // Per consumer: the queue's and one poller's spill high water (bounded by their capacities
  // until Shutdown), the stalls and how long they lasted.
  bool bounds_ok = true;
  for (const auto& c : after_destroy.consumers) {
    const bool ok_c = c.high_water <= f.queue_capacity && c.spill_high_water <= f.spill_capacity;
    bounds_ok = bounds_ok && ok_c;
    printf("  consumer %-14s delivered %12" PRIu64 ", queue high water %7" PRIu64
           ", spill high water %6" PRIu64 ", stalls %7" PRIu64 " (%.1f ms stalled)%s\n",
           c.name.c_str(), c.delivered, c.high_water, c.spill_high_water, c.stalls,
           c.stalled_ns / 1e6, ok_c ? "" : "  OVER CAPACITY");
  }
  const bool ok = v.lost == 0 && v.duplicated == 0 && v.out_of_order == 0 && bounds_ok &&
                  soak.teardown_failures.load() == 0 && soak.teardown_undelivered.load() == 0 &&
                  g_handler_waits.wrong.load() == 0 && v.orphan_mismatch == 0 && v.wrong_qp == 0 &&
                  v.late_calls == 0 && g_orphans.of_live_qp == 0 && g_orphans.unknown == 0 &&
                  ack_ok && !stuck && soak.inject_failures.load() == 0 &&
                  soak.control_errors.load() == 0 && v.injected == soak.injected.load();
  printf("soak: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

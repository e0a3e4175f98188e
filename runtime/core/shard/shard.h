// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/shard.h: one shard: its CQs, polled by one driver, routed to the consumers.
//
// A shard is four stages, each an object that owns its state and says what a pass did (Poll) and
// whether the shard may sleep (TryEnterIdle: it arms what will wake the sleeper for its work,
// then looks once more, as Seastar's pollers do), in this order:
//   EventInbox       async-event parts the event thread posts, placed behind their catch-up
//   Spills           what was polled and not yet handed over, handed to the consumers
//   CqSet            the CQs, polled (Router, FusedPoll), parked while idle, armed before sleep
//   HostedConsumers  the run-to-completion consumers this shard dispatches itself
// and the retired QPs' fences (fences.h) the CQs' polls consult. Pass runs every stage once;
// ArmAndRecheck asks every stage in order, then the mailbox: the first "no" cancels the sleep.
//
// Two thin drivers run them. A runtime-owned shard has a thread (shard.cc's Run): a pass, again
// while it did work; after `idle_budget` without work it announces the sleep (the parker),
// asks the stages, and parks; it stops at Stop. An engine-driven shard (RuntimeOptions::
// engine_shards) has none: the engine's loop calls Step (one pass) and PrepareSleep, and sleeps
// on fd(), an eventfd the parker writes (shard_engine.cc says who drives when, and how one
// thread sleeps at a time).
//
// Control calls (AddCq ... SettleFences) run on the driver through the mailbox and wait for it:
// between two passes, or inline on the calling thread before Start, once a thread-run shard's
// thread has exited, or while nobody drives an engine-driven shard (it takes the driver). A
// run-to-completion handler of this shard (or a wait of its, serving the mailbox) runs its
// control call inline, in the middle of a pass: the fused poll in progress is settled first
// (FusedPoll::Settle), and a CQ removed meanwhile leaves the pass through CqSet's deferral.
//
// Threading: Start, Stop and the control calls from control threads (one at a time: the
// runtime's mutex); Step and PrepareSleep from the engine; PostEvent from any thread (the event
// thread, the teardown worker, a CM hand-on: EventInbox::Post); CqEvents, UnparkAll and
// NotificationsBroken from the event thread; stats and AddSpillStats from any thread. Debug and
// chaos builds assert that a pass and each control part run on the driver (OnDriver).
#ifndef CQD_RUNTIME_CORE_SHARD_SHARD_H_
#define CQD_RUNTIME_CORE_SHARD_SHARD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/options.h"
#include "cqd/stats.h"
#include "runtime/base/mailbox.h"
#include "runtime/base/parker.h"
#include "runtime/core/fences.h"
#include "runtime/core/shard/cq_set.h"
#include "runtime/core/shard/event_inbox.h"
#include "runtime/core/shard/fused_poll.h"
#include "runtime/core/shard/hosted.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

class Shard {
 public:
  Shard(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
        const SlotPool& slots, OrphanSink& orphans);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Starts the thread (engine-driven: opens the mailbox); fails only if an eventfd was not made.
  Status Start();
  // Stops polling and hands everything held (spills, posted events) to the consumers; joins
  // (engine-driven: waits only for a Step in progress). Later events go straight to consumers.
  void Stop();

  // Engine-driven shards, on the engine's thread (Runtime::PollShard, TrySleepShard).
  bool engine_driven() const { return engine_driven_; }
  // One pass: returns the work done, 0 if another thread drives the shard, -EBUSY if this one
  // does (a handler or OrphanHandler inside this shard's Step).
  int Step(int budget) noexcept;
  // Returns 1 if the engine may sleep until fd() is readable, 2 if for at most kRecheckUnarmed
  // (a failed arm or channel), 0 if it must poll again (or another thread sleeps on the shard:
  // it was woken), -EBUSY as Step.
  int PrepareSleep() noexcept;
  int fd() const { return engine_.wake_fd; }
  // ThreadToken() of the thread that last called Step (relaxed): Teardown::Wait refuses it.
  const std::atomic<uintptr_t>& last_driver() const { return engine_.last_driver; }

  // Control calls (each runs on the driver and waits for it; shard_control.cc).
  void AddCq(CqRecord* cq);
  uint64_t RemoveCq(CqRecord* cq);            // CqSet::Remove
  void ReturnCq(CqRecord* cq) { AddCq(cq); }  // after RemoveCq (its destroy failed)
  Status ResizeCq(CqRecord* cq, int depth);
  // A registration on `consumer` starts or stops using `cq` (a CQ of this shard).
  void AddUse(CqRecord* cq, uint32_t consumer);
  void DropUse(CqRecord* cq, uint32_t consumer);
  // Takes dead registrations' entries out of `consumer`'s spill (completions to the orphan sink,
  // event parts released), then catches up the fences of a plain Unregister.
  void PurgeDead(uint32_t consumer);
  // `qp_num` is being retired: each of `sides` (on a CQ of this shard) gets a fence (fences.h)
  // holding `commit`, awaiting the side's marker if `ending` (the teardown that ended; null: a
  // plain Unregister, whose fences catch up at the next PurgeDead) posted it and no pass took it.
  struct RetiredSide {
    CqRecord* cq;
    uint32_t marker_bit;  // TeardownState::k*Marker of this side
    uint64_t marker;      // its wr_id
    bool unfenced;        // no marker can stand behind this side (fences.h)
    uint64_t commit;
    const void* qp;  // the retired QP's native object
  };
  void FenceRetired(const TeardownState* ending, uint32_t qp_num, const RetiredSide* sides, int n);
  // RegisterQp of `qp_num` on `cq` (`in_error_qp`: the QP if in the error state): catches up its
  // fences there (one more if `retired_here`: retired_numbers.h). Returns true once none stands
  // or the CQ failed; false while one stands (a consumer is full, or a marker is awaited).
  bool FenceForReuse(CqRecord* cq, uint32_t qp_num, const void* in_error_qp, bool retired_here);
  void DropFences(CqRecord* cq);    // the CQ is gone for good: its fences end
  void SettleFences(CqRecord* cq);  // polls a catch-up as far as room allows (capacity guard)

  // Any thread (EventInbox::Post).
  bool PostEvent(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b) {
    return inbox_.Post(consumer, item, cq_a, cq_b);
  }
  // Event thread: CQs of this shard got their events (`armed` cleared), a device failed (parked
  // CQs come back: no event will), or the shard's channel failed (no unbounded sleep again).
  void CqEvents() noexcept {
    cqs_.NoteCqEvents();
    parker_.Wake();
  }
  void UnparkAll() noexcept {
    cqs_.UnparkAll();
    parker_.Wake();
  }
  void NotificationsBroken() noexcept {
    cqs_.NotificationsBroken();
    parker_.Wake();
  }

  PollerStats stats() const;
  void AddSpillStats(uint32_t consumer, ConsumerStats& out) const {
    spills_.AddStats(consumer, out);
  }
  int index() const { return index_; }
  // The thread, for placement (placement.h); 0 when there is none.
  pthread_t native_thread() { return thread_.joinable() ? thread_.native_handle() : 0; }

 private:
  // The engine driver's (shard_engine.cc); all but the atomics belong to whoever holds `driver`.
  struct EngineDrive {
    alignas(64) std::atomic<uintptr_t> driver{0};  // ThreadToken of the driver; 0: none
    std::atomic<uintptr_t> last_driver{0};
    int wake_fd = -1;             // the eventfd the engine sleeps on
    bool sleep_prepared = false;  // PrepareSleep said 1 (or 2) and no Step came since
    bool wake_owed = false;       // a Wake won the race, its write is unread
    bool bounded_sleep = false;   // the prepared sleep must be bounded
    uintptr_t sleeper = 0;        // ThreadToken of the thread that may sleep
  };
  void Run();  // the thread
  void TrySleep() noexcept;
  int Pass(int budget) noexcept;
  bool ArmAndRecheck() noexcept;
  void ExitIdle() noexcept;
  // Runs `fn` on the driver and waits for it (checked in debug builds); RunOnDriver unchecked.
  void RunSync(const std::function<void()>& fn);
  void RunOnDriver(const std::function<void()>& fn);
  static void ServeMailbox(void* self);  // the wait duty of this shard's hosted handlers
  bool OnDriver() const noexcept;
  bool Stopping() const noexcept {
    return stop_.load(std::memory_order_relaxed) || stopped_.load(std::memory_order_relaxed);
  }
  // The engine driver (shard_engine.cc).
  bool TryDrive() noexcept;
  void GiveBackDriver() noexcept;
  void ServeIfFree() noexcept;
  void ServeAndGiveBack() noexcept;
  void EndSleep() noexcept;
  bool KickOtherSleeper() noexcept;

  static constexpr std::chrono::microseconds kRecheckUnarmed{1000};  // a bounded sleep's length
  static constexpr size_t kFencesReserved = 64;  // a plain Unregister's fences end in its call

  const int index_;
  const RuntimeOptions& options_;
  const SlotPool& slots_;
  const bool engine_driven_;
  FenceList fences_;  // the driver's; few
  ShardCounters counters_;
  Spills spills_;
  Router router_;
  std::unique_ptr<FusedPoll> fused_;  // only with hosted consumers
  CqSet cqs_;
  Parker parker_;
  EventInbox inbox_;
  HostedConsumers hosted_;
  Mailbox mailbox_;
  std::thread thread_;
  std::atomic<uintptr_t> thread_token_{0};  // ThreadToken() of thread_ while Run runs (OnDriver)
  std::atomic<bool> started_{false};        // Start ran (OnDriver)
  std::atomic<bool> stop_{false};           // Stop asked the thread to stop
  std::atomic<bool> stopped_{false};        // engine-driven: Stop ran (lanes handed over for good)
  EngineDrive engine_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_SHARD_H_

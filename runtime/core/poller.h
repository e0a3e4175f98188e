// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/poller.h: one poller thread, owning one CQ shard.
//
// Implemented in three files: poller.cc (the thread or the engine's drive of it, the pass, the
// sleep and parking), poller_route.cc (the pass's data path: poll, route, hand over, place
// events) and poller_control.cc (the control calls, run between two passes).
//
// The poller batch-polls its CQs round robin (at most poll_batch per CQ per pass, so one busy CQ
// cannot starve the others) and routes each completion by qp_num through its device's QpTable to
// the destination consumer's lane (lane.h). What becomes of each completion (a consumer, the
// orphan sink, a fence) is route.h's decision; the poller gathers its facts and carries it out.
// A CQ whose
// registered QPs all go to one consumer (`CqRecord::uses` has one entry) is polled straight into
// that consumer's lane, and routing writes only the metadata beside each completion; other CQs
// are polled into a scratch array and each completion is copied once into its lane. After each
// poll the lanes' spills are handed to their consumers by publishing each lane's new end, while
// the consumers have room. Async events reach it from the event thread
// (PostEvent) and join the same spills. Before it places an event, the poller catches up on the
// QP's CQs of its shard: it polls them until they are empty or it has taken a CQ depth's worth
// since the event arrived, so the event follows every completion that was in those CQs when the
// event was read.
//
// Fences (fences.h): what a retired QP may still have in this shard's CQs (a plain Unregister, or
// a teardown that ended before its markers were polled: deadline, device failure, Shutdown).
// Each fence holds its side's commitment on the CQ until its marker is polled or a catch-up of
// the CQ is over; routing takes the awaited markers (only while the CQ awaits one: one branch)
// and sends the rest of the retired QP's completions to the orphan sink, since nothing is
// registered for them. A new QP with the number is registered on a CQ only after
// FenceForReuse ended every fence of that number there, and, for a number retired there, a
// catch-up of its own (retired_numbers.h).
//
// Slow consumers: a consumer whose queue is full leaves its items in this poller's spill. Each
// CQ knows which consumers its registered QPs use (`CqRecord::uses`); a CQ is polled for at most
// as many completions as the fullest of those spills has room for, and skipped while one is
// full. CQs that a stalled consumer does not share are polled as usual. Unregistering a QP
// purges its items from the spills (completions to the orphan sink), so a consumer whose QPs
// are all gone stops holding anything back.
//
// Parking: a CQ found empty for `cq_park_after` while the poller stays busy is armed (S7), polled
// once more (S6), and moved out of the passes to `parked_` if that found nothing. The event
// thread clears the CQ's `armed` and calls CqEvents(), which bumps `cq_events_` (after the
// clear, both seq_cst); a pass that sees the count move puts every parked CQ whose `armed` is
// clear back. A completion on a parked CQ therefore always raises an event that unparks it.
// A failed arm keeps the CQ in the passes; a failed channel (NotificationsBroken) or device
// (UnparkAll) brings every parked CQ back and stops parking.
//
// The pass is five stages (poller.cc's kStages, in order): events placed, spills handed over,
// parked CQs brought back, CQs polled, run-to-completion consumers dispatched. Each stage says
// whether it did work (`poll`) and, before a sleep, whether it may sleep (`may_idle`: it arms
// what will wake the sleeper for its work, then looks once more), as Seastar's pollers do. Both
// drivers (the thread's Run, the engine's Step and PrepareSleep) run the same table.
//
// Idle: after `idle_budget` without work it announces the sleep (the parker), then asks every
// stage. The CQ stage arms every CQ not already armed (S7) and polls once more (S6); the event
// thread clears `armed` and calls CqEvents() for each event; Parker orders the sleep against the
// wake. A spill that holds entries (or an event held back) for a full consumer does not keep it
// awake: its stage sets the lane's wants_room and looks once more for room, and the consumer's
// next batch that frees room wakes it (consumer.h), so a stuck consumer costs its poller nothing.
// The sleep is bounded only while an arm failed or the shard's channel failed (kRecheckUnarmed:
// no event may come), so a missing notification costs latency, never a hang.
//
// Run-to-completion consumers of this shard (ConsumerKind::kRunToCompletion) are dispatched by
// this thread once per pass, after polling, with the wait duty of thread_role.h set: their
// handlers may make control calls, and the calls that would wait for this poller run inline.
// While such a consumer's queue is empty its handlers read their completions where the poll put
// them, in the spill of its lane; the entries leave the spill before the first handler runs, so
// a control call's purge (Unregister) cannot move them under it.
// Producers wake this poller instead of such a consumer, and the sleep re-checks their queues.
// When the thread stops it dispatches what they still hold and closes them.
//
// Engine-driven shards (RuntimeOptions::engine_shards) have no thread: the engine's loop calls
// Step (one pass) and PrepareSleep (the arm-then-poll-once-more protocol), and sleeps on `fd()`,
// an eventfd the Parker writes instead of a futex. The poller's state then belongs to whichever
// thread holds `driver_` (a compare-and-swap from 0 to its ThreadToken, seq_cst): the engine
// inside Step or PrepareSleep, or a control thread. A control call posts its part to the mailbox
// and then tries to take the driver itself and run it (ServeIfFree); if the engine holds it, the
// engine runs it before it lets go: GiveBackDriver stores 0 and then checks the mailbox (both
// seq_cst), so either the control thread's CAS sees the driver free or the engine sees the post. A
// handler of the shard waiting for the runtime serves the mailbox as on a thread (the wait duty).
// So no control call waits for the engine to come back, only for a Step in progress. Every control
// part run this way, and Stop, writes the fd if the engine prepared to sleep: a CQ added
// meanwhile is armed by the next PrepareSleep. Where the thread would sleep only briefly (a
// failed arm, broken notifications) PrepareSleep says so (2). One thread sleeps at a
// time: a Step or PrepareSleep of another thread meanwhile wakes it and returns 0, so that it
// never cancels or reads what the sleeper relies on.
// After Stop the engine's Steps dispatch what the hosted consumers still hold and close them.
//
// Threading: the CQ list, the spills and CqRecord::uses belong to the poller thread (the
// driver, on an engine-driven shard). Other threads change them only through the control calls
// below, which run on the poller thread between two passes (or inline once it has stopped, or
// while nobody drives an engine-driven shard) and wait for it. PostEvent and Wake may be called
// from any thread.
#ifndef CQD_RUNTIME_CORE_POLLER_H_
#define CQD_RUNTIME_CORE_POLLER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/options.h"
#include "cqd/stats.h"
#include "runtime/base/chaos.h"
#include "runtime/base/check.h"
#include "runtime/base/mailbox.h"
#include "runtime/base/mutex.h"
#include "runtime/base/parker.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"
#include "runtime/core/fences.h"
#include "runtime/core/lane.h"
#include "runtime/core/orphans.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"
#include "runtime/core/route.h"
#include "runtime/core/teardown.h"
#include "runtime/observe/latency.h"

namespace cqd::internal {

class Poller {
 public:
  Poller(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
         const SlotPool& slots, OrphanSink& orphans);
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // Starts the thread (engine-driven: opens the mailbox). Fails only for an engine-driven shard
  // whose eventfd could not be made.
  Status Start();
  // Stops polling, hands everything it holds (spills, posted events) to the consumers, and
  // joins. Events posted afterwards go straight to their consumer. Engine-driven: waits only for
  // a Step in progress.
  void Stop();

  // Engine-driven shards only, on the engine's thread (Runtime::PollShard, TrySleepShard).
  bool engine_driven() const { return engine_driven_; }
  // One pass: returns the work done, 0 if another thread drives the shard, -EBUSY if this one
  // does (a handler or OrphanHandler inside this shard's Step).
  int Step(int budget) noexcept;
  // Returns 1 if the engine may sleep until fd() is readable, 2 if for at most kRecheckUnarmed
  // (nothing may make fd() readable: a failed arm or channel), 0 if it must poll
  // again (or another thread sleeps on the shard: it was woken), -EBUSY as Step.
  int PrepareSleep() noexcept;
  int fd() const { return wake_fd_; }
  // ThreadToken() of the thread that last called Step (relaxed): Teardown::Wait refuses it.
  const std::atomic<uintptr_t>& last_driver() const { return last_driver_; }

  // Control path (each waits for the poller thread).
  void AddCq(CqRecord* cq);
  // Stops polling `cq` and polls it empty: what it still holds goes to the orphan sink (no live
  // registration uses it). Returns the number of completions taken.
  uint64_t RemoveCq(CqRecord* cq);
  // Puts `cq` back after RemoveCq (its destroy failed).
  void ReturnCq(CqRecord* cq);
  // Resizes `cq` (a CQ of this shard) while it is not being polled.
  Status ResizeCq(CqRecord* cq, int depth);
  // A registration on `consumer` starts or stops using `cq` (a CQ of this shard).
  void AddUse(CqRecord* cq, uint32_t consumer);
  void DropUse(CqRecord* cq, uint32_t consumer);
  // Moves the items of dead registrations out of `consumer`'s spill: completions to the orphan
  // sink, event parts released.
  void PurgeDead(uint32_t consumer);
  // A registration of `qp_num` is being retired (a teardown's before its state dies, so that no
  // pass takes a marker for nobody's; a plain Unregister's after): each of `sides`, a side
  // of it on a CQ of this shard, gets a fence (fences.h) holding `commit` of that CQ. It awaits
  // the side's marker if `ending` (the teardown that ended; null for a plain Unregister) posted it
  // (`marker_bit` in ending->markers) and no pass has polled it yet. A plain Unregister's fences
  // catch up (the next PurgeDead polls their CQs).
  struct RetiredSide {
    CqRecord* cq;
    uint32_t marker_bit;  // TeardownState::k*Marker of this side
    uint64_t marker;      // its wr_id
    bool unfenced;        // no marker can stand behind this side (fences.h)
    uint64_t commit;
    const void* qp;  // the retired QP's native object
  };
  void FenceRetired(const TeardownState* ending, uint32_t qp_num, const RetiredSide* sides, int n);
  // RegisterQp of a QP with `qp_num` on `cq`: starts a catch-up for every fence of that number
  // there (and, if `retired_here`, adds one: the number's registration ended on this CQ, and the
  // old QP may have completed more since its fences ended) and polls the CQ as far as its
  // consumers' room allows. `in_error_qp`: the QP, if it is in the error state (else null): a
  // fence of that very QP that awaits a marker ends only by it (fences.h). Returns true once no
  // fence of that number stands there, or the CQ is in error (never polled again, so nothing of
  // the old QP comes out of it): the registration may go on; false while a fence stands (a
  // consumer the CQ serves is full, or an awaited marker has not come back).
  bool FenceForReuse(CqRecord* cq, uint32_t qp_num, const void* in_error_qp, bool retired_here);
  // DestroyCq, once the CQ is gone for good (destroyed, or released to the engine): ends its
  // fences. (RemoveCq keeps them: a destroy that fails puts the CQ back with its fences.)
  void DropFences(CqRecord* cq);
  // Polls `cq` as far as room allows while a catch-up runs there, so that fences over by now give
  // their commitment back (the capacity guard asks before it grows or refuses).
  void SettleFences(CqRecord* cq);

  // Event thread: queues an async-event part (`item`, kind kEventPart) for `consumer` behind
  // every completion now in the QP's CQs of this shard (`cq_a`, `cq_b`: CQ ids, 0 for none).
  // Returns false only after the poller stopped, when `consumer` has closed too (an owned
  // consumer past Shutdown): the caller still owns the part.
  bool PostEvent(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b);
  // Event thread: CQs of this shard got their events (their `armed` already cleared).
  void CqEvents() noexcept {
    cq_events_.fetch_add(1, std::memory_order_seq_cst);
    parker_.Wake();
  }
  // Event thread: a device failed; parked CQs go back into the passes (no event will come).
  void UnparkAll() noexcept {
    unpark_all_.store(true, std::memory_order_seq_cst);
    CqEvents();
  }
  // Event thread: the shard's completion channel failed; never sleep unbounded again.
  void NotificationsBroken() noexcept;

  PollerStats stats() const;
  // Adds this poller's spill figures for `consumer` to `out`.
  void AddSpillStats(uint32_t consumer, ConsumerStats& out) const;
  int index() const { return index_; }
  // The thread, for placement (placement.h); 0 when there is none.
  pthread_t native_thread() { return thread_.joinable() ? thread_.native_handle() : 0; }

 private:
  struct PostedEvent {
    uint32_t consumer;
    Item item;
    uint32_t cq_ids[2];           // the QP's CQs on this shard (0: none)
    uint64_t polled[2] = {0, 0};  // completions taken off each since the event arrived
    uint32_t caught_up = 0;       // bit k: cq_ids[k] needs no more polling
  };
  void Run();
  // Runs `fn` where the shard's state may be touched (its driver) and waits for it.
  void RunSync(const std::function<void()>& fn);
  void RunOnDriver(const std::function<void()>& fn);  // RunSync without the affinity check
  // Whether the calling thread may touch the shard's state now (debug and chaos builds assert it
  // where a pass or a control part starts): the poller thread while it runs, or on an
  // engine-driven shard the thread holding the driver; any thread before Start (control calls
  // then run inline, one at a time) and, on a thread-run shard, once its thread has exited.
  bool OnDriver() const noexcept {
    const uintptr_t me = ThreadToken();
    if (engine_driven_) {
      return !started_.load(std::memory_order_relaxed) ||
             driver_.load(std::memory_order_relaxed) == me;
    }
    const uintptr_t running = thread_token_.load(std::memory_order_relaxed);
    return running == 0 || running == me;
  }
  // Hands everything polled and posted to the consumers (Stop); closes the inbox.
  void HandOverAll();
  // Engine-driven: takes or gives back the driver (see the header comment).
  bool TryDrive() noexcept {
    ChaosPoint();
    uintptr_t none = 0;
    return driver_.compare_exchange_strong(none, ThreadToken(), std::memory_order_seq_cst);
  }
  void GiveBackDriver() noexcept;
  // Any thread: runs what was posted to the mailbox if nobody drives the shard.
  void ServeIfFree() noexcept;
  // The driver: runs what was posted and gives the driver back, again while more is posted and
  // the driver is free.
  void ServeAndGiveBack() noexcept;
  // The driver: a sleep PrepareSleep allowed is over; reads the fd if a write is owed.
  void EndSleep() noexcept;
  // The driver: if another thread sleeps on the shard, wakes it, gives the driver back and
  // returns true (the caller returns 0: the shard is the sleeper's until it comes back).
  bool KickOtherSleeper() noexcept;
  // The driver: Step after Stop; returns the entries dispatched.
  int StepStopped() noexcept;
  // Arms every CQ in the passes not armed yet (S7); sets arm_failed_.
  void ArmAll() noexcept;
  // Polls every CQ in the passes once, for up to `budget` completions in all, parking those
  // idle long enough; returns the number of completions taken. A pass the budget cut short
  // starts the next one at the first CQ it left out.
  // With `may_fuse` (a pass's CQ stage only) a poll may run its handlers (PollFused); the sleep's
  // re-check polls without it, so that no handler runs inside a sleep (TrySleepShard's contract).
  int PollAll(int budget = INT32_MAX, bool may_fuse = false) noexcept;
  // Arms `cq` if it is not, polls it once more, and returns true if it may be parked.
  bool TryPark(CqRecord* cq) noexcept;
  // Puts parked CQs whose event came (or all, after UnparkAll) back into the passes.
  void Unpark() noexcept;
  bool UnparkPending() const noexcept {
    return cq_events_.load(std::memory_order_seq_cst) != seen_cq_events_;
  }
  // The CQ with id `id` in the passes or parked, or null.
  CqRecord* FindCq(uint32_t id) noexcept;
  // Polls `cq` for up to `room` completions, routes and flushes them; returns how many (fewer
  // than `room`: the CQ was found empty, or failed after some), or a negative errno once the CQ
  // has failed.
  int PollOne(CqRecord* cq, int room, bool may_fuse = false) noexcept;
  // One Poll of `cq` into `into` for up to `want`, counted in the stats (an empty one only when
  // `first`, the first of its PollOne) and stamped for latency; marks the CQ failed (S11) when
  // the poll does. Returns what Poll returned.
  int PollCounted(CqRecord* cq, int want, ibv_wc* into, bool first) noexcept {
    const int n = cq->cq->Poll(want, into);
    Count(polls_, 1);
    if (n == 0) {
      if (first) Count(empty_polls_, 1);
    } else if (n < 0) {  // CQ in error (overflow, device failure): only destroy works now
      cq->poll_failed = true;
      Count(cq->poll_errors, 1);
    } else {
      Count(cq->completions, static_cast<uint64_t>(n));
      Count(completions_, static_cast<uint64_t>(n));
      if (stamp_) poll_stamp_ = NowNs32();
    }
    return n;
  }
  // Whether a poll of up to `room` completions of `cq`, whose QPs all go to `consumer`, may run
  // their handlers as it routes them (PollFused): `consumer` is run to completion on this thread
  // with nothing handed over or spilled (what waits there is older), records no latency, and
  // takes batches of `room` (ConsumerOptions::dispatch_batch); `cq` awaits no fence.
  bool MayFuse(const CqRecord& cq, uint32_t consumer, int room) const noexcept;
  // The fused pass: polls `cq` for up to `room` completions and calls each run's handler as soon
  // as it is routed, with the checks RouteInLane makes; what they do not clear (a draining QP, a
  // QP of another consumer) and what follows it is routed into the lanes as usual. Returns as
  // PollOne. Should a handler make a control call that reaches this poller, SettleFused runs
  // first and the poll ends when that handler returns; `cq` is not touched after it.
  int PollFused(CqRecord* cq, uint32_t consumer, int room) noexcept;
  // Before a control call changes this poller's state from a callback it runs (RunSync inline,
  // or its mailbox served while a handler waits): inside a fused poll, routes what the poll still
  // holds into the lanes, against the state the poll saw, as the unfused pass would have before
  // any handler ran; inside PollAll (a fused handler, or a CmHandler the end of a fused batch
  // runs), leaves the CQ list whole (the CQs not polled yet first) and cuts the pass there.
  // Nothing otherwise.
  void SettleFused() noexcept;
  // Where a polled completion goes: a consumer's index, the orphan sink, or nowhere (kTaken: a
  // retired QP's marker, taken by its fence).
  static constexpr uint32_t kOrphan = ~uint32_t{0};
  static constexpr uint32_t kTaken = ~uint32_t{0} - 1;
  static constexpr uint32_t kNoConsumer = ~uint32_t{0} - 2;
  static constexpr uint32_t kNoQp = ~uint32_t{0};  // qp_num has 24 bits
  // The route of the last QP classified in one poll, reused for its next completions there.
  struct RouteCache {
    uint32_t qp_num = kNoQp;
    uint32_t consumer = kNoConsumer;
    EntryMeta meta{};
  };
  // The poll's facts about `slot`, found for `qp_num` on `cq`'s device, whose state the caller
  // read (acquire, or seq_cst where a handler may be called on it) as `state` before this reads
  // the slot's other fields.
  static void ReadSlotFacts(const CqRecord* cq, uint32_t qp_num, const Slot& slot, uint64_t state,
                            RouteFacts& facts) noexcept {
    facts.known = slot.Holds(cq->device->id, qp_num);
    facts.live = StateLive(state);
    facts.uses_cq = slot.Uses(cq->id);
    facts.draining = StateDraining(state);
  }
  // Looks up the slots of wcs[0, n) into batch_slots_, prefetching them.
  void LookUpBatch(CqRecord* cq, const ibv_wc* wcs, int n) noexcept;
  // Returns where `wc` (polled from `cq`, `slot` its lookup) goes, as Route (route.h) decides:
  // a consumer's index (and sets `meta`), kOrphan or kTaken.
  uint32_t Classify(CqRecord* cq, const ibv_wc& wc, const Slot* slot, RouteCache& cache,
                    EntryMeta& meta) noexcept;
  // Polls the event's CQs until it may be placed; false while a full spill holds it back.
  bool CatchUp(PostedEvent& posted) noexcept;
  // Polls `cq` while a fence's catch-up runs there and its consumers have room (not after Stop).
  void CatchUpFences(CqRecord* cq) noexcept;
  // Returns how many completions `cq` may be polled for now (0: skip it).
  int RoomFor(const CqRecord& cq) noexcept;
  // Routes the `n` completions just polled into `consumer`'s lane at its tail, in place.
  void RouteInLane(CqRecord* cq, uint32_t consumer, int n) noexcept;
  // Routes wcs[0, n), copying each into its lane.
  void RouteCompletions(CqRecord* cq, const ibv_wc* wcs, int n) noexcept;
  void AppendCompletion(uint32_t consumer, const EntryMeta& meta, const ibv_wc& wc) noexcept;
  // Requires room in the lane.
  void AppendEvent(uint32_t consumer, const Item& item) noexcept;
  void ListLane(uint32_t consumer) noexcept;
  // Hands the lanes' spills to their consumers' queues; returns true if anything moved. With
  // `force`, everything moves regardless of capacity.
  bool Flush(bool force) noexcept;
  bool FlushOne(uint32_t consumer, bool force) noexcept;
  // Returns true if the spills may be held for another poll (PollCqs): some lane of a queued
  // consumer has a spill, and every such spill can take another poll and stays within
  // kHeldBatches consumer batches.
  bool MayHoldSpills() noexcept;
  // Names in `item` this poller's lane of `consumer` and how far it has handed over: the item
  // goes behind that (lane.h, Item).
  void PlaceBehindLane(uint32_t consumer, Item& item) const noexcept;
  // Reserves and queues `item` for `consumer` on its own, behind what this poller's lane of it
  // has handed over so far.
  void PushAlone(uint32_t consumer, Item& item) noexcept;
  void NoteSpill(uint32_t consumer) noexcept;
  // Moves posted events into lanes that have room; returns true if any moved.
  bool PlaceEvents();
  // Dispatches the run-to-completion consumers this poller hosts; returns how many entries.
  int RunHosted() noexcept;
  // One batch of hosted `consumer`: from its queue if anything is queued, else in place from
  // the spill of this poller's lane. Returns how many entries it dispatched.
  int DispatchHosted(Consumer& consumer) noexcept;
  bool HostedPending() const noexcept;
  static void ServeMailbox(void* self);  // the wait duty of RunHosted's handlers
  void TrySleep() noexcept;
  // A stage of the pass (Seastar's pollers). `poll` does the stage's work (the CQ stage takes up
  // to `budget` completions) and returns how much it did, 0 for none. `may_idle` is the stage's
  // half of the sleep protocol, asked after the sleep was announced (the parker prepared): it
  // arms whatever will wake the sleeper when this stage has work (a CQ's notification, a full
  // consumer's wants_room), looks once more, and returns false if there is work after all. The
  // stages are asked in order and the first false cancels the sleep.
  struct Stage {
    const char* name;
    int (Poller::*poll)(int budget) noexcept;
    bool (Poller::*may_idle)() noexcept;
  };
  static constexpr int kStageCount = 5;
  static const Stage kStages[kStageCount];
  // Placed events (each behind its catch-up); the lanes of events held back ask for room.
  int PollEvents(int budget) noexcept;
  bool EventsMayIdle() noexcept;
  // Spills handed to their consumers; the lanes of spills held back ask for room.
  int PollSpills(int budget) noexcept;
  bool SpillsMayIdle() noexcept;
  // Parked CQs whose event came back into the passes (no work counted).
  int PollParked(int budget) noexcept;
  bool ParkedMayIdle() noexcept;
  // The CQs in the passes polled; armed (S7) and polled once more (S6) before a sleep. On a
  // runtime-owned poller, while every CQ it polls comes back full, what it routed stays in the
  // spills for up to kMaxHeldPasses passes, until a spill holds nearly kHeldBatches consumer
  // batches: a hand-over moves the same lines between the cores whatever it carries, and the
  // consumer's later batches of one hand-over find them still in its cache. A poll that comes
  // back short of full (the CQ is drained: no more to wait for), a spill that could not take
  // another poll, a sleep, Stop and an engine-driven step hand everything over at once.
  int PollCqs(int budget) noexcept;
  bool CqsMayIdle() noexcept;
  // The run-to-completion consumers dispatched.
  int PollHosted(int budget) noexcept;
  bool HostedMayIdle() noexcept;
  // One pass of the shard, the same for both drivers (Run's loop, the engine's Step): every
  // stage's poll, in order. Returns the work done (0: idle). The mailbox runs before it, in each
  // driver.
  int Pass(int budget) noexcept;
  // The sleep protocol's second half, the same for both drivers (TrySleep, PrepareSleep): every
  // stage's may_idle, then the mailbox. Returns true if there is work after all: the sleep must
  // not happen.
  bool ArmAndRecheck() noexcept;
  // True when no event may wake the sleep (an arm or the channel failed): it must be bounded.
  bool SleepMustBeBounded() const noexcept;
  void Count(std::atomic<uint64_t>& counter, uint64_t n) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  // How long a bounded sleep lasts (see the header comment).
  static constexpr std::chrono::microseconds kRecheckUnarmed{1000};
  // Fences (two per retired QP whose leftovers are still being polled) held before FenceList
  // allocates: a plain Unregister's usually end within the control call that made them.
  static constexpr size_t kFencesReserved = 64;
  // Empty polls in a row after which a CQ's idle time starts to be measured for parking.
  static constexpr uint32_t kParkProbe = 16;
  // The most passes PollCqs holds the spills for, and the consumer batches (dispatch_batch) a
  // held spill may reach. Four: in the VM's slow cross-core mode they took the handoff at batch
  // 32 from about the mutex pipeline's rate to 1.4x it; eight gained at most a few percent more
  // in the fast mode (docs/PERFORMANCE.md, "Small poll batches").
  static constexpr uint32_t kMaxHeldPasses = 16;
  static constexpr uint32_t kHeldBatches = 4;

  const int index_;
  const RuntimeOptions& options_;
  std::vector<Consumer*> consumers_;
  std::vector<Consumer*> hosted_;  // kRunToCompletion consumers this thread dispatches
  const SlotPool& slots_;
  OrphanSink& orphans_;
  FenceList fences_;               // poller thread only; few
  std::vector<CqRecord*> cqs_;     // in the passes, round robin
  std::vector<CqRecord*> parked_;  // armed, out of the passes until their event
  const bool may_park_;            // parking is on (cq_park_after > 0, not busy_poll)
  uint32_t seen_cq_events_ = 0;    // cq_events_ when parked_ was last checked
  std::vector<moodycamel::ProducerToken> tokens_;  // one per consumer
  std::vector<Lane*> lanes_;                       // one per consumer: this poller's lane
  std::vector<uint32_t> listed_;                   // consumers whose spill is not empty
  std::unique_ptr<ibv_wc[]> wcs_;                  // scratch: polls of CQs shared by consumers
  std::unique_ptr<const Slot*[]> batch_slots_;     // LookUpBatch's result for the poll routed
  std::vector<PostedEvent> deferred_;              // posted events not yet placed in a lane
  std::vector<bool> held_;                         // PlaceEvents: consumers with an event held back
  bool arm_failed_ = false;                        // the last TrySleep could not arm every CQ
  // PollCqs' hold: while `holding_`, PollOne leaves handing over to the stage's end, unless a
  // poll came back short (`polls_full_` false) or the spills could not take another poll.
  // `held_passes_` counts the passes since the spills were last handed over (Flush clears it).
  bool holding_ = false;
  bool polls_full_ = false;
  uint32_t held_passes_ = 0;
  // Some consumer records latency: PollOne reads the clock into poll_stamp_, which routing
  // writes into each completion's EntryMeta (latency.h).
  const bool stamp_;
  uint32_t poll_stamp_ = 0;

  std::thread thread_;
  std::atomic<uintptr_t> thread_token_{0};  // ThreadToken() of thread_ while Run runs (OnDriver)
  std::atomic<bool> started_{false};        // Start ran (OnDriver)
  std::atomic<bool> stop_{false};
  // Engine-driven shards.
  const bool engine_driven_;
  int wake_fd_ = -1;                  // the eventfd the engine sleeps on
  bool sleep_prepared_ = false;       // the driver's: PrepareSleep said 1 and no Step came since
  bool wake_owed_ = false;            // the driver's: a Wake won the race, its write is unread
  bool bounded_sleep_ = false;        // the driver's: the prepared sleep must be bounded
  uintptr_t sleeper_ = 0;             // the driver's: ThreadToken of the thread that may sleep
  std::atomic<bool> stopped_{false};  // Stop ran (HandOverAll)
  alignas(64) std::atomic<uintptr_t> driver_{0};  // ThreadToken of the driver; 0: none
  std::atomic<uintptr_t> last_driver_{0};
  std::atomic<bool> notifications_broken_{false};
  alignas(64) std::atomic<uint32_t> cq_events_{0};  // bumped by the event thread (CqEvents)
  std::atomic<bool> unpark_all_{false};
  Parker parker_;
  Mailbox mailbox_;

  // Events posted by the event thread, taken by the poller thread.
  Mutex inbox_mu_;
  std::vector<PostedEvent> inbox_ CQD_GUARDED_BY(inbox_mu_);
  bool inbox_open_ CQD_GUARDED_BY(inbox_mu_) = true;  // false once the thread has stopped
  std::atomic<bool> inbox_pending_{false};

  // Stats, written by the poller thread only.
  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> empty_polls_{0};
  std::atomic<uint64_t> completions_{0};
  std::atomic<uint64_t> arms_{0};
  std::atomic<uint64_t> arm_failures_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<bool> asleep_{false};  // committed to a sleep (PollerStats::asleep)
  std::atomic<uint64_t> backpressure_stalls_{0};
  std::atomic<uint64_t> parks_{0};
  std::atomic<uint64_t> parked_count_{0};  // parked_.size()

  // The fused pass's, poller thread only (last, so that the fields above keep their lines).
  // The fused poll's completions: apart from wcs_, which control calls served inside its
  // handlers poll into (RemoveCq) while a handler still reads its span of these.
  std::unique_ptr<ibv_wc[]> fused_wcs_;
  // The fused poll in progress (active until it ends or SettleFused routed the rest): its CQ and
  // consumer, and fused_wcs_[next, n) not yet run.
  struct FusedPoll {
    CqRecord* cq = nullptr;
    uint32_t consumer = 0;
    int next = 0;
    int n = 0;
    bool active = false;
  };
  FusedPoll fused_;
  std::unique_ptr<int[]> run_starts_;  // PollFused: where each run of one QP starts, and n
  // PollAll's place while it polls (SettleFused mends the list there): cqs_[0, poll_kept_) are
  // kept, cqs_[poll_next_, end) not visited yet; cut_pass_ once SettleFused ended the pass.
  bool in_poll_all_ = false;
  size_t poll_kept_ = 0;
  size_t poll_next_ = 0;
  bool cut_pass_ = false;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_POLLER_H_

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/cq_set.h: the shard's CQs, polled round robin, parked while idle, armed
// before a sleep.
//
// Polling: a pass polls each CQ in the list once, at most as much as the fullest spill of the
// consumers it serves has room for (Spills::RoomFor: a CQ a stalled consumer shares waits in the
// CQ) and at most poll_batch, so one busy CQ cannot starve the others; a budget cut short starts
// the next pass at the first CQ it left out. Each poll is routed (Router) into the lanes, or run
// by the fused poll (fused_poll.h) when its CQ's QPs all go to a run-to-completion consumer of
// this shard. A poll that takes fewer than it asked for found the CQ empty: the catch-ups of its
// fences (fences.h) and of posted events (EventInbox) rely on that.
//
// Parking: a CQ found empty for `cq_park_after` while the shard stays busy is armed (S7), polled
// once more (S6), and moved out of the passes to `parked_` if that found nothing. The event
// thread clears the CQ's `armed` and calls NoteCqEvents, which bumps `cq_events_` (after the
// clear, both seq_cst); a pass that sees the count move puts every parked CQ whose `armed` is
// clear back. A completion on a parked CQ therefore always raises an event that unparks it. A
// failed arm keeps the CQ in the passes; a failed channel (NotificationsBroken) or device
// (UnparkAll) brings every parked CQ back and stops parking.
//
// As a stage: Poll unparks what its event brought back, then polls the list. TryEnterIdle arms
// every CQ not already armed (S7), but those a full consumer holds back (Spills::HeldBack: its
// freed room wakes the shard), and polls once more (S6) without fusing (no handler runs inside
// a sleep's re-check); an arm that failed makes the sleep bounded (MustBoundSleep). Arming stays
// after a wake: the event it raises later only brings a parked CQ back, or wakes the shard once.
//
// A change to the list in the middle of a pass (a run-to-completion handler's control call, run
// on this thread inside a poll) is deferred generically: Remove nulls the CQ's entries, the pass
// skips them and never touches a CQ whose entry went null after its poll, and the pass compacts
// the list at its end. Add appends, so the pass may reach the CQ already.
//
// Threading: the shard's driver only, but NoteCqEvents, UnparkAll and NotificationsBroken (the
// event thread).
#ifndef CQD_RUNTIME_CORE_SHARD_CQ_SET_H_
#define CQD_RUNTIME_CORE_SHARD_CQ_SET_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cqd/options.h"
#include "cqd/status.h"
#include "runtime/core/fences.h"
#include "runtime/core/records.h"
#include "runtime/core/shard/counters.h"
#include "runtime/core/shard/router.h"
#include "runtime/core/shard/spills.h"

namespace cqd::internal {

class FusedPoll;

class CqSet {
 public:
  // `fused`: null when the shard hosts no run-to-completion consumer.
  CqSet(const RuntimeOptions& options, ShardCounters& counters, Spills& spills, Router& router,
        FenceList& fences, FusedPoll* fused);
  CqSet(const CqSet&) = delete;
  CqSet& operator=(const CqSet&) = delete;

  // Stage: parked CQs whose event came back rejoin the passes, then each CQ is polled once, for
  // up to `budget` completions in all, with the spills' hold around it. Returns the work done.
  int Poll(int budget) noexcept;
  // Stage: true if the shard may sleep: nothing unparked, every CQ armed and found empty.
  bool TryEnterIdle() noexcept;
  // True when no event may wake a sleep (an arm or the channel failed): it must be bounded.
  bool MustBoundSleep() const noexcept {
    return arm_failed_ || notifications_broken_.load(std::memory_order_relaxed);
  }

  // Event thread: CQs of this shard got their events (their `armed` already cleared). The caller
  // wakes the shard after.
  void NoteCqEvents() noexcept { cq_events_.fetch_add(1, std::memory_order_seq_cst); }
  // Event thread: a device failed; parked CQs go back into the passes (no event will come).
  void UnparkAll() noexcept {
    unpark_all_.store(true, std::memory_order_seq_cst);
    NoteCqEvents();
  }
  // Event thread: the shard's completion channel failed; never sleep unbounded again.
  void NotificationsBroken() noexcept {
    notifications_broken_.store(true, std::memory_order_seq_cst);
    UnparkAll();
  }

  // Control parts (on the driver).
  void Add(CqRecord* cq);
  // Stops polling `cq` and polls it empty: no live registration uses it, so what it still holds
  // goes to the orphan sink. Returns the number of completions taken.
  uint64_t Remove(CqRecord* cq);
  // Resizes `cq` while it is not being polled, and polls it again from the next pass.
  Status Resize(CqRecord* cq, int depth);
  // The CQ with id `id` in the passes or parked, or null.
  CqRecord* Find(uint32_t id) noexcept;
  // Polls the CQ `id` (a parked one too: it stays parked, since its next completion raises an
  // event) until it is found empty or a CQ depth has come out since `polled` started counting.
  // Returns false while a full spill holds it back. A CQ gone or failed is caught up.
  bool CatchUp(uint32_t id, uint64_t& polled) noexcept;
  // Polls `cq` while a fence's catch-up runs there and its consumers have room.
  void CatchUpFences(CqRecord* cq) noexcept;
  // The same for every CQ with a catch-up running.
  void CatchUpAllFences() noexcept;

 private:
  // Polls every CQ in the passes once, for up to `budget` completions in all, parking those
  // idle long enough; returns the number of completions taken. With `may_fuse` (the stage's
  // poll only) a poll may run its handlers.
  int PollAll(int budget = INT32_MAX, bool may_fuse = false) noexcept;
  // Polls `cq` for up to `room` completions, routes and hands them over (unless held); returns
  // how many (fewer than `room`: the CQ was found empty, or failed after some), or a negative
  // errno once the CQ has failed.
  int PollOne(CqRecord* cq, int room, bool may_fuse = false) noexcept;
  // Arms every CQ in the passes not armed yet (S7); sets arm_failed_.
  void ArmAll() noexcept;
  // Arms `cq` if it is not, polls it once more, and returns true if it may be parked.
  bool TryPark(CqRecord* cq) noexcept;
  // Puts parked CQs whose event came (or all, after UnparkAll) back into the passes.
  void Unpark() noexcept;
  bool UnparkPending() const noexcept {
    return cq_events_.load(std::memory_order_seq_cst) != seen_cq_events_;
  }
  void SetParkedCount() noexcept {
    counters_.parked_cqs.store(parked_.size(), std::memory_order_relaxed);
  }

  // Empty polls in a row after which a CQ's idle time starts to be measured for parking.
  static constexpr uint32_t kParkProbe = 16;
  static constexpr uint32_t kNoConsumer = ~uint32_t{0};

  const RuntimeOptions& options_;
  ShardCounters& counters_;
  Spills& spills_;
  Router& router_;
  FenceList& fences_;
  FusedPoll* const fused_;
  const bool may_park_;            // parking is on (cq_park_after > 0, not busy_poll)
  std::vector<CqRecord*> cqs_;     // in the passes, round robin; null: removed mid-pass
  std::vector<CqRecord*> parked_;  // armed, out of the passes until their event
  bool in_pass_ = false;           // PollAll is walking cqs_ (Remove nulls instead of erasing)
  bool arm_failed_ = false;        // the last TryEnterIdle could not arm every CQ
  uint32_t seen_cq_events_ = 0;    // cq_events_ when parked_ was last checked
  alignas(64) std::atomic<uint32_t> cq_events_{0};  // bumped by the event thread
  std::atomic<bool> unpark_all_{false};
  std::atomic<bool> notifications_broken_{false};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_CQ_SET_H_

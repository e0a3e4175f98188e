// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/event_inbox.h: async-event parts posted to a shard, placed into the lanes
// behind the completions before them.
//
// Before it places an event, the shard catches up on the QP's CQs of this shard (CqSet::CatchUp):
// it polls them until they are empty or it has taken a CQ depth's worth since the event arrived,
// so the event follows every completion that was in those CQs when the event was read. Events
// are placed in posting order; one that cannot be placed yet (its catch-up or its lane is held
// back by a full consumer) stays, and so do later ones for the same consumer, which keeps each
// consumer's events in order.
//
// As a stage: Poll places what it can. TryEnterIdle asks each consumer an event waits for to wake
// the shard when it frees room (Lane::wants_room), and looks once more; the spills stage, after
// it, completes the pair with the consumer for every lane that holds entries. ExitIdle takes the
// asking back.
//
// Threading: Post from any thread (the event thread, the teardown worker, a CM hand-on),
// serialized by `mu_`; after the shard stopped it hands the event straight to its consumer, with
// the shard's producer token, under `mu_`. The rest on the shard's driver. The inbox is guarded
// by `mu_`; `pending_` (seq_cst, set before the post wakes the shard) says it is not
// empty, so a pass takes the lock only when there is something to take.
#ifndef CQD_RUNTIME_CORE_SHARD_EVENT_INBOX_H_
#define CQD_RUNTIME_CORE_SHARD_EVENT_INBOX_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "runtime/base/mutex.h"
#include "runtime/base/parker.h"
#include "runtime/core/event_join.h"
#include "runtime/core/lane.h"
#include "runtime/core/route.h"
#include "runtime/core/shard/counters.h"
#include "runtime/core/shard/cq_set.h"
#include "runtime/core/shard/spills.h"

namespace cqd::internal {

class EventInbox {
 public:
  EventInbox(const ShardCounters& counters, Spills& spills, CqSet& cqs, Parker& shard_parker)
      : counters_(counters), spills_(spills), cqs_(cqs), parker_(shard_parker) {}
  EventInbox(const EventInbox&) = delete;
  EventInbox& operator=(const EventInbox&) = delete;

  // Any thread (serialized by mu_): queues `item` (kind kEventPart) for `consumer` behind every
  // completion now in the QP's CQs of this shard (`cq_a`, `cq_b`: CQ ids, 0 for none) and wakes
  // the shard. Returns false only after the shard stopped, when `consumer` has closed too (an
  // owned consumer past Shutdown): the caller still owns the part.
  bool Post(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b) CQD_EXCLUDES(mu_);

  // Stage: places what it can; returns 1 if anything moved.
  int Poll() CQD_EXCLUDES(mu_);
  // Stage: true if no event waits, or each waits for room its consumer will wake the shard for.
  bool TryEnterIdle() CQD_EXCLUDES(mu_);
  // Stage: the sleep is over: the consumers need not wake the shard for room any more.
  void ExitIdle() noexcept {
    for (const PostedEvent& posted : deferred_) {
      spills_.lane(posted.consumer).wants_room.store(false, std::memory_order_relaxed);
    }
  }

  // Control part: drops the events for `consumer` that `runs` says no consumer will run
  // (released), keeping the order of the rest.
  template <typename Runs>
  void Purge(uint32_t consumer, Runs&& runs) {
    std::erase_if(deferred_, [&](const PostedEvent& posted) {
      if (posted.consumer != consumer || runs(posted.item)) return false;
      DropEventPart(posted.item.join);  // deferred entries are events
      return true;
    });
  }
  // Stop: hands everything the lanes hold, and then every event posted, to the consumers (they
  // outlive the shard's stop); Posts from then on go straight to their consumer, behind it.
  void Close() CQD_EXCLUDES(mu_);

 private:
  struct PostedEvent {
    uint32_t consumer;
    Item item;
    uint32_t cq_ids[2];           // the QP's CQs on this shard (0: none)
    uint64_t polled[2] = {0, 0};  // completions taken off each since the event arrived
    uint32_t caught_up = 0;       // bit k: cq_ids[k] needs no more polling
  };
  // Polls the event's CQs until it may be placed; false while a full spill holds it back.
  bool CatchUp(PostedEvent& posted) noexcept;
  // Moves posted events into lanes that have room; returns true if any moved.
  bool Place() CQD_EXCLUDES(mu_);

  const ShardCounters& counters_;
  Spills& spills_;
  CqSet& cqs_;
  Parker& parker_;
  Mutex mu_;
  std::vector<PostedEvent> inbox_ CQD_GUARDED_BY(mu_);
  bool open_ CQD_GUARDED_BY(mu_) = true;  // false once the shard has stopped
  std::atomic<bool> pending_{false};
  std::vector<PostedEvent> deferred_;  // the driver's: taken from the inbox, not yet placed
  std::vector<bool> held_;             // Place: consumers with an event held back
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_EVENT_INBOX_H_

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/fused_poll.h: a poll of a CQ whose QPs all go to a run-to-completion
// consumer of this shard calls each run's handler as soon as the router has cleared it, the way
// an engine's own loop would, instead of routing the whole poll into the lane and dispatching it
// afterwards. What the router does not clear (a QP being torn down, a QP of another consumer)
// and what follows it takes the lanes as usual.
//
// What the unfused path guarantees, it keeps. Every completion of a poll is routed against the
// state the poll saw before any control call changes it: a control call that reaches this shard
// from a handler (Shard::RunSync inline) or while a handler waits (its mailbox, served as a wait
// duty) first runs Settle, which routes the rest of the poll into the lanes, where purges and
// fences find it as they would have. Each run's handler call is entered (Consumer::EnterCall)
// before its slot is read, and called only if the slot was read live, so an Unregister from
// another thread waits for that call, as on the consumer's own path (consumer.h).
//
// Threading: the shard's driver only.
#ifndef CQD_RUNTIME_CORE_SHARD_FUSED_POLL_H_
#define CQD_RUNTIME_CORE_SHARD_FUSED_POLL_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include "runtime/base/thread_role.h"
#include "runtime/core/orphans.h"
#include "runtime/core/records.h"
#include "runtime/core/shard/counters.h"
#include "runtime/core/shard/router.h"
#include "runtime/core/shard/spills.h"

namespace cqd::internal {

class FusedPoll {
 public:
  // `duty`: what the handlers' waits serve (the shard's mailbox, thread_role.h).
  FusedPoll(int poll_batch, ShardCounters& counters, Spills& spills, Router& router,
            OrphanSink& orphans, WaitDuty duty);
  FusedPoll(const FusedPoll&) = delete;
  FusedPoll& operator=(const FusedPoll&) = delete;

  // Whether a poll of up to `room` completions of `cq`, whose QPs all go to `consumer`, may run
  // their handlers as it routes them: `consumer` is run to completion on this shard with nothing
  // handed over or spilled (what waits there is older), records no latency, and takes batches of
  // `room` (ConsumerOptions::dispatch_batch); `cq` awaits no fence.
  bool MayFuse(const CqRecord& cq, uint32_t consumer, int room) noexcept {
    const Lane& lane = spills_.lane(consumer);
    const Consumer& target = spills_.consumer(consumer);
    return lane.direct && static_cast<size_t>(room) <= target.dispatch_batch() &&
           lane.spill_empty() && cq.fenced.awaited_markers == 0 && cq.fenced.catch_ups == 0 &&
           target.latency() == nullptr && !target.Pending();
  }
  // Polls `cq` for up to `room` completions and runs them (see above). Returns as CqSet's
  // PollOne. Should a handler make a control call that reaches this shard, Settle runs first and
  // the poll ends when that handler returns; `cq` is not touched after it.
  int Poll(CqRecord* cq, uint32_t consumer, int room) noexcept;
  // Before a control call changes the shard's state from a callback it runs: inside a fused
  // poll, routes what the poll still holds into the lanes, against the state the poll saw, as the
  // unfused path would have before any handler ran. Nothing otherwise.
  void Settle() noexcept;

 private:
  static constexpr uint32_t kNoQp = ~uint32_t{0};  // qp_num has 24 bits

  ShardCounters& counters_;
  Spills& spills_;
  Router& router_;
  OrphanSink& orphans_;
  const WaitDuty duty_;
  // The poll's completions: apart from the router's scratch, which control calls served inside
  // its handlers poll into (CqSet::Remove) while a handler still reads its span of these.
  std::unique_ptr<ibv_wc[]> wcs_;
  std::unique_ptr<const Slot*[]> run_slots_;  // each run's slot
  std::unique_ptr<int[]> run_starts_;         // where each run of one QP starts, and n
  // The poll in progress (active until it ends or Settle routed the rest): its CQ, and
  // wcs_[next, n) not yet run.
  CqRecord* cq_ = nullptr;
  int next_ = 0;
  int n_ = 0;
  bool active_ = false;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_FUSED_POLL_H_

// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/fused_poll.h"

namespace cqd::internal {

FusedPoll::FusedPoll(int poll_batch, ShardCounters& counters, Spills& spills, Router& router,
                     OrphanSink& orphans, WaitDuty duty)
    : counters_(counters),
      spills_(spills),
      router_(router),
      orphans_(orphans),
      duty_(duty),
      wcs_(std::make_unique<ibv_wc[]>(poll_batch)),
      run_slots_(std::make_unique<const Slot*[]>(poll_batch)),
      run_starts_(std::make_unique<int[]>(poll_batch + 1)) {}

int FusedPoll::Poll(CqRecord* cq, uint32_t consumer, int room) noexcept {
  ibv_wc* wcs = wcs_.get();
  const int n = counters_.CountedPoll(cq, room, wcs, true);
  if (n <= 0) return n;
  router_.Stamp();
  // One look at the poll: its runs of one QP, each run's slot looked up (and prefetched, so that
  // the misses overlap).
  Consumer& target = spills_.consumer(consumer);
  const QpTable& table = cq->device->qps;
  int runs = 0;
  uint32_t last = kNoQp;
  for (int i = 0; i < n; ++i) {
    const uint32_t qp_num = wcs[i].qp_num;
    if (qp_num == last) continue;
    last = qp_num;
    const Slot* slot = table.Lookup(qp_num);
    if (slot != nullptr) __builtin_prefetch(slot);
    run_slots_[runs] = slot;
    run_starts_[runs] = i;
    ++runs;
  }
  run_starts_[runs] = n;
  cq_ = cq;
  next_ = 0;
  n_ = n;
  active_ = true;
  uint64_t delivered = 0;
  int i = 0;
  {
    // Handlers may call the runtime from here (thread_role.h), as on the hosted stage.
    const HostedDispatchScope dispatching(duty_.serve, duty_.owner);
    target.OpenFusedBatch();
    for (int r = 0; r < runs; ++r) {
      const int j = run_starts_[r + 1];
      const Slot* slot = run_slots_[r];
      uint64_t state;
      // The call entered before the state read: Unregister's wait pairs with it (consumer.h).
      if (slot != nullptr) target.EnterCall(slot->index);
      const Router::RunRoute route = router_.RouteRun(*cq, wcs[i].qp_num, slot, consumer, state);
      if (route == Router::RunRoute::kOrphan) {
        target.LeaveCall();  // as the consumer's own path: no Unregister waits for the orphans
        const RuntimeThreadScope runtime(true);  // as on the unfused path: no calls in
        orphans_.Take({wcs + i, static_cast<size_t>(j - i)});
        i = j;
        continue;
      }
      // The entries of a QP being torn down may hold its marker, and another consumer's go
      // elsewhere: they and the rest of the poll take the lanes.
      if (route == Router::RunRoute::kEachAlone) [[unlikely]]
        break;
      next_ = j;  // what Settle would route, should this handler call in
      Consumer::DeliverFused(*slot, wcs + i, static_cast<size_t>(j - i));
      delivered += static_cast<uint64_t>(j - i);
      i = j;
      if (!active_) [[unlikely]]
        break;  // settled: the rest is in the lanes
    }
    const bool settled = !active_;
    active_ = false;
    if (!settled && i < n) {
      const RuntimeThreadScope runtime(true);
      router_.RouteCompletions(cq, wcs + i, n - i);
    }
    target.CloseFusedBatch(delivered);
  }
  if (!spills_.empty()) spills_.Flush(false);
  return n;
}

void FusedPoll::Settle() noexcept {
  if (!active_) return;
  active_ = false;
  const RuntimeThreadScope runtime(true);  // an OrphanHandler called here may not call in
  if (next_ < n_) router_.RouteCompletions(cq_, wcs_.get() + next_, n_ - next_);
}

}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/poller_fused.cc: the fused pass (poller.h): a poll of a CQ whose QPs all go to a
// run-to-completion consumer of this thread calls each run's handler as soon as it has routed
// it, the way an engine's own loop would, instead of routing the whole poll into the lane and
// dispatching it afterwards. Routing decides as in RouteInLane (route.h); what it does not clear
// takes the lanes as usual.
//
// What the unfused pass guarantees, it keeps. Every completion of a poll is routed against the
// state the poll saw before any control call changes it: a control call that reaches this poller
// from a handler (RunSync) or while a handler waits (its mailbox, served as a wait duty) first
// runs SettleFused, which routes the rest of the poll into the lanes, where purges and fences
// find it as they would have. The batch lists its CQ and the poll's QP numbers before any
// handler runs, so an Unregister from another thread waits for its end when it names a QP of that
// CQ with one of them (Consumer::OpenFusedBatch), and the handler of each run is called only
// after its slot was read live (seq_cst) inside that batch.
#include <algorithm>

#include "runtime/core/poller.h"
#include "runtime/core/route.h"

namespace cqd::internal {

bool Poller::MayFuse(const CqRecord& cq, uint32_t consumer, int room) const noexcept {
  const Lane& lane = *lanes_[consumer];
  const Consumer& target = *consumers_[consumer];
  return lane.direct && static_cast<size_t>(room) <= target.dispatch_batch() &&
         lane.spill_empty() && cq.awaited_markers == 0 && cq.catch_ups == 0 &&
         target.latency() == nullptr && !target.Pending();
}

int Poller::PollFused(CqRecord* cq, uint32_t consumer, int room) noexcept {
  ibv_wc* wcs = fused_wcs_.get();
  const int n = PollCounted(cq, room, wcs, true);
  if (n <= 0) return n;
  // One look at the poll: its runs of one QP, each run's slot looked up (prefetched, so that
  // the misses overlap) and its number listed for the batch.
  Consumer& target = *consumers_[consumer];
  std::atomic<uint32_t>* listing = target.FusedListing();
  const QpTable& table = cq->device->qps;
  int runs = 0;
  uint32_t last = kNoQp;
  for (int i = 0; i < n; ++i) {
    const uint32_t qp_num = wcs[i].qp_num;
    if (qp_num == last) continue;
    last = qp_num;
    const Slot* slot = table.Lookup(qp_num);
    if (slot != nullptr) __builtin_prefetch(slot);
    batch_slots_[runs] = slot;
    run_starts_[runs] = i;
    listing[runs].store(qp_num, std::memory_order_release);
    ++runs;
  }
  run_starts_[runs] = n;
  fused_ = {cq, consumer, 0, n, true};
  uint64_t delivered = 0;
  int i = 0;
  {
    // Handlers may call the runtime from here (thread_role.h), as in RunHosted.
    const HostedDispatchScope dispatching(&Poller::ServeMailbox, this);
    target.OpenFusedBatch(static_cast<size_t>(runs), cq->id);
    for (int r = 0; r < runs; ++r) {
      const int j = run_starts_[r + 1];
      const Slot* slot = batch_slots_[r];
      RouteFacts facts;
      uint64_t state = 0;
      if (slot != nullptr) {
        // seq_cst: Unregister's wait for the batch in progress pairs with it (consumer.h).
        state = slot->state.load(std::memory_order_seq_cst);
        ReadSlotFacts(cq, wcs[i].qp_num, *slot, state, facts);
      }
      if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) {
        const RuntimeThreadScope runtime(true);  // as on the unfused pass: no calls in
        orphans_.Take({wcs + i, static_cast<size_t>(j - i)});
        i = j;
        continue;
      }
      // A draining QP's entries may hold its marker, and another consumer's go elsewhere: they
      // and the rest of the poll take the lanes.
      if (facts.draining || StateConsumer(state) != consumer) [[unlikely]]
        break;
      fused_.next = j;  // what SettleFused would route, should this handler call in
      Consumer::DeliverFused(*slot, wcs + i, static_cast<size_t>(j - i));
      delivered += static_cast<uint64_t>(j - i);
      i = j;
      if (!fused_.active) [[unlikely]]
        break;  // settled: the rest is in the lanes
    }
    const bool settled = !fused_.active;
    fused_.active = false;
    if (!settled && i < n) {
      const RuntimeThreadScope runtime(true);
      RouteCompletions(cq, wcs + i, n - i);
    }
    target.CloseFusedBatch(delivered);
  }
  if (!listed_.empty()) Flush(false);
  return n;
}

void Poller::SettleFused() noexcept {
  if (fused_.active) {
    fused_.active = false;
    const RuntimeThreadScope runtime(true);  // an OrphanHandler called here may not call in
    if (fused_.next < fused_.n) {
      RouteCompletions(fused_.cq, fused_wcs_.get() + fused_.next, fused_.n - fused_.next);
    }
  }
  // Any control call on this thread inside PollAll (a fused handler's, or a CmHandler's that the
  // end of a fused batch runs) may change the list PollAll is compacting.
  if (!in_poll_all_) return;
  // cqs_[poll_kept_, poll_next_) hold stale copies (PollAll compacts as it goes): drop them, and
  // put the CQs not polled yet first, so that the next pass starts with them.
  cqs_.erase(cqs_.begin() + static_cast<std::ptrdiff_t>(poll_kept_),
             cqs_.begin() + static_cast<std::ptrdiff_t>(poll_next_));
  std::rotate(cqs_.begin(), cqs_.begin() + static_cast<std::ptrdiff_t>(poll_kept_), cqs_.end());
  in_poll_all_ = false;
  cut_pass_ = true;
}

}  // namespace cqd::internal

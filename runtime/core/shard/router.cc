// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/router.h"

#include <algorithm>

#include "runtime/core/teardown.h"

namespace cqd::internal {

Router::Router(int poll_batch, bool stamp, FenceList& fences, OrphanSink& orphans, Spills& spills)
    : fences_(fences),
      orphans_(orphans),
      spills_(spills),
      stamp_(stamp),
      scratch_(std::make_unique<ibv_wc[]>(poll_batch)),
      batch_slots_(std::make_unique<const Slot*[]>(poll_batch)) {}

void Router::LookUpBatch(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
  // Independent loads, one pass ahead of routing, so that their misses overlap.
  const QpTable& table = cq->device->qps;
  uint32_t last_qp = kNoQp;
  const Slot* last = nullptr;
  for (int i = 0; i < n; ++i) {
    const uint32_t qp_num = wcs[i].qp_num;
    if (qp_num != last_qp) {
      last_qp = qp_num;
      last = table.Lookup(qp_num);
      if (last != nullptr) __builtin_prefetch(last);
    }
    batch_slots_[i] = last;
  }
}

inline uint32_t Router::Classify(CqRecord* cq, const ibv_wc& wc, const Slot* slot,
                                 RouteCache& cache, EntryMeta& meta) noexcept {
  RouteFacts facts;
  if (cq->fenced.awaited_markers != 0) [[unlikely]] {
    facts.fence = fences_.Take(cq, wc);  // a retired QP's marker or what it flushed before it
  } else if (wc.qp_num == cache.qp_num) {
    meta = cache.meta;  // the same facts as its QP's previous completion in this poll
    return cache.consumer;
  }
  uint64_t state = 0;
  if (facts.fence == FenceList::Taken::kNotFenced && slot != nullptr) {
    state = slot->state.load(std::memory_order_acquire);
    ReadSlotFacts(*cq, wc.qp_num, *slot, state, facts);
  }
  TeardownState* teardown = nullptr;
  if (facts.tearing_down && facts.live) [[unlikely]] {
    // Non-null while the state says tearing down: a teardown nulls it only after the state died,
    // and makes its fences (FenceRetired, on the driver between polls: a call made mid-pass
    // settles the fused poll first) before that, so a marker is either marked `polled` here or
    // taken by its fence above.
    teardown = slot->teardown.load(std::memory_order_acquire);
    const uint64_t marker = reinterpret_cast<uint64_t>(teardown);
    facts.is_marker = marker != 0 && (wc.wr_id == marker || wc.wr_id == marker + 1);
  }
  switch (Route(RouteStage::kPoll, facts)) {
    case Disposal::kFenceTaken:
      return kTaken;
    case Disposal::kOrphan:
      return kOrphan;
    case Disposal::kNoteMarker:
      teardown->polled.fetch_or(wc.wr_id == teardown->send_marker() ? TeardownState::kSendMarker
                                                                    : TeardownState::kRecvMarker,
                                std::memory_order_relaxed);
      meta = {slot->index, StateGeneration(state), EntryKind::kTeardownMarker, 1, poll_stamp_};
      return StateConsumer(state);
    case Disposal::kDeliver:
      break;
    case Disposal::kDropEvent:   // never at the poll (route_test): Route decides only for a
    case Disposal::kDropMarker:  // completion there
    case Disposal::kToFallback:
    case Disposal::kUnaffected:
      return kOrphan;
  }
  meta = {slot->index, StateGeneration(state), EntryKind::kCompletion, 1, poll_stamp_};
  // The next completions of this QP in the poll route the same way (the consumer re-checks the
  // registration before it calls the handler, as it does for every run). A torn-down QP's are
  // each looked at: any may be its marker.
  if (!facts.tearing_down) cache = {wc.qp_num, StateConsumer(state), meta};
  return StateConsumer(state);
}

void Router::RouteInLane(CqRecord* cq, uint32_t consumer, int n) noexcept {
  Lane& lane = spills_.lane(consumer);
  const uint32_t base = lane.tail_at();
  ibv_wc* wcs = &lane.wc(base);
  EntryMeta* metas = &lane.meta(base);
  LookUpBatch(cq, wcs, n);
  // The common case, a run of one QP's completions at a time: one state read per run, its entries
  // stay where the poll put them.
  uint32_t kept = 0;  // entries [0, kept) stay: routed to `consumer`
  uint32_t i = 0;
  const uint32_t count = static_cast<uint32_t>(n);
  while (i < count && cq->fenced.awaited_markers == 0) {
    const uint32_t qp_num = wcs[i].qp_num;
    uint32_t j = i + 1;
    while (j < count && wcs[j].qp_num == qp_num) ++j;
    const Slot* slot = batch_slots_[i];
    uint64_t state;
    const RunRoute route = RouteRun(*cq, qp_num, slot, consumer, state);
    if (route == RunRoute::kOrphan) {
      orphans_.Take({wcs + i, j - i});
      i = j;
      continue;
    }
    if (route == RunRoute::kEachAlone) [[unlikely]]
      break;
    EntryMeta meta{slot->index, StateGeneration(state), EntryKind::kCompletion, 0, poll_stamp_};
    for (; i < j; ++i) {
      if (kept != i) wcs[kept] = wcs[i];  // close the gap an orphan left
      meta.run = static_cast<uint16_t>(j - i);
      metas[kept++] = meta;
    }
  }
  RouteCache cache;
  for (; i < count; ++i) {
    EntryMeta& meta = metas[kept];
    const uint32_t to = Classify(cq, wcs[i], batch_slots_[i], cache, meta);
    if (to == consumer) {
      if (kept != i) wcs[kept] = wcs[i];
      ++kept;
    } else if (to == kOrphan) {
      orphans_.Take({&wcs[i], 1});
    } else if (to != kTaken) [[unlikely]] {
      // Unreachable while `uses` is kept (a live QP's consumer is among its CQ's uses); should
      // that ever not hold, the rest of the poll takes the general path, behind what stays.
      const EntryMeta moved = meta;
      lane.Advance(kept);
      if (kept > 0) spills_.List(consumer);
      const uint32_t rest = count - i;
      ibv_wc* scratch = scratch_.get();
      std::copy(&wcs[i], &wcs[i] + rest, scratch);
      spills_.AppendCompletion(to, moved, scratch[0]);
      RouteCompletions(cq, scratch + 1, static_cast<int>(rest) - 1);
      return;
    }
  }
  lane.Advance(kept);
  if (kept > 0) spills_.List(consumer);
}

void Router::RouteCompletions(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
  LookUpBatch(cq, wcs, n);
  RouteCache cache;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    EntryMeta meta;
    const uint32_t to = Classify(cq, wc, batch_slots_[i], cache, meta);
    if (to == kTaken) continue;
    if (to == kOrphan) {
      orphans_.Take({&wc, 1});
      continue;
    }
    spills_.AppendCompletion(to, meta, wc);
  }
}

void Router::RouteUnused(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    RouteFacts facts;  // no live registration uses the CQ: nothing is known
    if (cq->fenced.awaited_markers != 0) facts.fence = fences_.Take(cq, wc);
    if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) orphans_.Take({&wc, 1});
  }
}

}  // namespace cqd::internal

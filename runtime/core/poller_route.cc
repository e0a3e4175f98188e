// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/poller_route.cc: the data path of a pass: events placed behind their catch-up,
// CQs polled as their consumers have room, each completion routed (route.h) into its lane, and
// the lanes handed over (poller.h says what each step guarantees).
#include <algorithm>
#include <chrono>

#include "runtime/base/chaos.h"
#include "runtime/base/mutex.h"
#include "runtime/core/poller.h"
#include "runtime/core/route.h"

namespace cqd::internal {

using Clock = std::chrono::steady_clock;

bool Poller::PlaceEvents() {
  if (inbox_pending_.exchange(false, std::memory_order_acq_rel)) {
    MutexLock lock(inbox_mu_);
    deferred_.insert(deferred_.end(), inbox_.begin(), inbox_.end());
    inbox_.clear();
  }
  // In posting order. One that cannot be placed yet stays, and so do later ones for the same
  // consumer, which keeps each consumer's events in order.
  bool moved = false;
  size_t kept = 0;
  held_.assign(consumers_.size(), false);
  for (size_t i = 0; i < deferred_.size(); ++i) {
    PostedEvent& posted = deferred_[i];
    if (held_[posted.consumer] || !CatchUp(posted) || lanes_[posted.consumer]->room() == 0) {
      held_[posted.consumer] = true;
      deferred_[kept++] = posted;
      continue;
    }
    AppendEvent(posted.consumer, posted.item);
    moved = true;
  }
  deferred_.resize(kept);
  return moved;
}

bool Poller::CatchUp(PostedEvent& posted) noexcept {
  for (int k = 0; k < 2; ++k) {
    if (posted.cq_ids[k] == 0 || (posted.caught_up & (1u << k))) continue;
    // A parked CQ is polled too; it stays parked, since its next completion raises an event.
    CqRecord* cq = FindCq(posted.cq_ids[k]);
    while (cq != nullptr && !cq->poll_failed) {
      const int room = RoomFor(*cq);
      if (room == 0) return false;
      const int n = PollOne(cq, room);
      if (n > 0) posted.polled[k] += n;
      // Empty, or a whole depth taken: everything that was there when the event came is out.
      if (n < room || posted.polled[k] >= static_cast<uint64_t>(cq->cq->depth())) break;
    }
    posted.caught_up |= 1u << k;
  }
  return true;
}

int Poller::RoomFor(const CqRecord& cq) noexcept {
  int room = options_.poll_batch;
  for (const CqRecord::Use& use : cq.uses) {
    room = std::min<int>(room, static_cast<int>(lanes_[use.consumer]->room()));
  }
  return room;
}

CqRecord* Poller::FindCq(uint32_t id) noexcept {
  for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
    for (CqRecord* cq : *list) {
      if (cq->id == id) return cq;
    }
  }
  return nullptr;
}

int Poller::PollAll(int budget, bool may_fuse) noexcept {
  int found = 0;
  size_t kept = 0;
  size_t resume = SIZE_MAX;  // where the budget ran out: the next pass starts there
  Clock::time_point now{};   // read at most once per pass, by the first CQ that needs it
  in_poll_all_ = true;
  for (size_t i = 0; i < cqs_.size(); ++i) {
    CqRecord* cq = cqs_[i];
    cqs_[kept++] = cq;
    if (cq->poll_failed) continue;
    if (found >= budget) {
      if (resume == SIZE_MAX) resume = kept - 1;
      continue;
    }
    int room = RoomFor(*cq);
    if (room == 0) {  // a consumer it shares is stalled: leave the completions in the CQ
      Count(backpressure_stalls_, 1);
      continue;
    }
    room = std::min(room, budget - found);
    poll_kept_ = kept;
    poll_next_ = i + 1;
    int n = PollOne(cq, room, may_fuse);
    if (n < room) polls_full_ = false;  // as PollOne's own: the fused pass and errors return early
    if (cut_pass_) [[unlikely]] {
      // A handler's control call ended the pass (SettleFused mended the list): `cq` may be gone.
      cut_pass_ = false;
      in_poll_all_ = false;
      return found + std::max(n, 0);
    }
    if (n != 0) {
      if (n > 0) found += n;
      cq->empty_run = 0;
      continue;
    }
    if (!may_park_ || cq->solicited_only) continue;
    if (++cq->empty_run <= kParkProbe) {
      if (cq->empty_run == kParkProbe) {
        if (now == Clock::time_point{}) now = Clock::now();
        cq->empty_since = now;
      }
      continue;
    }
    if (now == Clock::time_point{}) now = Clock::now();
    if (now - cq->empty_since < options_.cq_park_after) continue;
    if (TryPark(cq)) {
      --kept;
      cq->parked = true;
      parked_.push_back(cq);
      Count(parks_, 1);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
    }
  }
  in_poll_all_ = false;
  cqs_.resize(kept);
  if (resume != SIZE_MAX) std::rotate(cqs_.begin(), cqs_.begin() + resume, cqs_.end());
  return found;
}

bool Poller::TryPark(CqRecord* cq) noexcept {
  cq->empty_run = 0;  // whatever happens, measure afresh
  if (notifications_broken_.load(std::memory_order_relaxed) ||
      cq->device->failed.load(std::memory_order_relaxed)) {
    return false;
  }
  if (!cq->armed.load(std::memory_order_seq_cst)) {
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    Count(arms_, 1);
    if (cq->cq->RequestNotify(/*solicited_only=*/false) != 0) {
      cq->armed.store(false, std::memory_order_seq_cst);
      Count(arm_failures_, 1);
      return false;
    }
  }
  ChaosPoint();  // armed, not yet polled again
  // S6: a completion that came before the arm raises no event; only an empty CQ may park.
  const int room = RoomFor(*cq);
  return room > 0 && PollOne(cq, room) == 0;
}

void Poller::Unpark() noexcept {
  seen_cq_events_ = cq_events_.load(std::memory_order_seq_cst);
  const bool all = unpark_all_.exchange(false, std::memory_order_seq_cst);
  size_t kept = 0;
  for (CqRecord* cq : parked_) {
    if (all || !cq->armed.load(std::memory_order_seq_cst)) {
      cq->parked = false;
      cqs_.push_back(cq);
    } else {
      parked_[kept++] = cq;
    }
  }
  parked_.resize(kept);
  parked_count_.store(kept, std::memory_order_relaxed);
}

int Poller::PollOne(CqRecord* cq, int room, bool may_fuse) noexcept {
  // Every registered QP of the CQ goes to one consumer: poll straight into its lane. A poll into
  // a lane stops at the ring's edge; the rest of `room` is polled into the ring's start, so that
  // fewer than `room` taken still means the CQ is empty (CatchUp relies on it).
  const uint32_t direct = cq->uses.size() == 1 ? cq->uses[0].consumer : kNoConsumer;
  if (may_fuse && direct != kNoConsumer && MayFuse(*cq, direct, room)) {
    return PollFused(cq, direct, room);
  }
  int taken = 0;
  for (;;) {
    int want = room - taken;
    ibv_wc* into = wcs_.get();
    if (direct != kNoConsumer) {
      Lane& lane = *lanes_[direct];
      want = std::min<int>(want, static_cast<int>(lane.contiguous()));
      into = &lane.wc(lane.tail_at());
    }
    const int n = PollCounted(cq, want, into, taken == 0);
    if (n == 0) break;
    if (n < 0) {
      if (taken == 0) return n;
      break;
    }
    if (direct != kNoConsumer) {
      RouteInLane(cq, direct, n);
    } else {
      RouteCompletions(cq, wcs_.get(), n);
    }
    taken += n;
    if (n < want || taken == room) break;
  }
  // Fewer than `room` taken: the CQ was found empty (fences.h's catch-ups end there).
  if (cq->catch_ups != 0 && !cq->poll_failed) fences_.Polled(cq, taken, taken < room);
  if (taken < room) polls_full_ = false;  // drained: no reason to hold (PollCqs)
  if (taken > 0 && !(holding_ && polls_full_ && MayHoldSpills())) Flush(false);
  return taken;
}

void Poller::LookUpBatch(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
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

inline uint32_t Poller::Classify(CqRecord* cq, const ibv_wc& wc, const Slot* slot,
                                 RouteCache& cache, EntryMeta& meta) noexcept {
  RouteFacts facts;
  if (cq->awaited_markers != 0) [[unlikely]] {
    facts.fence = fences_.Take(cq, wc);  // a retired QP's marker or what it flushed before it
  } else if (wc.qp_num == cache.qp_num) {
    meta = cache.meta;  // the same facts as its QP's previous completion in this poll
    return cache.consumer;
  }
  uint64_t state = 0;
  if (facts.fence == FenceList::Taken::kNotFenced && slot != nullptr) {
    state = slot->state.load(std::memory_order_acquire);
    ReadSlotFacts(cq, wc.qp_num, *slot, state, facts);
  }
  TeardownState* teardown = nullptr;
  if (facts.draining && facts.live) [[unlikely]] {
    // Non-null while the state says draining: a teardown nulls it only after the state died, and
    // makes its fences (FenceRetired, on this thread between two passes) before that, so a
    // marker is either marked `polled` here or taken by its fence above.
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
    case Disposal::kReleaseEvent:  // never at the poll (route_test): Route decides only for a
    case Disposal::kDropMarker:    // completion there
      return kOrphan;
  }
  meta = {slot->index, StateGeneration(state), EntryKind::kCompletion, 1, poll_stamp_};
  // The next completions of this QP in the poll route the same way (the consumer re-checks the
  // registration before it calls the handler, as it does for every run). A draining QP's are
  // each looked at: any may be its marker.
  if (!facts.draining) cache = {wc.qp_num, StateConsumer(state), meta};
  return StateConsumer(state);
}

void Poller::RouteInLane(CqRecord* cq, uint32_t consumer, int n) noexcept {
  Lane& lane = *lanes_[consumer];
  const uint32_t base = lane.tail_at();
  ibv_wc* wcs = &lane.wc(base);
  EntryMeta* metas = &lane.meta(base);
  LookUpBatch(cq, wcs, n);
  // The common case, a run of one QP's completions at a time: one state read per run, its entries
  // stay where the poll put them. Anything else (a CQ awaiting a retired QP's marker, a draining
  // QP, a completion for another consumer) finishes on the general path.
  uint32_t kept = 0;  // entries [0, kept) stay: routed to `consumer`
  uint32_t i = 0;
  const uint32_t count = static_cast<uint32_t>(n);
  while (i < count && cq->awaited_markers == 0) {
    const uint32_t qp_num = wcs[i].qp_num;
    uint32_t j = i + 1;
    while (j < count && wcs[j].qp_num == qp_num) ++j;
    const Slot* slot = batch_slots_[i];
    RouteFacts facts;
    uint64_t state = 0;
    if (slot != nullptr) {
      state = slot->state.load(std::memory_order_acquire);
      ReadSlotFacts(cq, qp_num, *slot, state, facts);
    }
    if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) {
      orphans_.Take({wcs + i, j - i});
      i = j;
      continue;
    }
    // A draining QP's entries may hold its marker, and another consumer's go elsewhere: the
    // general path looks at each.
    if (facts.draining || StateConsumer(state) != consumer) [[unlikely]]
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
      if (kept > 0) ListLane(consumer);
      const uint32_t rest = count - i;
      std::copy(&wcs[i], &wcs[i] + rest, wcs_.get());
      AppendCompletion(to, moved, wcs_[0]);
      RouteCompletions(cq, wcs_.get() + 1, static_cast<int>(rest) - 1);
      return;
    }
  }
  lane.Advance(kept);
  if (kept > 0) ListLane(consumer);
}

void Poller::RouteCompletions(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
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
    AppendCompletion(to, meta, wc);
  }
}

void Poller::ListLane(uint32_t consumer) noexcept {
  Lane& lane = *lanes_[consumer];
  if (!lane.listed) {
    lane.listed = true;
    listed_.push_back(consumer);
  }
}

void Poller::AppendCompletion(uint32_t consumer, const EntryMeta& meta, const ibv_wc& wc) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.room() == 0) [[unlikely]] {
    // A CQ's completions go only to consumers among its uses, whose room bounded the poll; this
    // is the last line of defence should that ever not hold: the spill is handed over past the
    // queue bound, and this completion behind it on its own.
    FlushOne(consumer, /*force=*/true);
    Item item;
    item.wc = wc;
    item.slot = meta.slot;
    item.generation = meta.generation;
    item.kind = meta.kind;
    item.stamp = meta.stamp;
    PushAlone(consumer, item);
    return;
  }
  const uint32_t at = lane.tail_at();
  lane.wc(at) = wc;
  lane.meta(at) = meta;
  lane.Append();
  ListLane(consumer);
}

void Poller::AppendEvent(uint32_t consumer, const Item& item) noexcept {
  Lane& lane = *lanes_[consumer];  // the caller saw room()
  const uint32_t at = lane.tail_at();
  lane.SetJoin(at, item.join);
  lane.meta(at) = {item.slot, item.generation, item.kind, 1, 0};
  lane.Append();
  ListLane(consumer);
}

bool Poller::Flush(bool force) noexcept {
  held_passes_ = 0;
  bool moved = false;
  size_t kept = 0;
  for (size_t i = 0; i < listed_.size(); ++i) {
    uint32_t consumer = listed_[i];
    Lane& lane = *lanes_[consumer];
    // A run-to-completion consumer of this thread with nothing queued is dispatched straight
    // from the spill (DispatchHosted), unless the spill fills up: then the queue takes it.
    const bool direct =
        lane.direct && !force && !lane.spill_full() && !consumers_[consumer]->Pending();
    if (!direct) moved |= FlushOne(consumer, force);
    NoteSpill(consumer);
    if (lane.spill_empty()) {
      lane.listed = false;
    } else {
      listed_[kept++] = consumer;
    }
  }
  listed_.resize(kept);
  return moved;
}

bool Poller::FlushOne(uint32_t consumer, bool force) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.spill_empty()) return false;
  Consumer& c = *consumers_[consumer];
  const uint32_t n = lane.spill_size();
  size_t take = n;
  if (force) {
    c.Reserve(n);
  } else {
    take = c.ReserveUpTo(n);
    if (take == 0) return false;
  }
  // A run cut here must not reach into what stays (lane.h).
  if (take < n) lane.CapRunsAt(lane.published() + take);
  ChaosPoint();  // reserved, not yet handed over
  lane.Publish(static_cast<uint32_t>(take));
  c.HandedOver();
  return true;
}

void Poller::PlaceBehindLane(uint32_t consumer, Item& item) const noexcept {
  item.lane = static_cast<uint32_t>(index_);
  item.after = lanes_[consumer]->published();
}

void Poller::PushAlone(uint32_t consumer, Item& item) noexcept {
  PlaceBehindLane(consumer, item);
  consumers_[consumer]->Reserve(1);
  consumers_[consumer]->PushAlone(tokens_[consumer], item);
}

void Poller::NoteSpill(uint32_t consumer) noexcept {
  Lane& spill = *lanes_[consumer];
  uint64_t size = spill.spill_size();
  spill.depth_stat.store(size, std::memory_order_relaxed);
  if (size > spill.high_water.load(std::memory_order_relaxed)) {
    spill.high_water.store(size, std::memory_order_relaxed);
  }
  if (spill.spill_full() != spill.stalled) {  // a stall starts or ends: rare: read the clock
    Clock::time_point now = Clock::now();
    spill.stalled = spill.spill_full();
    if (spill.stalled) {
      spill.full_since = now;
      spill.stalled_since_ns.store(
          std::max<int64_t>(
              1,
              std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()),
          std::memory_order_relaxed);
      Count(spill.stalls, 1);
    } else {
      // Ended first, then the time added (release): see Lane::stalled_ns.
      spill.stalled_since_ns.store(0, std::memory_order_relaxed);
      const uint64_t stalled =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - spill.full_since).count();
      spill.stalled_ns.store(spill.stalled_ns.load(std::memory_order_relaxed) + stalled,
                             std::memory_order_release);
    }
  }
}

}  // namespace cqd::internal

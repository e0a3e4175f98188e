// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/cq_set.h"

#include <algorithm>

#include "runtime/base/chaos.h"
#include "runtime/core/shard/fused_poll.h"

namespace cqd::internal {

using Clock = std::chrono::steady_clock;

CqSet::CqSet(const RuntimeOptions& options, ShardCounters& counters, Spills& spills, Router& router,
             FenceList& fences, FusedPoll* fused)
    : options_(options),
      counters_(counters),
      spills_(spills),
      router_(router),
      fences_(fences),
      fused_(fused),
      may_park_(!options.busy_poll && options.cq_park_after.count() > 0) {}

int CqSet::Poll(int budget) noexcept {
  if (UnparkPending()) Unpark();  // parked CQs whose event came
  spills_.BeginHold();
  const int found = PollAll(budget, /*may_fuse=*/true);
  return found + spills_.EndHold(found);
}

bool CqSet::TryEnterIdle() noexcept {
  // The event thread bumps cq_events_ (seq_cst) before it wakes the shard.
  if (UnparkPending()) return false;
  ArmAll();
  // S6: completions that arrived before arming raise no event: poll once more.
  return PollAll() == 0;
}

int CqSet::PollAll(int budget, bool may_fuse) noexcept {
  int found = 0;
  size_t kept = 0;
  CqRecord* resume = nullptr;  // where the budget ran out: the next pass starts there
  Clock::time_point now{};     // read at most once per pass, by the first CQ that needs it
  in_pass_ = true;
  for (size_t i = 0; i < cqs_.size(); ++i) {
    CqRecord* cq = cqs_[i];
    if (cq == nullptr) continue;  // removed earlier in this pass
    cqs_[kept++] = cq;
    if (cq->poll_failed) continue;
    if (found >= budget) {
      if (resume == nullptr) resume = cq;
      continue;
    }
    int room = spills_.RoomFor(*cq);
    if (room == 0) {  // a consumer it shares is stalled: leave the completions in the CQ
      Count(counters_.backpressure_stalls, 1);
      continue;
    }
    room = std::min(room, budget - found);
    const int n = PollOne(cq, room, may_fuse);
    if (n < room) spills_.NoteShortPoll();  // as PollOne's own: the fused poll returns early
    if (cqs_[kept - 1] != cq) [[unlikely]] {
      // A handler's control call removed `cq` during its poll: it may be gone.
      --kept;
      if (n > 0) found += n;
      continue;
    }
    if (n != 0) {
      if (n > 0) found += n;
      cq->parking.empty_run = 0;
      continue;
    }
    if (!may_park_ || cq->solicited_only) continue;
    if (++cq->parking.empty_run <= kParkProbe) {
      if (cq->parking.empty_run == kParkProbe) {
        if (now == Clock::time_point{}) now = Clock::now();
        cq->parking.empty_since = now;
      }
      continue;
    }
    if (now == Clock::time_point{}) now = Clock::now();
    if (now - cq->parking.empty_since < options_.cq_park_after) continue;
    if (TryPark(cq)) {
      --kept;
      cq->parking.parked = true;
      parked_.push_back(cq);
      Count(counters_.parks, 1);
      SetParkedCount();
    }
  }
  in_pass_ = false;
  cqs_.resize(kept);
  // A handler's control call may have removed a CQ this pass had kept already.
  std::erase(cqs_, nullptr);
  if (resume != nullptr) {
    const auto at = std::find(cqs_.begin(), cqs_.end(), resume);
    if (at != cqs_.end()) std::rotate(cqs_.begin(), at, cqs_.end());
  }
  return found;
}

int CqSet::PollOne(CqRecord* cq, int room, bool may_fuse) noexcept {
  // Every registered QP of the CQ goes to one consumer: poll straight into its lane. A poll into
  // a lane stops at the ring's edge; the rest of `room` is polled into the ring's start, so that
  // fewer than `room` taken still means the CQ is empty (CatchUp relies on it).
  const uint32_t direct = cq->uses.size() == 1 ? cq->uses[0].consumer : kNoConsumer;
  if (may_fuse && fused_ != nullptr && direct != kNoConsumer &&
      fused_->MayFuse(*cq, direct, room)) {
    return fused_->Poll(cq, direct, room);
  }
  int taken = 0;
  for (;;) {
    int want = room - taken;
    ibv_wc* into = router_.scratch();
    if (direct != kNoConsumer) {
      Lane& lane = spills_.lane(direct);
      want = std::min<int>(want, static_cast<int>(lane.contiguous()));
      into = &lane.wc(lane.tail_at());
    }
    const int n = counters_.CountedPoll(cq, want, into, taken == 0);
    if (n == 0) break;
    if (n < 0) {
      if (taken == 0) return n;
      break;
    }
    router_.Stamp();
    if (direct != kNoConsumer) {
      router_.RouteInLane(cq, direct, n);
    } else {
      router_.RouteCompletions(cq, router_.scratch(), n);
    }
    taken += n;
    if (n < want || taken == room) break;
  }
  // Fewer than `room` taken: the CQ was found empty (fences.h's catch-ups end there).
  if (cq->fenced.catch_ups != 0 && !cq->poll_failed) fences_.Polled(cq, taken, taken < room);
  if (taken < room) spills_.NoteShortPoll();  // empty: no reason to hold
  spills_.AfterPoll(taken);
  return taken;
}

void CqSet::ArmAll() noexcept {
  arm_failed_ = false;
  for (CqRecord* cq : cqs_) {
    if (cq == nullptr) continue;  // removed in a pass (never met outside one: PollAll compacts)
    if (cq->poll_failed || cq->device->failed.load(std::memory_order_relaxed)) continue;
    if (cq->armed.load(std::memory_order_seq_cst)) continue;  // a notification is pending (S7)
    if (spills_.HeldBack(*cq)) continue;  // the consumer's freed room wakes the shard for it
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    Count(counters_.arms, 1);
    if (cq->cq->RequestNotify(cq->solicited_only) != 0) {
      // Not armed: no event will come. Clear the mark so the next sleep tries again, and sleep
      // only briefly meanwhile.
      cq->armed.store(false, std::memory_order_seq_cst);
      Count(counters_.arm_failures, 1);
      arm_failed_ = true;
    }
  }
}

bool CqSet::TryPark(CqRecord* cq) noexcept {
  cq->parking.empty_run = 0;  // whatever happens, measure afresh
  if (notifications_broken_.load(std::memory_order_relaxed) ||
      cq->device->failed.load(std::memory_order_relaxed)) {
    return false;
  }
  if (!cq->armed.load(std::memory_order_seq_cst)) {
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    Count(counters_.arms, 1);
    if (cq->cq->RequestNotify(/*solicited_only=*/false) != 0) {
      cq->armed.store(false, std::memory_order_seq_cst);
      Count(counters_.arm_failures, 1);
      return false;
    }
  }
  ChaosPoint();  // armed, not yet polled again
  // S6: a completion that came before the arm raises no event; only an empty CQ may park.
  const int room = spills_.RoomFor(*cq);
  return room > 0 && PollOne(cq, room) == 0;
}

void CqSet::Unpark() noexcept {
  seen_cq_events_ = cq_events_.load(std::memory_order_seq_cst);
  const bool all = unpark_all_.exchange(false, std::memory_order_seq_cst);
  size_t kept = 0;
  for (CqRecord* cq : parked_) {
    if (all || !cq->armed.load(std::memory_order_seq_cst)) {
      cq->parking.parked = false;
      cqs_.push_back(cq);
    } else {
      parked_[kept++] = cq;
    }
  }
  parked_.resize(kept);
  SetParkedCount();
}

void CqSet::Add(CqRecord* cq) {
  cqs_.push_back(cq);
  // Room for every CQ to park, so that parking (in PollAll) never allocates.
  parked_.reserve(cqs_.size() + parked_.size());
}

uint64_t CqSet::Remove(CqRecord* cq) {
  if (in_pass_) {
    std::replace(cqs_.begin(), cqs_.end(), cq, static_cast<CqRecord*>(nullptr));
  } else {
    std::erase(cqs_, cq);
  }
  if (cq->parking.parked) {
    std::erase(parked_, cq);
    SetParkedCount();
  }
  cq->parking.parked = false;
  cq->parking.empty_run = 0;
  if (cq->poll_failed) return 0;
  // No live registration uses it (the control path checked): everything left is an orphan.
  uint64_t taken = 0;
  ibv_wc* wcs = router_.scratch();
  for (;;) {
    const int n = cq->cq->Poll(options_.poll_batch, wcs);
    if (n <= 0) break;
    Count(cq->counts.completions, static_cast<uint64_t>(n));
    Count(counters_.completions, static_cast<uint64_t>(n));
    router_.RouteUnused(cq, wcs, n);
    taken += static_cast<uint64_t>(n);
  }
  return taken;
}

Status CqSet::Resize(CqRecord* cq, int depth) {
  const Status status = cq->cq->Resize(depth);
  // Whether a resize keeps a pending arm is the device's business: poll it again, and arm it
  // afresh before it parks or the shard sleeps (arming an armed CQ is harmless).
  if (cq->parking.parked) {
    std::erase(parked_, cq);
    SetParkedCount();
    cq->parking.parked = false;
    cqs_.push_back(cq);
  }
  cq->parking.empty_run = 0;
  cq->armed.store(false, std::memory_order_seq_cst);
  return status;
}

CqRecord* CqSet::Find(uint32_t id) noexcept {
  for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
    for (CqRecord* cq : *list) {
      if (cq != nullptr && cq->id == id) return cq;
    }
  }
  return nullptr;
}

bool CqSet::CatchUp(uint32_t id, uint64_t& polled) noexcept {
  CqRecord* cq = Find(id);
  while (cq != nullptr && !cq->poll_failed) {
    const int room = spills_.RoomFor(*cq);
    if (room == 0) return false;
    const int n = PollOne(cq, room);
    if (n > 0) polled += static_cast<uint64_t>(n);
    // Empty, or a whole depth taken: everything that was there when the event came is out.
    if (n < room || polled >= static_cast<uint64_t>(cq->cq->depth())) break;
  }
  return true;
}

void CqSet::CatchUpFences(CqRecord* cq) noexcept {
  // PollOne advances the catch-ups and ends them once it finds the CQ empty or a depth has come
  // out.
  while (cq->fenced.catch_ups != 0 && !cq->poll_failed) {
    ChaosPoint();
    const int room = spills_.RoomFor(*cq);
    if (room == 0) return;  // a consumer the CQ shares is full: later passes go on
    if (PollOne(cq, room) < 0) return;
  }
}

void CqSet::CatchUpAllFences() noexcept {
  for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
    for (CqRecord* cq : *list) {
      if (cq != nullptr && cq->fenced.catch_ups != 0) CatchUpFences(cq);
    }
  }
}

}  // namespace cqd::internal

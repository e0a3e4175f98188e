// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/poller_control.cc: the poller's control calls (poller.h): CQs taken, resized and
// removed, consumer uses, purges, fences, posted events. Each runs on the poller's thread (or
// the shard's driver) through RunSync, between two passes.
#include <algorithm>

#include "runtime/base/chaos.h"
#include "runtime/base/mutex.h"
#include "runtime/core/poller.h"
#include "runtime/core/route.h"

namespace cqd::internal {

void Poller::AddCq(CqRecord* cq) {
  RunSync([&] {
    cqs_.push_back(cq);
    // Room for every CQ to park, so that parking (in PollAll) never allocates.
    parked_.reserve(cqs_.size() + parked_.size());
  });
}

void Poller::ReturnCq(CqRecord* cq) { AddCq(cq); }

uint64_t Poller::RemoveCq(CqRecord* cq) {
  uint64_t taken = 0;
  RunSync([&] {
    std::erase(cqs_, cq);
    if (cq->parked) {
      std::erase(parked_, cq);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
    }
    cq->parked = false;
    cq->empty_run = 0;
    if (cq->poll_failed) return;
    // No live registration uses it (the control path checked): everything left is an orphan.
    for (;;) {
      int n = cq->cq->Poll(options_.poll_batch, wcs_.get());
      if (n <= 0) break;
      Count(cq->completions, n);
      Count(completions_, n);
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs_[i];
        RouteFacts facts;  // no live registration uses the CQ: nothing is known
        if (cq->awaited_markers != 0) facts.fence = fences_.Take(cq, wc);
        if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) orphans_.Take({&wc, 1});
      }
      taken += n;
    }
  });
  return taken;
}

Status Poller::ResizeCq(CqRecord* cq, int depth) {
  Status status;
  RunSync([&] {
    status = cq->cq->Resize(depth);
    // Whether a resize keeps a pending arm is the device's business: poll it again, and arm it
    // afresh before it parks or the poller sleeps (arming an armed CQ is harmless).
    if (cq->parked) {
      std::erase(parked_, cq);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
      cq->parked = false;
      cqs_.push_back(cq);
    }
    cq->empty_run = 0;
    cq->armed.store(false, std::memory_order_seq_cst);
  });
  return status;
}

void Poller::AddUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (CqRecord::Use& use : cq->uses) {
      if (use.consumer == consumer) {
        ++use.count;
        return;
      }
    }
    cq->uses.push_back({consumer, 1});
  });
}

void Poller::DropUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (size_t i = 0; i < cq->uses.size(); ++i) {
      if (cq->uses[i].consumer == consumer && --cq->uses[i].count == 0) {
        cq->uses.erase(cq->uses.begin() + i);
        return;
      }
    }
  });
}

void Poller::PurgeDead(uint32_t consumer) {
  RunSync([&] {
    auto route = [&](EntryKind kind, uint32_t slot, uint32_t generation) {
      RouteFacts facts{.kind = kind};
      if (kind != EntryKind::kListenerEvent) {  // a listener's event is nobody's registration's
        const uint64_t state = slots_.slot(slot).state.load(std::memory_order_acquire);
        facts.live = StateLiveAs(state, generation);
      }
      return Route(RouteStage::kConsumer, facts);
    };
    Lane& lane = *lanes_[consumer];
    lane.Filter([&](const EntryMeta& meta, uint32_t at) {
      const Disposal disposal = route(meta.kind, meta.slot, meta.generation);
      if (disposal == Disposal::kOrphan) orphans_.Take({&lane.wc(at), 1});
      if (disposal == Disposal::kReleaseEvent) ReleaseEventPart(lane.join(at));
      return Runs(disposal);
    });
    std::erase_if(deferred_, [&](const PostedEvent& posted) {
      const Item& item = posted.item;
      if (posted.consumer != consumer) return false;
      if (Runs(route(item.kind, item.slot, item.generation))) return false;
      ReleaseEventPart(posted.item.join);  // deferred entries are events
      return true;
    });
    NoteSpill(consumer);
    // A plain Unregister's fences catch up now that nothing is routed to the QP any more.
    for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
      for (CqRecord* cq : *list) {
        if (cq->catch_ups != 0) CatchUpFences(cq);
      }
    }
  });
}

void Poller::FenceRetired(const TeardownState* ending, uint32_t qp_num, const RetiredSide* sides,
                          int n) {
  RunSync([&] {
    // On this thread, between passes: `polled` holds every marker a pass has taken so far.
    const uint32_t posted = ending != nullptr ? ending->markers : 0;
    const uint32_t polled = ending != nullptr ? ending->polled.load(std::memory_order_relaxed) : 0;
    for (int k = 0; k < n; ++k) {
      const RetiredSide& side = sides[k];
      Fence fence;
      fence.cq = side.cq;
      fence.qp_num = qp_num;
      fence.qp = side.qp;
      fence.unfenced = side.unfenced;
      fence.commit = side.commit;
      if ((posted & side.marker_bit) != 0 && (polled & side.marker_bit) == 0) {
        fence.marker = side.marker;
      }
      fences_.Add(fence, /*catch_up=*/ending == nullptr);
    }
  });
}

bool Poller::FenceForReuse(CqRecord* cq, uint32_t qp_num, const void* in_error_qp,
                           bool retired_here) {
  bool clear = true;
  RunSync([&] {
    // A number retired here may have left completions behind after its fences ended: a catch-up
    // of its own polls them out (retired_numbers.h). One per number: an attempt refused while a
    // consumer is full leaves it running, and the next attempt waits for that one. (A fence the
    // retirement made may have begun its catch-up before the old QP's last completion, so it
    // does not stand in for this one.)
    if (!cq->poll_failed && retired_here && !fences_.HoldsForReuse(cq, qp_num)) {
      Fence catch_up;
      catch_up.cq = cq;
      catch_up.qp_num = qp_num;
      catch_up.for_reuse = true;
      fences_.Add(catch_up, /*catch_up=*/true);
    }
    if (!cq->poll_failed && fences_.Holds(cq, qp_num)) {
      fences_.AwaitMarkers(cq, qp_num, in_error_qp);
      fences_.StartCatchUps(cq, qp_num);
      CatchUpFences(cq);
      clear = !fences_.Holds(cq, qp_num);
    }
    // A CQ in error (an overflow, S11), found so before or by this catch-up, is polled no more:
    // nothing the old QP left in it can reach the new one, and waiting would never end.
    if (cq->poll_failed) clear = true;
  });
  return clear;
}

void Poller::DropFences(CqRecord* cq) {
  RunSync([&] { fences_.DropCq(cq); });
}

void Poller::SettleFences(CqRecord* cq) {
  RunSync([&] { CatchUpFences(cq); });
}

void Poller::CatchUpFences(CqRecord* cq) noexcept {
  // After Stop the lanes have been handed over for good: nothing is polled into them any more.
  if (stop_.load(std::memory_order_relaxed) || stopped_.load(std::memory_order_relaxed)) return;
  // A parked CQ is polled too (it stays parked: its next completion raises an event). PollOne
  // advances the catch-ups and ends them once it finds the CQ empty or a depth has come out.
  while (cq->catch_ups != 0 && !cq->poll_failed) {
    ChaosPoint();
    const int room = RoomFor(*cq);
    if (room == 0) return;  // a consumer the CQ shares is full: later passes go on
    if (PollOne(cq, room) < 0) return;
  }
}

bool Poller::PostEvent(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b) {
  MutexLock lock(inbox_mu_);
  if (!inbox_open_) {
    // The thread has stopped (Shutdown): nothing it polled is still held, so hand it over now.
    Item copy = item;
    PlaceBehindLane(consumer, copy);
    return consumers_[consumer]->PushIfOpen(tokens_[consumer], copy);
  }
  inbox_.push_back({consumer, item, {cq_a, cq_b}});
  inbox_pending_.store(true, std::memory_order_seq_cst);
  lock.Unlock();
  parker_.Wake();
  return true;
}

void Poller::NotificationsBroken() noexcept {
  notifications_broken_.store(true, std::memory_order_seq_cst);
  UnparkAll();
}

}  // namespace cqd::internal

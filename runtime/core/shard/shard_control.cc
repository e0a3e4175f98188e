// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/shard_control.cc: the shard's control calls (shard.h): CQs taken, resized
// and removed, consumer uses, purges, fences. Each runs on the driver through RunSync.
#include <algorithm>

#include "runtime/base/chaos.h"
#include "runtime/core/route.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {

void Shard::AddCq(CqRecord* cq) {
  RunSync([&] { cqs_.Add(cq); });
}

uint64_t Shard::RemoveCq(CqRecord* cq) {
  uint64_t taken = 0;
  RunSync([&] { taken = cqs_.Remove(cq); });
  return taken;
}

Status Shard::ResizeCq(CqRecord* cq, int depth) {
  Status status;
  RunSync([&] { status = cqs_.Resize(cq, depth); });
  return status;
}

namespace {
void NoteSoleConsumer(CqRecord* cq) {
  cq->sole_consumer.store(cq->uses.size() == 1 ? cq->uses[0].consumer : kNoSoleConsumer,
                          std::memory_order_relaxed);
}
}  // namespace

void Shard::AddUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (CqRecord::Use& use : cq->uses) {
      if (use.consumer == consumer) {
        ++use.count;
        return;
      }
    }
    cq->uses.push_back({consumer, 1});
    NoteSoleConsumer(cq);
  });
}

void Shard::DropUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (size_t i = 0; i < cq->uses.size(); ++i) {
      if (cq->uses[i].consumer == consumer && --cq->uses[i].count == 0) {
        cq->uses.erase(cq->uses.begin() + static_cast<std::ptrdiff_t>(i));
        NoteSoleConsumer(cq);
        return;
      }
    }
  });
}

void Shard::PurgeDead(uint32_t consumer) {
  RunSync([&] {
    auto route = [&](EntryKind kind, uint32_t slot, uint32_t generation) {
      return RouteEntryAtConsumer(kind, slots_, slot, generation);
    };
    Lane& lane = spills_.lane(consumer);
    OrphanSink& orphans = router_.orphans();
    lane.Filter([&](const EntryMeta& meta, uint32_t at) {
      const Disposal disposal = route(meta.kind, meta.slot, meta.generation);
      if (disposal == Disposal::kOrphan) orphans.Take({&lane.wc(at), 1});
      if (disposal == Disposal::kDropEvent) DropEventPart(lane.join(at));
      return Runs(disposal);
    });
    inbox_.Purge(consumer, [&](const Item& item) {
      return Runs(route(item.kind, item.slot, item.generation));
    });
    spills_.NoteSpill(consumer);
    // A plain Unregister's fences catch up now that nothing is routed to the QP any more (not
    // after Stop: the lanes have been handed over for good).
    if (!Stopping()) cqs_.CatchUpAllFences();
  });
}

void Shard::FenceRetired(const TeardownState* ending, uint32_t qp_num, const RetiredSide* sides,
                         int n) {
  RunSync([&] {
    // On the driver, between polls (a call made mid-pass settles the fused poll first): `polled`
    // holds every marker a poll has taken so far.
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

bool Shard::FenceForReuse(CqRecord* cq, uint32_t qp_num, const void* in_error_qp,
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
      if (!Stopping()) cqs_.CatchUpFences(cq);
      clear = !fences_.Holds(cq, qp_num);
    }
    // A CQ in error (an overflow, S11), found so before or by this catch-up, is polled no more:
    // nothing the old QP left in it can reach the new one, and waiting would never end.
    if (cq->poll_failed) clear = true;
  });
  return clear;
}

void Shard::DropFences(CqRecord* cq) {
  RunSync([&] { fences_.DropCq(cq); });
}

void Shard::SettleFences(CqRecord* cq) {
  RunSync([&] {
    if (!Stopping()) cqs_.CatchUpFences(cq);
  });
}

}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/router.h: where each completion a shard polls goes, carried out.
//
// The router gathers route.h's facts for a polled completion (the registration's slot, read once
// per run of one QP, and the CQ's fences), asks Route,
// and carries the answer out: into the destination consumer's lane (Spills), to the orphan sink,
// or taken by a fence. It alone reads a registration's destination consumer and liveness on the
// poll path (StateConsumer, StateLive). Three paths share its decisions:
//
//   - RouteInLane: a CQ whose registered QPs all go to one consumer is polled straight into that
//     consumer's lane; a run of one QP's completions costs one state read (RouteRun), and its
//     entries stay where the poll put them. Anything else (a CQ awaiting a retired QP's marker, a
//     QP being torn down, a completion for another consumer) finishes on the general path.
//   - RouteCompletions, the general path: each completion is classified (Classify) and copied
//     once into its lane. The route of the last QP classified is kept (RouteCache) and reused for
//     its next completions in the same poll; a torn-down QP's are each looked at (any may be its
//     marker).
//   - the fused poll (fused_poll.h) asks RouteRun for each run before it calls the handler.
//
// Threading: the shard's driver only.
#ifndef CQD_RUNTIME_CORE_SHARD_ROUTER_H_
#define CQD_RUNTIME_CORE_SHARD_ROUTER_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "runtime/core/fences.h"
#include "runtime/core/lane.h"
#include "runtime/core/orphans.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"
#include "runtime/core/route.h"
#include "runtime/core/shard/spills.h"
#include "runtime/observe/latency.h"

namespace cqd::internal {

class Router {
 public:
  // `stamp`: some consumer records latency (each completion's EntryMeta carries its poll time).
  Router(int poll_batch, bool stamp, FenceList& fences, OrphanSink& orphans, Spills& spills);
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // The poll that is about to be routed happened now (for latency, when recorded).
  void Stamp() noexcept {
    if (stamp_) poll_stamp_ = NowNs32();
  }
  OrphanSink& orphans() noexcept { return orphans_; }
  // Scratch for a poll of a CQ shared by consumers: poll_batch completions.
  ibv_wc* scratch() noexcept { return scratch_.get(); }

  // Routes the `n` completions just polled into `consumer`'s lane at its tail, in place.
  void RouteInLane(CqRecord* cq, uint32_t consumer, int n) noexcept;
  // Routes wcs[0, n), copying each into its lane.
  void RouteCompletions(CqRecord* cq, const ibv_wc* wcs, int n) noexcept;
  // Routes what a CQ no live registration uses still holds (RemoveCq): fenced markers are taken,
  // the rest goes to the orphan sink.
  void RouteUnused(CqRecord* cq, const ibv_wc* wcs, int n) noexcept;

  // The decision for a run of one QP's completions polled from `cq` for `consumer`, the fast
  // paths' (in place, fused). `slot` is the QP's lookup, its state read (acquire; the fused poll
  // entered the handler call before it, Consumer::EnterCall) into `state`. kStays: routed
  // to `consumer`; kOrphan: nobody may take them; kEachAlone: a torn-down QP's (any may be its
  // marker) or another consumer's: the general path looks at each, from the first on.
  enum class RunRoute : uint8_t { kStays, kOrphan, kEachAlone };
  RunRoute RouteRun(const CqRecord& cq, uint32_t qp_num, const Slot* slot, uint32_t consumer,
                    uint64_t& state) const noexcept {
    RouteFacts facts;
    state = 0;
    if (slot != nullptr) {
      state = slot->state.load(std::memory_order_acquire);
      ReadSlotFacts(cq, qp_num, *slot, state, facts);
    }
    switch (Route(RouteStage::kPoll, facts)) {
      case Disposal::kOrphan:
        return RunRoute::kOrphan;
      case Disposal::kDeliver:
        if (facts.tearing_down || StateConsumer(state) != consumer) [[unlikely]]
          return RunRoute::kEachAlone;
        return RunRoute::kStays;
      case Disposal::kNoteMarker:  // never without facts.tearing_down
      case Disposal::kFenceTaken:  // no fence was asked (the caller's CQ awaits no marker)
      case Disposal::kDropEvent:   // never at the poll (route_test)
      case Disposal::kDropMarker:
      case Disposal::kToFallback:
      case Disposal::kUnaffected:
        return RunRoute::kEachAlone;
    }
    return RunRoute::kEachAlone;
  }

 private:
  // Where a polled completion goes besides a consumer's index.
  static constexpr uint32_t kOrphan = ~uint32_t{0};
  static constexpr uint32_t kTaken = ~uint32_t{0} - 1;  // a retired QP's marker, its fence's
  static constexpr uint32_t kNoConsumer = ~uint32_t{0} - 2;
  static constexpr uint32_t kNoQp = ~uint32_t{0};  // qp_num has 24 bits
  // The route of the last QP classified in one poll, reused for its next completions there.
  struct RouteCache {
    uint32_t qp_num = kNoQp;
    uint32_t consumer = kNoConsumer;
    EntryMeta meta{};
  };
  // The poll's facts about `slot`, found for `qp_num` on `cq`'s device, whose state the caller
  // read as `state` before this reads the slot's other fields.
  static void ReadSlotFacts(const CqRecord& cq, uint32_t qp_num, const Slot& slot, uint64_t state,
                            RouteFacts& facts) noexcept {
    facts.known = slot.Holds(cq.device->id, qp_num);
    facts.live = StateLive(state);
    facts.uses_cq = slot.Uses(cq.id);
    facts.tearing_down = StateTearingDown(state);
  }
  // Looks up the slots of wcs[0, n) into batch_slots_, prefetching them.
  void LookUpBatch(CqRecord* cq, const ibv_wc* wcs, int n) noexcept;
  // Returns where `wc` (polled from `cq`, `slot` its lookup) goes, as Route (route.h) decides:
  // a consumer's index (and sets `meta`), kOrphan or kTaken.
  uint32_t Classify(CqRecord* cq, const ibv_wc& wc, const Slot* slot, RouteCache& cache,
                    EntryMeta& meta) noexcept;

  FenceList& fences_;
  OrphanSink& orphans_;
  Spills& spills_;
  const bool stamp_;
  uint32_t poll_stamp_ = 0;
  std::unique_ptr<ibv_wc[]> scratch_;
  std::unique_ptr<const Slot*[]> batch_slots_;  // LookUpBatch's result for the poll routed
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_ROUTER_H_

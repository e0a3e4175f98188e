// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/route.h: what becomes of every entry the runtime holds, decided in one function.
//
// An entry (a polled completion, a teardown marker, an event part) meets a decision three times
// at most: when a poller takes it off a CQ, when its consumer is about to run it (or a purge
// sorts a spill), and when no consumer is left to run it (Shutdown). Route() is that decision
// for all three; the callers gather the facts and carry out the answer, and none of them decides
// anything else. The table, in words:
//
//   at the poll       a marker its fence awaits             -> kFenceTaken
//                     a retired QP's, behind such a marker  -> kOrphan
//                     unknown qp_num, dead registration, or
//                     a CQ the registration does not use    -> kOrphan
//                     a torn-down QP's own teardown marker  -> kNoteMarker (to its consumer)
//                     anything else                         -> kDeliver (to its consumer)
//   at the consumer   live with the entry's generation: completion, event -> kDeliver;
//                     marker -> kNoteMarker; a listener's event is nobody's -> kDeliver
//                     otherwise: completion -> kOrphan, event -> kDropEvent,
//                     marker -> kDropMarker
//   no consumer left  completion -> kOrphan, event -> kDropEvent, marker -> kDropMarker
//
// A completion goes to a handler only if its registration was live at the poll and is still
// live with the same generation when its consumer runs it; a retired QP's completion can pass
// neither check while its fences stand (fences.h), and a new QP with its number is registered
// only once they are over (Shard::FenceForReuse). A teardown marker never reaches a handler or
// the OrphanHandler.
//
// Threading: Route is a pure function of its arguments; any thread may call it. The facts are
// the caller's reads (fences.h and registry.h say which thread may make them and with which
// order).
#ifndef CQD_RUNTIME_CORE_ROUTE_H_
#define CQD_RUNTIME_CORE_ROUTE_H_

#include <cstdint>

#include "runtime/core/fences.h"
#include "runtime/core/lane.h"

namespace cqd::internal {

enum class Disposal : uint8_t {
  kDeliver,     // to the registration's handler (a listener event: its channel's CmHandler)
  kNoteMarker,  // a marker of a QP being torn down: its consumer tells the teardown thread
  kFenceTaken,  // a retired QP's marker that its fence awaited: the runtime's own, dropped
  kOrphan,      // a completion no handler may take: the OrphanHandler
  kDropEvent,   // an event part nobody will deliver: released (its join may end)
  kDropMarker,  // a teardown marker whose teardown is over: the runtime's own, dropped
};

enum class RouteStage : uint8_t {
  kPoll,        // a poller has just taken a completion off a CQ
  kConsumer,    // the consumer is about to run the entry, or a purge sorts a spill
  kNoConsumer,  // nobody will run the entry (Shutdown's leftovers, a queue being destroyed)
};

// What the caller read. At kPoll `kind` is kCompletion (whether it is a marker is the
// decision's); at the consumer only `kind` and `live` count.
struct RouteFacts {
  EntryKind kind = EntryKind::kCompletion;
  FenceList::Taken fence = FenceList::Taken::kNotFenced;  // kPoll: the CQ's fences' verdict
  bool known = false;         // kPoll: a registration holds the qp_num on the CQ's device
  bool live = false;          // its state is live (at the consumer: with the entry's generation)
  bool uses_cq = false;       // kPoll: the registration's QP has the CQ as a send or receive CQ
  bool tearing_down = false;  // kPoll: its teardown is under way
  bool is_marker = false;     // kPoll: the wr_id is one of its teardown's markers
};

// Returns what becomes of the entry.
constexpr Disposal Route(RouteStage stage, const RouteFacts& f) noexcept {
  using Taken = FenceList::Taken;
  if (stage == RouteStage::kPoll) {
    if (f.fence == Taken::kMarker) return Disposal::kFenceTaken;
    if (f.fence == Taken::kBehindMarker) return Disposal::kOrphan;
    if (!f.known || !f.live || !f.uses_cq) return Disposal::kOrphan;
    return f.tearing_down && f.is_marker ? Disposal::kNoteMarker : Disposal::kDeliver;
  }
  const bool runs =
      stage == RouteStage::kConsumer && (f.live || f.kind == EntryKind::kListenerEvent);
  switch (f.kind) {
    case EntryKind::kCompletion:
      return runs ? Disposal::kDeliver : Disposal::kOrphan;
    case EntryKind::kTeardownMarker:
      return runs ? Disposal::kNoteMarker : Disposal::kDropMarker;
    case EntryKind::kEventPart:
    case EntryKind::kListenerEvent:
      return runs ? Disposal::kDeliver : Disposal::kDropEvent;
  }
  return Disposal::kDropMarker;  // unreachable: every kind is handled above
}

// True when the entry stays for a consumer to run.
constexpr bool Runs(Disposal d) noexcept {
  return d == Disposal::kDeliver || d == Disposal::kNoteMarker;
}

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_ROUTE_H_

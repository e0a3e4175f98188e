// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/route.h: what becomes of every entry the runtime holds, decided in one function.
//
// An entry (a polled completion, a teardown marker, an event part) meets a decision three times
// at most: when a poller takes it off a CQ, when its consumer is about to run it (or a purge
// sorts a spill), and when no consumer is left to run it (Shutdown). An async event meets one
// on the event thread: a QP's goes to the QP's consumer or to its device's handler, and a
// device-wide one (DEVICE_FATAL, CQ_ERR) is fanned out to each registration it takes down.
// Route() is every one of these decisions; the callers carry out the answer and decide nothing
// else. The table, in words:
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
//   a QP's event      a live registration holds the number on the device -> kDeliver (as
//                     event parts, along its shards); otherwise -> kToFallback (the device's
//                     DeviceEventHandler; a CM event: its channel's CmHandler)
//   a device's event  a live registration on the device, using the failed CQ (CQ_ERR) or any
//                     (DEVICE_FATAL) -> kDeliver (its copy, as a QP's event); else kUnaffected
//
// A completion goes to a handler only if its registration was live at the poll and is still
// live with the same generation when its consumer runs it; a retired QP's completion can pass
// neither check while its fences stand (fences.h), and a new QP with its number is registered
// only once they are over (Shard::FenceForReuse). A teardown marker never reaches a handler or
// the OrphanHandler.
//
// Gathering the facts: a registration's state word (Slot::state, registry.h) is read for routing
// here and in the shard's Router (shard/router.h) only, once per decision, with the memory order
// named at that one site: acquire where no handler of a batch may be running on the caller's
// thread (the poll's general and in-lane paths, async events: the slot's other fields are
// published by the word), seq_cst where one may be or a wait for one pairs with it (the consumer,
// RouteAtConsumer, which CM bindings use too; the fused poll). The control path keeps its own
// copy of what it published (Slot::control).
//
// Threading: Route is a pure function of its arguments; any thread may call it, and the readers
// below too (a slot is never freed, registry.h). The fences' verdict is the poller's (fences.h).
#ifndef CQD_RUNTIME_CORE_ROUTE_H_
#define CQD_RUNTIME_CORE_ROUTE_H_

#include <atomic>
#include <cstdint>

#include "runtime/core/fences.h"
#include "runtime/core/lane.h"
#include "runtime/core/registry.h"

namespace cqd::internal {

enum class Disposal : uint8_t {
  kDeliver,     // to the registration's handler (a listener event: its channel's CmHandler)
  kNoteMarker,  // a marker of a QP being torn down: its consumer tells the teardown thread
  kFenceTaken,  // a retired QP's marker that its fence awaited: the runtime's own, dropped
  kOrphan,      // a completion no handler may take: the OrphanHandler
  kDropEvent,   // an event part nobody will deliver: released (its join may end)
  kDropMarker,  // a teardown marker whose teardown is over: the runtime's own, dropped
  kToFallback,  // an event no registration takes: its device's handler (a CM event: its channel's)
  kUnaffected,  // a device's event that does not take this registration down: nothing to do
};

enum class RouteStage : uint8_t {
  kPoll,         // a poller has just taken a completion off a CQ
  kConsumer,     // the consumer is about to run the entry, or a purge sorts a spill
  kNoConsumer,   // nobody will run the entry (Shutdown's leftovers, a queue being destroyed)
  kQpEvent,      // the event thread has read an async event naming a QP (or a CM event's bind)
  kDeviceEvent,  // the event thread fans a device-wide event out: one registration at a time
};

// What the caller read. At kPoll `kind` is kCompletion (whether it is a marker is the
// decision's); at the consumer only `kind` and `live` count; for a QP's event `known` and
// `live`; for a device's event `known` (the registration is on that device), `live` and
// `uses_cq` (it uses the failed CQ; true for DEVICE_FATAL).
struct RouteFacts {
  EntryKind kind = EntryKind::kCompletion;
  FenceList::Taken fence = FenceList::Taken::kNotFenced;  // kPoll: the CQ's fences' verdict
  bool known = false;         // a registration holds the qp_num on the CQ's (event's) device
  bool live = false;          // its state is live (at the consumer: with the entry's generation)
  bool uses_cq = false;       // the registration's QP has the CQ as a send or receive CQ
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
  if (stage == RouteStage::kQpEvent) {
    return f.known && f.live ? Disposal::kDeliver : Disposal::kToFallback;
  }
  if (stage == RouteStage::kDeviceEvent) {
    return f.known && f.live && f.uses_cq ? Disposal::kDeliver : Disposal::kUnaffected;
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

// ---- The facts: a registration's state word, read ----

// Slot::state as MakeState (registry.h) packed it.
inline constexpr bool StateLive(uint64_t s) { return s & 1; }
inline constexpr bool StateTearingDown(uint64_t s) { return s & 2; }
inline constexpr uint32_t StateGeneration(uint64_t s) { return static_cast<uint32_t>(s >> 32); }
// Returns true if `s` is a live registration of `generation` (the one an item was routed to).
inline constexpr bool StateLiveAs(uint64_t s, uint32_t generation) {
  return StateLive(s) && StateGeneration(s) == generation;
}
inline constexpr uint32_t StateConsumer(uint64_t s) {
  return static_cast<uint32_t>(s >> 2) & 0x3fffffff;
}

// Where the parts of an event of one registration go: the registration as routed (its slot,
// generation and consumer) and the shards and CQs of its send and receive queues.
struct EventRoute {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t consumer = 0;
  int send_shard = 0, recv_shard = 0;
  uint32_t send_cq = 0, recv_cq = 0;
};

// Stage kConsumer: returns what becomes of an entry of `kind` routed to (slot, generation), as
// of now; sets `*tearing_down` (if given) to whether that registration is being torn down.
// Acquire: the handler a live state published is read after it. A consumer about to call the
// handler entered the call first (Consumer::EnterCall), which is what Unregister's wait pairs with.
inline Disposal RouteAtConsumer(EntryKind kind, const Slot& slot, uint32_t generation,
                                bool* tearing_down = nullptr) noexcept {
  RouteFacts facts{.kind = kind};
  if (kind != EntryKind::kListenerEvent) {  // a listener's event is nobody's registration's
    const uint64_t state = slot.state.load(std::memory_order_acquire);
    facts.live = StateLiveAs(state, generation);
    if (tearing_down != nullptr) *tearing_down = StateTearingDown(state);
  }
  return Route(RouteStage::kConsumer, facts);
}

// As RouteAtConsumer, for an entry that names its registration by slot index: a listener's event
// names none (kNoSlot), so the pool is read only for the other kinds.
inline Disposal RouteEntryAtConsumer(EntryKind kind, const SlotPool& slots, uint32_t slot,
                                     uint32_t generation) noexcept {
  if (kind == EntryKind::kListenerEvent) return Route(RouteStage::kConsumer, {.kind = kind});
  return RouteAtConsumer(kind, slots.slot(slot), generation);
}

// A QP's event routed (stage kQpEvent).
struct QpEventTarget {
  Disposal disposal = Disposal::kToFallback;  // kDeliver: along `route`
  EventRoute route;                           // set when kDeliver
  bool tearing_down = false;                  // the registration's teardown is under way
};

// Stage kQpEvent: returns where an event of (device, qp_num) goes, `slot` being the slot at
// `index` its lookup found (or the slot a CM id was bound to: then `generation` is the bound
// one, and another generation is not the bound registration). Acquire: the slot's other fields
// are read after the state that published them.
inline QpEventTarget RouteQpEvent(const Slot& slot, uint32_t index, uint32_t device,
                                  uint32_t qp_num, const uint32_t* generation = nullptr) noexcept {
  const uint64_t state = slot.state.load(std::memory_order_acquire);
  const bool live = generation != nullptr ? StateLiveAs(state, *generation) : StateLive(state);
  QpEventTarget target;
  target.disposal =
      Route(RouteStage::kQpEvent, {.known = slot.Holds(device, qp_num), .live = live});
  if (target.disposal != Disposal::kDeliver) return target;
  target.tearing_down = StateTearingDown(state);
  EventRoute& r = target.route;
  r.slot = index;
  r.generation = StateGeneration(state);
  r.consumer = StateConsumer(state);
  r.send_shard = slot.send_shard.load(std::memory_order_relaxed);
  r.recv_shard = slot.recv_shard.load(std::memory_order_relaxed);
  r.send_cq = slot.send_cq.load(std::memory_order_relaxed);
  r.recv_cq = slot.recv_cq.load(std::memory_order_relaxed);
  return target;
}

// Stage kDeviceEvent: returns kDeliver if the event of `device` (DEVICE_FATAL when `fatal`, else
// CQ_ERR of CQ `cq_id`, 0 if the CQ is not known) takes down the registration in `slot`, else
// kUnaffected. Acquire, as RouteQpEvent.
inline Disposal RouteDeviceEvent(const Slot& slot, uint32_t device, bool fatal,
                                 uint32_t cq_id) noexcept {
  const uint64_t state = slot.state.load(std::memory_order_acquire);
  const RouteFacts facts{.known = slot.device.load(std::memory_order_relaxed) == device,
                         .live = StateLive(state),
                         .uses_cq = fatal || (cq_id != 0 && slot.Uses(cq_id))};
  return Route(RouteStage::kDeviceEvent, facts);
}

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_ROUTE_H_

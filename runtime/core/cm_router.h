// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/cm_router.h: connection-manager (librdmacm) events, read on the event thread and
// routed.
//
// The event loop epolls each watched rdma_event_channel and calls Read when it is readable.
// Read copies each event into an EventJoin (CmEvent), acks it at once (so the engine's
// rdma_destroy_id never waits for the runtime), and routes it:
//   - the id is bound (RegisterQp(rdma_cm_id*)) and its registration is live: to that QP's
//     consumer through the shards of its CQs, like an async event (so it arrives after every
//     completion that was in those CQs when it was read, and after the id's earlier events);
//   - otherwise: to the channel's CmHandler on its consumer, through shard 0 (no catch-up).
//
// One rule for handing on (CmBinding): an id's events leave in the order they were read,
// whatever ends their registration. The binding lists the events routed to it that have not
// left. An event leaves when its consumer delivers it to the QP's handler (the registration is
// live when the consumer reaches it) or when it is handed on to the CmHandler. The binding ends
// at the first of: Unregister or a teardown's end (Retire calls Ended), a consumer or a purge
// finding the registration gone, the event thread finding it gone. Ending hands on every event
// still listed, in read order, at once: wherever their parts wait (a stalled consumer's queue, a
// shard's spill), those parts no longer carry them, so a consumer that never drains again holds
// no connection event of a QP it no longer serves. Only a delivery to the QP's handler under way
// holds the hand-on back until that handler returns. An ended binding routes nothing: its id's
// later events go to the CmHandler behind those handed on, and a new id at the same address is
// never routed by it (CONNECT_REQUEST and address and route resolution, which come before an
// engine registers an id, never go through a binding). Order is per handler: an id registered
// again may have its new QP handler see events before the CmHandler got the old ones.
//
// A handler is never entered twice at once: the CmHandler runs on its consumer; once that
// consumer has closed (an owned consumer after Shutdown), events handed on to it wait in
// HeldEvents and run on a thread that handed one on, holding no runtime lock and outside any
// dispatch batch (Consumer::DeliverHeldEvents once its outermost batch is over; Unregister and
// RegisterQp once they let go of the control mutex, or, called from a handler, after its
// batch), one thread at a time, in the order they were handed on.
//
// Bounds: each watch counts its events from read to delivery (EventJoin::Finish); at `limit`
// (the CmHandler consumer's queue_capacity + spill_capacity) the event loop stops reading the
// channel until the count falls, so the kernel holds the rest. Events handed on leave the count
// when the CmHandler gets them; so what a stalled consumer held for QPs it no longer serves stops
// counting as soon as a live consumer has delivered it.
//
// Threading: CmRouter belongs to the event thread (other threads reach it through
// EventLoop::RunSync), except Ended and held(), which any thread may call. CmWatch records live
// as long as the runtime, because joins in flight point at them; their fields are fixed once
// made except `unfinished`. A CmBinding's list and flags are guarded by its lock, which is held
// only to post (never to run a handler): lock order is binding, then a shard's inbox, then a
// consumer's close lock, then HeldEvents.
#ifndef CQD_RUNTIME_CORE_CM_ROUTER_H_
#define CQD_RUNTIME_CORE_CM_ROUTER_H_

#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cqd/handler.h"
#include "runtime/base/mutex.h"
#include "runtime/core/event_join.h"
#include "runtime/core/registry.h"

namespace cqd::internal {

class Shard;

// An id's binding to the registration it was registered with, and the events routed to that
// registration that have not left yet (see above).
class CmBinding final : public CmEventGate {
 public:
  CmBinding(const EventRoute& route, uint32_t qp_num) : route_(route), qp_num_(qp_num) {}
  CmBinding(const CmBinding&) = delete;
  CmBinding& operator=(const CmBinding&) = delete;

  const EventRoute& route() const { return route_; }

  enum class Admission { kRouted, kWaiting, kEnded };
  // Event thread: `join` was read for this binding's id. kRouted: the registration is live; the
  // join is listed (kind kCm; holds: the list's and the route's) and the caller posts it along
  // route(). kWaiting: the binding has ended but events before it still wait for a delivery under
  // way; it is listed and will be handed on behind them. kEnded: the caller hands it on itself (and
  // may forget the binding).
  Admission Admit(EventJoin* join, const std::shared_ptr<CmBinding>& self, const SlotPool& slots);
  // CmEventGate (event_join.h). kDone also when the binding ends now: the join is handed on
  // with every other event listed, or stays listed until the delivery under way returns.
  Arrival Arrived(EventJoin* join, const Slot* slot) noexcept override;
  void Delivered() noexcept override;
  void Drop(EventJoin* join) noexcept override;
  // Any thread: the registration ended. Hands on every event listed, now or once the delivery
  // under way returns. Returns true if nothing waits (the binding may be forgotten).
  bool End() noexcept;

 private:
  bool LiveIn(const Slot& slot) const noexcept;
  void Unlink(EventJoin* join) noexcept CQD_REQUIRES(mu_);
  void EndLocked() noexcept CQD_REQUIRES(mu_);

  const EventRoute route_;
  const uint32_t qp_num_;
  Mutex mu_;
  EventJoin* first_ CQD_GUARDED_BY(mu_) = nullptr;  // listed events, read order, linked by `next`
  EventJoin* last_ CQD_GUARDED_BY(mu_) = nullptr;
  bool ended_ CQD_GUARDED_BY(mu_) = false;
  bool delivering_ CQD_GUARDED_BY(mu_) = false;   // a consumer is in the QP handler with an event
  bool end_pending_ CQD_GUARDED_BY(mu_) = false;  // End waits for that delivery
};

class CmRouter {
 public:
  CmRouter(const SlotPool& slots, const std::vector<Shard*>& pollers)
      : slots_(slots), pollers_(pollers) {}
  ~CmRouter() { held_.DropAll(); }

  // Event thread. Returns a new watch of `channel` (owned here until the runtime goes).
  CmWatch* AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer,
                    int64_t limit);
  // Event thread. Routes the events of `id` to the registration (slot, generation) from now on;
  // false if memory ran out. An id bound again ends its old binding first; if that one still
  // waits for its QP handler's delivery under way (the handler re-registers the id), the events
  // it lists reach the CmHandler after that handler returns, and may come after events read
  // later and routed to the new registration.
  bool Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation) noexcept;
  // Any thread (Retire, with the registration already dead): ends the registration's binding,
  // if it has one. Does not run handlers.
  void Ended(uint32_t slot, uint32_t generation) noexcept;
  enum class ReadResult { kEmpty, kFull, kBroken };
  // Event thread. Reads and routes `watch`'s events until the channel is empty (kEmpty), the
  // watch's limit is reached (kFull: read again once it is below), or reading failed with
  // anything but EAGAIN/EINTR (kBroken: unwatch it).
  ReadResult Read(CmWatch& watch);
  // Event thread: routes `join`, an event read from join->watch and counted there (Read's
  // second half; tests route made-up events with it).
  void RouteEvent(EventJoin* join);

  HeldEvents& held() { return held_; }
  uint64_t events() const { return events_.load(std::memory_order_relaxed); }

 private:
  const SlotPool& slots_;
  const std::vector<Shard*>& pollers_;
  HeldEvents held_;
  std::vector<std::unique_ptr<CmWatch>> watches_;
  // Ids of registrations; ended ones are dropped when met, or when the map has doubled since
  // the last sweep.
  std::unordered_map<rdma_cm_id*, std::shared_ptr<CmBinding>> bindings_;
  size_t sweep_at_ = 64;
  // Slot -> the binding of its registration, for Ended (any thread).
  Mutex by_slot_mu_;
  std::unordered_map<uint32_t, std::shared_ptr<CmBinding>> by_slot_ CQD_GUARDED_BY(by_slot_mu_);
  std::atomic<uint64_t> events_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CM_ROUTER_H_

// runtime/cm_router.h: connection-manager (librdmacm) events, read on the event thread and routed.
//
// The event loop epolls each watched rdma_event_channel and calls Drain when it is readable.
// Drain copies each event into an EventJoin (CmEvent), acks it at once (so the engine's
// rdma_destroy_id never waits for the runtime), and routes it:
//   - the id is bound (RegisterQp(rdma_cm_id*)) and its registration is live, or events of it
//     are still on their way there: to that QP's consumer through the pollers of its CQs, like
//     an async event (so it arrives after every completion that was in those CQs when it was
//     read, and after the id's earlier events);
//   - otherwise: to the channel's CmHandler on its consumer, through poller 0 (no catch-up).
// The consumer delivers a bound event to the QP handler if the registration is still live, and
// otherwise hands it on to the CmHandler (HandOnOrDelete), in the order it dequeues them; while
// any event of a binding is on its way, later ones follow the same road, so the CmHandler sees
// one id's events in the order they were read. None is dropped before the runtime is destroyed:
// once an owned consumer has closed at Shutdown, an event for its CmHandler runs on the thread
// that hands it on.
//
// Bounds: each watch counts its events from read to delivery (EventJoin's destructor ends the
// count); at `limit` (the CmHandler consumer's queue_capacity + spill_capacity) the event loop
// stops reading the channel until the count falls, so the kernel holds the rest.
//
// Threading: CmRouter belongs to the event thread (other threads reach it through
// EventLoop::RunSync). CmWatch records live as long as the runtime, because joins in flight point
// at them; their fields are fixed once made except `unfinished`. CmBinding records are shared
// with joins in flight; their fields are fixed except `in_flight`.
#ifndef CQD_RUNTIME_CM_ROUTER_H_
#define CQD_RUNTIME_CM_ROUTER_H_

#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cqd/handler.h"
#include "cqd/runtime.h"
#include "runtime/consumer.h"
#include "runtime/event_route.h"
#include "runtime/registry.h"

namespace cqd::internal {

class Poller;

struct CmWatch {
  rdma_event_channel* channel = nullptr;
  CmHandler* handler = nullptr;
  uint32_t consumer = 0;
  Poller* poller = nullptr;  // listener events travel through it
  int64_t limit = 0;         // events read and not yet delivered, at most
  std::atomic<int64_t> unfinished{0};
};

// A registration an id was bound to, with the road its events take (copied at bind time, so
// that events can follow it after the slot was freed or reused).
struct CmBinding {
  EventRoute route;
  uint32_t qp_num = 0;
  // Events routed to this registration and not yet delivered or handed on.
  std::atomic<int> in_flight{0};
};

// Any runtime thread: `join` (its last part released, its registration gone) goes to its
// channel's CmHandler if it is a CM event, and is deleted otherwise.
void HandOnOrDelete(EventJoin* join) noexcept;

class CmRouter {
 public:
  CmRouter(const SlotPool& slots, const std::vector<Poller*>& pollers)
      : slots_(slots), pollers_(pollers) {}

  // Event thread. Returns a new watch of `channel` (owned here until the runtime goes).
  CmWatch* AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer,
                    int64_t limit);
  // Event thread. Routes the events of `id` to the registration (slot, generation) from now on;
  // false if memory ran out (nothing changed).
  bool Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation) noexcept;
  enum class DrainResult { kEmpty, kFull, kBroken };
  // Event thread. Reads and routes `watch`'s events until the channel is empty (kEmpty), the
  // watch's limit is reached (kFull: read again once it is below), or reading failed with
  // anything but EAGAIN/EINTR (kBroken: unwatch it).
  DrainResult Drain(CmWatch& watch);

  uint64_t events() const { return events_.load(std::memory_order_relaxed); }

 private:
  bool Live(const CmBinding& binding) const;
  void Route(EventJoin* join);

  const SlotPool& slots_;
  const std::vector<Poller*>& pollers_;
  std::vector<std::unique_ptr<CmWatch>> watches_;
  // Ids of registrations; ended ones are dropped when met with nothing in flight, or when the
  // map has doubled since the last sweep.
  std::unordered_map<rdma_cm_id*, std::shared_ptr<CmBinding>> bindings_;
  size_t sweep_at_ = 64;
  std::atomic<uint64_t> events_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CM_ROUTER_H_

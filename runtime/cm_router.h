// runtime/cm_router.h: connection-manager (librdmacm) events, read on the event thread and routed.
//
// The event loop epolls each watched rdma_event_channel and calls Drain when it is readable.
// Drain copies each event into an EventJoin (CmEvent), acks it at once (so the engine's
// rdma_destroy_id never waits for the runtime), and routes it:
//   - the id is bound to a live registration (RegisterQp(rdma_cm_id*)): to that QP's handler,
//     through the pollers of its CQs like an async event (PostJoin in event_loop.h), so it
//     arrives after every completion that was in those CQs when it was read;
//   - otherwise: to the channel's CmHandler on its consumer, through poller 0 (no catch-up).
// A CM event that finds its registration gone on the way (unregistered after it was read) is
// handed on to the CmHandler by whoever releases its last part (HandOnOrDelete), so none is lost.
//
// Threading: CmRouter belongs to the event thread (other threads reach it through
// EventLoop::RunSync). CmWatch records are immutable once made and live as long as the runtime,
// because joins in flight point at them; HandOnOrDelete may run on any runtime thread.
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
#include "runtime/registry.h"

namespace cqd::internal {

class Poller;

struct CmWatch {
  rdma_event_channel* channel = nullptr;
  CmHandler* handler = nullptr;
  uint32_t consumer = 0;
  Poller* poller = nullptr;  // listener events travel through it
};

// Any runtime thread: `join` (its last part released, its registration gone) goes to its
// channel's CmHandler if it is a CM event, and is deleted otherwise.
void HandOnOrDelete(EventJoin* join) noexcept;

class CmRouter {
 public:
  CmRouter(const SlotPool& slots, const std::vector<Poller*>& pollers)
      : slots_(slots), pollers_(pollers) {}

  // Event thread. Returns a new watch of `channel` (owned here until the runtime goes).
  CmWatch* AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer);
  // Event thread. Routes the events of `id` to the registration (slot, generation) from now on.
  void Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation, uint32_t qp_num,
            DeviceId device);
  // Event thread. Reads and routes `watch`'s events until the channel is empty; returns false if
  // reading failed with anything but EAGAIN/EINTR (the channel should be unwatched).
  bool Drain(const CmWatch& watch);

  uint64_t events() const { return events_.load(std::memory_order_relaxed); }

 private:
  struct Binding {
    uint32_t slot;
    uint32_t generation;
    uint32_t qp_num;
    DeviceId device;
  };
  bool Live(const Binding& binding) const;
  void Route(EventJoin* join);

  const SlotPool& slots_;
  const std::vector<Poller*>& pollers_;
  std::vector<std::unique_ptr<CmWatch>> watches_;
  // Ids of registrations, live or ended; ended ones are dropped when met or when the map has
  // doubled since the last sweep.
  std::unordered_map<rdma_cm_id*, Binding> bindings_;
  size_t sweep_at_ = 64;
  std::atomic<uint64_t> events_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CM_ROUTER_H_

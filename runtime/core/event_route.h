// runtime/core/event_route.h: how an event reaches one registration's consumer behind its completions.
//
// An event of a registration (async, teardown fence, or rdma_cm) travels as one part per poller
// of the registration's CQs (EventJoin, consumer.h); each poller first takes what is in those
// CQs, so the consumer, which delivers the event when it has every part, gets it after them.
#ifndef CQD_RUNTIME_CORE_EVENT_ROUTE_H_
#define CQD_RUNTIME_CORE_EVENT_ROUTE_H_

#include <cstdint>
#include <vector>

#include "cqd/handler.h"
#include "cqd/types.h"
#include "runtime/core/consumer.h"
#include "runtime/core/registry.h"

namespace cqd::internal {

class Poller;

// Where the parts of an event of one registration go: the registration as routed (its slot,
// generation and consumer) and the shards and CQs of its send and receive queues.
struct EventRoute {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t consumer = 0;
  int send_shard = 0, recv_shard = 0;
  uint32_t send_cq = 0, recv_cq = 0;
};

// Returns the route of `slot` as its `state` (loaded by the caller) names it.
EventRoute RouteOf(const Slot& slot, uint32_t index, uint64_t state);

// Posts `join` (parts unset) along `route`: one part per shard, each behind what that poller
// takes off the route's CQs first (see poller.h). The consumer delivers it if the registration
// is still the routed one, and otherwise releases it (a CM event's binding hands it on to the
// CmHandler, cm_router.h). A part a closed consumer
// refuses (after Shutdown) is released at once. Any thread.
void PostAlong(const EventRoute& route, EventJoin* join, const std::vector<Poller*>& pollers);

// Posts an async event (or, with `fence`, a teardown's fence: the consumer only notes it for the
// slot's teardown, see teardown.h) along the route of the live registration of event.qp_num on
// `device` in `slot`; false if there is none, or memory ran out. Any thread.
bool PostQpEvent(const SlotPool& slots, const std::vector<Poller*>& pollers, uint32_t slot,
                 const AsyncEvent& event, DeviceId device, bool fence);

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_EVENT_ROUTE_H_

#include "runtime/core/event_route.h"

#include <new>

#include "runtime/core/poller.h"

namespace cqd::internal {

bool PostQpEvent(const SlotPool& slots, const std::vector<Poller*>& pollers, uint32_t index,
                 const AsyncEvent& event, DeviceId device, bool fence) {
  const Slot& slot = slots.slot(index);
  const uint64_t state = slot.state.load(std::memory_order_acquire);
  if (!StateLive(state) || !slot.Holds(device, event.qp_num)) return false;
  auto* join = new (std::nothrow) EventJoin;
  if (join == nullptr) return false;  // out of memory: the device handler gets it instead
  join->kind = fence ? EventJoin::Kind::kFence : EventJoin::Kind::kAsync;
  join->event = event;
  if (StateDraining(state)) join->drain_epoch = slot.drain_epoch.load(std::memory_order_relaxed);
  PostAlong(RouteOf(slot, index, state), join, pollers);
  return true;
}

EventRoute RouteOf(const Slot& slot, uint32_t index, uint64_t state) {
  EventRoute route;
  route.slot = index;
  route.generation = StateGeneration(state);
  route.consumer = StateConsumer(state);
  route.send_shard = slot.send_shard.load(std::memory_order_relaxed);
  route.recv_shard = slot.recv_shard.load(std::memory_order_relaxed);
  route.send_cq = slot.send_cq.load(std::memory_order_relaxed);
  route.recv_cq = slot.recv_cq.load(std::memory_order_relaxed);
  return route;
}

void PostAlong(const EventRoute& route, EventJoin* join, const std::vector<Poller*>& pollers) {
  const EventRoute r = route;  // a copy: the join (which may hold the route) can go once posted
  const bool one = r.send_shard == r.recv_shard;
  join->parts.store(one ? 1 : 2, std::memory_order_relaxed);
  Item item;
  item.join = join;
  item.slot = r.slot;
  item.generation = r.generation;
  item.kind = ItemKind::kAsyncEvent;
  if (one) {
    if (!pollers[r.send_shard]->PostEvent(r.consumer, item, r.send_cq,
                                          r.recv_cq == r.send_cq ? 0 : r.recv_cq)) {
      Consumer::DropEventPart(item.join);
    }
    return;
  }
  if (!pollers[r.send_shard]->PostEvent(r.consumer, item, r.send_cq, 0)) {
    Consumer::DropEventPart(item.join);
  }
  if (!pollers[r.recv_shard]->PostEvent(r.consumer, item, r.recv_cq, 0)) {
    Consumer::DropEventPart(item.join);
  }
}

}  // namespace cqd::internal

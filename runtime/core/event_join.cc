// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/event_join.h"

#include <new>

#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {

void EventJoin::Finish() noexcept {
  if (finished_ || watch == nullptr) return;
  finished_ = true;
  watch->unfinished.fetch_sub(1, std::memory_order_release);
}

void PostToListener(EventJoin* join) noexcept {
  join->holds.fetch_add(1, std::memory_order_relaxed);
  join->cm.qp_num = 0;
  Item item;
  item.join = join;
  item.slot = kNoSlot;
  item.kind = EntryKind::kListenerEvent;
  CmWatch* watch = join->watch;
  if (!watch->poller->PostEvent(watch->consumer, item, 0, 0)) watch->held->Push(join);
}

// ---- HeldEvents ----

void HeldEvents::Push(EventJoin* join) noexcept {
  MutexLock lock(mu_);
  join->next_held = nullptr;
  (last_ != nullptr ? last_->next_held : first_) = join;
  last_ = join;
  any_.store(true, std::memory_order_release);
}

void HeldEvents::DeliverAll() noexcept {
  if (!any_.load(std::memory_order_acquire)) return;
  MutexLock lock(mu_);
  if (delivering_) return;  // that thread runs ours too, before it stops
  delivering_ = true;
  while (first_ != nullptr) {
    EventJoin* join = first_;
    first_ = join->next_held;
    if (first_ == nullptr) last_ = nullptr;
    lock.Unlock();
    {
      const CallbackScope scope;
      join->watch->handler->OnCmEvent(join->cm);
    }
    join->Finish();
    EventJoin::DropHold(join);
    lock.Lock();
  }
  any_.store(false, std::memory_order_relaxed);
  delivering_ = false;
}

void HeldEvents::DeliverAllOrAfterBatch() noexcept {
  if (!any_.load(std::memory_order_acquire)) return;
  if (Consumer::DeferHeldEvents(this)) return;
  DeliverAll();
}

void HeldEvents::DropAll() noexcept {
  MutexLock lock(mu_);
  while (first_ != nullptr) {
    EventJoin* join = first_;
    first_ = join->next_held;
    EventJoin::DropHold(join);
  }
  last_ = nullptr;
  any_.store(false, std::memory_order_relaxed);
}

bool PostQpEvent(const SlotPool& slots, const std::vector<Shard*>& pollers, uint32_t index,
                 const AsyncEvent& event, DeviceId device, bool stand_in,
                 const uint32_t* generation) {
  const Slot& slot = slots.slot(index);
  const QpEventTarget target = RouteQpEvent(slot, index, device, event.qp_num, generation);
  switch (target.disposal) {
    case Disposal::kDeliver:
      break;
    case Disposal::kToFallback:  // the caller hands it to the device's handler
      return false;
    case Disposal::kNoteMarker:  // never for an event (route_test)
    case Disposal::kFenceTaken:
    case Disposal::kOrphan:
    case Disposal::kDropEvent:
    case Disposal::kDropMarker:
    case Disposal::kUnaffected:
      return false;
  }
  auto* join = new (std::nothrow) EventJoin;
  if (join == nullptr) return false;  // out of memory: the device handler gets it instead
  join->kind = stand_in ? EventJoin::Kind::kLastWqeStandIn : EventJoin::Kind::kAsync;
  join->event = event;
  if (target.tearing_down) {
    join->teardown_epoch = slot.teardown_epoch.load(std::memory_order_relaxed);
  }
  PostAlong(target.route, join, pollers);
  return true;
}

void PostAlong(const EventRoute& route, EventJoin* join, const std::vector<Shard*>& pollers) {
  const EventRoute r = route;  // a copy: the join (which may hold the route) can go once posted
  const bool one = r.send_shard == r.recv_shard;
  join->parts.store(one ? 1 : 2, std::memory_order_relaxed);
  Item item;
  item.join = join;
  item.slot = r.slot;
  item.generation = r.generation;
  item.kind = EntryKind::kEventPart;
  if (one) {
    if (!pollers[r.send_shard]->PostEvent(r.consumer, item, r.send_cq,
                                          r.recv_cq == r.send_cq ? 0 : r.recv_cq)) {
      DropEventPart(item.join);
    }
    return;
  }
  if (!pollers[r.send_shard]->PostEvent(r.consumer, item, r.send_cq, 0)) {
    DropEventPart(item.join);
  }
  if (!pollers[r.recv_shard]->PostEvent(r.consumer, item, r.recv_cq, 0)) {
    DropEventPart(item.join);
  }
}

void DropEventPart(EventJoin* join, bool hand_on) noexcept {
  if (!join->DropPart()) return;
  if (join->kind != EventJoin::Kind::kCm) {
    delete join;
    return;
  }
  const std::shared_ptr<CmEventGate> gate = join->gate;  // the join may go first
  if (hand_on) {
    gate->Arrived(join, nullptr);  // never kDeliver without a slot
  } else {
    gate->Drop(join);
  }
  EventJoin::DropHold(join);  // the route's
}

}  // namespace cqd::internal

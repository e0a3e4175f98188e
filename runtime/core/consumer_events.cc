// SPDX-License-Identifier: BSD-2-Clause
// Consumer (consumer.h): what a batch holds besides completions: async events, CM events (through
// their binding's gate, cm_router.h), a listener's CM events, and teardown markers, each checked
// against the registration as of now (RouteAtConsumer, route.h) before its handler runs. On the
// consumer's thread, inside a batch.
#include "runtime/core/consumer.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

void Consumer::DeliverEvent(EventJoin* join, uint32_t slot_index, uint32_t generation) noexcept {
  if (!join->DropPart()) return;  // the other shard's part is still on its way
  Slot& slot = slots_.slot(slot_index);
  EnterCall(slot_index);  // before the state read, in DeliverCm's gate too
  if (join->kind == EventJoin::Kind::kCm) {
    DeliverCm(join, slot);
    return;
  }
  bool tearing_down = false;
  if (RouteAtConsumer(EntryKind::kEventPart, slot, generation, &tearing_down) ==
      Disposal::kDropEvent) {
    delete join;  // unregistered after it was routed here (its last part)
    return;
  }
  if (join->kind == EventJoin::Kind::kAsync) {
    slot.handler.load(std::memory_order_relaxed)->OnAsyncEvent(join->event);
    CountEvent();
  }
  if (tearing_down && join->teardown_epoch != 0 &&
      join->event.type == IBV_EVENT_QP_LAST_WQE_REACHED &&
      join->teardown_epoch == slot.teardown_epoch.load(std::memory_order_relaxed)) {
    // Null once the teardown ends or its start failed; either waits for this call before the
    // state goes away.
    TeardownState* teardown = slot.teardown.load(std::memory_order_relaxed);
    if (teardown != nullptr) teardown->worker->Note(teardown, TeardownState::kLastWqe);
  }
  delete join;
}

void Consumer::DeliverCm(EventJoin* join, const Slot& slot) noexcept {
  // Ours: the join (and its reference) may go while the binding is in use.
  const std::shared_ptr<CmEventGate> gate = join->gate;
  HeldEvents* held = join->watch->held;  // read now: the join may go
  if (gate->Arrived(join, &slot) == CmEventGate::Arrival::kDeliver) {
    slot.handler.load(std::memory_order_relaxed)->OnCmEvent(join->cm);
    CountEvent();
    join->Finish();
    EventJoin::DropHold(join);  // the route's
    gate->Delivered();
  } else {
    EventJoin::DropHold(join);  // the route's
  }
  LeaveCall();  // another runtime's held events may run here, inline: not this slot's handler
  DeferHeldEvents(held);  // run once the batch is over and released (cm_router.h)
}

void Consumer::DeliverListenerEvent(EventJoin* join) noexcept {
  // Nobody's registration: an Unregister must not wait for this handler.
  calling_.store(0, std::memory_order_release);
  join->watch->handler->OnCmEvent(join->cm);
  CountEvent();
  join->Finish();
  EventJoin::DropHold(join);
}

void Consumer::CountEvent() noexcept {
  async_delivered_.store(async_delivered_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
}

void Consumer::DeliverMarker(uint32_t slot_index, uint32_t generation, const ibv_wc& wc) noexcept {
  Slot& slot = slots_.slot(slot_index);
  EnterCall(slot_index);  // the teardown's end waits for this call before the state goes
  if (RouteAtConsumer(EntryKind::kTeardownMarker, slot, generation) == Disposal::kDropMarker)
    return;
  // Live with this generation: the teardown has not ended, or is ending now (ending unregisters,
  // which nulls the pointer and then waits for this call), so the state is still there.
  TeardownState* teardown = slot.teardown.load(std::memory_order_relaxed);
  if (teardown == nullptr) return;
  teardown->worker->Note(teardown, wc.wr_id == teardown->send_marker()
                                       ? TeardownState::kSendMarker
                                       : TeardownState::kRecvMarker);
}

}  // namespace cqd::internal

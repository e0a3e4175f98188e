// SPDX-License-Identifier: BSD-2-Clause
// The event thread's device async events: read, posted to their QP's registration before the ack
// (S13), then routed to the device handler and to the QPs a CQ_ERR or DEVICE_FATAL takes down.
#include <cerrno>
#include <string>

#include "runtime/core/event_loop.h"

namespace cqd::internal {

void EventLoop::ReadAsyncEvents(Source& source) {
  DeviceRecord* device = source.device;
  for (;;) {
    backend::AsyncEventRecord record;
    if (device->backend->GetAsyncEvent(&record) != 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) Unwatch(source);
      return;
    }
    async_events_.fetch_add(1, std::memory_order_relaxed);
    AsyncEvent event;
    event.type = record.type;
    event.qp_num = record.qp_num;
    event.device = device->id;
    event.port_num = record.port_num;
    if (record.native_cq != nullptr) {
      auto it = cqs_.find(record.native_cq);
      if (it != cqs_.end()) event.cq_id = it->second->id;
    }
    // S13: until this event is acked, destroying its QP cannot return, so its qp_num names no
    // other QP: a QP event is looked up and posted to its registration before the ack. After it,
    // a new QP may take the number and register, and a lookup would find that one.
    const bool posted = backend::IsQpEvent(event.type) && PostToRegistration(device, event);
    device->backend->AckAsyncEvent(&record);  // everything needed is copied
    RouteAsyncEvent(device, event, posted);
    if (event.type == IBV_EVENT_DEVICE_FATAL) {
      // Stop reading a dead device's async fd; its CQs are no longer armed by the pollers.
      Remove(source);
      if (log_ != nullptr) log_->Error("device " + device->backend->name() + ": DEVICE_FATAL");
      return;
    }
  }
}

bool EventLoop::PostToRegistration(DeviceRecord* device, const AsyncEvent& event) {
  const Slot* slot = device->qps.Lookup(event.qp_num);
  return slot != nullptr && DeliverToSlot(slot->index, event, device->id);
}

void EventLoop::RouteAsyncEvent(DeviceRecord* device, const AsyncEvent& event, bool posted) {
  if (backend::IsQpEvent(event.type)) {
    // Not posted: its QP was not registered when the event was read.
    if (!posted && device->handler != nullptr) device->handler->OnDeviceEvent(event);
    return;
  }
  if (event.type == IBV_EVENT_DEVICE_FATAL) {
    device->failed.store(true, std::memory_order_release);
    for (Shard* poller : pollers_) poller->UnparkAll();  // its CQs raise no more events
  }
  if (event.type == IBV_EVENT_CQ_ERR) {
    device->cq_errors.fetch_add(1, std::memory_order_relaxed);
    LogCqError(device, event);
  }
  if (device->handler != nullptr) device->handler->OnDeviceEvent(event);
  if (event.type != IBV_EVENT_CQ_ERR && event.type != IBV_EVENT_DEVICE_FATAL) return;
  // Fan out to every QP the event takes down: rare, so a scan of the slots is fine.
  const uint32_t slots = slots_.allocated();
  for (uint32_t i = 0; i < slots; ++i) {
    const Slot& slot = slots_.slot(i);
    const bool fatal = event.type == IBV_EVENT_DEVICE_FATAL;
    switch (RouteDeviceEvent(slot, device->id, fatal, event.cq_id)) {
      case Disposal::kDeliver:
        break;
      case Disposal::kUnaffected:  // not on the device, not live, or not using the CQ
      case Disposal::kNoteMarker:  // never for a device's event (route_test)
      case Disposal::kFenceTaken:
      case Disposal::kOrphan:
      case Disposal::kDropEvent:
      case Disposal::kDropMarker:
      case Disposal::kToFallback:
        continue;
    }
    AsyncEvent copy = event;
    copy.qp_num = slot.qp_num.load(std::memory_order_relaxed);
    DeliverToSlot(i, copy, device->id);
  }
  // Teardowns under way on a dead device will not drain: they end now (kUnavailable).
  if (event.type == IBV_EVENT_DEVICE_FATAL && on_device_failed_) on_device_failed_(device->id);
}

void EventLoop::LogCqError(const DeviceRecord* device, const AsyncEvent& event) {
  if (log_ == nullptr || !log_->enabled()) return;
  // At most one line a second: a burst of overflows (a consumer stuck behind many CQs) is one
  // line and a count, not a flood on the event thread.
  const auto now = std::chrono::steady_clock::now();
  if (cq_errors_logged_ > 0 && now - last_cq_error_log_ < std::chrono::seconds(1)) {
    ++cq_errors_unlogged_;
    return;
  }
  std::string line = "device " + device->backend->name() + ": CQ_ERR on cq " +
                     std::to_string(event.cq_id) +
                     ": the CQ overflowed or failed; its QPs are told (QpHandler::OnAsyncEvent)";
  if (cq_errors_unlogged_ > 0) {
    line += " (" + std::to_string(cq_errors_unlogged_) + " more CQ_ERR since the last line)";
  }
  log_->Error(line);
  ++cq_errors_logged_;
  cq_errors_unlogged_ = 0;
  last_cq_error_log_ = now;
}

bool EventLoop::DeliverToSlot(uint32_t index, const AsyncEvent& event, DeviceId device) {
  return PostQpEvent(slots_, pollers_, index, event, device, /*stand_in=*/false);
}

}  // namespace cqd::internal

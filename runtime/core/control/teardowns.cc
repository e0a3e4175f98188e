// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/teardowns.h"

#include <string>
#include <vector>

#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {

Teardowns::Teardowns(ControlCore& core, Registrations& registrations, Devices& devices,
                     const EngineEntry& engine)
    : core_(core),
      registrations_(registrations),
      devices_(devices),
      engine_(engine),
      worker_(std::make_unique<TeardownWorker>(static_cast<TeardownHost&>(*this))) {
  core_.events->set_on_device_failed([this](DeviceId device) { worker_->DeviceFailed(device); });
  worker_->set_logger(&core_.log);
}

CallTicket Teardowns::RetireTeardown(TeardownState& state) noexcept {
  return registrations_.RetireTeardown(state);
}

bool Teardowns::CallOver(const CallTicket& ticket) const noexcept {
  return core_.consumers[ticket.consumer]->CallOver(ticket.call);
}

void Teardowns::FreeSlot(uint32_t index) noexcept {
  ControlLock lock(core_.mu);
  core_.slots.Free(index);
}

bool Teardowns::RedriveFlush(const TeardownState& state) noexcept {
  ControlLock lock(core_.mu);
  const Slot& slot = core_.slots.slot(state.slot);
  if (!slot.control.LiveAs(state.generation)) return false;
  DeviceRecord* device = devices_.record(state.device);
  return device->backend
      ->RedriveFlush(slot.qp.load(std::memory_order_relaxed),
                     state.recv_marker_owed ? state.recv_marker() : 0)
      .ok();
}

void Teardowns::PostLastWqeStandIn(const TeardownState& state) noexcept {
  // Off the runtime mutex (the teardown thread): routed as a QP's event of the teardown's own
  // registration, so nothing is posted once its generation has gone (route.h, RouteQpEvent).
  AsyncEvent fence;
  fence.type = IBV_EVENT_QP_LAST_WQE_REACHED;
  fence.qp_num = state.qp_num;
  fence.device = state.device;
  std::vector<Shard*> pollers;
  for (auto& p : core_.pollers) pollers.push_back(p.get());
  PostQpEvent(core_.slots, pollers, state.slot, fence, state.device, /*stand_in=*/true,
              &state.generation);
}

Result<std::shared_ptr<TeardownState>> Teardowns::TeardownQp(uint32_t index, uint32_t generation,
                                                             const TeardownOptions& options) {
  if (Status refused = CheckCaller("TeardownQp"); !refused.ok()) return refused;
  if (options.timeout.count() <= 0) return InvalidArgument("TeardownQp: timeout must be > 0");
  if (options.last_wqe_grace.count() < 0) {
    return InvalidArgument("TeardownQp: last_wqe_grace must not be negative");
  }
  ControlLock lock(core_.mu);
  if (core_.shut_down) return FailedPrecondition("TeardownQp: the runtime is shut down");
  Slot& slot = core_.slots.slot(index);
  if (!slot.control.LiveAs(generation)) {
    return InvalidArgument("TeardownQp: the registration is no longer live");
  }
  if (slot.control.tearing_down) return FailedPrecondition("TeardownQp: already tearing down");
  DeviceRecord* device = devices_.record(slot.device.load(std::memory_order_relaxed));
  auto teardown = std::make_shared<TeardownState>();
  teardown->worker = worker_.get();
  teardown->slot = index;
  teardown->generation = generation;
  teardown->qp_num = slot.qp_num.load(std::memory_order_relaxed);
  teardown->device = device->id;
  teardown->deadline = TeardownState::After(TeardownState::Clock::now(), options.timeout);
  teardown->last_wqe_grace = options.last_wqe_grace;
  teardown->on_done = options.on_done;
  // Teardown::Wait refuses the runtime's engine threads, whatever the teardown needs (runtime.h).
  teardown->engine_threads = &engine_.threads();
  if (device->failed.load(std::memory_order_acquire)) {
    // Nothing flushes on a dead device: unregister at once (on the teardown thread).
    teardown->end_with = Unavailable("TeardownQp: device " + device->backend->name() +
                                     " has failed; unregistered without draining");
    worker_->Add(teardown);
    return teardown;
  }
  // Tearing down before the markers exist, so that the pollers recognize them.
  const uint32_t consumer = slot.control.consumer;
  slot.teardown.store(teardown.get(), std::memory_order_relaxed);
  const uint32_t epoch = slot.teardown_epoch.load(std::memory_order_relaxed) + 1;
  slot.teardown_epoch.store(epoch == 0 ? 1 : epoch, std::memory_order_relaxed);
  slot.Publish(generation, consumer, /*live=*/true, /*tearing_down=*/true,
               std::memory_order_seq_cst);
  Result<backend::FlushStart> posted = device->backend->StartQpFlush(
      slot.qp.load(std::memory_order_relaxed), teardown->send_marker(), teardown->recv_marker());
  if (!posted.ok()) {
    // No marker went out. Back to live; a call that saw `tearing_down` may still read the state
    // through slot.teardown: wait for it (without core.mu, as Unregister does) before it goes.
    slot.Publish(generation, consumer, /*live=*/true, /*tearing_down=*/false,
                 std::memory_order_seq_cst);
    lock.Unlock();
    core_.consumers[consumer]->WaitForCallInProgress(index);
    lock.Lock();
    if (slot.teardown.load(std::memory_order_relaxed) == teardown.get()) {
      slot.teardown.store(nullptr, std::memory_order_release);
    }
    return Status(posted.status().code(), "TeardownQp: " + posted.status().message());
  }
  Result<backend::QpCaps> caps = device->backend->QueryQp(slot.qp.load(std::memory_order_relaxed));
  // An SRQ QP has no receive marker: its receive side is known to be flushed by LAST_WQE_REACHED
  // or the fence that stands in for it. A receive marker that found the queue full is posted again
  // by the teardown thread once the flushes have made room (TeardownHost::RedriveFlush).
  teardown->srq = caps.ok() && caps->srq;
  if (*posted == backend::FlushStart::kNothingOutstanding) {
    teardown->end_with = Status::Ok();
  } else {
    teardown->markers = TeardownState::kSendMarker;
    if (!teardown->srq && *posted == backend::FlushStart::kAllMarkers) {
      teardown->markers |= TeardownState::kRecvMarker;
    }
    teardown->recv_marker_owed = !teardown->srq && *posted == backend::FlushStart::kSendMarkerOnly;
  }
  worker_->Add(teardown);
  return teardown;
}

}  // namespace cqd::internal

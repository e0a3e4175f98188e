// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/devices.h"

#include <string>

#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {

Result<DeviceId> Devices::AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                                    DeviceEventHandler* events) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  for (auto& d : devices_) {
    if (d->backend->kind() == device->kind() && d->backend->native() == device->native()) {
      return AlreadyExists(std::string(op) + ": " + device->name() +
                           " was already added as device " + std::to_string(d->id));
    }
  }
  if (core_.shut_down) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  auto record = std::make_unique<DeviceRecord>();
  if (!record->claim.Take(device->native())) {  // device_claims.h
    return AlreadyExists(std::string(op) + ": " + device->name() +
                         " was added to another runtime of this process, which reads its async "
                         "events (a device belongs to one runtime until that runtime is "
                         "destroyed)");
  }
  record->id = static_cast<DeviceId>(devices_.size() + 1);
  record->backend = std::move(device);
  record->handler = events;
  Status status;
  for (int shard = 0; shard < core_.options.pollers && status.ok(); ++shard) {
    Result<backend::Channel*> channel = record->backend->CreateChannel();
    if (channel.ok()) {
      record->channels.push_back(*channel);
    } else {
      status = channel.status();
    }
  }
  if (status.ok()) core_.events->RunSync([&] { status = core_.events->WatchDevice(record.get()); });
  if (!status.ok()) {
    for (backend::Channel* channel : record->channels) {
      (void)record->backend->DestroyChannel(channel);
    }
    return Status(status.code(),
                  std::string(op) + ": " + record->backend->name() + ": " + status.message());
  }
  devices_.push_back(std::move(record));
  const DeviceRecord& added = *devices_.back();
  if (core_.log.enabled()) {
    core_.log.Info("device " + added.backend->name() + " added as device " +
                   std::to_string(added.id) + " (" + std::to_string(core_.options.pollers) +
                   " channels)");
  }
  // NUMA placement (placement.h). Under mu with shut_down false: no thread has been joined.
  Placement::Threads threads;
  for (auto& poller : core_.pollers) threads.pollers.push_back(poller->native_thread());
  for (auto& consumer : core_.consumers) threads.consumers.push_back(consumer->native_thread());
  placement_.OnDeviceAdded(added.id, added.backend->name(), added.backend->in_sysfs(),
                           added.backend->comp_vectors(), threads);
  return added.id;
}

Result<void*> Devices::DeviceNative(const char* op, DeviceId id, backend::Kind kind) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  if (id < 1 || id > devices_.size())
    return NotFound(std::string(op) + ": no device " + std::to_string(id));
  const backend::Device& device = *devices_[id - 1]->backend;
  if (device.kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + std::to_string(id) + " (" +
                           device.name() + ") is not of the kind this call takes");
  }
  return device.native();
}

Result<DeviceId> Devices::FindDevice(const char* op, backend::Kind kind, void* native) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  for (auto& d : devices_) {
    if (d->backend->kind() == kind && d->backend->native() == native) return d->id;
  }
  return NotFound(std::string(op) + ": no device was added with this context (AddVerbsDevice)");
}

Status Devices::WatchCmChannel(rdma_event_channel* channel, CmHandler& handler,
                               ConsumerId consumer) {
  if (Status refused = CheckCaller("WatchCmChannel"); !refused.ok()) return refused;
  if (channel == nullptr) return InvalidArgument("WatchCmChannel: channel is null");
  ControlLock lock(core_.mu);
  if (core_.shut_down) return FailedPrecondition("WatchCmChannel: the runtime is shut down");
  if (consumer >= core_.consumers.size()) {
    return InvalidArgument("WatchCmChannel: consumer " + std::to_string(consumer) +
                           " is not in 0.." + std::to_string(core_.consumers.size() - 1));
  }
  const ConsumerOptions& c = core_.options.consumers[consumer];
  const int64_t limit = static_cast<int64_t>(c.queue_capacity + c.spill_capacity);
  Status status;
  core_.events->RunSync(
      [&] { status = core_.events->WatchCm(channel, &handler, consumer, limit); });
  return status;
}

Status Devices::UnwatchCmChannel(rdma_event_channel* channel) {
  if (Status refused = CheckCaller("UnwatchCmChannel"); !refused.ok()) return refused;
  if (channel == nullptr) return InvalidArgument("UnwatchCmChannel: channel is null");
  ControlLock lock(core_.mu);
  Status status;
  core_.events->RunSync([&] { status = core_.events->UnwatchCm(channel); });
  return status;
}

void Devices::FillStats(Stats& stats) const {
  ControlLock lock(core_.mu);
  for (DeviceStats& d : stats.devices) {
    if (d.id == 0 || d.id > devices_.size()) continue;
    const DeviceRecord& record = *devices_[d.id - 1];
    d.failed = record.failed.load(std::memory_order_relaxed) ? 1 : 0;
    d.cq_errors = record.cq_errors.load(std::memory_order_relaxed);
  }
}

}  // namespace cqd::internal

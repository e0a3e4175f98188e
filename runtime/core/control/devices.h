// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/devices.h: the runtime's devices (DeviceRecord, records.h) with their
// completion channels, one per shard, and the rdma_cm channels the event loop watches.
//
// Devices are added, never removed: a device's id is its index + 1, and its record and channels
// stay until the runtime goes (~RuntimeImpl destroys the channels once every thread is joined).
//
// Threading: control calls (any thread CheckCaller admits, caller.h). Each takes core.mu;
// AddDevice, WatchCmChannel and UnwatchCmChannel wait under it for the event thread
// (EventLoop::RunSync). The list is written under core.mu (AddDevice) and read under it by the
// other services (record, size), or without it once every thread is joined (all).
#ifndef CQD_RUNTIME_CORE_CONTROL_DEVICES_H_
#define CQD_RUNTIME_CORE_CONTROL_DEVICES_H_

#include <memory>
#include <vector>

#include "cqd/handler.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/placement.h"
#include "runtime/core/records.h"

namespace cqd::internal {

class Devices {
 public:
  // `placement` is only stored here: it may be built after this.
  Devices(ControlCore& core, Placement& placement) : core_(core), placement_(placement) {}
  Devices(const Devices&) = delete;
  Devices& operator=(const Devices&) = delete;

  // Adds `device` (destroyed here on failure); `op` names the public call in messages.
  // kAlreadyExists if a device of the same kind and native() was added.
  Result<DeviceId> AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                             DeviceEventHandler* events);
  // Returns the device's native() if it is of `kind`, else kInvalidArgument.
  Result<void*> DeviceNative(const char* op, DeviceId device, backend::Kind kind);
  // Returns the device of `kind` added with this native(), or kNotFound.
  Result<DeviceId> FindDevice(const char* op, backend::Kind kind, void* native);
  // Returns what the event thread's WatchCm / UnwatchCm returned (event_loop.h).
  Status WatchCmChannel(rdma_event_channel* channel, CmHandler& handler, ConsumerId consumer);
  Status UnwatchCmChannel(rdma_event_channel* channel);

  // Sets each device row of `stats` (placed by Placement::FillStats) from its record: failed,
  // cq_errors. Under core.mu.
  void FillStats(Stats& stats) const;
  // Returns the device `id`, which must be in 1..size() (under core.mu).
  DeviceRecord* record(DeviceId id) const { return devices_[id - 1].get(); }
  // Returns how many devices were added (under core.mu).
  size_t size() const { return devices_.size(); }
  // Returns every device, by id - 1 (~RuntimeImpl, once the threads are joined).
  const std::vector<std::unique_ptr<DeviceRecord>>& all() const { return devices_; }

 private:
  ControlCore& core_;
  Placement& placement_;  // NUMA placement of the threads and completion vectors (own mutex)
  std::vector<std::unique_ptr<DeviceRecord>> devices_;  // id - 1
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_DEVICES_H_

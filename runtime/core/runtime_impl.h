// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/runtime_impl.h: the control path, and the owner of every runtime thread and record.
//
// The facade (runtime/facade, cqd/runtime.h) checks and converts what engines pass and forwards
// here; this layer never sees the public handle types, only slots, ids and the backend seam.
// Control-path calls serialize on one mutex (ControlCore::mu, shared by every service). They
// never hold it while waiting for a consumer (a handler may itself be calling the control path),
// only while waiting for a poller or the event thread. The event thread never takes it; a poller
// takes it only in a run-to-completion handler's control call, and then waits for its turn
// serving its own mailbox (ControlMutex, thread_role.h), so a holder waiting for that poller is
// still served.
//
// RuntimeImpl is a facade over services (runtime/core/control/), each owning one concern:
// ControlCore (options, log, mutex, the threads' objects), Devices, Cqs, Registrations,
// Teardowns, EngineEntry and StatsService. Its methods forward to them; it keeps the threads'
// lifetime: the constructor, Start, Shutdown, StopEverything and the destructor.
#ifndef CQD_RUNTIME_CORE_RUNTIME_IMPL_H_
#define CQD_RUNTIME_CORE_RUNTIME_IMPL_H_

#include <memory>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/base/mutex.h"
#include "runtime/core/caller.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/control/cqs.h"
#include "runtime/core/control/devices.h"
#include "runtime/core/control/engine_entry.h"
#include "runtime/core/control/registrations.h"
#include "runtime/core/control/stats_service.h"
#include "runtime/core/control/teardowns.h"
#include "runtime/core/placement.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

class RuntimeImpl final {
 public:
  // `options` passed CheckOptions (options_check.h).
  explicit RuntimeImpl(const RuntimeOptions& options);
  ~RuntimeImpl();
  Status Start();

  // Devices (control/devices.h).
  Result<DeviceId> AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                             DeviceEventHandler* events) {
    return devices_.AddDevice(op, std::move(device), events);
  }
  Result<void*> DeviceNative(const char* op, DeviceId device, backend::Kind kind) {
    return devices_.DeviceNative(op, device, kind);
  }
  Result<DeviceId> FindDevice(const char* op, backend::Kind kind, void* native) {
    return devices_.FindDevice(op, kind, native);
  }
  Status WatchCmChannel(rdma_event_channel* channel, CmHandler& handler, ConsumerId consumer) {
    return devices_.WatchCmChannel(channel, handler, consumer);
  }
  Status UnwatchCmChannel(rdma_event_channel* channel) {
    return devices_.UnwatchCmChannel(channel);
  }
  // CQs (control/cqs.h).
  Result<PolledCq> CreateCq(DeviceId device, int shard, const CqOptions& options) {
    return cqs_.CreateCq(device, shard, options);
  }
  Result<void*> NativeChannel(const char* op, DeviceId device, int shard, backend::Kind kind) {
    return cqs_.NativeChannel(op, device, shard, kind);
  }
  Result<PolledCq> AdoptCq(DeviceId device, int shard, backend::Kind kind, void* native,
                           const CqOptions& options) {
    return cqs_.AdoptCq(device, shard, kind, native, options);
  }
  Status DestroyCq(uint64_t runtime, uint32_t id) { return cqs_.DestroyCq(runtime, id); }
  // Registrations (control/registrations.h).
  Result<RegisteredQp> RegisterQp(uint32_t qp_num, void* qp, void* send_cq, void* recv_cq,
                                  QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options) {
    return registrations_.RegisterQp(qp_num, qp, send_cq, recv_cq, handler, consumer, options);
  }
  bool BindCm(rdma_cm_id* id, const RegisteredQp& registration) {
    return registrations_.BindCm(id, registration);
  }
  bool Unregister(uint32_t slot, uint32_t generation) noexcept {
    return registrations_.Unregister(slot, generation);
  }
  // Teardowns (control/teardowns.h).
  Result<std::shared_ptr<TeardownState>> TeardownQp(uint32_t slot, uint32_t generation,
                                                    const TeardownOptions& options) {
    return teardowns_.TeardownQp(slot, generation, options);
  }
  // The engine's entry points (control/engine_entry.h).
  int Drain(ConsumerId consumer, int max) noexcept { return engine_.Drain(consumer, max); }
  Result<int> NotifyFd(ConsumerId consumer) { return engine_.NotifyFd(consumer); }
  int PollShard(int shard, int budget) noexcept { return engine_.PollShard(shard, budget); }
  int TrySleepShard(int shard) noexcept { return engine_.TrySleepShard(shard); }
  Result<int> ShardFd(int shard) { return engine_.ShardFd(shard); }
  // Stats (control/stats_service.h).
  Stats GetStats() const { return stats_.GetStats(); }

  // Refused from every cqd callback (kEveryRole, caller.h); else StopEverything.
  Status Shutdown();
  // Shutdown's work without its refusal (the caller checked, or Start never finished).
  Status StopEverything();

 private:
  Mutex shutdown_mu_;  // one StopEverything at a time
  // Start finished: threads may have run callbacks. Until then nothing of this runtime's can be
  // a caller's own thread or wait for one, so the destructor stops it from any thread.
  bool started_ = false;
  // Destroyed in reverse declaration order, which keeps the order of when these were RuntimeImpl's
  // own fields: the stats server first (its thread calls GetStats, which reads the others), then
  // the placement, the CQ table (its records point at the devices), the devices, the teardown
  // worker, the engine threads' list, and last the core (control_core.h: the event loop, the
  // pollers, the consumers, ...). A service built before one it refers to only stores the
  // reference.
  ControlCore core_;
  EngineEntry engine_;
  Teardowns teardowns_;
  Devices devices_;
  Cqs cqs_;
  Registrations registrations_;
  // NUMA placement of the threads and completion vectors of CQs (placement.h; own mutex).
  Placement placement_;
  StatsService stats_;  // last: its server's thread calls GetStats, so it goes first
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_RUNTIME_IMPL_H_

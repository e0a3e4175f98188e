// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/runtime_impl.h: the control path, and the owner of every runtime thread and record.
//
// The facade (runtime/facade, cqd/runtime.h) checks and converts what engines pass and forwards
// here; this layer never sees the public handle types, only slots, ids and the backend seam.
// Control-path calls serialize on `mu_`. They never hold it while waiting for a consumer (a
// handler may itself be calling the control path), only while waiting for a poller or the event
// thread. The event thread never takes it; a poller takes it only in a run-to-completion
// handler's control call, and then waits for its turn serving its own mailbox (ControlMutex,
// thread_role.h), so a holder waiting for that poller is still served.
//
// Implemented by concern: runtime_impl.cc (the threads' lifetime, the caller check, the engine's
// entry points, stats, Shutdown), runtime_cqs.cc (devices, CM channels, CQs and their
// commitments) and runtime_qps.cc (registrations, their retirement and fences, teardowns).
#ifndef CQD_RUNTIME_CORE_RUNTIME_IMPL_H_
#define CQD_RUNTIME_CORE_RUNTIME_IMPL_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/base/log.h"
#include "runtime/base/mutex.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"
#include "runtime/core/consumer.h"
#include "runtime/core/cq_table.h"
#include "runtime/core/event_loop.h"
#include "runtime/core/orphans.h"
#include "runtime/core/placement.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"
#include "runtime/core/shard/shard.h"
#include "runtime/core/stall_watch.h"
#include "runtime/core/teardown.h"
#include "runtime/observe/stats_server.h"

namespace cqd::internal {

// A registration made by RegisterQp (the facade wraps it in a cqd::Registration).
struct RegisteredQp {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t qp_num = 0;
};

// A CQ made or adopted (the facade wraps it in a cqd::CqHandle).
struct PolledCq {
  uint64_t runtime = 0;  // the runtime's serial: tells its CQs from another runtime's
  uint32_t id = 0;
  int shard = 0;
  DeviceId device = 0;
  backend::Kind kind = backend::Kind::kVerbs;
  void* native = nullptr;  // ibv_cq* or SimCq*, as `kind` says
};

class RuntimeImpl final : private TeardownHost {
 public:
  // Returns kFailedPrecondition, naming `op`, on the threads no control call may come from (a
  // poller or the event thread: an OrphanHandler or DeviceEventHandler; the log sink), else OK.
  // The callers every control call refuses: they may run where the call would wait for them
  // (pollers, the event thread) or under the runtime mutex (the log sink).
  static constexpr uint32_t kRefusedControlCallers = kRoleRuntimeThread | kRoleLogSink;
  // Returns kFailedPrecondition naming `op` and the reason when the caller holds a role of
  // `refused` (caller.h); else OK.
  static Status CheckCaller(const char* op, uint32_t refused = kRefusedControlCallers);
  // `options` passed CheckOptions (options_check.h).
  explicit RuntimeImpl(const RuntimeOptions& options);
  ~RuntimeImpl();
  Status Start();

  // Adds `device` (destroyed here on failure); `op` names the public call in messages.
  // kAlreadyExists if a device of the same kind and native() was added.
  Result<DeviceId> AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                             DeviceEventHandler* events);
  // Returns the device's native() if it is of `kind`, else kInvalidArgument.
  Result<void*> DeviceNative(const char* op, DeviceId device, backend::Kind kind);
  // Returns the device of `kind` added with this native(), or kNotFound.
  Result<DeviceId> FindDevice(const char* op, backend::Kind kind, void* native);
  Result<PolledCq> CreateCq(DeviceId device, int shard, const CqOptions& options);
  // The shard's channel as the backend knows it (ibv_comp_channel* or SimChannel*), if the
  // device is of `kind`.
  Result<void*> NativeChannel(const char* op, DeviceId device, int shard, backend::Kind kind);
  // `native` is a CQ of `kind` (an ibv_cq* or a SimCq*); kInvalidArgument unless the device is
  // of that kind too.
  Result<PolledCq> AdoptCq(DeviceId device, int shard, backend::Kind kind, void* native,
                           const CqOptions& options);
  // `runtime` and `id` as PolledCq gave them.
  Status DestroyCq(uint64_t runtime, uint32_t id);
  // `qp` is the native QP (ibv_qp* or SimQp*); `send_cq` and `recv_cq` are native CQs.
  Result<RegisteredQp> RegisterQp(uint32_t qp_num, void* qp, void* send_cq, void* recv_cq,
                                  QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options);
  Status WatchCmChannel(rdma_event_channel* channel, CmHandler& handler, ConsumerId consumer);
  Status UnwatchCmChannel(rdma_event_channel* channel);
  // Routes the CM events of `id` to `registration` (just made by RegisterQp); false if memory
  // ran out.
  bool BindCm(rdma_cm_id* id, const RegisteredQp& registration);
  // Returns false (and does nothing) on a poller or the event thread.
  bool Unregister(uint32_t slot, uint32_t generation) noexcept;
  // Starts a drained teardown of the registration; see Runtime::TeardownQp.
  Result<std::shared_ptr<TeardownState>> TeardownQp(uint32_t slot, uint32_t generation,
                                                    const TeardownOptions& options);
  int Drain(ConsumerId consumer, int max) noexcept;
  Result<int> NotifyFd(ConsumerId consumer);
  // Engine-driven shards: Runtime::PollShard, TrySleepShard, ShardFd.
  int PollShard(int shard, int budget) noexcept;
  int TrySleepShard(int shard) noexcept;
  Result<int> ShardFd(int shard);
  Stats GetStats() const;
  Status Shutdown();
  // Shutdown's work without its refusal (the caller checked, or Start never finished).
  Status StopEverything();

 private:
  // TeardownHost (teardown.h), on the teardown thread.
  BatchTicket RetireTeardown(TeardownState& state) noexcept override;
  bool BatchOver(const BatchTicket& ticket) const noexcept override;
  void FreeSlot(uint32_t slot) noexcept override;
  void PostLastWqeStandIn(const TeardownState& state) noexcept override;
  bool RedriveFlush(const TeardownState& state) noexcept override;

  // Ends the registration (slot, generation) without waiting for its consumer: it is dead and
  // unroutable, its CQ uses dropped, what the pollers hold for it orphaned, and what it may still
  // have in its CQs fenced (fences.h: `ending` is the teardown that ended, null for a plain
  // Unregister). Returns the batch to wait out before the slot is freed; `retired` false if it was
  // gone.
  BatchTicket Retire(uint32_t slot, uint32_t generation, TeardownState* ending) CQD_REQUIRES(mu_);
  void FenceRetired(const TeardownState* ending, uint32_t qp_num, const void* qp,
                    CqRecord* const cqs[2], const uint32_t commits[2]) CQD_REQUIRES(mu_);
  // The device `id`, if the runtime runs and `shard` is one of its shards.
  Result<DeviceRecord*> FindShard(const char* op, DeviceId id, int shard) CQD_REQUIRES(mu_);
  Result<PolledCq> AddCq(std::unique_ptr<CqRecord> record) CQD_REQUIRES(mu_);
  // Commits `wrs` more work requests on `cq`, growing it if allowed; kResourceExhausted if not.
  Status Commit(CqRecord* cq, uint64_t wrs, uint32_t qp_num) CQD_REQUIRES(mu_);

  const RuntimeOptions options_;
  const uint64_t serial_;  // tells this runtime's CqHandles from another's
  const Logger log_;       // RuntimeOptions::log; before every thread that logs
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  mutable ControlMutex mu_;  // thread_role.h: served while a run-to-completion poller waits
  Mutex shutdown_mu_;
  bool shut_down_ CQD_GUARDED_BY(mu_) = false;
  // Start finished: threads may have run callbacks. Until then nothing of this runtime's can be
  // a caller's own thread or wait for one, so the destructor stops it from any thread.
  bool started_ = false;
  // Registrations live now (Stats::registrations): written under mu_, read by GetStats anywhere.
  std::atomic<uint64_t> live_registrations_{0};
  SlotPool slots_;
  OrphanSink orphans_;
  // Declared before the pollers and the event loop: their producer tokens must go first.
  std::vector<std::unique_ptr<Consumer>> consumers_;
  std::vector<std::unique_ptr<Shard>> pollers_;
  // The "last drainer" and "last driver" tokens of every engine-driven consumer and shard
  // (TeardownState::engine_threads): fixed after the constructor.
  std::vector<const std::atomic<uintptr_t>*> engine_threads_;
  std::unique_ptr<StallWatch> stall_watch_;  // with a log sink: the event thread's tick
  std::unique_ptr<EventLoop> events_;
  std::unique_ptr<TeardownWorker> teardowns_;
  std::vector<std::unique_ptr<DeviceRecord>> devices_;  // id - 1
  CqTable cqs_ CQD_GUARDED_BY(mu_);
  // NUMA placement of the threads and completion vectors of CQs (placement.h; own mutex).
  Placement placement_{options_};
  // RuntimeOptions::stats_socket. Last: its thread calls GetStats, so it goes first.
  std::unique_ptr<StatsServer> stats_server_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_RUNTIME_IMPL_H_

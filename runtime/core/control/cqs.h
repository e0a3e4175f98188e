// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/cqs.h: the CQs the runtime polls (CqTable, cq_table.h): creating and
// adopting them on a device's shard, the shard's completion channel, and destroying them.
//
// A CQ is mapped in the event loop before its poller gets it, and leaves the poller before it is
// destroyed or released. The capacity guard's commitments on a CQ are made by RegisterQp
// (registrations.h), which reads the table through table().
//
// Threading: control calls (any thread CheckCaller admits, caller.h), and FillStats from any
// thread GetStats lets take the mutex. Each takes core.mu and waits under it for the CQ's poller
// and the event thread. The table is guarded by core.mu; whoever keeps table()'s pointer says so
// (CQD_PT_GUARDED_BY(core_.mu)).
#ifndef CQD_RUNTIME_CORE_CONTROL_CQS_H_
#define CQD_RUNTIME_CORE_CONTROL_CQS_H_

#include <cstdint>
#include <memory>

#include "cqd/options.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/control/devices.h"
#include "runtime/core/cq_table.h"
#include "runtime/core/placement.h"
#include "runtime/core/records.h"

namespace cqd::internal {

// A CQ made or adopted (the facade wraps it in a cqd::CqHandle).
struct PolledCq {
  uint64_t runtime = 0;  // the runtime's serial: tells its CQs from another runtime's
  uint32_t id = 0;
  int shard = 0;
  DeviceId device = 0;
  backend::Kind kind = backend::Kind::kVerbs;
  void* native = nullptr;  // ibv_cq* or SimCq*, as `kind` says
};

class Cqs {
 public:
  // `placement` is only stored here: it may be built after this.
  Cqs(ControlCore& core, const Devices& devices, Placement& placement);
  Cqs(const Cqs&) = delete;
  Cqs& operator=(const Cqs&) = delete;

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
  // Adds the CQs' part of `stats` (CqTable::FillStats), under core.mu.
  void FillStats(Stats& stats) const;

  // Returns the table, guarded by core.mu: for RegisterQp and retirement, and ~RuntimeImpl.
  CqTable* table() { return &table_; }

 private:
  // The device `id`, if the runtime runs and `shard` is one of its shards.
  Result<DeviceRecord*> FindShard(const char* op, DeviceId id, int shard) CQD_REQUIRES(core_.mu);
  Result<PolledCq> AddCq(std::unique_ptr<CqRecord> record) CQD_REQUIRES(core_.mu);

  ControlCore& core_;
  const Devices& devices_;
  Placement& placement_;   // the completion vector of a CQ CreateCq makes (own mutex)
  const uint64_t serial_;  // tells this runtime's CqHandles from another's
  CqTable table_ CQD_GUARDED_BY(core_.mu);
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_CQS_H_

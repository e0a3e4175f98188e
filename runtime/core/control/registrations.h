// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/registrations.h: QP registrations (their Slots, registry.h, in
// core.slots): RegisterQp with the capacity guard's commitments on the QP's CQs, binding its CM
// events, and retirement: Unregister, or a teardown's end, kills the registration and fences what
// its QP may still have in its CQs (fences.h).
//
// Threading: control calls (RegisterQp and Unregister refuse what CheckCaller refuses, caller.h;
// BindCm follows a RegisterQp), RetireTeardown on the teardown thread, live() anywhere. Each takes
// core.mu and waits under it for pollers and the event thread, never for a consumer: Unregister
// waits for the registration's batch with core.mu released. A slot is published by a release
// store of its state word (registry.h); live() is a relaxed load.
#ifndef CQD_RUNTIME_CORE_CONTROL_REGISTRATIONS_H_
#define CQD_RUNTIME_CORE_CONTROL_REGISTRATIONS_H_

#include <atomic>
#include <cstdint>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/control/cqs.h"
#include "runtime/core/control/devices.h"
#include "runtime/core/cq_table.h"
#include "runtime/core/records.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

// A registration made by RegisterQp (the facade wraps it in a cqd::Registration).
struct RegisteredQp {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t qp_num = 0;
};

class Registrations {
 public:
  // `cqs` is built: its table is taken here.
  Registrations(ControlCore& core, Devices& devices, Cqs& cqs)
      : core_(core), devices_(devices), cqs_(cqs.table()) {}
  Registrations(const Registrations&) = delete;
  Registrations& operator=(const Registrations&) = delete;

  // `qp` is the native QP (ibv_qp* or SimQp*); `send_cq` and `recv_cq` are native CQs.
  Result<RegisteredQp> RegisterQp(uint32_t qp_num, void* qp, void* send_cq, void* recv_cq,
                                  QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options);
  // Routes the CM events of `id` to `registration` (just made by RegisterQp); false if memory
  // ran out.
  bool BindCm(rdma_cm_id* id, const RegisteredQp& registration);
  // Returns false (and does nothing) on a poller or the event thread.
  bool Unregister(uint32_t slot, uint32_t generation) noexcept;
  // Teardown thread (TeardownHost::RetireTeardown): Retire, `state` ending, under core.mu.
  CallTicket RetireTeardown(TeardownState& state) noexcept;
  // Returns the registrations live now (Stats::registrations), from any thread.
  uint64_t live() const { return live_.load(std::memory_order_relaxed); }

 private:
  // Commits `wrs` more work requests on `cq`, growing it if allowed; kResourceExhausted if not.
  Status Commit(CqRecord* cq, uint64_t wrs, uint32_t qp_num) CQD_REQUIRES(core_.mu);
  // Ends the registration (slot, generation) without waiting for its consumer: it is dead and
  // unroutable, its CQ uses dropped, what the pollers hold for it orphaned, and what it may still
  // have in its CQs fenced (fences.h: `ending` is the teardown that ended, null for a plain
  // Unregister). Returns the handler call to wait out before the slot is freed; `retired` false if
  // it was gone.
  CallTicket Retire(uint32_t slot, uint32_t generation, TeardownState* ending)
      CQD_REQUIRES(core_.mu);
  void FenceRetired(const TeardownState* ending, uint32_t qp_num, const void* qp,
                    CqRecord* const cqs[2], const uint32_t commits[2]) CQD_REQUIRES(core_.mu);

  ControlCore& core_;
  Devices& devices_;
  CqTable* const cqs_ CQD_PT_GUARDED_BY(core_.mu);  // Cqs::table()
  // Registrations live now: written under core.mu, read by live() anywhere.
  std::atomic<uint64_t> live_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_REGISTRATIONS_H_

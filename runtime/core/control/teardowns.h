// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/teardowns.h: drained QP teardowns (teardown.h): TeardownQp starts one, and
// the TeardownWorker it owns ends it through this class's TeardownHost calls.
//
// Threading: TeardownQp is a control call (any thread CheckCaller admits, caller.h), under
// core.mu, which it releases only to wait for a handler call when no marker went out. The
// TeardownHost calls run on the teardown thread, each under core.mu but CallOver (an acquire load
// of the consumer's call word) and PostLastWqeStandIn (an acquire load of the state word). Start
// and Stop: RuntimeImpl's lifetime, without core.mu.
#ifndef CQD_RUNTIME_CORE_CONTROL_TEARDOWNS_H_
#define CQD_RUNTIME_CORE_CONTROL_TEARDOWNS_H_

#include <cstdint>
#include <memory>

#include "cqd/options.h"
#include "cqd/status.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/control/devices.h"
#include "runtime/core/control/engine_entry.h"
#include "runtime/core/control/registrations.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

class Teardowns final : private TeardownHost {
 public:
  // `registrations` and `devices` are only stored here: they may be built after this. Makes the
  // worker, which the event loop tells of a failed device.
  Teardowns(ControlCore& core, Registrations& registrations, Devices& devices,
            const EngineEntry& engine);
  Teardowns(const Teardowns&) = delete;
  Teardowns& operator=(const Teardowns&) = delete;

  // Starts a drained teardown of the registration; see Runtime::TeardownQp.
  Result<std::shared_ptr<TeardownState>> TeardownQp(uint32_t slot, uint32_t generation,
                                                    const TeardownOptions& options);
  void Start() { worker_->Start(); }
  // Ends every pending teardown (TeardownWorker::Stop); the consumers must still run.
  void Stop() { worker_->Stop(); }

 private:
  // TeardownHost (teardown.h), on the teardown thread.
  CallTicket RetireTeardown(TeardownState& state) noexcept override;
  bool CallOver(const CallTicket& ticket) const noexcept override;
  void FreeSlot(uint32_t slot) noexcept override;
  void PostLastWqeStandIn(const TeardownState& state) noexcept override;
  bool RedriveFlush(const TeardownState& state) noexcept override;

  ControlCore& core_;
  Registrations& registrations_;
  Devices& devices_;
  const EngineEntry& engine_;  // its engine threads, which Teardown::Wait refuses
  std::unique_ptr<TeardownWorker> worker_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_TEARDOWNS_H_

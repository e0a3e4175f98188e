// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/stats_service.h: the runtime's Stats (GetStats) and the stats server that
// serves them (RuntimeOptions::stats_socket, stats_tcp; runtime/observe/stats_server.h).
//
// Threading: GetStats from any thread, the server's included; it reads the threads' counters
// (relaxed), and takes core.mu for the CQs' part unless the caller is refused control calls
// (caller.h), whose Stats then lack it. Start and Stop: RuntimeImpl's lifetime, without core.mu
// (the server's thread may be waiting for it in GetStats).
#ifndef CQD_RUNTIME_CORE_CONTROL_STATS_SERVICE_H_
#define CQD_RUNTIME_CORE_CONTROL_STATS_SERVICE_H_

#include <memory>

#include "cqd/stats.h"
#include "cqd/status.h"
#include "runtime/core/control/control_core.h"
#include "runtime/core/control/cqs.h"
#include "runtime/core/control/devices.h"
#include "runtime/core/control/registrations.h"
#include "runtime/core/placement.h"
#include "runtime/observe/stats_server.h"

namespace cqd::internal {

class StatsService {
 public:
  StatsService(const ControlCore& core, const Devices& devices, const Cqs& cqs,
               const Registrations& registrations, const Placement& placement)
      : core_(core),
        devices_(devices),
        cqs_(cqs),
        registrations_(registrations),
        placement_(placement) {}
  StatsService(const StatsService&) = delete;
  StatsService& operator=(const StatsService&) = delete;

  Stats GetStats() const;
  // Starts the server if the options ask for one; returns why it could not start.
  Status Start();
  // Stops the server, if any: its thread calls GetStats no more.
  void Stop();

 private:
  const ControlCore& core_;
  const Devices& devices_;
  const Cqs& cqs_;
  const Registrations& registrations_;
  const Placement& placement_;
  std::unique_ptr<StatsServer> server_;  // RuntimeOptions::stats_socket, stats_tcp
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_STATS_SERVICE_H_

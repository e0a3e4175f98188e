// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/control_core.h: what every control service shares: the options, the log,
// the control mutex, the shut-down flag, and the threads' objects (consumers, pollers, the event
// loop) with the slots and the orphan sink they are built on.
//
// RuntimeImpl owns one, declared before its services, and starts and stops its threads; each
// service (control/*.h) holds a reference. Control-path calls serialize on `mu`, one mutex for
// every service: a service's method locks it itself or says CQD_REQUIRES(core_.mu). They never
// hold it while waiting for a consumer (a handler may itself be calling the control path), only
// while waiting for a poller or the event thread (runtime_impl.h says why that is safe). The
// analysis cannot tell that two services' core_ are one: a service calls no CQD_REQUIRES method
// of another, and reads another's guarded state only through a CQD_PT_GUARDED_BY(core_.mu)
// pointer of its own (Registrations' CQ table).
//
// The declaration order matters (destruction runs in reverse): the log is declared before every
// thread that logs, the slots and the orphan sink before the consumers and pollers built on them,
// the consumers before the pollers and the event loop (their producer tokens must go first), the
// stall watch before the event loop that ticks it; each outlives what comes after it.
#ifndef CQD_RUNTIME_CORE_CONTROL_CONTROL_CORE_H_
#define CQD_RUNTIME_CORE_CONTROL_CONTROL_CORE_H_

#include <chrono>
#include <memory>
#include <vector>

#include "cqd/options.h"
#include "runtime/base/log.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"
#include "runtime/core/event_loop.h"
#include "runtime/core/orphans.h"
#include "runtime/core/registry.h"
#include "runtime/core/shard/shard.h"
#include "runtime/core/stall_watch.h"

namespace cqd::internal {

struct ControlCore {
  // `options` passed CheckOptions (options_check.h). Builds the consumers, the pollers, the event
  // loop (and, with a log sink, the stall watch); starts no thread.
  explicit ControlCore(const RuntimeOptions& options);
  ControlCore(const ControlCore&) = delete;
  ControlCore& operator=(const ControlCore&) = delete;

  const RuntimeOptions options;
  const Logger log;  // RuntimeOptions::log; before every thread that logs
  const std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  ControlMutex mu;  // thread_role.h: served while a run-to-completion poller waits
  bool shut_down CQD_GUARDED_BY(mu) = false;
  SlotPool slots;  // the registrations' slots (registry.h): lock-free reads, writes under mu
  OrphanSink orphans;
  // Declared before the pollers and the event loop: their producer tokens must go first.
  std::vector<std::unique_ptr<Consumer>> consumers;
  std::vector<std::unique_ptr<Shard>> pollers;
  std::unique_ptr<StallWatch> stall_watch;  // with a log sink: the event thread's tick
  std::unique_ptr<EventLoop> events;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_CONTROL_CORE_H_

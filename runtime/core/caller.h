// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/caller.h: who is calling, the one answer every refusal reads.
//
// A control call or a wait that could wait for the thread making it is refused with a status
// (runtime.h, "Which threads may block"). Whether it could depends on what the calling thread is
// doing, which thread_role.h and the consumer and teardown marks record. CallerRoles() reads them
// all; each refusal names the roles it refuses and takes its reason from RefusalReason, so that
// "may this thread call or wait here?" has one answer, written once. CheckCaller is the control
// path's refusal (the facade's and the control services', runtime/core/control/).
//
// Threading: any thread, about itself; reads only thread-local marks. Never blocks.
#ifndef CQD_RUNTIME_CORE_CALLER_H_
#define CQD_RUNTIME_CORE_CALLER_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "cqd/status.h"

namespace cqd::internal {

// What the calling thread is doing; several may hold at once.
enum CallerRole : uint32_t {
  kRoleRuntimeThread = 1u << 0,   // a cqd poller or the event thread, or an engine thread driving
                                  // a shard: an OrphanHandler or a DeviceEventHandler runs there
  kRoleLogSink = 1u << 1,         // inside RuntimeOptions::log (it may run under the runtime mutex)
  kRoleHandler = 1u << 2,         // inside a consumer's dispatch: a QpHandler or a CmHandler
  kRoleTeardownThread = 1u << 3,  // the thread that ends teardowns (TeardownOptions::on_done)
  kRoleWaitDuty = 1u << 4,        // a poller's thread running its run-to-completion handlers
  kRoleCallback = 1u << 5,        // another cqd callback on a control thread (CallbackScope)
  // Not a callback: the engine thread that last drained an engine-driven consumer or polled an
  // engine-driven shard of the runtime asked about (CallerRoles' `engine_threads`).
  kRoleEngineThread = 1u << 6,
};
// Every callback role above: any cqd callback, as Runtime::InCallback().
inline constexpr uint32_t kEveryRole = (kRoleCallback << 1) - 1;

// The ThreadToken()s (thread_role.h) of a runtime's engine threads: each engine-driven
// consumer's last drainer and each engine-driven shard's last driver (relaxed loads).
using EngineThreads = std::vector<const std::atomic<uintptr_t>*>;

// Returns the roles of the calling thread (0: an engine thread outside every cqd callback), with
// kRoleEngineThread if it is one of `engine_threads` (when given).
uint32_t CallerRoles(const EngineThreads* engine_threads = nullptr) noexcept;

// Returns why a caller in `roles` may not make a call that refuses `refused` ("called from ..."),
// the first role of the enum's order that both hold; nullptr when none does.
const char* RefusalReason(uint32_t roles, uint32_t refused) noexcept;

// The callers every control call refuses: they may run where the call would wait for them
// (pollers, the event thread) or under the runtime mutex (the log sink).
inline constexpr uint32_t kRefusedControlCallers = kRoleRuntimeThread | kRoleLogSink;

// Returns kFailedPrecondition naming `op` and the reason when the caller holds a role of
// `refused`; else OK. With the default: refuses the threads no control call may come from (a
// poller or the event thread: an OrphanHandler or DeviceEventHandler; the log sink).
Status CheckCaller(const char* op, uint32_t refused = kRefusedControlCallers);

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CALLER_H_

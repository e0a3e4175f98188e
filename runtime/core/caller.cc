// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/caller.h"

#include <string>

#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {

uint32_t CallerRoles(const EngineThreads* engine_threads) noexcept {
  uint32_t roles = 0;
  if (engine_threads != nullptr) {
    for (const std::atomic<uintptr_t>* token : *engine_threads) {
      if (token->load(std::memory_order_relaxed) == ThreadToken()) roles |= kRoleEngineThread;
    }
  }
  if (OnRuntimeThread()) roles |= kRoleRuntimeThread;
  if (InLogSink()) roles |= kRoleLogSink;
  if (Consumer::OnConsumerThread()) roles |= kRoleHandler;
  if (TeardownWorker::OnWorkerThread()) roles |= kRoleTeardownThread;
  if (HasWaitDuty()) roles |= kRoleWaitDuty;
  if (InCallbackScope()) roles |= kRoleCallback;
  return roles;
}

const char* RefusalReason(uint32_t roles, uint32_t refused) noexcept {
  const uint32_t held = roles & refused;
  if (held & kRoleRuntimeThread) {
    return "called from a cqd poller or event thread (an OrphanHandler or DeviceEventHandler)";
  }
  if (held & kRoleLogSink) {
    return "called from the RuntimeOptions::log sink (it may run under the runtime mutex)";
  }
  if (held & kRoleHandler) {
    return "called from a handler (its consumer, or one a teardown needs, would wait for it)";
  }
  if (held & kRoleTeardownThread) {
    return "called from a teardown's on_done (the thread that ends teardowns)";
  }
  if (held & kRoleWaitDuty) {
    return "called from a run-to-completion handler (its poller would wait for it)";
  }
  if (held & kRoleCallback) return "called from a cqd callback";
  if (held & kRoleEngineThread) {
    return "called from a thread that drains an engine-driven consumer or polls an engine-driven "
           "shard of the runtime (the QP's markers may wait behind what it delivers or polls)";
  }
  return nullptr;
}

Status CheckCaller(const char* op, uint32_t refused) {
  const char* reason = RefusalReason(CallerRoles(), refused);
  if (reason == nullptr) return Status::Ok();
  return FailedPrecondition(std::string(op) + ": " + reason +
                            ", which must not make this call (runtime.h, \"Waiting\")");
}

}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/orphans.h: where completions that no handler may take end up.
//
// Called, possibly concurrently, from every thread that does a shard's or a consumer's work
// (OrphanHandler in cqd/handler.h lists them): pollers (unknown qp_num), consumers (QP
// unregistered while its completions were queued), a control thread doing a shard's work inline
// (Mailbox::RunSync inline: PurgeDead or RemoveCq while nobody drives the shard), the teardown
// worker likewise (through Retire), and the destructor (items left in engine-driven queues).
// Orphans are rare, so one shared relaxed counter costs nothing that matters.
#ifndef CQD_RUNTIME_CORE_ORPHANS_H_
#define CQD_RUNTIME_CORE_ORPHANS_H_

#include <atomic>
#include <cstdint>
#include <span>

#include "cqd/handler.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {

class OrphanSink {
 public:
  explicit OrphanSink(OrphanHandler* handler) : handler_(handler) {}

  void Take(std::span<const ibv_wc> wcs) noexcept {
    if (wcs.empty()) return;
    count_.fetch_add(wcs.size(), std::memory_order_relaxed);
    if (handler_ == nullptr) return;
    const CallbackScope scope;
    if (!HasWaitDuty()) {
      handler_->OnOrphans(wcs);
      return;
    }
    // Dispatching run-to-completion handlers on a poller, where they may call the runtime: an
    // OrphanHandler on a poller may not (handler.h), so its calls are refused here as elsewhere.
    const RuntimeThreadScope runtime(true);
    handler_->OnOrphans(wcs);
  }
  // Returns the number of orphans so far.
  uint64_t total() const { return count_.load(std::memory_order_relaxed); }

 private:
  OrphanHandler* const handler_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_ORPHANS_H_

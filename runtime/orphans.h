// runtime/orphans.h: where completions that no handler may take end up.
//
// Called from pollers (unknown qp_num), consumers (QP unregistered while its completions were
// queued) and the destructor (items left in engine-driven queues). Counts per thread with
// tbb::enumerable_thread_specific, so the rare concurrent callers never share a counter line.
#ifndef CQD_RUNTIME_ORPHANS_H_
#define CQD_RUNTIME_ORPHANS_H_

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <atomic>
#include <cstdint>
#include <span>

#include "cqd/handler.h"

namespace cqd::internal {

class OrphanSink {
 public:
  explicit OrphanSink(OrphanHandler* handler) : handler_(handler) {}

  void Take(std::span<const ibv_wc> wcs) noexcept {
    if (wcs.empty()) return;
    counts_.local().fetch_add(wcs.size(), std::memory_order_relaxed);
    if (handler_ != nullptr) handler_->OnOrphans(wcs);
  }
  // Returns the number of orphans so far (a sum of relaxed per-thread counts).
  uint64_t total() const {
    uint64_t sum = 0;
    for (const auto& count : counts_) sum += count.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  OrphanHandler* const handler_;
  mutable tbb::enumerable_thread_specific<std::atomic<uint64_t>> counts_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_ORPHANS_H_

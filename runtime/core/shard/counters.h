// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/counters.h: a shard's statistics (PollerStats), and the one poll of a CQ
// that counts itself in them.
//
// Threading: written by the shard's driver only (relaxed: each counter has one writer, so an add
// is a load and a store, no locked instruction); read by any thread (Shard::stats).
#ifndef CQD_RUNTIME_CORE_SHARD_COUNTERS_H_
#define CQD_RUNTIME_CORE_SHARD_COUNTERS_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

#include "runtime/core/records.h"

namespace cqd::internal {

// Adds `n` to a counter that only the calling thread writes.
inline void Count(std::atomic<uint64_t>& counter, uint64_t n) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct ShardCounters {
  std::atomic<uint64_t> polls{0};
  std::atomic<uint64_t> empty_polls{0};
  std::atomic<uint64_t> completions{0};
  std::atomic<uint64_t> arms{0};
  std::atomic<uint64_t> arm_failures{0};
  std::atomic<uint64_t> sleeps{0};
  std::atomic<bool> asleep{false};  // committed to a sleep (PollerStats::asleep)
  std::atomic<uint64_t> backpressure_stalls{0};
  std::atomic<uint64_t> parks{0};
  std::atomic<uint64_t> parked_cqs{0};

  // One Poll of `cq` into `into` for up to `want`, counted (an empty one only when `first`, the
  // first poll of a CQ's turn); marks the CQ failed (S11) when the poll does. Returns what Poll
  // returned.
  int CountedPoll(CqRecord* cq, int want, ibv_wc* into, bool first) noexcept {
    const int n = cq->cq->Poll(want, into);
    Count(polls, 1);
    if (n == 0) {
      if (first) Count(empty_polls, 1);
    } else if (n < 0) {  // CQ in error (overflow, device failure): only destroy works now
      cq->poll_failed = true;
      Count(cq->counts.poll_errors, 1);
    } else {
      Count(cq->counts.completions, static_cast<uint64_t>(n));
      Count(completions, static_cast<uint64_t>(n));
    }
    return n;
  }
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_COUNTERS_H_

// runtime/core/spill.h: a poller's bounded FIFO of items for one consumer (its spill).
//
// Every item a poller routes to a consumer goes through that consumer's spill: completions as
// they are polled, async-event parts as the event thread posts them. The poller moves items from
// the front into the consumer's queue while the queue has room, so items leave in the order they
// arrived and the consumer's queue never holds more than its capacity. When a consumer stops
// draining, its spill fills up to `limit` items; the poller then skips the CQs that consumer
// shares (see Poller), and only those.
//
// Threading: the ring and its positions belong to the owning poller thread. The stats are
// atomics written by that thread (relaxed) and read by GetStats on any thread.
#ifndef CQD_RUNTIME_CORE_SPILL_H_
#define CQD_RUNTIME_CORE_SPILL_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>

#include "runtime/core/consumer.h"

namespace cqd::internal {

class Spill {
 public:
  explicit Spill(uint32_t limit)
      : limit_(limit),
        mask_(std::bit_ceil(limit) - 1),
        ring_(std::make_unique<Item[]>(std::bit_ceil(limit))) {}

  uint32_t size() const noexcept { return static_cast<uint32_t>(tail_ - head_); }
  bool empty() const noexcept { return tail_ == head_; }
  // Returns how many more items fit before the spill is full.
  uint32_t room() const noexcept { return limit_ - size(); }
  bool full() const noexcept { return size() >= limit_; }

  // Requires room() > 0. Returns the slot to fill.
  Item& Append() noexcept { return ring_[tail_++ & mask_]; }
  // Returns the oldest items that are contiguous in memory (at most `max`); sets *n.
  Item* Front(uint32_t max, uint32_t* n) noexcept {
    uint32_t contiguous = static_cast<uint32_t>((mask_ + 1) - (head_ & mask_));
    *n = std::min({max, size(), contiguous});
    return &ring_[head_ & mask_];
  }
  void PopFront(uint32_t n) noexcept { head_ += n; }

  // Keeps the items for which keep(item) is true, in order; returns how many were removed.
  template <typename Keep>
  uint32_t Filter(Keep&& keep) {
    uint64_t write = head_;
    for (uint64_t read = head_; read != tail_; ++read) {
      Item& item = ring_[read & mask_];
      if (keep(item)) {
        if (write != read) ring_[write & mask_] = item;
        ++write;
      }
    }
    uint32_t removed = static_cast<uint32_t>(tail_ - write);
    tail_ = write;
    return removed;
  }

  // Stats (poller writes, anyone reads).
  std::atomic<uint64_t> depth_stat{0};  // size() after the poller's last change
  std::atomic<uint64_t> high_water{0};  // most items held at once
  std::atomic<uint64_t> stalls{0};      // times it filled up (its CQs were skipped)
  std::atomic<uint64_t> stalled_ns{0};  // time spent full, summed over stalls that ended
  std::chrono::steady_clock::time_point full_since{};  // poller-owned: start of the current stall
  bool stalled = false;                                // poller-owned
  bool listed = false;  // poller-owned: in the poller's list of non-empty spills
  // poller-owned, set once: for a run-to-completion consumer of this poller, which dispatches
  // straight from the spill while the consumer's queue is empty (Poller::DispatchHosted).
  bool direct = false;

 private:
  const uint32_t limit_;
  const uint64_t mask_;
  std::unique_ptr<Item[]> ring_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SPILL_H_

// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/latency.h: the opt-in poll -> dispatch latency histogram of a consumer
// (ConsumerOptions::record_latency).
//
// The poller reads the clock once per CQ poll that returned completions and writes the low 32
// bits of the steady-clock time in nanoseconds into every entry of that poll (EntryMeta::stamp in
// the lane, Item::stamp for one that travels alone). The consumer reads the clock once per
// dispatch batch, after gathering the batch (from the lanes' published positions and its queued
// items) and before calling its handlers, and records `now - stamp` (mod 2^32) for each
// completion in it.
// Completions of one poll share a stamp and usually sit next to each other in a batch, so a run
// of equal stamps is one Record call. A latency of 2^32 ns (4.29 s) or more wraps and is recorded
// modulo 2^32 ns; such waits show up in the stall counters.
//
// Buckets are log-linear (HDR-style): exact below 16 ns, then 16 buckets per power of two, so a
// bucket is at most 1/16 (6.25 %) of its values wide. The bucket of a value v holds v - 1 (v = 0
// shares the bucket of 1), which makes the upper bound of every 16th bucket a power of two: a
// Prometheus `le` ladder of powers of two reads exact counts out of it.
//
// Threading: Record is called by the consumer's dispatching thread only (single writer), with
// relaxed load + store per counter; Snapshot may run on any thread, concurrently, with relaxed
// loads. A snapshot is consistent per counter, not across them: `count` is the sum of the bucket
// counts it read, so the percentiles always agree with it.
#ifndef CQD_RUNTIME_OBSERVE_LATENCY_H_
#define CQD_RUNTIME_OBSERVE_LATENCY_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "cqd/stats.h"

namespace cqd::internal {

// Returns the low 32 bits of the steady clock in nanoseconds.
inline uint32_t NowNs32() noexcept {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 4;
  static constexpr uint32_t kSub = 1u << kSubBits;
  // Groups: 0 holds the exact values 0..15 (of v - 1); group g >= 1 holds msb == g + 3.
  static constexpr uint32_t kBuckets = (32 - kSubBits + 1) * kSub;  // 464

  // Bucket index of a latency of `v` ns.
  static constexpr uint32_t Index(uint32_t v) noexcept {
    const uint32_t x = v == 0 ? 0 : v - 1;
    if (x < kSub) return x;
    const uint32_t msb = static_cast<uint32_t>(std::bit_width(x)) - 1;  // >= kSubBits
    const uint32_t shift = msb - kSubBits;
    return (shift + 1) * kSub + ((x >> shift) - kSub);
  }
  // The largest latency (ns, inclusive) that bucket `index` holds.
  static constexpr uint64_t UpperBound(uint32_t index) noexcept {
    if (index < kSub) return uint64_t{index} + 1;
    const uint32_t group = index / kSub;
    const uint64_t sub = index % kSub;
    const uint32_t shift = group - 1;
    return (kSub + sub + 1) << shift;  // the highest x in the bucket, plus one
  }

  // Consumer thread: `count` completions waited `latency_ns`.
  void Record(uint32_t latency_ns, uint64_t count) noexcept {
    std::atomic<uint64_t>& bucket = buckets_[Index(latency_ns)];
    bucket.store(bucket.load(std::memory_order_relaxed) + count, std::memory_order_relaxed);
    sum_.store(sum_.load(std::memory_order_relaxed) + uint64_t{latency_ns} * count,
               std::memory_order_relaxed);
    if (latency_ns > max_.load(std::memory_order_relaxed)) {
      max_.store(latency_ns, std::memory_order_relaxed);
    }
  }

  // Consumer thread: records the completions among `items[0..n)` (those with
  // `item.kind == completion`) against `now` (NowNs32(), read once per dispatch batch).
  template <typename ItemT, typename KindT>
  void RecordBatch(const ItemT* items, size_t n, KindT completion, uint32_t now) noexcept {
    size_t i = 0;
    while (i < n) {
      if (items[i].kind != completion) {
        ++i;
        continue;
      }
      const uint32_t stamp = items[i].stamp;
      size_t j = i + 1;
      while (j < n && items[j].kind == completion && items[j].stamp == stamp) ++j;
      Record(now - stamp, j - i);
      i = j;
    }
  }

  // Any thread: the counts, percentiles and non-empty buckets.
  LatencyStats Snapshot() const {
    LatencyStats s;
    s.enabled = true;
    uint64_t counts[kBuckets];
    for (uint32_t b = 0; b < kBuckets; ++b) {
      counts[b] = buckets_[b].load(std::memory_order_relaxed);
      s.count += counts[b];
    }
    s.sum_ns = sum_.load(std::memory_order_relaxed);
    s.max_ns = max_.load(std::memory_order_relaxed);
    if (s.count == 0) return s;
    // A bucket may be read with a count whose max update is not seen yet: the max is at least
    // the lower end of the highest non-empty bucket.
    for (uint32_t b = kBuckets; b-- > 0;) {
      if (counts[b] != 0) {
        const uint64_t lower = b == 0 ? 0 : UpperBound(b - 1) + 1;
        s.max_ns = std::max(s.max_ns, lower);
        break;
      }
    }
    for (uint32_t b = 0; b < kBuckets; ++b) {
      if (counts[b] != 0) s.buckets.push_back({UpperBound(b), counts[b]});
    }
    s.p50_ns = Percentile(s, 0.5);
    s.p90_ns = Percentile(s, 0.9);
    s.p99_ns = Percentile(s, 0.99);
    s.p999_ns = Percentile(s, 0.999);
    return s;
  }

  // The upper bound of the bucket holding the ceil(q * count)-th smallest latency, at most max.
  static uint64_t Percentile(const LatencyStats& s, double q) {
    if (s.count == 0) return 0;
    uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(s.count));
    if (static_cast<double>(rank) < q * static_cast<double>(s.count)) ++rank;
    rank = std::clamp<uint64_t>(rank, 1, s.count);
    uint64_t seen = 0;
    for (const LatencyStats::Bucket& b : s.buckets) {
      seen += b.count;
      if (seen >= rank) return std::min(b.upper_ns, s.max_ns);
    }
    return s.max_ns;
  }

 private:
  std::atomic<uint64_t> buckets_[kBuckets] = {};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_OBSERVE_LATENCY_H_

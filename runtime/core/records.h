// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/records.h: what the runtime keeps per device and per CQ, shared by its threads.
//
// Ownership: RuntimeImpl owns both (control path, under its mutex). Fields are grouped by the
// thread that writes them; fields read by other threads are atomics.
#ifndef CQD_RUNTIME_CORE_RECORDS_H_
#define CQD_RUNTIME_CORE_RECORDS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "cqd/handler.h"
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/core/device_claims.h"
#include "runtime/core/registry.h"
#include "runtime/core/retired_numbers.h"

namespace cqd::internal {

// Unacked completion events of one CQ (S2, S3). Whoever brings the count to the threshold takes
// the whole count with one exchange and makes the single ibv_ack_cq_events call for it, so no
// event is acked twice and none is forgotten. All operations are seq_cst: see CqRecord::retiring.
class AckCounter {
 public:
  // Adds `n` events; returns how many the caller must ack now (0 below the threshold).
  uint32_t Add(uint32_t n, uint32_t threshold) noexcept {
    uint32_t now = unacked_.fetch_add(n, std::memory_order_seq_cst) + n;
    return now >= threshold ? unacked_.exchange(0, std::memory_order_seq_cst) : 0;
  }
  // Returns every unacked event; the caller must ack them.
  uint32_t TakeAll() noexcept { return unacked_.exchange(0, std::memory_order_seq_cst); }

 private:
  std::atomic<uint32_t> unacked_{0};
};

struct DeviceRecord {
  DeviceId id = 0;
  std::unique_ptr<backend::Device> backend;
  std::vector<backend::Channel*> channels;  // one per shard
  DeviceEventHandler* handler = nullptr;    // device-level async events; may be null
  QpTable qps;                              // qp_num -> registration, for this device
  std::atomic<bool> failed{false};          // DEVICE_FATAL seen
  std::atomic<uint64_t> cq_errors{0};       // CQ_ERR events read (the event thread adds)
  DeviceClaim claim;                        // this runtime's hold on the native device
};

// The most work requests the capacity guard lets a CQ grow to (RegisterQp, Registrations::Commit).
inline constexpr uint64_t kCqGrowthCeiling = uint64_t{1} << 30;

// CqRecord::sole_consumer when the CQ's QPs have no consumer or more than one.
inline constexpr uint32_t kNoSoleConsumer = ~uint32_t{0};

struct CqRecord {
  uint32_t id = 0;
  int shard = 0;
  DeviceRecord* device = nullptr;
  backend::Cq* cq = nullptr;
  void* native = nullptr;  // cq->native(), kept: it names the CQ after the backend destroyed it
  bool adopted = false;
  bool solicited_only = false;
  bool grow = true;        // CqOptions::grow
  int comp_vector = -1;    // the vector CreateCq used; -1 for an adopted CQ
  int registered_qps = 0;  // control path
  uint64_t committed = 0;  // control path: work requests its registered QPs may have outstanding
  // Work requests of retired QPs whose completions may still be in the CQ, held by their fences
  // (fences.h). Raised on the poller thread inside a control call; lowered by the poller when a
  // fence ends (release).
  std::atomic<uint64_t> leftover_commit{0};
  // The fences on this CQ (fences.h): written by its shard, read (relaxed) by the control path,
  // which skips the reuse check while it is 0 and the number is not in `retired`.
  std::atomic<uint32_t> fences{0};
  // Control path: numbers whose registration ended here and that have not registered here since
  // (retired_numbers.h): RegisterQp polls the CQ out before such a number comes back.
  RetiredNumbers retired;

  // Shard-owned (changed by the control path only through Shard's calls).
  bool poll_failed = false;
  // The fences here (FenceList), as a poll of the CQ sees them.
  struct FenceState {
    uint32_t awaited_markers = 0;  // fences waiting for a marker
    uint32_t catch_ups = 0;        // fences with a catch-up running
    // The catch-up clock: completions polled here while catch-ups ran, and the count at which
    // the earliest running one may end (a poll before it, that does not find the CQ empty, ends
    // none and walks no fence).
    uint64_t catch_up_polled = 0;
    uint64_t catch_up_due = UINT64_MAX;
  };
  FenceState fenced;
  // Consumers of the QPs registered on this CQ, with how many QPs each: the spills whose room
  // bounds a poll of this CQ (see shard/spills.h).
  struct Use {
    uint32_t consumer;
    uint32_t count;
  };
  std::vector<Use> uses;
  // The one consumer in `uses`, or kNoSoleConsumer: written with `uses` (relaxed), read by the
  // event thread (relaxed), which marks that consumer in EventLoop::ReadChannel and pre-wakes it
  // in EventLoop::Run, before the shard.
  // A stale read costs a wake that finds nothing, or a wake not made early; never a completion.
  std::atomic<uint32_t> sole_consumer{kNoSoleConsumer};
  // Parking (RuntimeOptions::cq_park_after): a parked CQ is armed and out of its shard's passes
  // until its event; empty_run counts the empty polls in a row, empty_since is when that run
  // reached CqSet::kParkProbe polls.
  struct Parking {
    bool parked = false;
    uint32_t empty_run = 0;
    std::chrono::steady_clock::time_point empty_since{};
  };
  Parking parking;

  // Set by the poller before it arms, cleared by the event thread when the CQ's event arrives:
  // the poller arms only while it is clear, so at most once per notification (S7).
  alignas(64) std::atomic<bool> armed{false};
  AckCounter acks;
  // Set (seq_cst) before the final ack flush at destroy or release. The event thread checks it
  // (seq_cst) after counting an event and then flushes itself: with the counter's seq_cst
  // operations, every event it read is acked exactly once, by it or by the destroyer.
  std::atomic<bool> retiring{false};

  // Stats: completions and poll_errors by the shard; the rest by whoever acks or reads events.
  struct Counts {
    std::atomic<uint64_t> completions{0};
    std::atomic<uint64_t> poll_errors{0};
    std::atomic<uint64_t> events{0};
    std::atomic<uint64_t> acked_events{0};
    std::atomic<uint64_t> ack_calls{0};
  };
  Counts counts;

  // Acks `n` events of this CQ (n may be 0) and counts the call.
  void Ack(uint32_t n) noexcept {
    if (n == 0) return;
    // Counted before the device has the ack (the events were counted before this call): once
    // the engine's destroy of a released CQ returns, which waits for the ack, the count is in.
    // Release: whoever reads acked_events (acquire) first, then events, sees every event acked.
    counts.acked_events.fetch_add(n, std::memory_order_release);
    counts.ack_calls.fetch_add(1, std::memory_order_relaxed);
    device->backend->AckCqEvents(cq, n);
  }
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_RECORDS_H_

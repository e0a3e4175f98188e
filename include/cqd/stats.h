// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/stats.h: a snapshot of the runtime's counters, from Runtime::GetStats().
///
/// Each counter is written by the thread that owns it or by atomic read-modify-writes from any
/// thread (orphans, a consumer's high water), so each is consistent on its own; no snapshot is
/// atomic across counters.
#ifndef CQD_STATS_H_
#define CQD_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cqd/version.h"

namespace cqd {

/// One poller (one CQ shard).
struct PollerStats {
  int cpu = -1;               ///< pinned CPU (RuntimeOptions::poller_cpus), -1 if not pinned
  int numa_node = -1;         ///< NUMA node whose CPUs auto_placement confined it to, or -1
  int engine_driven = 0;      ///< 1: an engine-driven shard (RuntimeOptions::engine_shards)
  uint64_t polls = 0;         ///< poll calls on CQs
  uint64_t empty_polls = 0;   ///< ... of which returned nothing
  uint64_t completions = 0;   ///< completions taken off CQs
  uint64_t arms = 0;          ///< ibv_req_notify_cq calls
  uint64_t arm_failures = 0;  ///< ... of which failed (the CQ is armed again at the next sleep)
  uint64_t sleeps = 0;        ///< times the poller went to sleep
  uint64_t backpressure_stalls = 0;  ///< CQ polls skipped because a consumer it serves was full
  uint64_t parks = 0;       ///< times an idle CQ was parked (RuntimeOptions::cq_park_after)
  uint64_t parked_cqs = 0;  ///< CQs parked now: armed, and not polled until their event
  /// 1 while the poller sleeps: it armed its CQs, found nothing after arming, and waits for an
  /// event or a wake (an engine-driven shard: from a TrySleepShard that said sleep until a wake
  /// or its next call; 0 at once if a wake had come before that call); 0 while it runs, and
  /// after Shutdown. A completion that comes while it is 1 is found through the completion
  /// channel, unless the sleep is bounded (a failed arm or channel: the poller polls again
  /// within 1 ms) or the CQ is solicited-only and the completion raises no event (S8).
  uint64_t asleep = 0;
};

/// One CQ the runtime polls.
struct CqStats {
  uint32_t id = 0;            ///< CqHandle::id()
  int shard = 0;              ///< the shard whose poller polls it
  int comp_vector = -1;       ///< the completion vector it was created on; -1 if adopted
  uint64_t completions = 0;   ///< completions polled from this CQ
  uint64_t events = 0;        ///< completion events read from the channel
  uint64_t acked_events = 0;  ///< events acknowledged so far (never above `events`)
  uint64_t ack_calls = 0;     ///< ibv_ack_cq_events calls
  uint64_t poll_errors = 0;   ///< negative poll returns (the CQ is then left alone)
};

/// Poll -> dispatch latency of a consumer's completions (ConsumerOptions::record_latency): from
/// the poller taking a completion off its CQ to the consumer taking the dispatch batch holding it
/// off its queue, right before the batch's handlers run. Recorded in log-linear buckets at most
/// 6.25 % wide; percentiles are the upper bound of the bucket that holds them (at most max_ns).
/// A wait is stamped in 32 bits of nanoseconds, so one of 2^32 ns (4.29 s) or more is recorded
/// modulo 2^32 ns. All zero when not enabled.
struct LatencyStats {
  /// One histogram bucket.
  struct Bucket {
    uint64_t upper_ns = 0;  ///< inclusive; the previous bucket's upper_ns (exclusive) is its lower
    uint64_t count = 0;     ///< completions in this bucket (not cumulative)
  };
  bool enabled = false;           ///< ConsumerOptions::record_latency
  uint64_t count = 0;             ///< completions recorded (delivered, or orphaned at the consumer)
  uint64_t sum_ns = 0;            ///< their latencies added up
  uint64_t p50_ns = 0;            ///< median
  uint64_t p90_ns = 0;            ///< 90th percentile
  uint64_t p99_ns = 0;            ///< 99th percentile
  uint64_t p999_ns = 0;           ///< 99.9th percentile
  uint64_t max_ns = 0;            ///< the largest recorded (exact)
  std::vector<Bucket> buckets{};  ///< the non-empty buckets, by upper_ns ascending
};

/// One consumer (RuntimeOptions::consumers, in order).
struct ConsumerStats {
  std::string name{};         ///< ConsumerOptions::name (or "consumer<i>")
  int cpu = -1;               ///< pinned CPU (ConsumerOptions::cpu), -1 if not pinned
  int numa_node = -1;         ///< NUMA node whose CPUs auto_placement confined it to, or -1
  uint64_t delivered = 0;     ///< completions handed to handlers
  uint64_t async_events = 0;  ///< async and connection-manager events handed to handlers
  uint64_t queue_depth = 0;   ///< items handed over and not yet dispatched (their handlers done)
  uint64_t high_water = 0;    ///< most such items at once
  /// Spill: items pollers hold because the queue was full (summed over pollers; see
  /// ConsumerOptions::spill_capacity), as each poller's last hand-over left them: what a poller
  /// gathers under a backlog before it hands over (README, "Threading model") takes spill room
  /// but is not counted. A stall is a time a poller's spill for this consumer was full, so that
  /// it skipped the CQs this consumer uses. A run-to-completion consumer's poller
  /// also holds there, between polling and dispatch, what it dispatches without queueing it: for
  /// that kind the queue figures count only what the spill could not hold.
  uint64_t spill_depth = 0;       ///< items held in pollers' spills now
  uint64_t spill_high_water = 0;  ///< most items one poller held at once
  uint64_t stalls = 0;            ///< stalls begun
  uint64_t stalled_ns = 0;        ///< time spent stalled, the stalls in progress included
  uint64_t stall_ns = 0;          ///< how long the stall in progress has lasted (0: none)
  uint64_t queue_capacity = 0;    ///< ConsumerOptions::queue_capacity: queue_depth's bound
  uint64_t spill_capacity = 0;    ///< ConsumerOptions::spill_capacity: each poller's spill bound
  /// kOwnedThread: times the event thread woke this consumer's thread from its sleep (or from
  /// the moment before it, when it had decided to sleep) just before it woke a poller for a CQ
  /// whose QPs are all this consumer's, so that the consumer's wake overlaps the poller's (it
  /// then spins, ConsumerOptions::idle_spin, while the poller hands over). 0 for the other kinds.
  uint64_t pre_wakes = 0;
  LatencyStats latency{};  ///< ConsumerOptions::record_latency
};

/// One device added to the runtime.
struct DeviceStats {
  uint32_t id = 0;         ///< the DeviceId
  std::string name{};      ///< the verbs device's name ("rxe0", "mlx5_0"), or the simulated one's
  int numa_node = -1;      ///< from sysfs; -1: unknown, none, or the simulated device
  int comp_vectors = 1;    ///< ibv_context::num_comp_vectors (1 on the simulated device)
  uint64_t failed = 0;     ///< 1 once the device raised DEVICE_FATAL (its QPs and teardowns ended)
  uint64_t cq_errors = 0;  ///< CQ_ERR async events of the device's CQs
};

/// A snapshot of the runtime's counters (Runtime::GetStats).
struct Stats {
  uint64_t uptime_ns = 0;  ///< steady-clock time from Runtime::Create to this snapshot
  /// QPs registered now: registrations that have not ended (by Unregister, the Registration's
  /// destructor, or the end of a TeardownQp). 0 once every registration ended: a leak check.
  uint64_t registrations = 0;
  uint64_t max_registrations = 0;      ///< RuntimeOptions::max_registrations: registrations' bound
  std::vector<PollerStats> pollers{};  ///< by shard
  std::vector<CqStats> cqs{};          ///< the CQs polled now (none from a runtime thread)
  std::vector<ConsumerStats> consumers{};  ///< by ConsumerId
  std::vector<DeviceStats> devices{};      ///< by DeviceId, from 1
  /// The CPUs auto_placement confined threads to, as a cpulist ("0-3,8-11"); empty if none.
  std::string placement_cpus{};
  uint64_t orphans = 0;       ///< completions given to the orphan handler (or dropped if none)
  uint64_t async_events = 0;  ///< async events read from devices (CM events: cm_events)
  /// Completion channel or async fds the event thread stopped watching because reading them kept
  /// failing (a device gone); the affected pollers then sleep in bounded steps.
  uint64_t failed_fds = 0;
  uint64_t cm_events = 0;  ///< connection-manager events read from watched channels
  /// Totals over every CQ this runtime has polled, destroyed ones included; in any one snapshot
  /// cq_acked_events <= cq_events, equal once every CQ is destroyed. Like `cqs`, 0 in a snapshot
  /// taken on a runtime thread or in the log sink.
  uint64_t cq_events = 0;        ///< completion events read
  uint64_t cq_acked_events = 0;  ///< ... of which acknowledged
  uint64_t cq_ack_calls = 0;     ///< ibv_ack_cq_events calls
};

}  // namespace cqd

#endif  // CQD_STATS_H_

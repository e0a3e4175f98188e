// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/stats_format.h: a Stats snapshot as JSON or as Prometheus text.
///
/// Both are pure functions of their argument: any thread may call them, on any Stats (for example
/// the result of Runtime::GetStats()). Strings (consumer names are the engine's) are escaped; bytes
/// that are not valid UTF-8 become U+FFFD, so the output is always valid UTF-8.
///
/// JSON (one line, no trailing newline; every number an integer, -1 only for "cpu", "numa_node"
/// and "comp_vector", which use it for none):
///   {"uptime_ns":N,"registrations":N,"orphans":N,"async_events":N,"failed_fds":N,"cm_events":N,
///    "cq_events":N,"cq_acked_events":N,"cq_ack_calls":N,"placement_cpus":"0-3",
///    "devices":[{"id":1,"name":"mlx5_0","numa_node":0,"comp_vectors":8},...],
///    "pollers":[{"index":0,"cpu":-1,"numa_node":-1,"polls":N,"empty_polls":N,"completions":N,
///                "arms":N,"arm_failures":N,"sleeps":N,"backpressure_stalls":N,"parks":N,
///                "parked_cqs":N,"asleep":N},...],
///    "cqs":[{"id":1,"shard":0,"comp_vector":0,"completions":N,"events":N,"acked_events":N,
///            "ack_calls":N,"poll_errors":N},...],
///    "consumers":[{"index":0,"name":"consumer0","cpu":-1,"numa_node":-1,"delivered":N,
///                  "async_events":N,
///                  "queue_depth":N,"high_water":N,"spill_depth":N,"spill_high_water":N,
///                  "stalls":N,"stalled_ns":N,
///                  "latency":{"enabled":true,"count":N,"sum_ns":N,"p50_ns":N,"p90_ns":N,
///                             "p99_ns":N,"p999_ns":N,"max_ns":N,
///                             "buckets":[[upper_ns,count],...]}},...]}
/// Fields may be added later; readers should ignore keys they do not know.
///
/// Both come from one table of fields inside the library, so every number above has
/// a Prometheus family too, except "index", "id", "shard" and the placement ids ("cpu",
/// "numa_node", "comp_vector"), which are labels there.
///
/// Prometheus text exposition format 0.0.4: metric names start with "cqd_", every family has
/// HELP and TYPE lines; counters end in "_total"; labels poller="<index>", cq="<id>" (with
/// shard="<shard>"), consumer="<name>" (with consumer_id="<index>", since names need not be
/// unique), device="<id>" (with name="<name>"). Durations are in seconds. Placement (CPUs, NUMA
/// nodes, completion vectors) is not a quantity: it comes as labels of info families, always 1,
/// a label empty where JSON says -1: cqd_poller_info{poller,cpu,numa_node},
/// cqd_cq_info{cq,shard,comp_vector}, cqd_consumer_info{consumer,consumer_id,cpu,numa_node},
/// cqd_device_info{device,name,numa_node}, and cqd_placement_info{cpus}. cqd_registrations and
/// cqd_cqs count what is live now. Consumers
/// that record latency get a histogram cqd_consumer_latency_seconds with buckets at powers of two
/// nanoseconds (16 ns .. 2^32 ns), exact because the runtime's buckets end at powers of two.
#ifndef CQD_STATS_FORMAT_H_
#define CQD_STATS_FORMAT_H_

#include <string>

#include "cqd/stats.h"
#include "cqd/version.h"

namespace cqd {

/// How StatsToPrometheus writes its text.
struct PrometheusOptions {
  /// false: leaves out the per-CQ families (cqd_cq_*_total and cqd_cq_info), whose series come
  /// and go with the CQs of an engine that makes one per connection. The totals over every CQ
  /// (cqd_cqs, cqd_cq_events_all_total and the other *_all_total families, the pollers'
  /// completions) stay.
  bool per_cq = true;
};

/// Returns `stats` as one line of JSON (no newline), as described above.
std::string StatsToJson(const Stats& stats);
/// Returns `stats` in the Prometheus text format (0.0.4), as described above.
std::string StatsToPrometheus(const Stats& stats, const PrometheusOptions& options = {});

}  // namespace cqd

#endif  // CQD_STATS_FORMAT_H_

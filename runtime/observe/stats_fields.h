// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_fields.h: the field table: every plain number of a Stats row, once, for
// both formats (stats_format_json.cc and stats_format_prometheus.cc write JSON and Prometheus
// text from it). A field added to cqd/stats.h is added here, and both formats have it.
//
// Threading: constant data; any thread.
#ifndef CQD_RUNTIME_OBSERVE_STATS_FIELDS_H_
#define CQD_RUNTIME_OBSERVE_STATS_FIELDS_H_

#include <cstdint>

#include "cqd/stats.h"

namespace cqd::stats_fields {

// How a field prints: unsigned (counts, depths), signed (-1 for none), or nanoseconds (JSON keeps
// nanoseconds, Prometheus prints seconds).
enum class Unit { kUnsigned, kSigned, kNanoseconds };

template <typename Row>
struct Field {
  const char* json;    // its key in the row's JSON object
  const char* metric;  // its Prometheus family, or nullptr when it is only a label there
  const char* type;    // "counter" or "gauge"
  const char* help;
  Unit unit;
  uint64_t Row::*u64 = nullptr;  // kUnsigned, kNanoseconds
  int Row::*i32 = nullptr;       // kSigned
};

template <typename Row>
constexpr Field<Row> U(const char* json, const char* metric, const char* type, const char* help,
                       uint64_t Row::*field) {
  return {json, metric, type, help, Unit::kUnsigned, field, nullptr};
}
template <typename Row>
constexpr Field<Row> I(const char* json, const char* metric, const char* help, int Row::*field) {
  return {json, metric, "gauge", help, Unit::kSigned, nullptr, field};
}
template <typename Row>
constexpr Field<Row> Ns(const char* json, const char* metric, const char* type, const char* help,
                        uint64_t Row::*field) {
  return {json, metric, type, help, Unit::kNanoseconds, field, nullptr};
}

// The runtime's totals, before the rows (in JSON, in this order).
inline constexpr Field<Stats> kTotalFields[] = {
    Ns<Stats>("uptime_ns", "cqd_uptime_seconds", "gauge", "Time since the runtime was created.",
              &Stats::uptime_ns),
    U<Stats>("registrations", "cqd_registrations", "gauge",
             "QPs registered now (registrations not yet ended).", &Stats::registrations),
    U<Stats>("max_registrations", "cqd_max_registrations", "gauge",
             "Most QPs that may be registered at once (RuntimeOptions::max_registrations).",
             &Stats::max_registrations),
    U<Stats>("orphans", "cqd_orphans_total", "counter",
             "Completions given to the orphan handler (or dropped if none).", &Stats::orphans),
    U<Stats>("async_events", "cqd_async_events_total", "counter", "Async events read from devices.",
             &Stats::async_events),
    U<Stats>("failed_fds", "cqd_failed_fds_total", "counter",
             "Channel or async fds the event thread stopped watching because reads kept failing.",
             &Stats::failed_fds),
    U<Stats>("cm_events", "cqd_cm_events_total", "counter",
             "Connection-manager events read from watched channels.", &Stats::cm_events),
    U<Stats>("cq_events", "cqd_cq_events_all_total", "counter",
             "Completion events read, over every CQ including destroyed.", &Stats::cq_events),
    U<Stats>("cq_acked_events", "cqd_cq_acked_events_all_total", "counter",
             "Completion events acknowledged, over every CQ including destroyed.",
             &Stats::cq_acked_events),
    U<Stats>("cq_ack_calls", "cqd_cq_ack_calls_all_total", "counter",
             "ibv_ack_cq_events calls, over every CQ including destroyed.", &Stats::cq_ack_calls),
};

inline constexpr Field<DeviceStats> kDeviceFields[] = {
    I<DeviceStats>("numa_node", nullptr, nullptr, &DeviceStats::numa_node),  // cqd_device_info
    I<DeviceStats>("comp_vectors", "cqd_device_comp_vectors", "Completion vectors of the device.",
                   &DeviceStats::comp_vectors),
    U<DeviceStats>("failed", "cqd_device_failed", "gauge",
                   "1 once the device raised DEVICE_FATAL, else 0.", &DeviceStats::failed),
    U<DeviceStats>("cq_errors", "cqd_device_cq_errors_total", "counter",
                   "CQ_ERR async events of the device's CQs.", &DeviceStats::cq_errors),
};

inline constexpr Field<PollerStats> kPollerFields[] = {
    I<PollerStats>("cpu", nullptr, nullptr, &PollerStats::cpu),  // cqd_poller_info
    I<PollerStats>("numa_node", nullptr, nullptr, &PollerStats::numa_node),
    I<PollerStats>("engine_driven", nullptr, nullptr, &PollerStats::engine_driven),
    U<PollerStats>("polls", "cqd_poller_polls_total", "counter", "Poll calls on CQs.",
                   &PollerStats::polls),
    U<PollerStats>("empty_polls", "cqd_poller_empty_polls_total", "counter",
                   "Poll calls that returned nothing.", &PollerStats::empty_polls),
    U<PollerStats>("completions", "cqd_poller_completions_total", "counter",
                   "Completions taken off CQs.", &PollerStats::completions),
    U<PollerStats>("arms", "cqd_poller_arms_total", "counter", "ibv_req_notify_cq calls.",
                   &PollerStats::arms),
    U<PollerStats>("arm_failures", "cqd_poller_arm_failures_total", "counter",
                   "ibv_req_notify_cq calls that failed.", &PollerStats::arm_failures),
    U<PollerStats>("sleeps", "cqd_poller_sleeps_total", "counter",
                   "Times the poller went to sleep.", &PollerStats::sleeps),
    U<PollerStats>("backpressure_stalls", "cqd_poller_backpressure_stalls_total", "counter",
                   "CQ polls skipped because a consumer the CQ serves was full.",
                   &PollerStats::backpressure_stalls),
    U<PollerStats>("parks", "cqd_poller_parks_total", "counter",
                   "Times an idle CQ was armed and left out of the passes.", &PollerStats::parks),
    U<PollerStats>("parked_cqs", "cqd_poller_parked_cqs", "gauge",
                   "CQs parked now: armed, not polled until an event.", &PollerStats::parked_cqs),
    U<PollerStats>("asleep", "cqd_poller_asleep", "gauge",
                   "1 while the poller sleeps, waiting for an event or a wake.",
                   &PollerStats::asleep),
};

inline constexpr Field<CqStats> kCqFields[] = {
    I<CqStats>("shard", nullptr, nullptr, &CqStats::shard),              // a label in Prometheus
    I<CqStats>("comp_vector", nullptr, nullptr, &CqStats::comp_vector),  // cqd_cq_info
    U<CqStats>("completions", "cqd_cq_completions_total", "counter",
               "Completions polled from this CQ.", &CqStats::completions),
    U<CqStats>("events", "cqd_cq_events_total", "counter", "Completion events read for this CQ.",
               &CqStats::events),
    U<CqStats>("acked_events", "cqd_cq_acked_events_total", "counter",
               "Completion events of this CQ acknowledged.", &CqStats::acked_events),
    U<CqStats>("ack_calls", "cqd_cq_ack_calls_total", "counter",
               "ibv_ack_cq_events calls for this CQ.", &CqStats::ack_calls),
    U<CqStats>("poll_errors", "cqd_cq_poll_errors_total", "counter",
               "Negative poll returns of this CQ.", &CqStats::poll_errors),
};

inline constexpr Field<ConsumerStats> kConsumerFields[] = {
    I<ConsumerStats>("cpu", nullptr, nullptr, &ConsumerStats::cpu),  // cqd_consumer_info
    I<ConsumerStats>("numa_node", nullptr, nullptr, &ConsumerStats::numa_node),
    U<ConsumerStats>("delivered", "cqd_consumer_delivered_total", "counter",
                     "Completions handed to handlers.", &ConsumerStats::delivered),
    U<ConsumerStats>("async_events", "cqd_consumer_async_events_total", "counter",
                     "Async and CM events handed to handlers.", &ConsumerStats::async_events),
    U<ConsumerStats>("queue_depth", "cqd_consumer_queue_depth", "gauge", "Items queued now.",
                     &ConsumerStats::queue_depth),
    U<ConsumerStats>("queue_capacity", "cqd_consumer_queue_capacity", "gauge",
                     "Most items the queue holds (ConsumerOptions::queue_capacity).",
                     &ConsumerStats::queue_capacity),
    U<ConsumerStats>("spill_capacity", "cqd_consumer_spill_capacity", "gauge",
                     "Most items each poller's spill holds (ConsumerOptions::spill_capacity).",
                     &ConsumerStats::spill_capacity),
    U<ConsumerStats>("high_water", "cqd_consumer_queue_high_water", "gauge",
                     "Most items ever queued at once.", &ConsumerStats::high_water),
    U<ConsumerStats>("pre_wakes", "cqd_consumer_pre_wakes_total", "counter",
                     "Times the event thread woke the sleeping consumer with a poller.",
                     &ConsumerStats::pre_wakes),
    U<ConsumerStats>("spill_depth", "cqd_consumer_spill_depth", "gauge",
                     "Items held in pollers' spills now.", &ConsumerStats::spill_depth),
    U<ConsumerStats>("spill_high_water", "cqd_consumer_spill_high_water", "gauge",
                     "Most items one poller held at once.", &ConsumerStats::spill_high_water),
    U<ConsumerStats>("stalls", "cqd_consumer_stalls_total", "counter",
                     "Times a poller's spill for this consumer filled up.", &ConsumerStats::stalls),
    Ns<ConsumerStats>("stalled_ns", "cqd_consumer_stalled_seconds_total", "counter",
                      "Time spent stalled, the stalls in progress included.",
                      &ConsumerStats::stalled_ns),
    Ns<ConsumerStats>("stall_ns", "cqd_consumer_stall_seconds", "gauge",
                      "How long the stall in progress has lasted (0: not stalled).",
                      &ConsumerStats::stall_ns),
};

}  // namespace cqd::stats_fields

#endif  // CQD_RUNTIME_OBSERVE_STATS_FIELDS_H_

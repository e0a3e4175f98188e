// SPDX-License-Identifier: BSD-2-Clause
#include "cqd/stats_format.h"

#include <cinttypes>
#include <cstdio>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cqd/version.h"
#include "runtime/base/utf8.h"

namespace cqd {
namespace {

// Calls emit(code_point) for each character of `s`, decoded as UTF-8; a byte that does not start
// a valid, shortest-form sequence of a scalar value comes out as U+FFFD.
template <typename Emit>
void DecodeUtf8(std::string_view s, Emit&& emit) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      emit(static_cast<char32_t>(b0));
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = (b & 0xc0) == 0x80;
      cp = (cp << 6) | (b & 0x3f);
    }
    ok = ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      emit(char32_t{0xfffd});
      ++i;
      continue;
    }
    emit(cp);
    i += len;
  }
}

using internal::AppendUtf8;

void AppendU64(std::string& out, uint64_t v) {
  char buf[24];
  int n = snprintf(buf, sizeof(buf), "%" PRIu64, v);
  out.append(buf, static_cast<size_t>(n));
}

void AppendI64(std::string& out, int64_t v) {
  char buf[24];
  int n = snprintf(buf, sizeof(buf), "%" PRId64, v);
  out.append(buf, static_cast<size_t>(n));
}

// Nanoseconds as exact decimal seconds, e.g. 1500000001 -> "1.500000001".
void AppendSeconds(std::string& out, uint64_t ns) {
  char buf[40];
  int n = snprintf(buf, sizeof(buf), "%" PRIu64 ".%09" PRIu64, ns / 1000000000, ns % 1000000000);
  out.append(buf, static_cast<size_t>(n));
}

// ---- JSON ----

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  DecodeUtf8(s, [&](char32_t cp) {
    switch (cp) {
      case '"':
        out += "\\\"";
        return;
      case '\\':
        out += "\\\\";
        return;
      case '\b':
        out += "\\b";
        return;
      case '\f':
        out += "\\f";
        return;
      case '\n':
        out += "\\n";
        return;
      case '\r':
        out += "\\r";
        return;
      case '\t':
        out += "\\t";
        return;
      default:
        break;
    }
    if (cp < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
      return;
    }
    AppendUtf8(out, cp);
  });
  out += '"';
}

// Writes `"key":` after a comma unless it opens an object.
class JsonObject {
 public:
  explicit JsonObject(std::string& out) : out_(out) { out_ += '{'; }
  ~JsonObject() { out_ += '}'; }
  std::string& Key(std::string_view key) {
    if (!first_) out_ += ',';
    first_ = false;
    AppendJsonString(out_, key);
    out_ += ':';
    return out_;
  }
  void U64(std::string_view key, uint64_t v) { AppendU64(Key(key), v); }
  void I64(std::string_view key, int64_t v) { AppendI64(Key(key), v); }

 private:
  std::string& out_;
  bool first_ = true;
};

void AppendLatencyJson(std::string& out, const LatencyStats& l) {
  JsonObject o(out);
  o.Key("enabled") += l.enabled ? "true" : "false";
  o.U64("count", l.count);
  o.U64("sum_ns", l.sum_ns);
  o.U64("p50_ns", l.p50_ns);
  o.U64("p90_ns", l.p90_ns);
  o.U64("p99_ns", l.p99_ns);
  o.U64("p999_ns", l.p999_ns);
  o.U64("max_ns", l.max_ns);
  std::string& b = o.Key("buckets");
  b += '[';
  for (size_t i = 0; i < l.buckets.size(); ++i) {
    if (i > 0) b += ',';
    b += '[';
    AppendU64(b, l.buckets[i].upper_ns);
    b += ',';
    AppendU64(b, l.buckets[i].count);
    b += ']';
  }
  b += ']';
}

// ---- Prometheus ----

void AppendLabelValue(std::string& out, std::string_view s) {
  out += '"';
  DecodeUtf8(s, [&](char32_t cp) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\n') {
      out += "\\n";
    } else {
      AppendUtf8(out, cp);
    }
  });
  out += '"';
}

struct Label {
  std::string_view name;
  std::string value;
};

class PromWriter {
 public:
  explicit PromWriter(std::string& out) : out_(out) {}

  void Family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;  // our own text: no backslashes or newlines to escape
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  // Writes `name{labels} ` and leaves the value to the caller.
  std::string& Sample(std::string_view name, const std::vector<Label>& labels) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) out_ += ',';
        out_ += labels[i].name;
        out_ += '=';
        AppendLabelValue(out_, labels[i].value);
      }
      out_ += '}';
    }
    out_ += ' ';
    return out_;
  }
  void U64(std::string_view name, const std::vector<Label>& labels, uint64_t v) {
    AppendU64(Sample(name, labels), v);
    out_ += '\n';
  }
  void I64(std::string_view name, const std::vector<Label>& labels, int64_t v) {
    AppendI64(Sample(name, labels), v);
    out_ += '\n';
  }
  void Seconds(std::string_view name, const std::vector<Label>& labels, uint64_t ns) {
    AppendSeconds(Sample(name, labels), ns);
    out_ += '\n';
  }

 private:
  std::string& out_;
};

std::vector<Label> PollerLabels(size_t index) { return {{"poller", std::to_string(index)}}; }
std::vector<Label> CqLabels(const CqStats& cq) {
  return {{"cq", std::to_string(cq.id)}, {"shard", std::to_string(cq.shard)}};
}
std::vector<Label> ConsumerLabels(const ConsumerStats& c, size_t index) {
  return {{"consumer", c.name}, {"consumer_id", std::to_string(index)}};
}
std::vector<Label> DeviceLabels(const DeviceStats& d) {
  return {{"device", std::to_string(d.id)}, {"name", d.name}};
}

// Power-of-two nanoseconds as exact decimal seconds (2^k has at most 10 digits for k <= 32).
std::string PowerOfTwoSeconds(int k) {
  std::string s;
  AppendSeconds(s, uint64_t{1} << k);
  // Trim trailing zeros (and the point) for readability: "0.000000016", "4.294967296", "1".
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// ---- The field table: every plain number of a Stats row, once, for both formats ----

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
constexpr Field<Stats> kTotalFields[] = {
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

constexpr Field<DeviceStats> kDeviceFields[] = {
    I<DeviceStats>("numa_node", nullptr, nullptr, &DeviceStats::numa_node),  // cqd_device_info
    I<DeviceStats>("comp_vectors", "cqd_device_comp_vectors", "Completion vectors of the device.",
                   &DeviceStats::comp_vectors),
};

constexpr Field<PollerStats> kPollerFields[] = {
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
};

constexpr Field<CqStats> kCqFields[] = {
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

constexpr Field<ConsumerStats> kConsumerFields[] = {
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

template <typename Row, size_t N>
void AppendJsonFields(JsonObject& o, const Row& row, const Field<Row> (&fields)[N]) {
  for (const Field<Row>& f : fields) {
    if (f.unit == Unit::kSigned) {
      o.I64(f.json, row.*f.i32);
    } else {
      o.U64(f.json, row.*f.u64);
    }
  }
}

// Writes one family per field of `fields` that has a metric, one sample per row (labels(i)).
template <typename Row, size_t N, typename Labels>
void AppendPromFamilies(PromWriter& w, std::type_identity_t<std::span<const Row>> rows,
                        const Field<Row> (&fields)[N], Labels&& labels) {
  for (const Field<Row>& f : fields) {
    if (f.metric == nullptr) continue;
    w.Family(f.metric, f.type, f.help);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      switch (f.unit) {
        case Unit::kUnsigned:
          w.U64(f.metric, labels(i), row.*f.u64);
          break;
        case Unit::kSigned:
          w.I64(f.metric, labels(i), row.*f.i32);
          break;
        case Unit::kNanoseconds:
          w.Seconds(f.metric, labels(i), row.*f.u64);
          break;
      }
    }
  }
}

void AppendLatencyHistograms(PromWriter& w, const std::vector<ConsumerStats>& consumers) {
  bool any_latency = false;
  for (const ConsumerStats& c : consumers) any_latency |= c.latency.enabled;
  if (!any_latency) return;
  constexpr int kFirstPow = 4;  // 16 ns
  constexpr int kLastPow = 32;  // 4.29 s, the most a 32-bit stamp can tell
  w.Family("cqd_consumer_latency_seconds", "histogram",
           "Time from a poller taking a completion off its CQ to the consumer dispatching it.");
  for (size_t i = 0; i < consumers.size(); ++i) {
    const ConsumerStats& c = consumers[i];
    if (!c.latency.enabled) continue;
    const std::vector<Label> base = ConsumerLabels(c, i);
    size_t next = 0;
    uint64_t cumulative = 0;
    for (int k = kFirstPow; k <= kLastPow; ++k) {
      const uint64_t le = uint64_t{1} << k;
      while (next < c.latency.buckets.size() && c.latency.buckets[next].upper_ns <= le) {
        cumulative += c.latency.buckets[next++].count;
      }
      std::vector<Label> labels = base;
      labels.push_back({"le", PowerOfTwoSeconds(k)});
      w.U64("cqd_consumer_latency_seconds_bucket", labels, cumulative);
    }
    std::vector<Label> labels = base;
    labels.push_back({"le", "+Inf"});
    w.U64("cqd_consumer_latency_seconds_bucket", labels, c.latency.count);
    w.Seconds("cqd_consumer_latency_seconds_sum", base, c.latency.sum_ns);
    w.U64("cqd_consumer_latency_seconds_count", base, c.latency.count);
  }
  w.Family("cqd_consumer_latency_max_seconds", "gauge",
           "Longest poll to dispatch time recorded since the runtime started.");
  for (size_t i = 0; i < consumers.size(); ++i) {
    if (!consumers[i].latency.enabled) continue;
    w.Seconds("cqd_consumer_latency_max_seconds", ConsumerLabels(consumers[i], i),
              consumers[i].latency.max_ns);
  }
}

// An id label's value: the number, or empty for -1 (none); Prometheus treats an empty label
// as absent.
std::string Id(int value) { return value < 0 ? std::string() : std::to_string(value); }

// One info family (always 1 per row), whose labels carry what is an id rather than a quantity.
template <typename Row, typename Labels>
void AppendInfo(PromWriter& w, const char* metric, const char* help, const std::vector<Row>& rows,
                Labels&& labels) {
  if (rows.empty()) return;
  w.Family(metric, "gauge", help);
  for (size_t i = 0; i < rows.size(); ++i) w.U64(metric, labels(i), 1);
}

void AppendStatsJson(std::string& out, const Stats& s) {
  JsonObject root(out);
  AppendJsonString(root.Key("version"), Version().string);  // the library's
  AppendJsonFields(root, s, kTotalFields);
  AppendJsonString(root.Key("placement_cpus"), s.placement_cpus);
  root.Key("devices") += '[';
  for (size_t i = 0; i < s.devices.size(); ++i) {
    if (i > 0) out += ',';
    const DeviceStats& d = s.devices[i];
    JsonObject o(out);
    o.U64("id", d.id);
    AppendJsonString(o.Key("name"), d.name);
    AppendJsonFields(o, d, kDeviceFields);
  }
  out += ']';
  root.Key("pollers") += '[';
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    if (i > 0) out += ',';
    JsonObject o(out);
    o.U64("index", i);
    AppendJsonFields(o, s.pollers[i], kPollerFields);
  }
  out += ']';
  root.Key("cqs") += '[';
  for (size_t i = 0; i < s.cqs.size(); ++i) {
    if (i > 0) out += ',';
    JsonObject o(out);
    o.U64("id", s.cqs[i].id);
    AppendJsonFields(o, s.cqs[i], kCqFields);
  }
  out += ']';
  root.Key("consumers") += '[';
  for (size_t i = 0; i < s.consumers.size(); ++i) {
    if (i > 0) out += ',';
    const ConsumerStats& c = s.consumers[i];
    JsonObject o(out);
    o.U64("index", i);
    AppendJsonString(o.Key("name"), c.name);
    AppendJsonFields(o, c, kConsumerFields);
    o.Key("latency");
    AppendLatencyJson(out, c.latency);
  }
  out += ']';
}

}  // namespace

std::string StatsToJson(const Stats& s) {
  std::string out;
  out.reserve(512 +
              200 * (s.pollers.size() + s.cqs.size() + s.consumers.size() + s.devices.size()));
  AppendStatsJson(out, s);  // its object is closed when it returns
  return out;
}

std::string StatsToPrometheus(const Stats& s, const PrometheusOptions& options) {
  std::string out;
  out.reserve(4096 + 600 * (s.pollers.size() + s.cqs.size()) + 3000 * s.consumers.size());
  PromWriter w(out);
  w.Family("cqd_build_info", "gauge", "Always 1; the version of the cqd library.");
  w.U64("cqd_build_info", {{"version", Version().string}}, 1);
  AppendPromFamilies(w, {&s, 1}, kTotalFields, [](size_t) { return std::vector<Label>{}; });
  w.Family("cqd_cqs", "gauge", "CQs the runtime polls now (0 in a snapshot without CQs).");
  w.U64("cqd_cqs", {}, s.cqs.size());
  AppendPromFamilies(w, s.pollers, kPollerFields, PollerLabels);
  AppendInfo(
      w, "cqd_poller_info",
      "Always 1; the poller's CPU and NUMA node (empty if none), and 1 for an engine-driven shard.",
      s.pollers, [&](size_t i) {
        std::vector<Label> labels = PollerLabels(i);
        labels.push_back({"cpu", Id(s.pollers[i].cpu)});
        labels.push_back({"numa_node", Id(s.pollers[i].numa_node)});
        labels.push_back({"engine_driven", Id(s.pollers[i].engine_driven)});
        return labels;
      });
  if (options.per_cq) {
    AppendPromFamilies(w, s.cqs, kCqFields, [&](size_t i) { return CqLabels(s.cqs[i]); });
    AppendInfo(w, "cqd_cq_info",
               "Always 1; the CQ's completion vector, empty if the engine created the CQ.", s.cqs,
               [&](size_t i) {
                 std::vector<Label> labels = CqLabels(s.cqs[i]);
                 labels.push_back({"comp_vector", Id(s.cqs[i].comp_vector)});
                 return labels;
               });
  }
  AppendPromFamilies(w, s.consumers, kConsumerFields,
                     [&](size_t i) { return ConsumerLabels(s.consumers[i], i); });
  AppendInfo(w, "cqd_consumer_info",
             "Always 1; the consumer thread's CPU and NUMA node, empty if none.", s.consumers,
             [&](size_t i) {
               std::vector<Label> labels = ConsumerLabels(s.consumers[i], i);
               labels.push_back({"cpu", Id(s.consumers[i].cpu)});
               labels.push_back({"numa_node", Id(s.consumers[i].numa_node)});
               return labels;
             });
  AppendLatencyHistograms(w, s.consumers);
  AppendPromFamilies(w, s.devices, kDeviceFields,
                     [&](size_t i) { return DeviceLabels(s.devices[i]); });
  AppendInfo(w, "cqd_device_info", "Always 1; the device's NUMA node, empty if unknown or none.",
             s.devices, [&](size_t i) {
               std::vector<Label> labels = DeviceLabels(s.devices[i]);
               labels.push_back({"numa_node", Id(s.devices[i].numa_node)});
               return labels;
             });
  if (!s.placement_cpus.empty()) {
    w.Family("cqd_placement_info", "gauge",
             "Always 1; cpus is the cpulist auto_placement confined threads to.");
    w.U64("cqd_placement_info", {{"cpus", s.placement_cpus}}, 1);
  }
  return out;
}

}  // namespace cqd

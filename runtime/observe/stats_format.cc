#include "cqd/stats_format.h"

#include <cinttypes>
#include <cstdio>
#include <string_view>

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
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      default: break;
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

void AppendStatsJson(std::string& out, const Stats& s) {
  JsonObject root(out);
  root.U64("uptime_ns", s.uptime_ns);
  root.U64("orphans", s.orphans);
  root.U64("async_events", s.async_events);
  root.U64("failed_fds", s.failed_fds);
  root.U64("cm_events", s.cm_events);
  root.U64("cq_events", s.cq_events);
  root.U64("cq_acked_events", s.cq_acked_events);
  root.U64("cq_ack_calls", s.cq_ack_calls);
  AppendJsonString(root.Key("placement_cpus"), s.placement_cpus);
  root.Key("devices") += '[';
  for (size_t i = 0; i < s.devices.size(); ++i) {
    if (i > 0) out += ',';
    const DeviceStats& d = s.devices[i];
    JsonObject o(out);
    o.U64("id", d.id);
    AppendJsonString(o.Key("name"), d.name);
    o.I64("numa_node", d.numa_node);
    o.I64("comp_vectors", d.comp_vectors);
  }
  out += ']';
  root.Key("pollers") += '[';
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    if (i > 0) out += ',';
    const PollerStats& p = s.pollers[i];
    JsonObject o(out);
    o.U64("index", i);
    o.I64("cpu", p.cpu);
    o.I64("numa_node", p.numa_node);
    o.U64("polls", p.polls);
    o.U64("empty_polls", p.empty_polls);
    o.U64("completions", p.completions);
    o.U64("arms", p.arms);
    o.U64("arm_failures", p.arm_failures);
    o.U64("sleeps", p.sleeps);
    o.U64("backpressure_stalls", p.backpressure_stalls);
    o.U64("parks", p.parks);
    o.U64("parked_cqs", p.parked_cqs);
  }
  out += ']';
  root.Key("cqs") += '[';
  for (size_t i = 0; i < s.cqs.size(); ++i) {
    if (i > 0) out += ',';
    const CqStats& c = s.cqs[i];
    JsonObject o(out);
    o.U64("id", c.id);
    o.I64("shard", c.shard);
    o.I64("comp_vector", c.comp_vector);
    o.U64("completions", c.completions);
    o.U64("events", c.events);
    o.U64("acked_events", c.acked_events);
    o.U64("ack_calls", c.ack_calls);
    o.U64("poll_errors", c.poll_errors);
  }
  out += ']';
  root.Key("consumers") += '[';
  for (size_t i = 0; i < s.consumers.size(); ++i) {
    if (i > 0) out += ',';
    const ConsumerStats& c = s.consumers[i];
    JsonObject o(out);
    o.U64("index", i);
    AppendJsonString(o.Key("name"), c.name);
    o.I64("cpu", c.cpu);
    o.I64("numa_node", c.numa_node);
    o.U64("delivered", c.delivered);
    o.U64("async_events", c.async_events);
    o.U64("queue_depth", c.queue_depth);
    o.U64("high_water", c.high_water);
    o.U64("spill_depth", c.spill_depth);
    o.U64("spill_high_water", c.spill_high_water);
    o.U64("stalls", c.stalls);
    o.U64("stalled_ns", c.stalled_ns);
    o.Key("latency");
    AppendLatencyJson(out, c.latency);
  }
  out += ']';
}

}  // namespace

std::string StatsToJson(const Stats& s) {
  std::string out;
  out.reserve(512 + 200 * (s.pollers.size() + s.cqs.size() + s.consumers.size() +
                           s.devices.size()));
  AppendStatsJson(out, s);  // its object is closed when it returns
  return out;
}

std::string StatsToPrometheus(const Stats& s) {
  std::string out;
  out.reserve(4096 + 600 * (s.pollers.size() + s.cqs.size()) + 3000 * s.consumers.size());
  PromWriter w(out);

  w.Family("cqd_uptime_seconds", "gauge", "Time since the runtime was created.");
  w.Seconds("cqd_uptime_seconds", {}, s.uptime_ns);

  // Pollers.
  struct PollerCounter {
    const char* name;
    const char* help;
    uint64_t PollerStats::*field;
  };
  static const PollerCounter kPollerCounters[] = {
      {"cqd_poller_polls_total", "Poll calls on CQs.", &PollerStats::polls},
      {"cqd_poller_empty_polls_total", "Poll calls that returned nothing.",
       &PollerStats::empty_polls},
      {"cqd_poller_completions_total", "Completions taken off CQs.", &PollerStats::completions},
      {"cqd_poller_arms_total", "ibv_req_notify_cq calls.", &PollerStats::arms},
      {"cqd_poller_arm_failures_total", "ibv_req_notify_cq calls that failed.",
       &PollerStats::arm_failures},
      {"cqd_poller_sleeps_total", "Times the poller went to sleep.", &PollerStats::sleeps},
      {"cqd_poller_backpressure_stalls_total",
       "CQ polls skipped because a consumer the CQ serves was full.",
       &PollerStats::backpressure_stalls},
      {"cqd_poller_parks_total", "Times an idle CQ was armed and left out of the passes.",
       &PollerStats::parks},
  };
  w.Family("cqd_poller_cpu", "gauge", "CPU the poller is pinned to, -1 if not pinned.");
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    w.I64("cqd_poller_cpu", PollerLabels(i), s.pollers[i].cpu);
  }
  w.Family("cqd_poller_numa_node", "gauge",
           "NUMA node whose CPUs auto_placement confined the poller to, -1 if none.");
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    w.I64("cqd_poller_numa_node", PollerLabels(i), s.pollers[i].numa_node);
  }
  w.Family("cqd_poller_parked_cqs", "gauge", "CQs parked now: armed, not polled until an event.");
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    w.U64("cqd_poller_parked_cqs", PollerLabels(i), s.pollers[i].parked_cqs);
  }
  for (const PollerCounter& c : kPollerCounters) {
    w.Family(c.name, "counter", c.help);
    for (size_t i = 0; i < s.pollers.size(); ++i) {
      w.U64(c.name, PollerLabels(i), s.pollers[i].*c.field);
    }
  }

  // CQs.
  struct CqCounter {
    const char* name;
    const char* help;
    uint64_t CqStats::*field;
  };
  static const CqCounter kCqCounters[] = {
      {"cqd_cq_completions_total", "Completions polled from this CQ.", &CqStats::completions},
      {"cqd_cq_events_total", "Completion events read for this CQ.", &CqStats::events},
      {"cqd_cq_acked_events_total", "Completion events of this CQ acknowledged.",
       &CqStats::acked_events},
      {"cqd_cq_ack_calls_total", "ibv_ack_cq_events calls for this CQ.", &CqStats::ack_calls},
      {"cqd_cq_poll_errors_total", "Negative poll returns of this CQ.", &CqStats::poll_errors},
  };
  for (const CqCounter& c : kCqCounters) {
    w.Family(c.name, "counter", c.help);
    for (const CqStats& cq : s.cqs) w.U64(c.name, CqLabels(cq), cq.*c.field);
  }
  w.Family("cqd_cq_comp_vector", "gauge",
           "Completion vector the CQ was created on, -1 if the engine created it.");
  for (const CqStats& cq : s.cqs) w.I64("cqd_cq_comp_vector", CqLabels(cq), cq.comp_vector);

  // Consumers.
  struct ConsumerField {
    const char* name;
    const char* type;
    const char* help;
    uint64_t ConsumerStats::*field;
  };
  static const ConsumerField kConsumerFields[] = {
      {"cqd_consumer_delivered_total", "counter", "Completions handed to handlers.",
       &ConsumerStats::delivered},
      {"cqd_consumer_async_events_total", "counter", "Async and CM events handed to handlers.",
       &ConsumerStats::async_events},
      {"cqd_consumer_queue_depth", "gauge", "Items queued now.", &ConsumerStats::queue_depth},
      {"cqd_consumer_queue_high_water", "gauge", "Most items ever queued at once.",
       &ConsumerStats::high_water},
      {"cqd_consumer_spill_depth", "gauge", "Items held in pollers' spills now.",
       &ConsumerStats::spill_depth},
      {"cqd_consumer_spill_high_water", "gauge", "Most items one poller held at once.",
       &ConsumerStats::spill_high_water},
      {"cqd_consumer_stalls_total", "counter",
       "Times a poller's spill for this consumer filled up.", &ConsumerStats::stalls},
  };
  for (const ConsumerField& f : kConsumerFields) {
    w.Family(f.name, f.type, f.help);
    for (size_t i = 0; i < s.consumers.size(); ++i) {
      w.U64(f.name, ConsumerLabels(s.consumers[i], i), s.consumers[i].*f.field);
    }
  }
  w.Family("cqd_consumer_cpu", "gauge", "CPU the consumer's thread is pinned to, -1 if none.");
  for (size_t i = 0; i < s.consumers.size(); ++i) {
    w.I64("cqd_consumer_cpu", ConsumerLabels(s.consumers[i], i), s.consumers[i].cpu);
  }
  w.Family("cqd_consumer_numa_node", "gauge",
           "NUMA node whose CPUs auto_placement confined the consumer to, -1 if none.");
  for (size_t i = 0; i < s.consumers.size(); ++i) {
    w.I64("cqd_consumer_numa_node", ConsumerLabels(s.consumers[i], i), s.consumers[i].numa_node);
  }
  w.Family("cqd_consumer_stalled_seconds_total", "counter",
           "Time spent stalled, over stalls that have ended.");
  for (size_t i = 0; i < s.consumers.size(); ++i) {
    w.Seconds("cqd_consumer_stalled_seconds_total", ConsumerLabels(s.consumers[i], i),
              s.consumers[i].stalled_ns);
  }

  bool any_latency = false;
  for (const ConsumerStats& c : s.consumers) any_latency |= c.latency.enabled;
  if (any_latency) {
    constexpr int kFirstPow = 4;   // 16 ns
    constexpr int kLastPow = 32;   // 4.29 s, the most a 32-bit stamp can tell
    const char* kName = "cqd_consumer_latency_seconds";
    w.Family(kName, "histogram",
             "Time from a poller taking a completion off its CQ to the consumer dispatching it.");
    for (size_t i = 0; i < s.consumers.size(); ++i) {
      const ConsumerStats& c = s.consumers[i];
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
    for (size_t i = 0; i < s.consumers.size(); ++i) {
      if (!s.consumers[i].latency.enabled) continue;
      w.Seconds("cqd_consumer_latency_max_seconds", ConsumerLabels(s.consumers[i], i),
                s.consumers[i].latency.max_ns);
    }
  }

  // Devices and placement.
  w.Family("cqd_device_numa_node", "gauge", "NUMA node of the device, -1 if unknown or none.");
  for (const DeviceStats& d : s.devices) {
    w.I64("cqd_device_numa_node", DeviceLabels(d), d.numa_node);
  }
  w.Family("cqd_device_comp_vectors", "gauge", "Completion vectors of the device.");
  for (const DeviceStats& d : s.devices) {
    w.I64("cqd_device_comp_vectors", DeviceLabels(d), d.comp_vectors);
  }
  if (!s.placement_cpus.empty()) {
    w.Family("cqd_placement_info", "gauge",
             "Always 1; cpus is the cpulist auto_placement confined threads to.");
    w.U64("cqd_placement_info", {{"cpus", s.placement_cpus}}, 1);
  }

  // Runtime totals.
  struct Total {
    const char* name;
    const char* help;
    uint64_t Stats::*field;
  };
  static const Total kTotals[] = {
      {"cqd_orphans_total", "Completions given to the orphan handler (or dropped if none).",
       &Stats::orphans},
      {"cqd_async_events_total", "Async events read from devices.", &Stats::async_events},
      {"cqd_failed_fds_total",
       "Channel or async fds the event thread stopped watching because reads kept failing.",
       &Stats::failed_fds},
      {"cqd_cm_events_total", "Connection-manager events read from watched channels.",
       &Stats::cm_events},
      {"cqd_cq_events_all_total", "Completion events read, over every CQ including destroyed.",
       &Stats::cq_events},
      {"cqd_cq_acked_events_all_total",
       "Completion events acknowledged, over every CQ including destroyed.",
       &Stats::cq_acked_events},
      {"cqd_cq_ack_calls_all_total", "ibv_ack_cq_events calls, over every CQ including destroyed.",
       &Stats::cq_ack_calls},
  };
  for (const Total& t : kTotals) {
    w.Family(t.name, "counter", t.help);
    w.U64(t.name, {}, s.*t.field);
  }
  return out;
}

}  // namespace cqd

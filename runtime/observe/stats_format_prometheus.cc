// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_format_prometheus.cc: cqd/stats_format.h's StatsToPrometheus: label
// escaping, the family and sample writer, and a Stats snapshot's text exposition from the field
// table (stats_fields.h), with the latency histograms and the info families.
#include <cinttypes>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cqd/stats_format.h"
#include "cqd/version.h"
#include "runtime/base/utf8.h"
#include "runtime/observe/stats_fields.h"
#include "runtime/observe/stats_text.h"

namespace cqd {
namespace {

using namespace stats_fields;  // NOLINT: the table and its types, in this file only

using internal::AppendUtf8;
using stats_text::AppendI64;
using stats_text::AppendU64;
using stats_text::DecodeUtf8;

// Nanoseconds as exact decimal seconds, e.g. 1500000001 -> "1.500000001".
void AppendSeconds(std::string& out, uint64_t ns) {
  char buf[40];
  int n = snprintf(buf, sizeof(buf), "%" PRIu64 ".%09" PRIu64, ns / 1000000000, ns % 1000000000);
  out.append(buf, static_cast<size_t>(n));
}

void AppendLabelValue(std::string& out, std::string_view s) {
  out += '"';
  DecodeUtf8(s, [&](char32_t cp) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == 0) {
      AppendUtf8(out, 0xfffd);  // Prometheus's parser stops at a NUL in a label value
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

}  // namespace

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

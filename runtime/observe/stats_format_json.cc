// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_format_json.cc: cqd/stats_format.h's StatsToJson: JSON string escaping,
// the object writer, and a Stats snapshot's JSON from the field table (stats_fields.h).
#include <cstdio>
#include <string>
#include <string_view>

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

}  // namespace cqd

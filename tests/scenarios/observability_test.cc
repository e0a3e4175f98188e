// SPDX-License-Identifier: BSD-2-Clause
// Observability: Stats as JSON and Prometheus text, the poll -> dispatch latency histogram, the
// stats endpoint on a Unix socket, and the log sink. Nothing here asserts on speed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/stats_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/observe/latency.h"
#include "tests/test_util.h"

namespace cqd {
namespace {

using Json = nlohmann::json;
using testing::InjectRecvs;
using testing::SequenceHandler;
using testing::WaitFor;

// Parses `text` as one JSON value (RFC 8259: nothing after it, valid UTF-8 in strings); nullopt,
// with the parser's message in *error, if it is not.
std::optional<Json> Parse(const std::string& text, std::string* error = nullptr) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  }
}

// ---- helpers ----

// A Stats with a bit of everything, including names that need escaping.
Stats SampleStats() {
  Stats s;
  s.uptime_ns = 12'345'678'901;
  s.orphans = 3;
  s.async_events = 4;
  s.failed_fds = 1;
  s.cm_events = 9;
  s.cq_events = 100;
  s.cq_acked_events = 64;
  s.cq_ack_calls = 1;
  PollerStats p;
  p.cpu = 2;
  p.numa_node = 1;
  p.polls = 1000;
  p.empty_polls = 10;
  p.completions = 18'446'744'073'709'551'615u;  // 2^64 - 1 must come out exact
  p.arms = 5;
  p.sleeps = 4;
  s.pollers = {p, PollerStats{}};
  CqStats cq;
  cq.id = 7;
  cq.shard = 1;
  cq.comp_vector = 3;
  cq.completions = 999;
  cq.events = 100;
  s.cqs = {cq};
  ConsumerStats a;
  a.name = "quote\" backslash\\ newline\n tab\t bell\x07 \xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80";
  a.cpu = 5;
  a.numa_node = 0;
  a.delivered = 42;
  a.stalled_ns = 1'500'000'001;
  a.latency.enabled = true;
  a.latency.count = 6;
  a.latency.sum_ns = 6000;
  a.latency.p50_ns = 1024;
  a.latency.p90_ns = 1088;
  a.latency.p99_ns = 1088;
  a.latency.p999_ns = 1088;
  a.latency.max_ns = 1070;
  a.latency.buckets = {{16, 1}, {1024, 2}, {1088, 3}};
  ConsumerStats b;
  b.name = "bad utf8 \xff\xfe \xc0\xaf \xed\xa0\x80 end";  // invalid, overlong, surrogate
  s.consumers = {a, b};
  s.devices = {{1, "mlx5_0", 0, 8}, {2, "sim\"0\"", -1, 1}};
  s.placement_cpus = "0-3,8-11";
  return s;
}

// The name as the formatters must carry it: invalid UTF-8 sequences become U+FFFD per byte.
const char* kBadNameSanitized =
    "bad utf8 \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end";

// One sample line of the Prometheus text format, parsed.
struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // values unescaped
  double value = 0;
  std::string value_text;
};

bool IsNameChar(char c, bool first, bool colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool ValidName(const std::string& s, bool colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!IsNameChar(s[i], i == 0, colon)) return false;
  }
  return true;
}

// Parses `line` by the exposition grammar: name, optional {label="value",...}, one space, a
// float (or +Inf, -Inf, NaN), nothing after (we never write timestamps).
bool ParseSample(const std::string& line, Sample* out, std::string* why) {
  size_t i = 0;
  while (i < line.size() && IsNameChar(line[i], i == 0, true)) ++i;
  out->name = line.substr(0, i);
  if (!ValidName(out->name, true)) return *why = "bad metric name", false;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      size_t start = i;
      while (i < line.size() && IsNameChar(line[i], i == start, false)) ++i;
      std::string label = line.substr(start, i - start);
      if (!ValidName(label, false)) return *why = "bad label name", false;
      if (line.compare(i, 2, "=\"") != 0) return *why = "'=\"' expected", false;
      i += 2;
      std::string value;
      while (true) {
        if (i >= line.size()) return *why = "unterminated label value", false;
        char c = line[i++];
        if (c == '"') break;
        if (c == '\n') return *why = "raw newline in label value", false;
        if (c == '\\') {
          if (i >= line.size()) return *why = "dangling escape", false;
          char e = line[i++];
          if (e == '\\') {
            value += '\\';
          } else if (e == '"') {
            value += '"';
          } else if (e == 'n') {
            value += '\n';
          } else {
            return *why = "invalid escape in label value", false;
          }
          continue;
        }
        value += c;
      }
      out->labels.emplace_back(label, value);
      if (i < line.size() && line[i] == ',') {
        ++i;
        continue;
      }
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      return *why = "',' or '}' expected", false;
    }
  }
  if (i >= line.size() || line[i] != ' ') return *why = "one space before the value", false;
  out->value_text = line.substr(i + 1);
  const std::string& v = out->value_text;
  if (v == "+Inf" || v == "-Inf" || v == "NaN") {
    out->value = v == "NaN" ? NAN : (v[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  if (v.empty() || v.find_first_not_of("0123456789.eE+-") != std::string::npos) {
    return *why = "bad value", false;
  }
  char* end = nullptr;
  out->value = strtod(v.c_str(), &end);
  if (*end != '\0') return *why = "bad value", false;
  return true;
}

std::string LabelKey(const std::vector<std::pair<std::string, std::string>>& labels,
                     const std::string& skip = "") {
  std::string key;
  for (const auto& [k, v] : labels) {
    if (k == skip) continue;
    key += k + "=" + v + "\x1f";
  }
  return key;
}

using Samples = std::map<std::string, std::vector<Sample>>;

// Checks `text` against the exposition format and cqd's conventions, and collects the samples
// by metric name into `*out` (if set). Fails the test for every problem found.
void CheckPrometheus(const std::string& text, Samples* out = nullptr) {
  Samples local;
  Samples& samples = out != nullptr ? *out : local;
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "the last line must end with a newline";
  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> helped, finished, series;
  std::string current;  // the family whose lines we are in
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    SCOPED_TRACE("line " + std::to_string(line_no) + ": " + line.substr(0, 200));
    ASSERT_FALSE(line.empty()) << "empty line";
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const bool help = line[2] == 'H';
      const size_t sp = line.find(' ', 7);
      const std::string family = line.substr(7, sp == std::string::npos ? sp : sp - 7);
      EXPECT_TRUE(ValidName(family, true));
      EXPECT_TRUE(family.rfind("cqd_", 0) == 0) << family;
      EXPECT_NE(sp, std::string::npos);
      if (family != current) {
        EXPECT_EQ(finished.count(family), 0u) << family << " is not contiguous";
        if (!current.empty()) finished.insert(current);
        current = family;
      }
      if (help) {
        EXPECT_TRUE(helped.insert(family).second) << "second HELP for " << family;
        EXPECT_EQ(types.count(family), 0u) << "HELP after TYPE for " << family;
      } else {
        const std::string type = line.substr(sp + 1);
        EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram" ||
                    type == "summary" || type == "untyped")
            << type;
        EXPECT_TRUE(types.emplace(family, type).second) << "second TYPE for " << family;
        EXPECT_EQ(helped.count(family), 1u) << "TYPE without HELP: " << family;
        if (type == "counter") {
          EXPECT_TRUE(family.size() > 6 && family.compare(family.size() - 6, 6, "_total") == 0)
              << "counter not ending in _total: " << family;
        }
      }
      continue;
    }
    ASSERT_NE(line[0], '#') << "a comment cqd does not write";
    Sample sample;
    std::string why;
    ASSERT_TRUE(ParseSample(line, &sample, &why)) << why;
    // The family: the name itself, or a histogram's name without its suffix.
    std::string family = sample.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (family.size() > sfx.size() &&
          family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0) {
        std::string base = family.substr(0, family.size() - sfx.size());
        if (types.count(base) && types[base] == "histogram") family = base;
      }
    }
    EXPECT_EQ(family, current) << "sample outside its family's block";
    ASSERT_EQ(types.count(family), 1u) << "sample without TYPE: " << sample.name;
    if (types[family] == "histogram") {
      EXPECT_NE(sample.name, family) << "a histogram's samples carry a suffix";
    }
    std::set<std::string> label_names;
    for (const auto& [k, v] : sample.labels) {
      EXPECT_TRUE(label_names.insert(k).second) << "label twice: " << k;
      EXPECT_NE(k.rfind("__", 0), 0u) << "reserved label name " << k;
    }
    EXPECT_TRUE(series.insert(sample.name + "|" + LabelKey(sample.labels)).second)
        << "duplicate series";
    if (types[family] == "counter") {
      EXPECT_GE(sample.value, 0);
    }
    samples[sample.name].push_back(std::move(sample));
  }
  // Histograms: per series, ascending `le`, cumulative counts, +Inf last and equal to _count.
  for (const auto& [family, type] : types) {
    if (type != "histogram") continue;
    std::map<std::string, std::vector<const Sample*>> buckets;
    for (const Sample& s : samples[family + "_bucket"]) {
      buckets[LabelKey(s.labels, "le")].push_back(&s);
    }
    std::map<std::string, double> counts;
    for (const Sample& s : samples[family + "_count"]) counts[LabelKey(s.labels)] = s.value;
    EXPECT_EQ(buckets.size(), counts.size()) << family;
    for (const auto& [key, list] : buckets) {
      double last_le = -1, last_count = 0;
      for (const Sample* s : list) {
        std::string le;
        for (const auto& [k, v] : s->labels) {
          if (k == "le") le = v;
        }
        ASSERT_FALSE(le.empty()) << "bucket without le";
        const double le_value = le == "+Inf" ? INFINITY : strtod(le.c_str(), nullptr);
        EXPECT_GT(le_value, last_le);
        EXPECT_GE(s->value, last_count) << "buckets not cumulative";
        last_le = le_value;
        last_count = s->value;
      }
      EXPECT_EQ(last_le, INFINITY) << "the last bucket must be +Inf";
      EXPECT_EQ(last_count, counts[key]) << "+Inf bucket != _count";
    }
  }
}

// Returns the label value `name` of `s`, or "".
std::string LabelOf(const Sample& s, const std::string& name) {
  for (const auto& [k, v] : s.labels) {
    if (k == name) return v;
  }
  return "";
}

// A Unix socket path for a test: under TEST_TMPDIR when it fits, else under /tmp.
std::string SocketPath(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    path = "/tmp/cqd-" + std::to_string(getpid()) + "-" + name;
  }
  unlink(path.c_str());
  return path;
}

int Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return out;
    }
  }
}

// Connects, sends `request` (then closes the sending side if `shut`), reads to EOF.
std::string Ask(const std::string& path, const std::string& request, bool shut = false) {
  int fd = Connect(path);
  if (fd < 0) return "<connect failed: " + std::string(strerror(errno)) + ">";
  if (!request.empty()) {
    EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  }
  if (shut) shutdown(fd, SHUT_WR);
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

// A TCP port nobody listens on now (the kernel's pick; free again once closed).
int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Sends `request` to 127.0.0.1:`port` (or [::1] with `v6`) and reads to EOF.
std::string AskTcp(int port, const std::string& request, bool v6 = false) {
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*a);
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return "<connect failed: " + why + ">";
  }
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Collects what the log sink receives.
struct LogCollector {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  std::function<void(LogLevel, std::string_view)> Sink() {
    return [this](LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu);
      lines.emplace_back(level, std::string(message));
    };
  }
  bool Saw(LogLevel level, const std::string& part) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [l, m] : lines) {
      if (l == level && m.find(part) != std::string::npos) return true;
    }
    return false;
  }
};

// ---- the formats ----

TEST(StatsFormat, JsonIsWellFormedAndCarriesEveryField) {
  const Stats s = SampleStats();
  const std::string text = StatsToJson(s);
  std::string error;
  std::optional<Json> root = Parse(text, &error);
  ASSERT_TRUE(root) << error << "\n" << text;
  EXPECT_EQ(text.find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(root->at("version").get<std::string>(), Version().string);
  EXPECT_EQ(root->at("uptime_ns").get<uint64_t>(), s.uptime_ns);
  EXPECT_EQ(root->at("orphans").get<uint64_t>(), 3u);
  EXPECT_EQ(root->at("failed_fds").get<uint64_t>(), 1u);
  EXPECT_EQ(root->at("cm_events").get<uint64_t>(), 9u);
  EXPECT_EQ(root->at("cq_ack_calls").get<uint64_t>(), 1u);
  const Json* pollers = &root->at("pollers");
  ASSERT_TRUE(pollers && pollers->is_array());
  ASSERT_EQ(pollers->size(), 2u);
  EXPECT_EQ(pollers->at(0).at("cpu").get<int64_t>(), 2);
  EXPECT_EQ(pollers->at(1).at("cpu").get<int64_t>(), -1);
  EXPECT_EQ(pollers->at(0).at("completions").get<uint64_t>(), 18'446'744'073'709'551'615u);
  EXPECT_EQ(pollers->at(0).at("empty_polls").get<uint64_t>(), 10u);
  EXPECT_EQ(pollers->at(1).at("index").get<uint64_t>(), 1u);
  EXPECT_EQ(pollers->at(0).at("numa_node").get<int64_t>(), 1);
  EXPECT_EQ(pollers->at(1).at("numa_node").get<int64_t>(), -1);
  const Json* cqs = &root->at("cqs");
  ASSERT_TRUE(cqs && cqs->size() == 1);
  EXPECT_EQ(cqs->at(0).at("id").get<uint64_t>(), 7u);
  EXPECT_EQ(cqs->at(0).at("shard").get<int64_t>(), 1);
  EXPECT_EQ(cqs->at(0).at("events").get<uint64_t>(), 100u);
  EXPECT_EQ(cqs->at(0).at("comp_vector").get<int64_t>(), 3);
  const Json* devices = &root->at("devices");
  ASSERT_TRUE(devices && devices->size() == 2);
  EXPECT_EQ(devices->at(0).at("name").get<std::string>(), "mlx5_0");
  EXPECT_EQ(devices->at(0).at("comp_vectors").get<int64_t>(), 8);
  EXPECT_EQ(devices->at(1).at("id").get<uint64_t>(), 2u);
  EXPECT_EQ(devices->at(1).at("name").get<std::string>(), "sim\"0\"");
  EXPECT_EQ(devices->at(1).at("numa_node").get<int64_t>(), -1);
  EXPECT_EQ(root->at("placement_cpus").get<std::string>(), "0-3,8-11");
  const Json* consumers = &root->at("consumers");
  ASSERT_TRUE(consumers && consumers->size() == 2);
  const Json& a = consumers->at(0);
  EXPECT_EQ(a.at("name").get<std::string>(), s.consumers[0].name) << "escaped and decoded back";
  EXPECT_EQ(a.at("delivered").get<uint64_t>(), 42u);
  EXPECT_EQ(a.at("cpu").get<int64_t>(), 5);
  EXPECT_EQ(a.at("numa_node").get<int64_t>(), 0);
  EXPECT_EQ(consumers->at(1).at("cpu").get<int64_t>(), -1);
  EXPECT_EQ(a.at("stalled_ns").get<uint64_t>(), 1'500'000'001u);
  const Json* latency = &a.at("latency");
  ASSERT_TRUE(latency && latency->at("enabled").get<bool>());
  EXPECT_EQ(latency->at("count").get<uint64_t>(), 6u);
  EXPECT_EQ(latency->at("p50_ns").get<uint64_t>(), 1024u);
  EXPECT_EQ(latency->at("max_ns").get<uint64_t>(), 1070u);
  const Json* buckets = &latency->at("buckets");
  ASSERT_TRUE(buckets && buckets->size() == 3);
  EXPECT_EQ(buckets->at(2).at(0).get<uint64_t>(), 1088u);
  EXPECT_EQ(buckets->at(2).at(1).get<uint64_t>(), 3u);
  EXPECT_EQ(consumers->at(1).at("name").get<std::string>(), kBadNameSanitized);
  EXPECT_FALSE(consumers->at(1).at("latency").at("enabled").get<bool>());
  // No raw control characters anywhere (the tab, newline and bell were escaped).
  for (char c : text) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
  // An empty Stats is valid JSON too.
  EXPECT_TRUE(Parse(StatsToJson(Stats{}), &error)) << error;
}

TEST(StatsFormat, TheValidatorIsStrict) {
  for (const char* bad :
       {"",        "{",           "{\"a\":1,}",  "[1,]",     "01",           "-",
        "1.",      "1e",          "+1",          "'a'",      "{\"a\" 1}",    "\"\x01\"",
        "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
        "{} {}",   "nul",         "[1 2]",       "{1:2}"}) {
    EXPECT_FALSE(Parse(bad)) << "accepted: " << bad;
  }
  for (const char* good : {"0", "-0.5e+3", "[]", "{}", " {\"a\" : [true, false, null]} ",
                           "\"\\ud83d\\ude00 \\u00fc \xc3\xbc\"", "18446744073709551615"}) {
    EXPECT_TRUE(Parse(good)) << "rejected: " << good;
  }
  EXPECT_EQ(Parse("\"\\ud83d\\ude00\"")->get<std::string>(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(Parse("18446744073709551615")->get<uint64_t>(), 18'446'744'073'709'551'615u);
}

TEST(StatsFormat, PrometheusFollowsTheExpositionFormat) {
  const Stats s = SampleStats();
  const std::string text = StatsToPrometheus(s);
  Samples samples;
  CheckPrometheus(text, &samples);
  ASSERT_FALSE(::testing::Test::HasFailure()) << text;

  ASSERT_EQ(samples["cqd_poller_completions_total"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_poller_completions_total"][0], "poller"), "0");
  EXPECT_EQ(samples["cqd_poller_completions_total"][0].value_text, "18446744073709551615");
  // Placement ids are labels of info families, empty where there is none; no -1 gauges.
  for (const char* gone : {"cqd_poller_cpu", "cqd_poller_numa_node", "cqd_cq_comp_vector",
                           "cqd_consumer_cpu", "cqd_consumer_numa_node", "cqd_device_numa_node"}) {
    EXPECT_EQ(samples.count(gone), 0u) << gone;
  }
  ASSERT_EQ(samples["cqd_poller_info"].size(), 2u);
  EXPECT_EQ(samples["cqd_poller_info"][0].value, 1);
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "poller"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "cpu"), "2");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "numa_node"), "1");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][1], "cpu"), "");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_cq_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_cq_info"][0], "cq"), "7");
  EXPECT_EQ(LabelOf(samples["cqd_cq_info"][0], "comp_vector"), "3");
  ASSERT_EQ(samples["cqd_consumer_info"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][0], "cpu"), "5");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][0], "numa_node"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][1], "cpu"), "");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_device_info"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][0], "numa_node"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][1], "name"), "sim\"0\"");
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_cqs"].size(), 1u);
  EXPECT_EQ(samples["cqd_cqs"][0].value, 1);
  ASSERT_EQ(samples["cqd_cq_events_total"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_cq_events_total"][0], "cq"), "7");
  EXPECT_EQ(LabelOf(samples["cqd_cq_events_total"][0], "shard"), "1");
  ASSERT_EQ(samples["cqd_consumer_delivered_total"].size(), 2u);
  const Sample& delivered = samples["cqd_consumer_delivered_total"][0];
  EXPECT_EQ(LabelOf(delivered, "consumer"), s.consumers[0].name) << "escaped and read back";
  EXPECT_EQ(LabelOf(delivered, "consumer_id"), "0");
  EXPECT_EQ(delivered.value, 42);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_delivered_total"][1], "consumer"), kBadNameSanitized);
  EXPECT_EQ(samples["cqd_consumer_stalled_seconds_total"][0].value_text, "1.500000001");
  EXPECT_EQ(samples["cqd_uptime_seconds"][0].value_text, "12.345678901");
  EXPECT_EQ(samples["cqd_failed_fds_total"][0].value, 1);
  EXPECT_EQ(samples["cqd_cm_events_total"][0].value, 9);
  ASSERT_EQ(samples["cqd_device_comp_vectors"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_device_comp_vectors"][0], "device"), "1");
  EXPECT_EQ(LabelOf(samples["cqd_device_comp_vectors"][0], "name"), "mlx5_0");
  EXPECT_EQ(samples["cqd_device_comp_vectors"][0].value, 8);
  ASSERT_EQ(samples["cqd_placement_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_placement_info"][0], "cpus"), "0-3,8-11");

  // The histogram: only the consumer that records latency; exact counts at powers of two.
  ASSERT_EQ(samples["cqd_consumer_latency_seconds_count"].size(), 1u);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_count"][0].value, 6);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_sum"][0].value_text, "0.000006000");
  std::map<std::string, double> by_le;
  for (const Sample& b : samples["cqd_consumer_latency_seconds_bucket"]) {
    by_le[LabelOf(b, "le")] = b.value;
  }
  EXPECT_EQ(by_le["0.000000016"], 1);  // the bucket ending at 16 ns
  EXPECT_EQ(by_le["0.000000512"], 1);
  EXPECT_EQ(by_le["0.000001024"], 3);  // + the two ending at 1024 ns
  EXPECT_EQ(by_le["0.000002048"], 6);  // + the three ending at 1088 ns
  EXPECT_EQ(by_le["4.294967296"], 6);
  EXPECT_EQ(by_le["+Inf"], 6);
  EXPECT_EQ(samples["cqd_consumer_latency_max_seconds"][0].value_text, "0.000001070");

  // No consumer records latency: no histogram family at all.
  Stats plain = s;
  for (auto& c : plain.consumers) c.latency = LatencyStats{};
  const std::string plain_text = StatsToPrometheus(plain);
  EXPECT_EQ(plain_text.find("latency"), std::string::npos);
  CheckPrometheus(plain_text);
  CheckPrometheus(StatsToPrometheus(Stats{}));

  // Without the per-CQ families: no cq label anywhere, the totals still there.
  Samples lean;
  const std::string lean_text = StatsToPrometheus(s, {.per_cq = false});
  CheckPrometheus(lean_text, &lean);
  EXPECT_EQ(lean_text.find("cq=\""), std::string::npos);
  EXPECT_EQ(lean.count("cqd_cq_events_total"), 0u);
  EXPECT_EQ(lean.count("cqd_cq_info"), 0u);
  EXPECT_EQ(lean["cqd_cqs"][0].value, 1);
  EXPECT_EQ(lean.count("cqd_cq_events_all_total"), 1u);
  EXPECT_EQ(lean["cqd_poller_completions_total"].size(), 2u);
}

// ---- the histogram ----

TEST(LatencyHistogram, BucketsCoverEveryValueNarrowly) {
  using internal::LatencyHistogram;
  uint32_t last_index = 0;
  for (uint64_t v = 0; v <= 0xffffffffu; v = v < 4096 ? v + 1 : v + v / 1000 + 1) {
    const uint32_t index = LatencyHistogram::Index(static_cast<uint32_t>(v));
    ASSERT_LT(index, LatencyHistogram::kBuckets);
    ASSERT_GE(index, last_index) << "not monotonic at " << v;
    last_index = index;
    const uint64_t upper = LatencyHistogram::UpperBound(index);
    const uint64_t lower = index == 0 ? 0 : LatencyHistogram::UpperBound(index - 1) + 1;
    ASSERT_LE(lower, v);
    ASSERT_GE(upper, v);
    ASSERT_LE(upper - lower, std::max<uint64_t>(1, lower / 16)) << "too wide at " << v;
  }
  EXPECT_EQ(LatencyHistogram::Index(0xffffffffu), LatencyHistogram::kBuckets - 1);
  // Every power of two is a bucket's upper bound (what the Prometheus ladder relies on).
  for (int k = 0; k <= 32; ++k) {
    const uint64_t p = uint64_t{1} << k;
    if (p > 0xffffffffu) {
      EXPECT_EQ(LatencyHistogram::UpperBound(LatencyHistogram::kBuckets - 1), p);
      continue;
    }
    const uint32_t index = LatencyHistogram::Index(static_cast<uint32_t>(p));
    EXPECT_EQ(LatencyHistogram::UpperBound(index), p) << k;
  }
}

TEST(LatencyHistogram, PercentilesAreOrderedAndBounded) {
  internal::LatencyHistogram h;
  EXPECT_EQ(h.Snapshot().count, 0u);
  h.Record(100, 500);
  h.Record(1000, 400);
  h.Record(10000, 90);
  h.Record(100000, 9);
  h.Record(1000000, 1);
  LatencyStats s = h.Snapshot();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_EQ(s.sum_ns, 100u * 500 + 1000u * 400 + 10000u * 90 + 100000u * 9 + 1000000u);
  EXPECT_EQ(s.max_ns, 1000000u);
  EXPECT_GE(s.p50_ns, 100u);
  EXPECT_LE(s.p50_ns, 100u + 100 / 16 + 1);
  EXPECT_GE(s.p90_ns, 1000u);
  EXPECT_LE(s.p90_ns, 1000u + 1000 / 16 + 1);
  EXPECT_GE(s.p99_ns, 10000u);
  EXPECT_LE(s.p99_ns, 10000u + 10000 / 16 + 1);
  EXPECT_GE(s.p999_ns, 100000u);
  EXPECT_LE(s.p999_ns, s.max_ns);
  uint64_t total = 0;
  for (const auto& b : s.buckets) total += b.count;
  EXPECT_EQ(total, s.count);
  EXPECT_EQ(s.buckets.size(), 5u);
}

// Traffic through a runtime whose consumers record latency: one figure per completion.
TEST(LatencyHistogram, RecordsEveryDeliveredCompletion) {
  RuntimeOptions options = testing::EngineAndOwned(2);
  for (auto& c : options.consumers) c.record_latency = true;
  testing::SimTopology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 4));
  constexpr uint64_t kPerQp = 500;
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, kPerQp));
  ASSERT_TRUE(testing::DrainUntil(*topo.rt, 0,
                                  [&] { return topo.received() == kPerQp * topo.qps.size(); }));
  const Stats s = topo.rt->GetStats();
  uint64_t recorded = 0;
  for (const ConsumerStats& c : s.consumers) {
    SCOPED_TRACE(c.name);
    const LatencyStats& l = c.latency;
    EXPECT_TRUE(l.enabled);
    EXPECT_EQ(l.count, c.delivered);
    EXPECT_EQ(l.count, kPerQp * 2) << "two QPs per consumer";
    EXPECT_GT(l.p50_ns, 0u);
    EXPECT_LE(l.p50_ns, l.p90_ns);
    EXPECT_LE(l.p90_ns, l.p99_ns);
    EXPECT_LE(l.p99_ns, l.p999_ns);
    EXPECT_LE(l.p999_ns, l.max_ns);
    EXPECT_GE(l.sum_ns, l.count) << "each latency is at least 1 ns";
    uint64_t total = 0;
    for (const auto& b : l.buckets) total += b.count;
    EXPECT_EQ(total, l.count);
    recorded += l.count;
  }
  EXPECT_EQ(recorded, kPerQp * topo.qps.size());
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(LatencyHistogram, OffByDefault) {
  testing::SimTopology topo;
  CQD_ASSERT_OK(topo.Build(testing::OwnedConsumers(1, 2), 1, 2));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 100));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));
  for (const ConsumerStats& c : topo.rt->GetStats().consumers) {
    EXPECT_FALSE(c.latency.enabled);
    EXPECT_EQ(c.latency.count, 0u);
    EXPECT_TRUE(c.latency.buckets.empty());
    EXPECT_EQ(c.delivered, 100u);
  }
  CQD_ASSERT_OK(topo.TearDown());
}

// One consumer records, the other does not: only the first has figures.
TEST(LatencyHistogram, PerConsumer) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  options.consumers[1].record_latency = true;
  testing::SimTopology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 2));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 100));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));
  const Stats s = topo.rt->GetStats();
  EXPECT_EQ(s.consumers[0].latency.count, 0u);
  EXPECT_EQ(s.consumers[1].latency.count, 100u);
  CQD_ASSERT_OK(topo.TearDown());
}

// ---- the endpoint ----

TEST(StatsEndpoint, ServesJsonAndPrometheus) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.consumers[0].name = "fast \"lane\"";
  options.consumers[1].record_latency = true;
  options.consumers[0].queue_capacity = 1000;  // bounds of its own, told apart from the defaults
  options.consumers[1].spill_capacity = 77;
  options.max_registrations = 300;
  options.stats_socket = SocketPath("stats.sock");
  testing::SimTopology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 4));
  ASSERT_TRUE(Exists(options.stats_socket));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 50));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));

  // JSON, asked for by name.
  std::string error;
  const std::string body = Ask(options.stats_socket, "json\n");
  ASSERT_FALSE(body.empty());
  EXPECT_EQ(body.back(), '\n');
  std::optional<Json> root = Parse(body, &error);
  ASSERT_TRUE(root) << error << "\n" << body;
  EXPECT_GT(root->at("uptime_ns").get<uint64_t>(), 0u);
  ASSERT_EQ(root->at("pollers").size(), 2u);
  ASSERT_EQ(root->at("cqs").size(), 2u);
  ASSERT_EQ(root->at("devices").size(), 1u);
  EXPECT_EQ(root->at("devices").at(0).at("name").get<std::string>(), "sim0");
  const Json* consumers = &root->at("consumers");
  ASSERT_EQ(consumers->size(), 2u);
  EXPECT_EQ(consumers->at(0).at("name").get<std::string>(), "fast \"lane\"");
  EXPECT_EQ(consumers->at(0).at("delivered").get<uint64_t>(), 100u);
  EXPECT_EQ(consumers->at(1).at("delivered").get<uint64_t>(), 100u);
  EXPECT_EQ(consumers->at(1).at("latency").at("count").get<uint64_t>(), 100u);
  uint64_t polled = 0;
  for (const Json& p : root->at("pollers")) polled += p.at("completions").get<uint64_t>();
  EXPECT_EQ(polled, 200u);
  EXPECT_EQ(root->at("registrations").get<uint64_t>(), 4u);

  // JSON when the client sends nothing and closes its side; and with an empty line.
  EXPECT_TRUE(Parse(Ask(options.stats_socket, "", /*shut=*/true), &error)) << error;
  EXPECT_TRUE(Parse(Ask(options.stats_socket, "\r\n"), &error)) << error;
  // ... and when it sends nothing at all (after the server's short wait).
  EXPECT_TRUE(Parse(Ask(options.stats_socket, ""), &error)) << error;

  // Prometheus.
  const std::string prom = Ask(options.stats_socket, "prometheus\n");
  Samples samples;
  CheckPrometheus(prom, &samples);
  ASSERT_EQ(samples["cqd_consumer_delivered_total"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_delivered_total"][0], "consumer"), "fast \"lane\"");
  EXPECT_EQ(samples["cqd_consumer_delivered_total"][0].value, 100);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_count"].size(), 1u);
  ASSERT_EQ(samples["cqd_registrations"].size(), 1u);
  EXPECT_EQ(samples["cqd_registrations"][0].value, 4);
  // The bounds beside the depths, so that a fill ratio needs no configuration: what the runtime
  // was created with.
  ASSERT_EQ(samples["cqd_max_registrations"].size(), 1u);
  EXPECT_EQ(samples["cqd_max_registrations"][0].value, options.max_registrations);
  ASSERT_EQ(samples["cqd_consumer_queue_capacity"].size(), 2u);
  EXPECT_EQ(samples["cqd_consumer_queue_capacity"][0].value, options.consumers[0].queue_capacity);
  ASSERT_EQ(samples["cqd_consumer_spill_capacity"].size(), 2u);
  EXPECT_EQ(samples["cqd_consumer_spill_capacity"][1].value, options.consumers[1].spill_capacity);
  ASSERT_EQ(samples["cqd_build_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_build_info"][0], "version"), Version().string);
  EXPECT_EQ(samples["cqd_build_info"][0].value, 1);

  // HTTP, as curl --unix-socket sends it.
  const std::string http =
      Ask(options.stats_socket, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  ASSERT_EQ(http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << http.substr(0, 200);
  EXPECT_NE(http.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  const size_t header_end = http.find("\r\n\r\n");
  ASSERT_NE(header_end, std::string::npos);
  const std::string http_body = http.substr(header_end + 4);
  EXPECT_NE(http.find("Content-Length: " + std::to_string(http_body.size()) + "\r\n"),
            std::string::npos);
  CheckPrometheus(http_body);
  const std::string http_json = Ask(options.stats_socket, "GET /json HTTP/1.0\r\n\r\n");
  ASSERT_EQ(http_json.rfind("HTTP/1.0 200 OK\r\n", 0), 0u);
  EXPECT_TRUE(Parse(http_json.substr(http_json.find("\r\n\r\n") + 4), &error)) << error;
  EXPECT_EQ(Ask(options.stats_socket, "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(Ask(options.stats_socket, "POST / HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  // HEAD: GET's headers, its Content-Length included, and no body.
  const std::string head = Ask(options.stats_socket, "HEAD /json HTTP/1.1\r\n\r\n");
  ASSERT_EQ(head.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("\r\n\r\n"), head.size() - 4) << head;
  EXPECT_NE(head.find("Content-Length: "), std::string::npos) << head;
  EXPECT_EQ(Ask(options.stats_socket, "HEAD /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);

  EXPECT_EQ(Ask(options.stats_socket, "xml\n"), "error: unknown request (json|prometheus)\n");

  // Shutdown removes the file and stops answering.
  CQD_ASSERT_OK(topo.TearDown());
  CQD_ASSERT_OK(topo.rt->Shutdown());
  EXPECT_FALSE(Exists(options.stats_socket));
  EXPECT_LT(Connect(options.stats_socket), 0);
}

// Stats::registrations follows every way a registration begins and ends.
TEST(Stats, CountLiveRegistrations) {
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build());
  EXPECT_EQ(bed.rt->GetStats().registrations, 0u);
  SequenceHandler handlers[4];
  std::vector<SimQp*> qps{bed.qp};
  for (int i = 1; i < 4; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()));
    qps.push_back(qp);
  }
  std::vector<Registration> regs;
  for (int i = 0; i < 4; ++i) {
    handlers[i].qp_num = qps[i]->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*qps[i], handlers[i], 0));
    regs.push_back(std::move(reg));
  }
  EXPECT_EQ(bed.rt->GetStats().registrations, 4u);
  // A refused registration (the same QP twice) counts nothing.
  SequenceHandler again;
  EXPECT_FALSE(bed.rt->RegisterQp(*qps[0], again, 0).ok());
  EXPECT_EQ(bed.rt->GetStats().registrations, 4u);
  regs[0].Unregister();
  EXPECT_EQ(bed.rt->GetStats().registrations, 3u);
  regs[0].Unregister();  // a second time: a no-op
  EXPECT_EQ(bed.rt->GetStats().registrations, 3u);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(regs[1]));
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_EQ(bed.rt->GetStats().registrations, 2u);
  { Registration gone = std::move(regs[2]); }  // destroyed: unregistered
  EXPECT_EQ(bed.rt->GetStats().registrations, 1u);
  EXPECT_NE(StatsToJson(bed.rt->GetStats()).find("\"registrations\":1,"), std::string::npos);
  regs[3].Unregister();
  EXPECT_EQ(bed.rt->GetStats().registrations, 0u);
}

// Prometheus scrapes the TCP listener directly; loopback only unless the engine says otherwise.
TEST(StatsEndpoint, ServesPrometheusOverLoopbackTcp) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  RuntimeOptions options;
  options.stats_tcp = "127.0.0.1:" + std::to_string(port);
  options.stats_per_cq = false;
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  SequenceHandler handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 10));
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 10; }));

  const std::string http = AskTcp(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << http.substr(0, 200);
  const size_t header_end = http.find("\r\n\r\n");
  ASSERT_NE(header_end, std::string::npos);
  Samples samples;
  CheckPrometheus(http.substr(header_end + 4), &samples);
  EXPECT_EQ(samples["cqd_registrations"][0].value, 1);
  EXPECT_EQ(samples["cqd_cqs"][0].value, 1);
  EXPECT_EQ(samples["cqd_consumer_delivered_total"][0].value, 10);
  EXPECT_EQ(samples.count("cqd_cq_completions_total"), 0u) << "stats_per_cq = false";
  const std::string json_http = AskTcp(port, "GET /json HTTP/1.0\r\n\r\n");
  ASSERT_EQ(json_http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u);
  std::optional<Json> root = Parse(json_http.substr(json_http.find("\r\n\r\n") + 4));
  ASSERT_TRUE(root);
  EXPECT_EQ(root->at("cqs").size(), 1u) << "JSON keeps the CQs";
  // The plain protocol too.
  EXPECT_TRUE(Parse(AskTcp(port, "json\n")));

  // The port is taken: a second runtime on it fails to start.
  RuntimeOptions twice;
  twice.stats_tcp = options.stats_tcp;
  EXPECT_EQ(Runtime::Create(twice).status().code(), StatusCode::kAlreadyExists);

  reg.Unregister();
  CQD_ASSERT_OK(bed.rt->Shutdown());
  EXPECT_EQ(AskTcp(port, "json\n").rfind("<connect failed", 0), 0u) << "Shutdown closes it";
}

TEST(StatsEndpoint, TcpAddressesAreCheckedAndRemoteOnesRefusedUnlessAllowed) {
  for (const char* bad :
       {"localhost:9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
        "127.0.0.1:12ab", "[::1]9464", "[::1:9464", ":9464", "300.0.0.1:9464", "::1:9464"}) {
    RuntimeOptions options;
    options.stats_tcp = bad;
    const Status s = Runtime::Create(options).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad << ": " << s.ToString();
    EXPECT_NE(s.message().find("stats_tcp"), std::string::npos) << s.ToString();
  }
  for (const char* remote : {"0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "[2001:db8::1]:9464"}) {
    RuntimeOptions options;
    options.stats_tcp = remote;
    const Status s = Runtime::Create(options).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << remote;
    EXPECT_NE(s.message().find("stats_tcp_allow_remote"), std::string::npos) << s.ToString();
  }
  // Allowed: it binds (every interface here, reached through loopback).
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  RuntimeOptions options;
  options.stats_tcp = "0.0.0.0:" + std::to_string(port);
  options.stats_tcp_allow_remote = true;
  CQD_ASSERT_OK_AND_ASSIGN(rt, Runtime::Create(options));
  EXPECT_TRUE(Parse(AskTcp(port, "json\n")));
  CQD_ASSERT_OK(rt->Shutdown());
  // IPv6 loopback, where this machine has it.
  const int port6 = FreeTcpPort();
  RuntimeOptions v6;
  v6.stats_tcp = "[::1]:" + std::to_string(port6);
  auto created = Runtime::Create(v6);
  if (created.ok()) {
    EXPECT_TRUE(Parse(AskTcp(port6, "json\n", /*v6=*/true)));
  } else {
    EXPECT_EQ(created.status().code(), StatusCode::kInternal) << created.status().ToString();
    EXPECT_NE(created.status().message().find("bind"), std::string::npos);
  }
}

TEST(StatsEndpoint, BadPathsFailCreate) {
  RuntimeOptions options;
  options.stats_socket = "/tmp/" + std::string(200, 'x');
  auto rt = Runtime::Create(options);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rt.status().message().find("stats_socket"), std::string::npos);

  options.stats_socket = std::string("/tmp/a\0b", 8);
  EXPECT_EQ(Runtime::Create(options).status().code(), StatusCode::kInvalidArgument);

  options.stats_socket = "/nonexistent-cqd-dir/stats.sock";
  rt = Runtime::Create(options);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kInternal);
  EXPECT_NE(rt.status().message().find("bind"), std::string::npos) << rt.status().ToString();
  EXPECT_NE(rt.status().message().find("/nonexistent-cqd-dir/stats.sock"), std::string::npos);

  // A regular file is in the way: refused, and left alone.
  const std::string file = SocketPath("plain-file");
  std::ofstream(file) << "keep me";
  options.stats_socket = file;
  rt = Runtime::Create(options);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kAlreadyExists) << rt.status().ToString();
  std::ifstream in(file);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "keep me");
  unlink(file.c_str());
}

// The socket file is owner-only by default, whatever the umask (under umask 0 any local user
// could read the stats), and gets exactly the mode the engine asks for.
TEST(StatsEndpoint, SocketFileModeIsOwnerOnlyUnlessAsked) {
  const mode_t old_umask = umask(0);
  for (uint32_t mode : {0600u, 0660u, 0700u}) {
    RuntimeOptions options;
    options.stats_socket = SocketPath("mode.sock");
    if (mode != 0600) options.stats_socket_mode = mode;
    auto rt = Runtime::Create(options);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    struct stat st;
    ASSERT_EQ(stat(options.stats_socket.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, mode);
  }
  umask(old_umask);
  for (uint32_t bad : {01000u, 0444u, 0u}) {
    RuntimeOptions options;
    options.stats_socket = SocketPath("mode.sock");
    options.stats_socket_mode = bad;
    auto rt = Runtime::Create(options);
    EXPECT_EQ(rt.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(rt.status().message().find("stats_socket_mode"), std::string::npos);
  }
}

TEST(StatsEndpoint, StaleSocketIsReplacedLiveOneIsNot) {
  const std::string path = SocketPath("stale.sock");
  {  // A socket file nobody listens on, as a crashed process leaves it.
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path.data(), path.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
    ASSERT_TRUE(Exists(path));
  }
  LogCollector log;
  RuntimeOptions options;
  options.stats_socket = path;
  options.log = log.Sink();
  CQD_ASSERT_OK_AND_ASSIGN(rt, Runtime::Create(options));
  EXPECT_TRUE(log.Saw(LogLevel::kInfo, "replaced a stale socket"));
  EXPECT_TRUE(Parse(Ask(path, "json\n")));

  // A second runtime on the same path: refused; the first keeps serving.
  auto second = Runtime::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  EXPECT_TRUE(Parse(Ask(path, "json\n")));

  // The destructor alone (no Shutdown) removes the file too.
  rt.reset();
  EXPECT_FALSE(Exists(path));
}

// A client that sends nothing and reads nothing neither holds up Shutdown nor, once dropped,
// other clients.
TEST(StatsEndpoint, SlowClientsDoNotHoldAnythingUp) {
  LogCollector log;
  RuntimeOptions options;
  // A response far bigger than a socket buffer: long consumer names in every consumer line.
  options.consumers.assign(4, ConsumerOptions{});
  for (size_t i = 0; i < options.consumers.size(); ++i) {
    options.consumers[i].kind = ConsumerKind::kEngineDriven;
    options.consumers[i].queue_capacity = 1;
    options.consumers[i].name = std::string(40000, static_cast<char>('a' + i));
  }
  options.stats_socket = SocketPath("slow.sock");
  options.log = log.Sink();
  CQD_ASSERT_OK_AND_ASSIGN(rt, Runtime::Create(options));
  const std::string full = StatsToPrometheus(rt->GetStats());
  // The server's socket buffer (net.core.wmem_default) must be far smaller than the response
  // for the client to be dropped mid-way.
  uint64_t wmem = 0;
  std::ifstream("/proc/sys/net/core/wmem_default") >> wmem;
  const bool fits = wmem == 0 || full.size() < 2 * wmem;

  // Asks for Prometheus and does not read.
  int stuck = Connect(options.stats_socket);
  ASSERT_GE(stuck, 0);
  ASSERT_EQ(write(stuck, "prometheus\n", 11), 11);
  // Another client is answered once the server has given up on the first.
  std::optional<Json> root = Parse(Ask(options.stats_socket, "json\n"));
  ASSERT_TRUE(root);
  EXPECT_EQ(root->at("consumers").size(), 4u);
  const std::string partial = ReadAll(stuck);
  close(stuck);
  if (!fits) {
    EXPECT_LT(partial.size(), full.size()) << "dropped before it was all written";
    EXPECT_TRUE(log.Saw(LogLevel::kDebug, "dropped a client"));
  }

  // A silent client is connected while the runtime shuts down: Shutdown returns anyway.
  int silent = Connect(options.stats_socket);
  ASSERT_GE(silent, 0);
  CQD_ASSERT_OK(rt->Shutdown());
  EXPECT_FALSE(Exists(options.stats_socket));
  close(silent);
}

// ---- the log sink ----

TEST(LogSink, HearsControlPathEvents) {
  LogCollector log;
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // never drained: the teardown times out
  options.log = log.Sink();
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  EXPECT_TRUE(log.Saw(LogLevel::kInfo, "added as device 1"));

  // A teardown that cannot drain runs out of time.
  SequenceHandler handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 3));
  TeardownOptions teardown_options;
  teardown_options.timeout = std::chrono::milliseconds(50);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(reg, teardown_options));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  char qp[16];
  snprintf(qp, sizeof(qp), "0x%x", bed.qp->qp_num());
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, qp); }));
  EXPECT_TRUE(log.Saw(LogLevel::kWarning, "did not flush back before the deadline"));

  // A completion channel whose reads keep failing is given up, and said so.
  CQD_ASSERT_OK_AND_ASSIGN(channel, bed.rt->SimChannelFor(bed.dev, 0));
  SequenceHandler second;
  CQD_ASSERT_OK_AND_ASSIGN(qp2, bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()));
  second.qp_num = qp2->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg2, bed.rt->RegisterQp(*qp2, second, 0));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*bed.rt));
  bed.sim->FailGetEvent(channel, EIO, 1 << 30);
  ASSERT_TRUE(InjectRecvs(qp2, 0, 1));  // raises the event the poller is armed for
  ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().failed_fds == 1; }));
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, "no longer watched"); }));

  // A CQ that overflows (S11): CQ_ERR, logged at error level with the CQ's id.
  CqOptions small;
  small.depth = 8;
  CQD_ASSERT_OK_AND_ASSIGN(doomed, bed.rt->CreateCq(bed.dev, 0, small));
  CQD_ASSERT_OK_AND_ASSIGN(qp3, bed.sim->CreateQp(doomed.sim(), doomed.sim()));
  std::vector<ibv_wc> burst(9);
  for (auto& wc : burst) wc.qp_num = qp3->qp_num();
  EXPECT_EQ(doomed.sim()->Inject(burst, false, /*overflow=*/true), -1);
  EXPECT_TRUE(WaitFor([&] {
    return log.Saw(LogLevel::kError, "CQ_ERR on cq " + std::to_string(doomed.id()) + ":");
  }));

  // DEVICE_FATAL.
  bed.sim->RaiseDeviceFatal();
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kError, "DEVICE_FATAL"); }));
  reg2.Unregister();
  bed.sim->FailGetEvent(channel, 0, 0);
}

// Runs `body` with stdout and stderr sent to a file; returns what was printed.
std::string Printed(const std::function<void()>& body) {
  fflush(stdout);
  fflush(stderr);
  const std::string capture = SocketPath("printed.txt");
  const int file = open(capture.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (file < 0) return "open failed";
  const int saved_out = dup(1);
  const int saved_err = dup(2);
  dup2(file, 1);
  dup2(file, 2);
  body();
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  close(file);
  std::ifstream in(capture);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Builds a runtime with one simulated QP (which logs "device ... added as device 1" at info),
// with CQD_LOG_LEVEL set to `level` (nullptr: unset) and no sink of the engine's unless `sink`.
std::string PrintedWithLogLevel(const char* level, LogCollector* sink = nullptr) {
  if (level != nullptr) {
    setenv("CQD_LOG_LEVEL", level, 1);
  } else {
    unsetenv("CQD_LOG_LEVEL");
  }
  std::string printed = Printed([&] {
    RuntimeOptions options;
    if (sink != nullptr) options.log = sink->Sink();
    testing::OneQp bed;
    EXPECT_TRUE(bed.Build(options).ok());
  });
  unsetenv("CQD_LOG_LEVEL");
  return printed;
}

TEST(LogSink, TheEnvironmentChoosesAStderrSink) {
  EXPECT_EQ(PrintedWithLogLevel(nullptr), "");
  EXPECT_EQ(PrintedWithLogLevel("off"), "");
  EXPECT_EQ(PrintedWithLogLevel(""), "");
  const std::string info = PrintedWithLogLevel("info");
  // "cqd: <UTC time>Z <pid>:<tid> info: device ... added as device 1"
  const std::regex line(
      "cqd: 2[0-9]{3}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\\.[0-9]{6}Z "
      "[0-9]+:[0-9]+ info: device .* added as device 1.*\n");
  EXPECT_TRUE(std::regex_match(info, line)) << info;
  EXPECT_NE(info.find(" " + std::to_string(getpid()) + ":"), std::string::npos) << info;
  EXPECT_NE(PrintedWithLogLevel("debug").find(" info: device "), std::string::npos);
  // Levels in any case, as rdma-core's and UCX's switches take them.
  EXPECT_TRUE(std::regex_match(PrintedWithLogLevel("INFO"), line));
  EXPECT_TRUE(std::regex_match(PrintedWithLogLevel("Debug"), line));
  EXPECT_EQ(PrintedWithLogLevel("OFF"), "");
  // Above the message's level: nothing.
  EXPECT_EQ(PrintedWithLogLevel("warning"), "");
  EXPECT_EQ(PrintedWithLogLevel("WARN"), "") << "UCX's spelling is known too";
  EXPECT_EQ(PrintedWithLogLevel("error"), "");
  // A value it does not know is said once, and the log stays off.
  EXPECT_EQ(PrintedWithLogLevel("loud"),
            "cqd: CQD_LOG_LEVEL=loud is not one of debug, info, warning, error, off: the log "
            "stays off\n");
  // The engine's sink wins over the environment.
  LogCollector engine;
  EXPECT_EQ(PrintedWithLogLevel("debug", &engine), "");
  EXPECT_TRUE(engine.Saw(LogLevel::kInfo, "added as device 1"));
}

// A consumer that stops draining holds its poller back; once that has lasted a second the log
// says which consumer and how full, once, and says again when it drains. Meanwhile the metrics
// show the stall in progress.
TEST(LogSink, AStuckConsumerIsLoggedOnceAndItsEndToo) {
  LogCollector log;
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // drained only below
  options.consumers[0].name = "stuck";
  options.consumers[0].queue_capacity = 1;
  options.consumers[0].spill_capacity = 1;
  options.log = log.Sink();
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  SequenceHandler handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 8));  // more than the queue and the spill hold
  const std::string held = "consumer 0 (stuck) has held its pollers back for ";
  ASSERT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, held); }));
  const auto warnings = [&] {
    std::lock_guard<std::mutex> lock(log.mu);
    return std::count_if(log.lines.begin(), log.lines.end(), [&](const auto& line) {
      return line.second.find(held) != std::string::npos;
    });
  };
  EXPECT_EQ(warnings(), 1);
  // What a Prometheus scrape shows meanwhile: the stall in progress beside the queue's bound.
  Samples samples;
  CheckPrometheus(StatsToPrometheus(bed.rt->GetStats()), &samples);
  ASSERT_EQ(samples["cqd_consumer_stall_seconds"].size(), 1u);
  EXPECT_GE(samples["cqd_consumer_stall_seconds"][0].value, 1.0);
  ASSERT_EQ(samples["cqd_consumer_queue_capacity"].size(), 1u);
  EXPECT_EQ(samples["cqd_consumer_queue_capacity"][0].value, 1);
  while (handler.received() < 8) bed.rt->Drain(0, 64);
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kInfo, "consumer 0 (stuck) drains again"); }));
  EXPECT_EQ(warnings(), 1) << "one warning for the one stall";
  reg.Unregister();
}

// CQD_LOG_FILE: the lines are appended to that file, not printed; a file that cannot be opened
// is said on stderr, and the lines go there.
TEST(LogSink, CqdLogFileTakesTheLines) {
  const std::string path = SocketPath("cqd.log");
  {
    std::ofstream earlier(path);
    earlier << "an earlier line\n";
  }
  setenv("CQD_LOG_FILE", path.c_str(), 1);
  EXPECT_EQ(PrintedWithLogLevel("info"), "");
  std::ifstream in(path);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written.rfind("an earlier line\ncqd: ", 0), 0u) << written;
  EXPECT_NE(written.find(" info: device "), std::string::npos) << written;
  setenv("CQD_LOG_FILE", "/nonexistent-dir/cqd.log", 1);
  const std::string printed = PrintedWithLogLevel("info");
  unsetenv("CQD_LOG_FILE");
  EXPECT_EQ(printed.rfind("cqd: CQD_LOG_FILE=/nonexistent-dir/cqd.log cannot be opened (", 0), 0u)
      << printed;
  EXPECT_NE(printed.find(" info: device "), std::string::npos) << printed;
}

// Without a sink the library writes nothing to stdout or stderr, even when things go wrong.
TEST(LogSink, NothingIsPrintedWithoutOne) {
  unsetenv("CQD_LOG_LEVEL");
  fflush(stdout);
  fflush(stderr);
  const std::string capture = SocketPath("captured.txt");
  const int file = open(capture.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  const int saved_out = dup(1);
  const int saved_err = dup(2);
  dup2(file, 1);
  dup2(file, 2);
  bool ok = true;
  {
    RuntimeOptions options;
    options.stats_socket = SocketPath("quiet.sock");
    testing::OneQp bed;
    ok = bed.Build(options).ok();
    if (ok) {
      auto channel = bed.rt->SimChannelFor(bed.dev, 0);
      SequenceHandler handler;
      auto reg = bed.rt->RegisterQp(*bed.qp, handler, 0);
      ok = channel.ok() && reg.ok() && testing::WaitForPollersAsleep(*bed.rt);
      if (ok) {
        bed.sim->FailGetEvent(*channel, EIO, 1 << 30);
        ok = InjectRecvs(bed.qp, 0, 1) &&
             WaitFor([&] { return bed.rt->GetStats().failed_fds == 1; });
        (void)Ask(options.stats_socket, "bogus\n");
        bed.sim->RaiseDeviceFatal();
        bed.sim->FailGetEvent(*channel, 0, 0);
      }
      if (reg.ok()) reg->Unregister();
    }
  }
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  close(file);
  ASSERT_TRUE(ok);
  std::ifstream in(capture);
  const std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(printed, "");
  unlink(capture.c_str());
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// tests/scenarios/observe_checks.h: what the observability tests share: a strict JSON parse, a
// validator of the Prometheus exposition format, a sample Stats, clients of the stats endpoint
// (Unix socket and TCP), and a log sink that collects lines.
#ifndef CQD_TESTS_SCENARIOS_OBSERVE_CHECKS_H_
#define CQD_TESTS_SCENARIOS_OBSERVE_CHECKS_H_

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
#include <random>
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
#include "tests/fixtures/fixtures.h"

namespace cqd::observe_test {

using Json = nlohmann::json;

inline std::optional<Json> Parse(const std::string& text, std::string* error = nullptr) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  }
}

// ---- helpers ----

// A Stats with a bit of everything, including names that need escaping.
inline Stats SampleStats() {
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
  s.devices = {{1, "mlx5_0", 0, 8, 1, 4}, {2, "sim\"0\"", -1, 1}};
  s.placement_cpus = "0-3,8-11";
  return s;
}

// The name as the formatters must carry it: invalid UTF-8 sequences become U+FFFD per byte.
inline const char* kBadNameSanitized =
    "bad utf8 \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end";

// One sample line of the Prometheus text format, parsed.
struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // values unescaped
  double value = 0;
  std::string value_text;
};

inline bool IsNameChar(char c, bool first, bool colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

inline bool ValidName(const std::string& s, bool colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!IsNameChar(s[i], i == 0, colon)) return false;
  }
  return true;
}

// Parses `line` by the exposition grammar: name, optional {label="value",...}, one space, a
// float (or +Inf, -Inf, NaN), nothing after (we never write timestamps).
inline bool ParseSample(const std::string& line, Sample* out, std::string* why) {
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

inline std::string LabelKey(const std::vector<std::pair<std::string, std::string>>& labels,
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
inline void CheckPrometheus(const std::string& text, Samples* out = nullptr) {
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
inline std::string LabelOf(const Sample& s, const std::string& name) {
  for (const auto& [k, v] : s.labels) {
    if (k == name) return v;
  }
  return "";
}

// A Unix socket path for a test: under TEST_TMPDIR when it fits, else under /tmp, named for
// this process. Not by its pid alone: tests that run at once in Bazel's sandbox, each in a PID
// namespace of its own, get the same few pids, and one test's socket took another's path.
inline std::string SocketPath(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    static const std::string process = [] {
      char tag[32];
      snprintf(tag, sizeof(tag), "%d-%08x", static_cast<int>(getpid()), std::random_device{}());
      return std::string(tag);
    }();
    path = "/tmp/cqd-" + process + "-" + name;
  }
  unlink(path.c_str());
  return path;
}

inline int Connect(const std::string& path) {
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

inline std::string ReadAll(int fd) {
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
inline std::string Ask(const std::string& path, const std::string& request, bool shut = false) {
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
inline int FreeTcpPort() {
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
inline std::string AskTcp(int port, const std::string& request, bool v6 = false) {
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

inline bool Exists(const std::string& path) {
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

}  // namespace cqd::observe_test

#endif  // CQD_TESTS_SCENARIOS_OBSERVE_CHECKS_H_

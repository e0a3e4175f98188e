// SPDX-License-Identifier: BSD-2-Clause
// cqd_top: live rates of a running cqd runtime, read from its stats endpoint
// (RuntimeOptions::stats_socket, or stats_tcp).
//
//   bazel run //tools:cqd_top -- ENDPOINT [--interval=1] [--count=N] [--cqs=10] [--clear]
//
// ENDPOINT is the Unix socket's path, or HOST:PORT of the TCP endpoint (a path never has a colon
// here: one with a colon is taken as HOST:PORT unless it starts with '/' or '.').
// Every interval it connects, asks for JSON ("json\n" on the socket, GET /json over TCP), and
// prints one frame of aligned plain-text tables: registrations (now and the bound); per poller
// completions, polls, empty polls, sleeps, arms and parks per second and its parked CQs; per CQ
// completions, events and acks per second (the busiest --cqs of them); per consumer deliveries
// per second, queue and spill depth, stalls, the stall in progress (STALL_NOW: how long this
// consumer has held its pollers back), and the poll -> dispatch latency of the interval
// (p50/p99/p99.9 from the histogram buckets that changed; MAX_EVER is since the start) where the
// consumer records it. --count N prints N frames and exits (0: run until interrupted); --clear
// clears the terminal before each frame. Exits 1 when the endpoint cannot be read.
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cqd/version.h"

namespace {

struct Flags {
  std::string endpoint;  // a Unix socket's path, or HOST:PORT
  double interval = 1;
  long count = 0;
  size_t cqs = 10;
  bool clear = false;
};

void Usage(FILE* to) {
  fprintf(to,
          "usage: cqd_top ENDPOINT [--interval=SECONDS] [--count=N] [--cqs=N] [--clear]\n"
          "  ENDPOINT    the runtime's RuntimeOptions::stats_socket (a path), or its stats_tcp\n"
          "              (HOST:PORT)\n"
          "  --interval  seconds between frames (default 1, at least 0.05)\n"
          "  --count     frames to print, then exit (default 0: until interrupted)\n"
          "  --cqs       CQs to show, the busiest first (default 10)\n"
          "  --clear     clear the terminal before each frame\n"
          "  --help      print this and exit; --version: print the cqd version and exit\n");
}

// Parses "--name VALUE" or "--name=VALUE" at argv[*i]; advances *i past what it used.
bool FlagValue(int argc, char** argv, int* i, const char* name, std::string* value) {
  const size_t n = strlen(name);
  const char* arg = argv[*i];
  if (strncmp(arg, name, n) != 0) return false;
  if (arg[n] == '=') {
    *value = arg + n + 1;
    return true;
  }
  if (arg[n] != '\0' || *i + 1 >= argc) return false;
  *value = argv[++*i];
  return true;
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string v;
    char* end = nullptr;
    if (FlagValue(argc, argv, &i, "--interval", &v)) {
      flags->interval = strtod(v.c_str(), &end);
      if (*end != '\0' || !(flags->interval >= 0.05)) return false;
    } else if (FlagValue(argc, argv, &i, "--count", &v)) {
      flags->count = strtol(v.c_str(), &end, 10);
      if (*end != '\0' || flags->count < 0) return false;
    } else if (FlagValue(argc, argv, &i, "--cqs", &v)) {
      long cqs = strtol(v.c_str(), &end, 10);
      if (*end != '\0' || cqs < 0) return false;
      flags->cqs = static_cast<size_t>(cqs);
    } else if (strcmp(argv[i], "--clear") == 0) {
      flags->clear = true;
    } else if (argv[i][0] == '-' || !flags->endpoint.empty()) {
      return false;
    } else {
      flags->endpoint = argv[i];
    }
  }
  return !flags->endpoint.empty();
}

// True if `endpoint` names a TCP endpoint (HOST:PORT) rather than a Unix socket's path.
bool IsTcp(const std::string& endpoint) {
  return endpoint.find(':') != std::string::npos && endpoint[0] != '/' && endpoint[0] != '.';
}

// A connected stream socket to `endpoint`, with 5 s send and receive timeouts; -1 (and `error`)
// on failure.
int Connect(const std::string& endpoint, std::string* error) {
  if (!IsTcp(endpoint)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (endpoint.size() >= sizeof(addr.sun_path)) {
      *error = "socket path too long";
      return -1;
    }
    memcpy(addr.sun_path, endpoint.data(), endpoint.size());
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = std::string("socket: ") + strerror(errno);
      return -1;
    }
    timeval tv{5, 0};  // never hang on a stuck endpoint
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      *error = "connect " + endpoint + ": " + strerror(errno);
      close(fd);
      return -1;
    }
    return fd;
  }
  const size_t colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), endpoint.c_str() + colon + 1, &hints, &found);
  if (rc != 0) {
    *error = "resolve " + endpoint + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *error = "connect " + endpoint + ": " + strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

// Reads the endpoint's JSON; returns false with `error` set on failure.
bool Fetch(const std::string& endpoint, std::string* body, std::string* error) {
  const int fd = Connect(endpoint, error);
  if (fd < 0) return false;
  const bool tcp = IsTcp(endpoint);
  const std::string request = tcp ? "GET /json HTTP/1.0\r\n\r\n" : "json\n";
  bool ok = send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size());
  if (!ok) *error = std::string("send: ") + strerror(errno);
  body->clear();
  char buf[65536];
  while (ok) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      body->append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      *error = std::string("read: ") + strerror(errno);
      ok = false;
    }
  }
  close(fd);
  if (ok && tcp) {  // an HTTP response: its status, then the body after the headers
    const size_t end = body->find("\r\n\r\n");
    if (body->rfind("HTTP/1.0 200", 0) != 0 || end == std::string::npos) {
      *error = "GET /json from " + endpoint + ": " + body->substr(0, body->find('\r'));
      return false;
    }
    body->erase(0, end + 4);
  }
  return ok;
}

// What a frame needs from one JSON document.
struct Snapshot {
  struct Poller {
    int64_t cpu;
    uint64_t polls, empty_polls, completions, arms, arm_failures, sleeps, stalls, parks, parked_cqs,
        asleep;
  };
  struct Cq {
    int64_t shard;
    uint64_t completions, events, acked_events, ack_calls, poll_errors;
  };
  struct Consumer {
    std::string name;
    uint64_t delivered, async_events, queue_depth, high_water, spill_depth, spill_high_water,
        stalls, stalled_ns, stall_ns;
    bool latency = false;
    uint64_t latency_max_ns = 0;
    std::map<uint64_t, uint64_t> buckets;  // upper_ns -> count
  };
  uint64_t uptime_ns = 0;
  uint64_t registrations = 0, max_registrations = 0;
  uint64_t orphans = 0, async_events = 0, failed_fds = 0, cm_events = 0;
  uint64_t cq_events = 0, cq_acked_events = 0, cq_ack_calls = 0;
  std::vector<Poller> pollers;
  std::map<uint64_t, Cq> cqs;  // by id
  std::vector<Consumer> consumers;
};

using nlohmann::json;

uint64_t U64(const json& j, const char* key) { return j.at(key).get<uint64_t>(); }
// A field an older runtime may not serve: 0 then.
uint64_t Newer(const json& j, const char* key) { return j.value(key, uint64_t{0}); }

// Throws nlohmann::json::exception for a document that is not a cqd stats document (a key
// missing, a value of another type); Read turns that into an error.
void Extract(const json& root, Snapshot* s) {
  s->uptime_ns = U64(root, "uptime_ns");
  s->registrations = U64(root, "registrations");
  s->max_registrations = Newer(root, "max_registrations");
  s->orphans = U64(root, "orphans");
  s->async_events = U64(root, "async_events");
  s->failed_fds = U64(root, "failed_fds");
  s->cm_events = U64(root, "cm_events");
  s->cq_events = U64(root, "cq_events");
  s->cq_acked_events = U64(root, "cq_acked_events");
  s->cq_ack_calls = U64(root, "cq_ack_calls");
  for (const json& p : root.at("pollers")) {
    s->pollers.push_back({p.value("cpu", int64_t{-1}), U64(p, "polls"), U64(p, "empty_polls"),
                          U64(p, "completions"), U64(p, "arms"), U64(p, "arm_failures"),
                          U64(p, "sleeps"), U64(p, "backpressure_stalls"), Newer(p, "parks"),
                          Newer(p, "parked_cqs"), Newer(p, "asleep")});
  }
  for (const json& c : root.at("cqs")) {
    s->cqs[U64(c, "id")] = {
        c.at("shard").get<int64_t>(), U64(c, "completions"), U64(c, "events"),
        U64(c, "acked_events"),       U64(c, "ack_calls"),   U64(c, "poll_errors")};
  }
  for (const json& c : root.at("consumers")) {
    Snapshot::Consumer out{c.at("name").get<std::string>(),
                           U64(c, "delivered"),
                           U64(c, "async_events"),
                           U64(c, "queue_depth"),
                           U64(c, "high_water"),
                           U64(c, "spill_depth"),
                           U64(c, "spill_high_water"),
                           U64(c, "stalls"),
                           U64(c, "stalled_ns"),
                           Newer(c, "stall_ns"),
                           false,
                           0,
                           {}};
    const json& l = c.at("latency");
    if (l.at("enabled").get<bool>()) {
      out.latency = true;
      out.latency_max_ns = U64(l, "max_ns");
      for (const json& pair : l.at("buckets")) {
        out.buckets[pair.at(0).get<uint64_t>()] = pair.at(1).get<uint64_t>();
      }
    }
    s->consumers.push_back(std::move(out));
  }
}

bool Read(const std::string& path, Snapshot* s, std::string* error) {
  std::string body;
  if (!Fetch(path, &body, error)) return false;
  *s = Snapshot{};
  try {
    Extract(json::parse(body), s);
  } catch (const json::parse_error& e) {
    *error = std::string("bad JSON from the endpoint: ") + e.what();
    return false;
  } catch (const json::exception& e) {
    *error = std::string("not a cqd stats document: ") + e.what();
    return false;
  }
  return true;
}

// ---- formatting ----

std::string Rate(uint64_t now, uint64_t before, double seconds) {
  const double v = now >= before ? static_cast<double>(now - before) / seconds : 0;
  char buf[32];
  if (v < 1000) {
    snprintf(buf, sizeof(buf), "%.0f", v);
  } else if (v < 1e6) {
    snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  } else if (v < 1e9) {
    snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  } else {
    snprintf(buf, sizeof(buf), "%.2fG", v / 1e9);
  }
  return buf;
}

std::string Num(uint64_t v) { return std::to_string(v); }

std::string Duration(uint64_t ns) {
  char buf[32];
  if (ns < 1000) {
    snprintf(buf, sizeof(buf), "%" PRIu64 "ns", ns);
  } else if (ns < 1000000) {
    snprintf(buf, sizeof(buf), "%.1fus", ns / 1e3);
  } else if (ns < 1000000000) {
    snprintf(buf, sizeof(buf), "%.1fms", ns / 1e6);
  } else {
    snprintf(buf, sizeof(buf), "%.2fs", ns / 1e9);
  }
  return buf;
}

// Rows of cells; the first column left-aligned, the others right-aligned.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      const std::string pad(width[c] - row[c].size(), ' ');
      line += c == 0 ? row[c] + pad : pad + row[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    printf("%s\n", line.c_str());
  }
}

// The upper bound of the bucket holding the q-th quantile of `delta` (upper_ns -> count).
uint64_t Quantile(const std::map<uint64_t, uint64_t>& delta, uint64_t total, double q) {
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  rank = std::clamp<uint64_t>(rank, 1, total);
  uint64_t seen = 0;
  for (const auto& [upper, count] : delta) {
    seen += count;
    if (seen >= rank) return upper;
  }
  return delta.empty() ? 0 : delta.rbegin()->first;
}

void PrintFrame(const Flags& flags, const Snapshot& prev, const Snapshot& cur) {
  const double dt = static_cast<double>(cur.uptime_ns - prev.uptime_ns) / 1e9;
  if (flags.clear) printf("\033[H\033[2J");
  printf("cqd_top %s  uptime %.1fs  interval %.2fs\n", flags.endpoint.c_str(),
         static_cast<double>(cur.uptime_ns) / 1e9, dt);
  printf("registrations %" PRIu64 " of %" PRIu64 "\n", cur.registrations, cur.max_registrations);
  printf("orphans %s/s  async events %s/s  CM events %s/s  failed fds %" PRIu64
         "  CQ events %s/s  acked %s/s  ack calls %s/s\n\n",
         Rate(cur.orphans, prev.orphans, dt).c_str(),
         Rate(cur.async_events, prev.async_events, dt).c_str(),
         Rate(cur.cm_events, prev.cm_events, dt).c_str(), cur.failed_fds,
         Rate(cur.cq_events, prev.cq_events, dt).c_str(),
         Rate(cur.cq_acked_events, prev.cq_acked_events, dt).c_str(),
         Rate(cur.cq_ack_calls, prev.cq_ack_calls, dt).c_str());

  std::vector<std::vector<std::string>> rows = {{"POLLER", "CPU", "COMPL/s", "POLLS/s", "EMPTY/s",
                                                 "SLEEPS/s", "ARMS/s", "ARM_FAIL/s", "SKIPPED/s",
                                                 "PARKS/s", "PARKED", "ASLEEP"}};
  for (size_t i = 0; i < cur.pollers.size(); ++i) {
    const Snapshot::Poller& c = cur.pollers[i];
    const Snapshot::Poller p = i < prev.pollers.size() ? prev.pollers[i] : c;
    // "-": not pinned (Stats says -1).
    rows.push_back({Num(i), c.cpu < 0 ? "-" : std::to_string(c.cpu),
                    Rate(c.completions, p.completions, dt), Rate(c.polls, p.polls, dt),
                    Rate(c.empty_polls, p.empty_polls, dt), Rate(c.sleeps, p.sleeps, dt),
                    Rate(c.arms, p.arms, dt), Rate(c.arm_failures, p.arm_failures, dt),
                    Rate(c.stalls, p.stalls, dt), Rate(c.parks, p.parks, dt), Num(c.parked_cqs),
                    Num(c.asleep)});
  }
  PrintTable(rows);
  printf("\n");

  // CQs, the busiest first.
  struct CqRow {
    uint64_t id;
    uint64_t delta;
  };
  std::vector<CqRow> order;
  for (const auto& [id, c] : cur.cqs) {
    auto it = prev.cqs.find(id);
    const uint64_t before = it == prev.cqs.end() ? 0 : it->second.completions;
    order.push_back({id, c.completions >= before ? c.completions - before : 0});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const CqRow& a, const CqRow& b) { return a.delta > b.delta; });
  rows = {{"CQ", "SHARD", "COMPL/s", "EVENTS/s", "ACKED/s", "ACK_CALLS/s", "POLL_ERRORS"}};
  for (size_t k = 0; k < order.size() && k < flags.cqs; ++k) {
    const Snapshot::Cq& c = cur.cqs.at(order[k].id);
    auto it = prev.cqs.find(order[k].id);
    const Snapshot::Cq p = it == prev.cqs.end() ? Snapshot::Cq{c.shard, 0, 0, 0, 0, 0} : it->second;
    rows.push_back({Num(order[k].id), std::to_string(c.shard),
                    Rate(c.completions, p.completions, dt), Rate(c.events, p.events, dt),
                    Rate(c.acked_events, p.acked_events, dt), Rate(c.ack_calls, p.ack_calls, dt),
                    Num(c.poll_errors)});
  }
  if (flags.cqs > 0) {
    PrintTable(rows);
    if (order.size() > flags.cqs) {
      printf("(%zu of %zu CQs shown)\n", flags.cqs, order.size());
    }
    printf("\n");
  }

  rows = {{"CONSUMER", "DELIV/s", "EVENTS/s", "QUEUE", "QUEUE_HW", "SPILL", "SPILL_HW", "STALLS/s",
           "STALLED/s", "STALL_NOW", "P50", "P99", "P99.9", "MAX_EVER"}};
  for (size_t i = 0; i < cur.consumers.size(); ++i) {
    const Snapshot::Consumer& c = cur.consumers[i];
    const Snapshot::Consumer& p = i < prev.consumers.size() ? prev.consumers[i] : c;
    std::vector<std::string> row = {
        c.name,
        Rate(c.delivered, p.delivered, dt),
        Rate(c.async_events, p.async_events, dt),
        Num(c.queue_depth),
        Num(c.high_water),
        Num(c.spill_depth),
        Num(c.spill_high_water),
        Rate(c.stalls, p.stalls, dt),
        Duration(c.stalled_ns >= p.stalled_ns
                     ? static_cast<uint64_t>(static_cast<double>(c.stalled_ns - p.stalled_ns) / dt)
                     : 0),
        c.stall_ns == 0 ? "-" : Duration(c.stall_ns)};
    if (!c.latency) {
      row.insert(row.end(), {"-", "-", "-", "-"});
    } else {
      std::map<uint64_t, uint64_t> delta;
      uint64_t total = 0;
      for (const auto& [upper, count] : c.buckets) {
        auto it = p.buckets.find(upper);
        const uint64_t before = it == p.buckets.end() ? 0 : it->second;
        if (count > before) {
          delta[upper] = count - before;
          total += count - before;
        }
      }
      if (total == 0) {
        row.insert(row.end(), {"-", "-", "-"});
      } else {
        // A bucket's upper bound may exceed every latency in it; none exceeds the maximum.
        for (double q : {0.5, 0.99, 0.999}) {
          row.push_back(Duration(std::min(Quantile(delta, total, q), c.latency_max_ns)));
        }
      }
      row.push_back(Duration(c.latency_max_ns));
    }
    rows.push_back(std::move(row));
  }
  PrintTable(rows);
  printf("\n");
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      Usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf("cqd_top (cqd) %s\n", CQD_VERSION_STRING);
      return 0;
    }
  }
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    Usage(stderr);
    return 2;
  }
  Snapshot prev;
  std::string error;
  if (!Read(flags.endpoint, &prev, &error)) {
    fprintf(stderr, "cqd_top: %s\n", error.c_str());
    return 1;
  }
  const auto interval = std::chrono::duration<double>(flags.interval);
  auto next = std::chrono::steady_clock::now() + interval;
  for (long frame = 0; flags.count == 0 || frame < flags.count;) {
    std::this_thread::sleep_until(next);
    next += interval;
    Snapshot cur;
    if (!Read(flags.endpoint, &cur, &error)) {
      fprintf(stderr, "cqd_top: %s\n", error.c_str());
      return 1;
    }
    if (cur.uptime_ns <= prev.uptime_ns) {  // another runtime on the same path: start over
      printf("(the runtime behind %s restarted)\n", flags.endpoint.c_str());
      prev = std::move(cur);
      continue;
    }
    PrintFrame(flags, prev, cur);
    prev = std::move(cur);
    ++frame;
  }
  return 0;
}

// SPDX-License-Identifier: BSD-2-Clause
// cqd demo: traffic through the runtime on the simulated device.
//
//   bazel run -c opt //tools:demo -- [--pollers=N] [--consumers=N] [--qps=N] [--seconds=S]
//                                    [--stats-socket=PATH] [--latency]
//
// --stats-socket serves the runtime's stats there while it runs (watch it with
// `bazel run //tools:cqd_top -- PATH`); --latency records each consumer's poll -> dispatch
// latency histogram.
//
// Phase 1 injects completions as fast as one traffic thread can; phase 2 paces them slowly so the
// pollers arm their CQs and sleep between completions (event mode). On a terminal a one-line
// display shows progress; each phase ends with a summary line, and a stats table follows.
// --help lists the flags; a flag it does not know, or a value that is not a number in range, is
// an error that names it (exit code 2).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int pollers = 2;
  int consumers = 3;
  int qps = 64;
  double seconds = 2;
  std::string stats_socket;
  std::string stats_tcp;
  bool latency = false;
};

// Parses "NAME=VALUE" of `arg` into *out if it starts with NAME=; false if it names another flag.
// A value that is not a number in [min, max] (all of it) prints why and exits 2.
// True if `arg` names flag `name` ("--name" spelled with dashes or, as older command lines
// do, underscores) and its value follows at arg[strlen(name)].
bool Names(const char* arg, const char* name) {
  for (size_t i = 0; name[i] != '\0'; ++i) {
    const char want = name[i] == '_' ? '-' : name[i];
    const char got = arg[i] == '_' && i >= 2 ? '-' : arg[i];
    if (got != want) return false;
  }
  return true;
}

bool ParseFlag(const char* arg, const char* name, double min, double max, double* out) {
  const size_t n = strlen(name);
  if (!Names(arg, name) || arg[n] != '=') return false;
  const char* text = arg + n + 1;
  char* end = nullptr;
  errno = 0;
  const double value = strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno != 0 || !(value >= min && value <= max)) {
    fprintf(stderr, "demo: %s=%s: expected a number from %g to %g (see demo --help)\n", name, text,
            min, max);
    exit(2);
  }
  *out = value;
  return true;
}

// Progress frames redraw one line with \r: only on a terminal; into a file or a pipe, only the
// phases' summary lines are written.
const bool kTerminal = isatty(STDOUT_FILENO) == 1;

// Counts completions and checks that wr_ids of its QP arrive 0, 1, 2, ...
class DemoHandler : public cqd::QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id != next_) out_of_order_.fetch_add(1, std::memory_order_relaxed);
      next_ = wc.wr_id + 1;
    }
    received_.fetch_add(wcs.size(), std::memory_order_relaxed);
  }
  uint64_t received() const { return received_.load(std::memory_order_relaxed); }
  uint64_t out_of_order() const { return out_of_order_.load(std::memory_order_relaxed); }

 private:
  uint64_t next_ = 0;
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> out_of_order_{0};
};

uint64_t Sum(const std::vector<std::unique_ptr<DemoHandler>>& hs) {
  uint64_t n = 0;
  for (const auto& h : hs) n += h->received();
  return n;
}

void Progress(const char* phase, double elapsed, uint64_t delivered, uint64_t last, double interval,
              const cqd::Stats& s) {
  if (!kTerminal) return;
  uint64_t depth = 0, sleeps = 0;
  for (const auto& c : s.consumers) depth += c.queue_depth;
  for (const auto& p : s.pollers) sleeps += p.sleeps;
  printf("\r%-6s %4.1fs %11" PRIu64 " done %9.3f M/s  queued %7" PRIu64 "  sleeps %7" PRIu64
         "  events %7" PRIu64 " ",
         phase, elapsed, delivered, (delivered - last) / interval / 1e6, depth, sleeps,
         s.cq_events);
  fflush(stdout);
}

// Runs `source` for `seconds` (or until it finishes), showing progress; returns when all that
// was injected has been delivered.
void RunPhase(const char* phase, cqd::Runtime& rt, cqd::SimTrafficSource& source,
              const std::vector<std::unique_ptr<DemoHandler>>& handlers, double seconds) {
  Clock::time_point start = Clock::now();
  source.Start();
  uint64_t last = 0;
  const double interval = 0.1;
  while (true) {
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    uint64_t delivered = Sum(handlers);
    Progress(phase, elapsed, delivered, last, interval, rt.GetStats());
    last = delivered;
    if (elapsed >= seconds || source.injected() == source.total()) break;
  }
  source.Stop();
  source.Join();
  while (Sum(handlers) < source.injected()) std::this_thread::yield();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t delivered = Sum(handlers);
  printf("%s%-6s %4.1fs %11" PRIu64 " done %9.3f M/s average%38s\n", kTerminal ? "\r" : "", phase,
         elapsed, delivered, delivered / elapsed / 1e6, "");
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  static constexpr char kUsage[] =
      "usage: demo [--pollers=N] [--consumers=N] [--qps=N] [--seconds=S] [--stats-socket=PATH] "
      "[--stats-tcp=HOST:PORT] "
      "[--latency] [--version]\n"
      "  --pollers=N        poller threads, 1-256 (default 2)\n"
      "  --consumers=N      consumers, 1-256 (default 3)\n"
      "  --qps=N            simulated QPs (default 64; more than max_registrations fail)\n"
      "  --seconds=S        length of the busy phase, and of the events phase if more than 1\n"
      "                     (default 2)\n"
      "  --stats-socket=PATH  serve live stats there (bazel run //tools:cqd_top -- PATH)\n"
      "  --stats-tcp=HOST:PORT  serve them over HTTP there too (cqd_top -- HOST:PORT)\n"
      "  --latency          record each consumer's poll -> dispatch latency\n";
  for (int i = 1; i < argc; ++i) {
    double v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("%s", kUsage);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("demo (cqd) %s\n", cqd::Version().string);
      return 0;
    } else if (ParseFlag(argv[i], "--pollers", 1, 256, &v)) {
      flags.pollers = static_cast<int>(v);
    } else if (ParseFlag(argv[i], "--consumers", 1, 256, &v)) {
      flags.consumers = static_cast<int>(v);
    } else if (ParseFlag(argv[i], "--qps", 1, 1 << 24, &v)) {
      flags.qps = static_cast<int>(v);
    } else if (ParseFlag(argv[i], "--seconds", 0.001, 86400, &v)) {
      flags.seconds = v;
    } else if (Names(argv[i], "--stats-socket") && argv[i][14] == '=') {
      flags.stats_socket = argv[i] + 15;
    } else if (Names(argv[i], "--stats-tcp") && argv[i][11] == '=') {
      flags.stats_tcp = argv[i] + 12;
    } else if (strcmp(argv[i], "--latency") == 0) {
      flags.latency = true;
    } else {
      fprintf(stderr, "demo: unknown argument \"%s\"\n%s", argv[i], kUsage);
      return 2;
    }
  }
  cqd::RuntimeOptions options;
  options.pollers = flags.pollers;
  options.consumers.assign(flags.consumers > 0 ? flags.consumers : 0, cqd::ConsumerOptions{});
  options.idle_budget = std::chrono::microseconds(50);
  options.stats_socket = flags.stats_socket;
  options.stats_tcp = flags.stats_tcp;
  for (auto& c : options.consumers) c.record_latency = flags.latency;
  auto rt_or = cqd::Runtime::Create(options);
  if (!rt_or.ok()) {
    fprintf(stderr, "demo: %s\n", rt_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<cqd::Runtime> rt = std::move(rt_or).value();
  auto sim = cqd::SimDevice::Create();
  cqd::DeviceId dev = rt->AddSimDevice(sim).value();

  // Two CQs per poller shard; QPs spread over CQs and consumers.
  std::vector<cqd::CqHandle> cqs;
  for (int i = 0; i < 2 * flags.pollers; ++i) {
    cqs.push_back(rt->CreateCq(dev, i % flags.pollers, cqd::CqOptions{.depth = 4096}).value());
  }
  std::vector<cqd::SimQp*> qps;
  std::vector<std::unique_ptr<DemoHandler>> handlers;
  std::vector<cqd::Registration> registrations;
  for (int i = 0; i < flags.qps; ++i) {
    cqd::SimCq* cq = cqs[i % cqs.size()].sim();
    qps.push_back(sim->CreateQp(cq, cq).value());
    handlers.push_back(std::make_unique<DemoHandler>());
    registrations.push_back(
        rt->RegisterQp(*qps.back(), *handlers.back(), i % flags.consumers).value());
  }
  printf("cqd demo: %d pollers, %d consumers, %zu CQs, %d QPs on simulated device %s\n",
         flags.pollers, flags.consumers, cqs.size(), flags.qps, sim->name().c_str());

  cqd::SimTrafficOptions fast;
  fast.qps = qps;
  fast.completions_per_qp = UINT64_MAX / 2 / qps.size();
  fast.burst = 32;
  cqd::SimTrafficSource fast_source(fast);
  RunPhase("busy", *rt, fast_source, handlers, flags.seconds);

  // Phase 2 runs on fresh QPs, so each handler's wr_ids again start at 0.
  std::vector<cqd::Registration> slow_registrations;
  std::vector<cqd::SimQp*> slow_qps;
  std::vector<std::unique_ptr<DemoHandler>> slow_handlers;
  for (int i = 0; i < 8; ++i) {
    cqd::SimCq* cq = cqs[i % cqs.size()].sim();
    slow_qps.push_back(sim->CreateQp(cq, cq).value());
    slow_handlers.push_back(std::make_unique<DemoHandler>());
    slow_registrations.push_back(
        rt->RegisterQp(*slow_qps.back(), *slow_handlers.back(), i % flags.consumers).value());
  }
  cqd::SimTrafficOptions slow;
  slow.qps = slow_qps;
  // 2000 completions a second across the 8 QPs, for max(1, --seconds) s: the pollers sleep
  // between completions (a stats socket stays up as long as --seconds says).
  const double events_seconds = std::max(1.0, flags.seconds);
  slow.completions_per_qp = static_cast<uint64_t>(250 * events_seconds);
  slow.burst = 1;
  slow.rate_per_sec = 2000;
  cqd::SimTrafficSource slow_source(slow);
  RunPhase("events", *rt, slow_source, slow_handlers, events_seconds + 10);

  uint64_t disorder = 0;
  for (const auto& h : handlers) disorder += h->out_of_order();
  for (const auto& h : slow_handlers) disorder += h->out_of_order();

  cqd::Stats s = rt->GetStats();
  printf("\n%-10s %6s %12s %12s %12s %8s %8s\n", "poller", "cpu", "polls", "empty", "completions",
         "arms", "sleeps");
  for (size_t i = 0; i < s.pollers.size(); ++i) {
    const auto& p = s.pollers[i];
    const std::string cpu = p.cpu < 0 ? "-" : std::to_string(p.cpu);  // "-": not pinned
    printf("%-10zu %6s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %8" PRIu64 " %8" PRIu64 "\n", i,
           cpu.c_str(), p.polls, p.empty_polls, p.completions, p.arms, p.sleeps);
  }
  printf("\n%-10s %6s %12s %12s %12s %10s\n", "cq", "shard", "completions", "events", "acked",
         "ack calls");
  for (const auto& c : s.cqs) {
    printf("%-10u %6d %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10" PRIu64 "\n", c.id, c.shard,
           c.completions, c.events, c.acked_events, c.ack_calls);
  }
  printf("\n%-10s %12s %8s %10s %10s %10s %10s\n", "consumer", "delivered", "queued", "high-water",
         "p50 ns", "p99 ns", "max ns");
  for (const auto& c : s.consumers) {
    printf("%-10s %12" PRIu64 " %8" PRIu64 " %10" PRIu64, c.name.c_str(), c.delivered,
           c.queue_depth, c.high_water);
    if (c.latency.enabled) {
      printf(" %10" PRIu64 " %10" PRIu64 " %10" PRIu64 "\n", c.latency.p50_ns, c.latency.p99_ns,
             c.latency.max_ns);
    } else {
      printf(" %10s %10s %10s\n", "-", "-", "-");
    }
  }
  printf("\norphans %" PRIu64 ", out-of-order deliveries %" PRIu64 "\n", s.orphans, disorder);

  registrations.clear();
  slow_registrations.clear();
  for (auto* qp : qps) (void)sim->DestroyQp(qp);
  for (auto* qp : slow_qps) (void)sim->DestroyQp(qp);
  for (auto cq : cqs) (void)rt->DestroyCq(cq);
  return disorder == 0 && s.orphans == 0 ? 0 : 1;
}

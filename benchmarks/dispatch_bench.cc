// SPDX-License-Identifier: BSD-2-Clause
// cqd's dispatch harness: cqd beside the limits and the alternatives, in one process, on the
// simulated device.
//
//   bazel run -c opt //benchmarks:dispatch -- [--quick] [--seconds=S] [--out=DIR]
//
// Writes DIR/dispatch.json (DIR defaults to docs/perf in the workspace). Parts:
//   throughput  completions/s delivered to handlers and CPU ns per completion over all threads,
//               per pipeline (pipelines.h), poll batch 1..64, 1 and 1000 QPs; many CQs; many QPs
//               in random order; median of 3 runs, threads pinned alike for every pipeline;
//               each one-consumer handoff row (cqd, mutex, tbb, ceph) with its bound, the
//               smallest of the inline loop, the handlers alone and the copy floor measured in the
//               same run, and its ratio to it
//   latency     poll -> handler and completion added -> handler at a low rate, cqd handoff and
//               run to completion, busy-polling and in event mode, beside a two-thread eventfd
//               ping-pong (one wake) and a spinning cache-line handoff (the busy floor)
//   open loop   default options, completions arriving on schedule (a paced replay) at 10, 50
//               and 90 % of the measured cqd saturation: added -> handler percentiles and the
//               CPU the process used meanwhile
//   idle CPU    CPU time of the whole process over a few seconds with no traffic
//   acks        ibv_ack_cq_events calls per completion event for several thresholds
// Every throughput, latency and open-loop row records the cross-core probe (machine.h) taken just
// before and just after it, "xcore_rtt_ns": [before, after], so that a summary can tell which of
// the machine's modes the row ran in (benchmarks/perf_summary.py).
// --latency-only and --event-latency-only print the busy-poll rows beside the spin floor and the
// event-mode rows beside one eventfd wake, alone (docs/perf/issue47/ab.sh); the busy rows add
// four bare hand-over protocols (RunBareHandOver, docs/perf/issue47/bare.sh); the event rows add
// cqd_event_spin, the handoff with the consumer's idle_spin at its default (the other event rows
// set it to 0, so that the consumer sleeps at once, as they did before the pre-wake).
// --busy-latency-only prints the busy-poll handoff and the spin floor alone, about 8 s a run
// (docs/perf/issue47/busy.sh).
// --scaling[=ROUNDS] instead prints the scaling rows only (RunScaling): 1, 2, 4 and 8 shards of a
// poller and a consumer each, as many as the machine has two CPUs for. --probe prints the
// cross-core probe alone (which mode the machine is in now).
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/machine.h"
#include "benchmarks/pipelines.h"
#include "cqd/runtime.h"
#include "cqd/sim.h"

namespace cqd::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void SleepFor(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// Pins the calling thread to `cpu` (latency runs: one side on CPU 0, the other on CPU 1).
void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

void CpuRelaxHere() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

void Unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned i = 0; i < std::thread::hardware_concurrency(); ++i) CPU_SET(i, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct Flags {
  bool quick = false;
  bool random_order = false;  // --only: the QPs' completions in random order (as the "qps" rows)
  double seconds = 0.3;
  std::string out;
};

// A progress line, redrawn in place on a terminal; into a pipe or a file (a kept run's log) it
// writes nothing, so the log holds the results only.
void Progress(const std::string& line) {
  static const bool terminal = isatty(STDERR_FILENO) == 1;
  if (!terminal) return;
  fprintf(stderr, "\r%-100s", line.c_str());
  fflush(stderr);
}

// The cross-core probe taken before and after one row (machine.h): ns per round trip.
struct CrossCore {
  double before = 0, after = 0;
};

std::string CrossCoreJson(const CrossCore& x) {
  char buf[64];
  snprintf(buf, sizeof(buf), "\"xcore_rtt_ns\": [%.1f, %.1f]", x.before, x.after);
  return buf;
}

// ---- throughput ----

struct ThroughputRow {
  std::string part;  // "dispatch", "cqs" or "qps"
  PipelineConfig config;
  double mcps = 0;       // million completions per second delivered to handlers
  double cpu_ns = 0;     // CPU time of every thread of the process per delivered completion
  double cpu_cores = 0;  // CPU time / wall time over the window: cores kept busy
  std::map<std::string, uint64_t> threads;  // per-thread CPU over the window, ns
  CrossCore xcore;
  // A one-consumer handoff row's bound (AttachBounds): the smallest of the inline loop (limit),
  // the handlers alone and the copy floor measured in this run with the same batch and QPs, and
  // which one it was; 0 for other rows.
  double bound_mcps = 0;
  std::string bound_by;
};

ThroughputRow MeasureOnce(const PipelineConfig& config, double seconds) {
  std::unique_ptr<Pipeline> pipeline = StartPipeline(config);
  SleepFor(std::min(0.2, seconds / 2));  // warm up: queues fill, caches settle
  const uint64_t d0 = pipeline->Delivered();
  const std::map<std::string, uint64_t> threads0 = ThreadCpu();
  const uint64_t cpu0 = ProcessCpuNs();
  const Clock::time_point t0 = Clock::now();
  SleepFor(seconds);
  const uint64_t d1 = pipeline->Delivered();
  const uint64_t cpu1 = ProcessCpuNs();
  const std::map<std::string, uint64_t> threads1 = ThreadCpu();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  pipeline->Stop();
  ThroughputRow row;
  row.config = config;
  row.mcps = (d1 - d0) / elapsed / 1e6;
  row.cpu_ns = d1 > d0 ? static_cast<double>(cpu1 - cpu0) / (d1 - d0) : 0;
  row.cpu_cores = (cpu1 - cpu0) / 1e9 / elapsed;
  row.threads = CpuDelta(threads0, threads1);
  return row;
}

// The median of three runs (by rate): single runs on a small shared machine are noisy. The
// cross-core probe is taken before the first and after the last.
ThroughputRow MeasureThroughput(const PipelineConfig& config, double seconds) {
  const double before = CrossCoreRoundTripNs();
  std::vector<ThroughputRow> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(MeasureOnce(config, seconds));
  std::sort(runs.begin(), runs.end(),
            [](const ThroughputRow& a, const ThroughputRow& b) { return a.mcps < b.mcps; });
  runs[1].xcore = {before, CrossCoreRoundTripNs()};
  return runs[1];
}

std::vector<ThroughputRow> RunThroughput(const Flags& flags) {
  std::vector<int> batches = {1, 8, 32, 64};
  if (flags.quick) batches = {1, 32};
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<std::pair<std::string, PipelineConfig>> configs;
  for (int q : {1, 1000}) {
    for (const char* impl :
         {"limit", "limit2", "cqd", "cqd_rtc", "mutex", "tbb", "ceph", "handlers", "copy"}) {
      for (int b : batches) configs.push_back({"dispatch", {impl, b, q, 1}});
    }
    // Two consumers only where three busy threads have a core each.
    if (cpus >= 3) {
      for (const char* impl : {"cqd", "mutex", "tbb", "ceph"}) {
        configs.push_back({"dispatch", {impl, 32, q, 2}});
      }
    }
  }
  // Many CQs: 10 carry traffic, alone or among 990 idle ones.
  for (int cqs : {10, 1000}) {
    PipelineConfig c{"cqd", 32, 1000, 1};
    c.cqs = cqs;
    c.active_cqs = 10;
    c.busy_poll = false;  // the default poller: it parks the idle CQs
    configs.push_back({"cqs", c});
  }
  // Many QPs: completions of 1000 or 100000 QPs, in random order, with the bound's rows.
  for (int qps : {1000, 100000}) {
    for (const char* impl : {"cqd", "limit", "handlers", "copy"}) {
      PipelineConfig c{impl, 32, qps, 1};
      c.random_order = true;
      configs.push_back({"qps", c});
    }
  }
  std::vector<ThroughputRow> rows;
  for (size_t i = 0; i < configs.size(); ++i) {
    const PipelineConfig& c = configs[i].second;
    char label[160];
    snprintf(label, sizeof(label), "[%zu/%zu] %-8s %-7s batch %2d qps %6d consumers %d cqs %4d%s",
             i + 1, configs.size(), configs[i].first.c_str(), c.impl.c_str(), c.batch, c.qps,
             c.consumers, c.cqs, c.random_order ? " random" : "");
    Progress(label);
    ThroughputRow row = MeasureThroughput(c, flags.seconds);
    row.part = configs[i].first;
    Progress(std::string(label) + "  " + std::to_string(row.mcps).substr(0, 6) + " M/s");
    rows.push_back(std::move(row));
  }
  fprintf(stderr, "\n");
  return rows;
}

// ---- scaling ----

// For 1, 2, 4 and 8 shards (as many as have two CPUs each), each shard a polling thread and one
// consumer with 1000 QPs of its own (PipelineConfig::shards), batch 32: cqd's handoff and run to
// completion, the mutex pipeline and the inline loop, alternating within each round. Prints one
// line per row; rows of one round were taken minutes apart at most, so compare within a round.
void RunScaling(int rounds, double seconds) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  printf("scaling: %d CPUs, %d rounds, %.2f s per run (median of 3), batch 32, 1000 QPs a shard\n",
         cpus, rounds, seconds);
  printf("machine: %s\n", TopologyJson().c_str());
  for (int round = 1; round <= rounds; ++round) {
    for (int shards = 1; 2 * shards <= cpus && shards <= 8; shards *= 2) {
      for (const char* impl : {"limit", "limit2", "cqd_rtc", "cqd", "mutex"}) {
        PipelineConfig c{impl, 32, 1000, 1};
        c.shards = shards;
        const ThroughputRow r = MeasureThroughput(c, seconds);
        printf(
            "round %d shards %d %-8s %8.2f M/s total %7.2f M/s a shard %6.1f CPU ns each "
            "%5.2f cores xcore %.0f/%.0f ns\n",
            round, shards, impl, r.mcps, r.mcps / shards, r.cpu_ns, r.cpu_cores, r.xcore.before,
            r.xcore.after);
        fflush(stdout);
      }
    }
  }
}

// ---- latency ----

struct Percentiles {
  double p50 = 0, p99 = 0, p999 = 0, min = 0, max = 0;
};

Percentiles Summarize(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return static_cast<double>(v[std::min(v.size() - 1, size_t(q * v.size()))]);
  };
  return {at(0.50), at(0.99), at(0.999), static_cast<double>(v.front()),
          static_cast<double>(v.back())};
}

// Records, for each completion, how long after its injection (wr_id) and after its poll (src_qp,
// see SimCq::StampPollTime) the handler was entered.
class LatencyHandler : public QpHandler {
 public:
  explicit LatencyHandler(size_t n) : from_inject(n), from_poll(n) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    uint64_t now = NowNs();
    for (const ibv_wc& wc : wcs) {
      size_t i = count.load(std::memory_order_relaxed);
      if (i < from_inject.size()) {
        from_inject[i] = now - wc.wr_id;
        from_poll[i] = static_cast<uint32_t>(now) - wc.src_qp;  // modulo 2^32
      }
      count.store(i + 1, std::memory_order_release);
    }
  }
  std::vector<uint64_t> from_inject, from_poll;
  std::atomic<size_t> count{0};
};

struct LatencyResult {
  std::string mode;
  std::vector<uint64_t> samples;     // poll -> handler entry
  std::vector<uint64_t> end_to_end;  // completion added -> handler entry
  Percentiles p, e2e;
  double idle_cpu = -1;  // % of one core over the idle window after traffic
  CrossCore xcore;
};

// Runs one latency mode between two cross-core probes.
template <class Run>
LatencyResult Probed(Run run) {
  const double before = CrossCoreRoundTripNs();
  LatencyResult r = run();
  r.xcore = {before, CrossCoreRoundTripNs()};
  return r;
}

// Sleeps until arrival times `rate` per second apart on average, each interval jittered by
// +-50 %, so that samples do not lock onto a timer or a poller's rhythm.
class Arrivals {
 public:
  explicit Arrivals(double rate) : period_(1.0 / rate), next_(Clock::now()) {}
  void SleepUntilNext() {
    next_ += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(period_ * (0.5 + (rng_() % 1000) / 1000.0)));
    std::this_thread::sleep_until(next_);
  }

 private:
  const double period_;
  Clock::time_point next_;
  std::mt19937 rng_{1};
};

// Process CPU time (user + system), seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Runs `samples` completions at `rate` per second through cqd, then measures idle CPU.
// busy: the poller busy-polls; with a handoff the consumer is this thread, spinning on Drain
// after each injection (two busy threads fit two cores). event: the poller arms and sleeps at
// once and so does the consumer thread, unless `default_spin`: then the consumer keeps its
// default idle_spin (20 us), which it also spins after a pre-wake; at `rate` (5000/s: 100 to 300
// us apart) it still sleeps before each completion arrives. rtc: the handler runs on the poller
// thread (a run-to-completion consumer); this thread injects and waits for it.
LatencyResult RunCqdLatency(bool busy, bool rtc, size_t samples, double rate, double idle_seconds,
                            bool default_spin = false) {
  RuntimeOptions options;
  options.pollers = 1;
  options.poller_cpus = {0};
  options.consumers.assign(1, ConsumerOptions{});
  if (rtc) {
    options.consumers[0].kind = ConsumerKind::kRunToCompletion;
    options.busy_poll = busy;
    if (!busy) options.idle_budget = std::chrono::microseconds(0);
  } else if (busy) {
    options.busy_poll = true;
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
  } else {
    options.consumers[0].cpu = 1 % std::max(1u, std::thread::hardware_concurrency());
    options.idle_budget = std::chrono::microseconds(0);
    if (!default_spin) options.consumers[0].idle_spin = std::chrono::microseconds(0);
  }
  auto created = Runtime::Create(options);
  if (!created.ok()) {
    fprintf(stderr, "latency: %s\n", created.status().ToString().c_str());
    exit(1);
  }
  auto rt = std::move(created).value();
  if (busy || rtc) PinTo(1);  // this thread injects (and with a busy handoff, consumes)
  auto sim = SimDevice::Create();
  DeviceId dev = rt->AddSimDevice(sim).value();
  CqHandle cq = rt->CreateCq(dev, 0).value();
  cq.sim()->StampPollTime(true);
  SimQp* qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  LatencyHandler handler(samples);
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();

  Arrivals arrivals(rate);
  for (size_t i = 0; i < samples; ++i) {
    arrivals.SleepUntilNext();
    ibv_wc wc{};
    wc.qp_num = qp->qp_num();
    wc.opcode = IBV_WC_RECV;
    wc.wr_id = NowNs();
    while (cq.sim()->Inject({&wc, 1}) != 1) {
    }
    if (busy && !rtc) {
      while (handler.count.load(std::memory_order_acquire) <= i) rt->Drain(0, 64);
    } else if (rtc) {
      while (handler.count.load(std::memory_order_acquire) <= i) CpuRelaxHere();
    }
    if (i % 256 == 0) {
      Progress(std::string("latency ") + (rtc ? "cqd run-to-completion " : "cqd handoff ") +
               (busy ? "busy-poll " : "event mode ") + std::to_string(i) + "/" +
               std::to_string(samples));
    }
  }
  while (handler.count.load(std::memory_order_acquire) < samples) std::this_thread::yield();

  LatencyResult result;
  result.mode = std::string(rtc ? "cqd_rtc" : "cqd") + (busy ? "_busy_poll" : "_event") +
                (default_spin ? "_spin" : "");
  result.samples = handler.from_poll;
  result.end_to_end = handler.from_inject;
  result.p = Summarize(result.samples);
  result.e2e = Summarize(result.end_to_end);
  SleepFor(0.2);  // let the poller and consumer reach their idle state
  double c0 = CpuSeconds();
  Clock::time_point t0 = Clock::now();
  SleepFor(idle_seconds);
  result.idle_cpu =
      100.0 * (CpuSeconds() - c0) / std::chrono::duration<double>(Clock::now() - t0).count();
  reg.Unregister();
  (void)sim->DestroyQp(qp);
  (void)rt->DestroyCq(cq);
  Unpin();
  return result;
}

// One thread wakes another through an eventfd at `rate`; the latency of each wake.
LatencyResult RunEventfdPingPong(size_t samples, double rate) {
  int ping = eventfd(0, EFD_CLOEXEC);
  int pong = eventfd(0, EFD_CLOEXEC);
  std::atomic<uint64_t> stamp{0};
  std::vector<uint64_t> lat(samples);
  std::thread receiver([&] {
    PinTo(1);
    uint64_t v;
    for (size_t i = 0; i < samples; ++i) {
      if (read(ping, &v, sizeof(v)) != sizeof(v)) std::abort();
      lat[i] = NowNs() - stamp.load(std::memory_order_acquire);
      v = 1;
      if (write(pong, &v, sizeof(v)) != sizeof(v)) std::abort();
    }
  });
  PinTo(0);
  Arrivals arrivals(rate);
  for (size_t i = 0; i < samples; ++i) {
    arrivals.SleepUntilNext();
    uint64_t v = 1;
    stamp.store(NowNs(), std::memory_order_release);
    if (write(ping, &v, sizeof(v)) != sizeof(v)) std::abort();
    if (read(pong, &v, sizeof(v)) != sizeof(v)) std::abort();
  }
  receiver.join();
  Unpin();
  close(ping);
  close(pong);
  LatencyResult result;
  result.mode = "eventfd_pingpong";
  result.samples = lat;
  result.end_to_end = lat;
  result.p = result.e2e = Summarize(lat);
  return result;
}

// One thread hands a timestamp to another that spins on it: the cost of moving one cache line
// between cores, the floor for any busy-polled cross-thread handoff on this machine.
LatencyResult RunSpinHandoff(size_t samples, double rate) {
  alignas(64) std::atomic<uint64_t> stamp{0};
  std::vector<uint64_t> lat(samples);
  std::atomic<bool> ready{false};
  std::thread receiver([&] {
    PinTo(1);
    ready.store(true);
    for (size_t i = 0; i < samples; ++i) {
      uint64_t s;
      while ((s = stamp.load(std::memory_order_acquire)) == 0) {
      }
      lat[i] = NowNs() - s;
      stamp.store(0, std::memory_order_release);
    }
  });
  while (!ready.load()) std::this_thread::yield();
  PinTo(0);
  Arrivals arrivals(rate);
  for (size_t i = 0; i < samples; ++i) {
    arrivals.SleepUntilNext();
    stamp.store(NowNs(), std::memory_order_release);
    while (stamp.load(std::memory_order_acquire) != 0) {
    }
  }
  receiver.join();
  Unpin();
  LatencyResult result;
  result.mode = "spin_handoff";
  result.samples = lat;
  result.end_to_end = lat;
  result.p = result.e2e = Summarize(lat);
  return result;
}

// The busy handoff's own line traffic with no runtime code around it: a bare hand-over protocol,
// to compare protocols under one way of waiting (a tight spin). It is not a lower bound: a
// consumer that waits otherwise may get its lines sooner. One thread plays the poller (it stamps
// an entry, writes its 16-byte metadata and its ibv_wc, then hands it over), the other the
// consumer (it spins until the entry is handed over, then reads it and checks it). Entries go
// one at a time: the poller waits for the consumer's `done` before the next, so the ring never
// fills and nothing is recycled. The protocols:
//   kDepthThenEnd   cqd's (lane.h, consumer.h): the poller reserves depth with a CAS, then
//                   stores the lane's published end; the consumer spins on the depth, starts
//                   loading the entry's metadata and first wc line (as Dispatch's PrefetchNext),
//                   spins on the end, then reads the entry.
//   kEnd            a plain single-producer ring: the consumer spins on the published end, then
//                   reads the entry.
//   kEntrySequence  the entry carries its own sequence number in its metadata: the consumer spins
//                   on the metadata's line, then reads the ibv_wc (the ibv_wcs stay one array,
//                   as a handler's span into the lane needs).
//   kOneLine        as kEntrySequence, with each ibv_wc and its metadata side by side in one
//                   64-byte line: the least a hand-over of a completion can move, without spans.
enum class HandOver { kDepthThenEnd, kEnd, kEntrySequence, kOneLine };
struct HandOverRings {
  static constexpr uint64_t kSize = 1024;
  struct Meta {
    uint32_t slot;
    uint32_t sequence;  // kEntrySequence, kOneLine: position + 1, stored last (release)
    uint16_t kind;
    uint16_t run;
    uint32_t stamp;
  };
  struct alignas(64) Entry {
    ibv_wc wc;
    Meta meta;
  };
  static_assert(sizeof(Entry) == 64);
  alignas(4096) ibv_wc wcs[kSize];
  alignas(4096) Meta metas[kSize];
  alignas(4096) Entry entries[kSize];  // kOneLine's ring
  ibv_wc& wc(bool one_line, uint32_t at) { return one_line ? entries[at].wc : wcs[at]; }
  Meta& meta(bool one_line, uint32_t at) { return one_line ? entries[at].meta : metas[at]; }
};
LatencyResult RunBareHandOver(size_t samples, double rate, HandOver protocol) {
  auto rings = std::make_unique<HandOverRings>();
  std::memset(rings.get(), 0, sizeof(HandOverRings));
  const bool one_line = protocol == HandOver::kOneLine;
  const bool sequenced = one_line || protocol == HandOver::kEntrySequence;
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  Line depth, published, done;
  std::vector<uint64_t> lat(samples);
  std::atomic<bool> ready{false};
  // Everything the consumer reads per entry is its own copy or one of the lines above, so no
  // line of this thread's stack crosses inside the measured interval.
  std::thread consumer([r = rings.get(), protocol, one_line, sequenced, samples, out = lat.data(),
                        &depth, &published, &done, &ready] {
    PinTo(1);
    ready.store(true);
    uint64_t misread = 0;
    for (uint64_t pos = 0; pos < samples; ++pos) {
      const uint32_t at = static_cast<uint32_t>(pos % HandOverRings::kSize);
      if (sequenced) {
        std::atomic_ref<uint32_t> sequence(r->meta(one_line, at).sequence);
        while (sequence.load(std::memory_order_acquire) != static_cast<uint32_t>(pos + 1)) {
        }
      } else {
        if (protocol == HandOver::kDepthThenEnd) {
          while (depth.value.load(std::memory_order_relaxed) == 0) {
          }
          __builtin_prefetch(&r->meta(one_line, at));
          __builtin_prefetch(&r->wc(one_line, at));
        }
        while (published.value.load(std::memory_order_acquire) <= pos) {
        }
      }
      // The fields the poller wrote (the metadata, and wr_id and qp_num, which sit on two lines
      // for one entry in four) are read before the clock, so that each protocol's time ends once
      // its completion has arrived, not once its signal has.
      // Each entry carries its position, so an entry read before it was written (or a lap late)
      // is caught.
      const ibv_wc& wc = r->wc(one_line, at);
      const uint64_t stamp = wc.wr_id;
      misread += wc.qp_num != static_cast<uint32_t>(pos) ||
                 r->meta(one_line, at).slot != ~static_cast<uint32_t>(pos);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the loads above stay above
      out[pos] = NowNs() - stamp;
      if (protocol == HandOver::kDepthThenEnd) depth.value.fetch_sub(1, std::memory_order_seq_cst);
      done.value.store(pos + 1, std::memory_order_release);
    }
    if (misread != 0) {
      fprintf(stderr, "hand-over %d: %" PRIu64 " entries misread\n", static_cast<int>(protocol),
              misread);
      std::abort();
    }
  });
  while (!ready.load()) std::this_thread::yield();
  PinTo(0);
  Arrivals arrivals(rate);
  for (uint64_t pos = 0; pos < samples; ++pos) {
    arrivals.SleepUntilNext();
    const uint32_t at = static_cast<uint32_t>(pos % HandOverRings::kSize);
    ibv_wc& wc = rings->wc(one_line, at);
    wc.wr_id = NowNs();  // the poll stamp
    wc.qp_num = static_cast<uint32_t>(pos);
    wc.opcode = IBV_WC_RECV;
    HandOverRings::Meta& meta = rings->meta(one_line, at);
    meta.slot = ~static_cast<uint32_t>(pos);
    meta.kind = 0;
    meta.run = 1;
    if (sequenced) {
      std::atomic_ref<uint32_t>(meta.sequence)
          .store(static_cast<uint32_t>(pos + 1), std::memory_order_release);
    } else {
      if (protocol == HandOver::kDepthThenEnd) {
        uint64_t d = depth.value.load(std::memory_order_relaxed);
        while (!depth.value.compare_exchange_weak(d, d + 1, std::memory_order_seq_cst,
                                                  std::memory_order_relaxed)) {
        }
      }
      published.value.store(pos + 1, std::memory_order_release);
    }
    while (done.value.load(std::memory_order_acquire) <= pos) CpuRelaxHere();
  }
  consumer.join();
  Unpin();
  LatencyResult result;
  result.mode = protocol == HandOver::kDepthThenEnd ? "bare_depth_end"
                : protocol == HandOver::kEnd        ? "bare_end"
                : one_line                          ? "bare_one_line"
                                                    : "bare_entry_seq";
  result.samples = lat;
  result.end_to_end = lat;
  result.p = result.e2e = Summarize(lat);
  return result;
}

// ---- open loop ----

// Counts completions and records every `stride`-th one's added -> handler time (wr_id carries
// the arrival time, SimCq::Replay with a rate). One consumer thread calls it for every QP.
class SampledLatencyHandler : public QpHandler {
 public:
  SampledLatencyHandler(uint64_t stride, size_t max) : samples(max), stride_(stride) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (seen_++ % stride_ == 0 && taken < samples.size()) samples[taken++] = NowNs() - wc.wr_id;
    }
    count.store(seen_, std::memory_order_release);
  }
  std::atomic<uint64_t> count{0};
  std::vector<uint64_t> samples;
  size_t taken = 0;

 private:
  const uint64_t stride_;
  uint64_t seen_ = 0;
};

struct OpenLoopRow {
  double load = 0;            // fraction of the saturation rate
  double offered_mcps = 0;    // arrival rate
  double delivered_mcps = 0;  // delivered / time from the first arrival to the last delivery
  uint64_t total = 0, delivered = 0;
  size_t samples = 0;
  Percentiles lat;
  double cpu_cores = 0;  // process CPU time / wall time over the traffic
  CrossCore xcore;
};

// Default RuntimeOptions, one owned consumer, 1000 QPs on one CQ whose completions arrive round
// robin on schedule for `seconds`.
OpenLoopRow RunOpenLoop(double load, double saturation_mcps, double seconds) {
  constexpr int kQps = 1000;
  OpenLoopRow row;
  const double probe_before = CrossCoreRoundTripNs();
  row.load = load;
  row.offered_mcps = load * saturation_mcps;
  const double rate = row.offered_mcps * 1e6;
  row.total = static_cast<uint64_t>(rate * seconds);
  auto rt = Runtime::Create(RuntimeOptions{}).value();
  auto sim = SimDevice::Create();
  DeviceId dev = rt->AddSimDevice(sim).value();
  CqHandle cq = rt->CreateCq(dev, 0, CqOptions{.depth = 4096}).value();
  SampledLatencyHandler handler(std::max<uint64_t>(1, row.total / 200000), 200001);
  std::vector<SimQp*> qps;
  std::vector<Registration> regs;
  std::vector<ibv_wc> pattern;
  for (int i = 0; i < kQps; ++i) {
    qps.push_back(sim->CreateQp(cq.sim(), cq.sim()).value());
    regs.push_back(
        rt->RegisterQp(*qps.back(), handler, 0, QpOptions{.send_wrs = 0, .recv_wrs = 0}).value());
    ibv_wc wc{};
    wc.opcode = IBV_WC_RECV;
    wc.byte_len = 64;
    wc.qp_num = qps.back()->qp_num();
    pattern.push_back(wc);
  }
  SleepFor(0.1);
  const uint64_t cpu0 = ProcessCpuNs();
  const Clock::time_point t0 = Clock::now();
  cq.sim()->Replay(pattern, row.total, rate);
  const Clock::time_point give_up = t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(seconds * 10 + 10));
  while (handler.count.load(std::memory_order_acquire) < row.total && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  row.cpu_cores = (ProcessCpuNs() - cpu0) / 1e9 / elapsed;
  row.delivered = handler.count.load(std::memory_order_acquire);
  row.delivered_mcps = row.delivered / elapsed / 1e6;
  cq.sim()->Replay({}, 0);
  (void)rt->Shutdown();
  row.samples = handler.taken;
  handler.samples.resize(handler.taken);
  if (!handler.samples.empty()) row.lat = Summarize(handler.samples);
  regs.clear();
  for (SimQp* qp : qps) (void)sim->DestroyQp(qp);
  (void)rt->DestroyCq(cq);
  row.xcore = {probe_before, CrossCoreRoundTripNs()};
  return row;
}

// ---- acks ----

struct AckRow {
  uint32_t threshold = 0;
  uint64_t events = 0, ack_calls = 0, acked = 0;
};

// Drives `events` real completion events (one completion each time the poller is asleep).
AckRow RunAcks(uint32_t threshold, int events) {
  RuntimeOptions options;
  options.idle_budget = std::chrono::microseconds(0);
  options.ack_threshold = threshold;
  auto rt = Runtime::Create(options).value();
  auto sim = SimDevice::Create();
  DeviceId dev = rt->AddSimDevice(sim).value();
  CqHandle cq = rt->CreateCq(dev, 0).value();
  SimQp* qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  CountingHandler handler;
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();
  for (int i = 0; i < events; ++i) {
    uint64_t sleeps = rt->GetStats().pollers[0].sleeps;
    qp->Complete(i);
    while (handler.count.load() < static_cast<uint64_t>(i) + 1) std::this_thread::yield();
    // The poller goes back to sleep (armed) before the next completion.
    while (rt->GetStats().pollers[0].sleeps == sleeps) std::this_thread::yield();
  }
  reg.Unregister();
  (void)sim->DestroyQp(qp);
  (void)rt->DestroyCq(cq);  // flushes the last partial batch
  Stats s = rt->GetStats();
  return {threshold, s.cq_events, s.cq_ack_calls, s.cq_acked_events};
}

// ---- output ----

std::string JsonString(const std::string& s) { return "\"" + s + "\""; }

void WriteJson(const std::string& dir, const std::string& command,
               const std::vector<ThroughputRow>& tput, const std::vector<LatencyResult>& lat,
               const std::vector<OpenLoopRow>& open, const std::vector<AckRow>& acks) {
  std::string cmd = "mkdir -p '" + dir + "'";
  if (system(cmd.c_str()) != 0) return;
  std::ofstream json(dir + "/dispatch.json");
  time_t now = time(nullptr);
  char when[64];
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  json << "{\n  \"command\": " << JsonString(command) << ",\n  \"when\": " << JsonString(when)
       << ",\n  \"machine\": " << TopologyJson() << ",\n  \"throughput\": [\n";
  for (size_t i = 0; i < tput.size(); ++i) {
    const auto& r = tput[i];
    json << "    {\"part\": " << JsonString(r.part) << ", \"impl\": " << JsonString(r.config.impl)
         << ", \"batch\": " << r.config.batch << ", \"qps\": " << r.config.qps
         << ", \"consumers\": " << r.config.consumers << ", \"cqs\": " << r.config.cqs
         << ", \"active_cqs\": " << r.config.active_cqs
         << ", \"random_order\": " << (r.config.random_order ? "true" : "false")
         << ", \"mcps\": " << r.mcps << ", \"cpu_ns_per_completion\": " << r.cpu_ns
         << ", \"cpu_cores\": " << r.cpu_cores << ", " << CrossCoreJson(r.xcore);
    if (r.bound_mcps > 0) {
      json << ", \"bound_mcps\": " << r.bound_mcps << ", \"bound_by\": " << JsonString(r.bound_by)
           << ", \"ratio_to_bound\": " << r.mcps / r.bound_mcps;
    }
    json << ", \"thread_cpu_ns\": {";
    bool first = true;
    for (const auto& [name, ns] : r.threads) {
      json << (first ? "" : ", ") << JsonString(name) << ": " << ns;
      first = false;
    }
    json << "}}" << (i + 1 < tput.size() ? "," : "") << "\n";
  }
  json << "  ],\n  \"latency_ns\": [\n";
  for (size_t i = 0; i < lat.size(); ++i) {
    const auto& r = lat[i];
    json << "    {\"mode\": " << JsonString(r.mode) << ", \"samples\": " << r.samples.size()
         << ", \"poll_to_handler\": {\"p50\": " << r.p.p50 << ", \"p99\": " << r.p.p99
         << ", \"p999\": " << r.p.p999 << ", \"min\": " << r.p.min << ", \"max\": " << r.p.max
         << "}, \"added_to_handler\": {\"p50\": " << r.e2e.p50 << ", \"p99\": " << r.e2e.p99
         << ", \"p999\": " << r.e2e.p999 << "}, " << CrossCoreJson(r.xcore);
    if (r.idle_cpu >= 0) json << ", \"idle_cpu_percent\": " << r.idle_cpu;
    json << "}" << (i + 1 < lat.size() ? "," : "") << "\n";
  }
  json << "  ],\n  \"open_loop\": [\n";
  for (size_t i = 0; i < open.size(); ++i) {
    const auto& o = open[i];
    json << "    {\"load\": " << o.load << ", \"offered_mcps\": " << o.offered_mcps
         << ", \"delivered_mcps\": " << o.delivered_mcps << ", \"total\": " << o.total
         << ", \"delivered\": " << o.delivered << ", \"samples\": " << o.samples
         << ", \"added_to_handler_ns\": {\"p50\": " << o.lat.p50 << ", \"p99\": " << o.lat.p99
         << ", \"p999\": " << o.lat.p999 << ", \"max\": " << o.lat.max
         << "}, \"cpu_cores\": " << o.cpu_cores << ", " << CrossCoreJson(o.xcore) << "}"
         << (i + 1 < open.size() ? "," : "") << "\n";
  }
  json << "  ],\n  \"acks\": [\n";
  for (size_t i = 0; i < acks.size(); ++i) {
    const auto& a = acks[i];
    json << "    {\"threshold\": " << a.threshold << ", \"events\": " << a.events
         << ", \"ack_calls\": " << a.ack_calls << ", \"acked_events\": " << a.acked
         << ", \"calls_per_event\": " << double(a.ack_calls) / std::max<uint64_t>(1, a.events)
         << "}" << (i + 1 < acks.size() ? "," : "") << "\n";
  }
  json << "  ]\n}\n";
}

const ThroughputRow* Find(const std::vector<ThroughputRow>& rows, const std::string& part,
                          const std::string& impl, int batch, int qps, int cqs = 1) {
  for (const auto& r : rows) {
    if (r.part == part && r.config.impl == impl && r.config.batch == batch && r.config.qps == qps &&
        r.config.cqs == cqs && r.config.consumers == 1) {
      return &r;
    }
  }
  return nullptr;
}

double Mcps(const ThroughputRow* r) { return r == nullptr ? 0 : r->mcps; }

bool IsHandoff(const std::string& impl) {
  return impl == "cqd" || impl == "mutex" || impl == "tbb" || impl == "ceph";
}

// Sets each one-consumer handoff row's bound from the rows of the same run (ThroughputRow).
void AttachBounds(std::vector<ThroughputRow>& rows) {
  for (ThroughputRow& r : rows) {
    if (!IsHandoff(r.config.impl) || r.config.consumers != 1 || r.config.cqs != 1) continue;
    for (const char* impl : {"limit", "handlers", "copy"}) {
      const ThroughputRow* b = Find(rows, r.part, impl, r.config.batch, r.config.qps);
      if (b == nullptr || b->mcps <= 0) continue;
      if (r.bound_mcps == 0 || b->mcps < r.bound_mcps) {
        r.bound_mcps = b->mcps;
        r.bound_by = impl;
      }
    }
  }
}

}  // namespace
}  // namespace cqd::bench

int main(int argc, char** argv) {
  using namespace cqd::bench;
  Flags flags;
  const char* workspace = getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string root = workspace ? workspace : ".";
  flags.out = root + "/docs/perf";
  std::string command = "bazel run -c opt //benchmarks:dispatch --";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    command += " " + a;
    if (a == "--random-order") {  // before --only
      flags.random_order = true;
    } else if (a == "--quick") {
      flags.quick = true;
      flags.seconds = 0.2;
    } else if (a.rfind("--seconds=", 0) == 0) {
      flags.seconds = atof(a.c_str() + 10);
    } else if (a.rfind("--out=", 0) == 0) {
      flags.out = a.substr(6);
      if (!flags.out.empty() && flags.out[0] != '/') flags.out = root + "/" + flags.out;
    } else if (a == "--open-loop-only") {  // saturation, then the open-loop part only
      const double saturation = MeasureThroughput({"cqd", 32, 1000, 1}, flags.seconds).mcps;
      printf("saturation %.2f M/s\n", saturation);
      for (double load : {0.1, 0.5, 0.9}) {
        OpenLoopRow o = RunOpenLoop(load, saturation, 1.0);
        printf("%3.0f%%: offered %.2f delivered %.2f M/s (%" PRIu64 "/%" PRIu64
               "), p50 %.0f p99 %.0f p99.9 %.0f ns, %.2f cores\n",
               load * 100, o.offered_mcps, o.delivered_mcps, o.delivered, o.total, o.lat.p50,
               o.lat.p99, o.lat.p999, o.cpu_cores);
      }
      return 0;
    } else if (a.rfind("--scaling", 0) == 0) {  // --scaling[=rounds]: shards side by side
      const int rounds = a.size() > 10 ? atoi(a.c_str() + 10) : 3;
      RunScaling(std::max(1, rounds), flags.seconds);
      return 0;
    } else if (a == "--probe") {  // the cross-core probe alone: which mode the machine is in
      printf("xcore %.1f ns per round trip\n", CrossCoreRoundTripNs());
      return 0;
    } else if (a == "--latency-only") {  // the busy latency rows and their floor, printed
      const size_t samples = 20000;
      const LatencyResult rows[] = {
          Probed([&] { return RunCqdLatency(true, false, samples, 5000, 0.1); }),
          Probed([&] { return RunCqdLatency(true, true, samples, 5000, 0.1); }),
          Probed([&] { return RunSpinHandoff(samples, 5000); }),
          Probed([&] { return RunBareHandOver(samples, 5000, HandOver::kDepthThenEnd); }),
          Probed([&] { return RunBareHandOver(samples, 5000, HandOver::kEnd); }),
          Probed([&] { return RunBareHandOver(samples, 5000, HandOver::kEntrySequence); }),
          Probed([&] { return RunBareHandOver(samples, 5000, HandOver::kOneLine); })};
      fprintf(stderr, "\n");
      for (const LatencyResult& r : rows) {
        printf("%-18s poll->handler p50 %6.0f p99 %6.0f ns, xcore %.0f/%.0f ns\n", r.mode.c_str(),
               r.p.p50, r.p.p99, r.xcore.before, r.xcore.after);
      }
      return 0;
    } else if (a == "--busy-latency-only") {  // the busy-poll handoff and the spin floor alone
      const size_t samples = 20000;
      const LatencyResult rows[] = {
          Probed([&] { return RunCqdLatency(true, false, samples, 5000, 0.1); }),
          Probed([&] { return RunSpinHandoff(samples, 5000); })};
      fprintf(stderr, "\n");
      for (const LatencyResult& r : rows) {
        printf("%-18s poll->handler p50 %6.0f p99 %6.0f ns, xcore %.0f/%.0f ns\n", r.mode.c_str(),
               r.p.p50, r.p.p99, r.xcore.before, r.xcore.after);
      }
      return 0;
    } else if (a == "--event-latency-only") {  // the event-mode rows and one eventfd wake
      const size_t samples = 5000;
      const LatencyResult rows[] = {
          Probed([&] { return RunCqdLatency(false, false, samples, 5000, 0.1); }),
          Probed([&] { return RunCqdLatency(false, true, samples, 5000, 0.1); }),
          Probed([&] { return RunEventfdPingPong(samples, 5000); }),
          Probed([&] { return RunCqdLatency(false, false, samples, 5000, 0.1, true); })};
      fprintf(stderr, "\n");
      for (const LatencyResult& r : rows) {
        printf(
            "%-18s added->handler p50 %6.0f p99 %6.0f ns, poll->handler p50 %6.0f ns, xcore "
            "%.0f/%.0f ns\n",
            r.mode.c_str(), r.e2e.p50, r.e2e.p99, r.p.p50, r.xcore.before, r.xcore.after);
      }
      return 0;
    } else if (a.rfind("--only=", 0) == 0) {  // impl:batch:qps:consumers, for profiling
      PipelineConfig c;
      char impl[16] = {};
      int busy = 1;
      const int got = sscanf(a.c_str() + 7, "%15[^:]:%d:%d:%d:%d:%d:%d", impl, &c.batch, &c.qps,
                             &c.consumers, &c.cqs, &c.active_cqs, &busy);
      if (got != 4 && got != 7) {
        fprintf(stderr, "--only=impl:batch:qps:consumers[:cqs:active_cqs:busy_poll]\n");
        return 2;
      }
      c.busy_poll = busy != 0;
      c.random_order = flags.random_order;
      c.impl = impl;
      ThroughputRow r = MeasureThroughput(c, flags.seconds);
      printf(
          "%s batch %d qps %d consumers %d%s: %.2f M completions/s, %.1f CPU ns each, xcore "
          "%.0f/%.0f ns\n",
          impl, c.batch, c.qps, c.consumers, c.random_order ? " random" : "", r.mcps, r.cpu_ns,
          r.xcore.before, r.xcore.after);
      return 0;
    } else {
      fprintf(stderr,
              "usage: dispatch [--quick] [--seconds=S] [--out=DIR] [--random-order] "
              "[--only=impl:batch:qps:consumers[:cqs:active_cqs:busy_poll] | --open-loop-only | "
              "--latency-only | --busy-latency-only | --event-latency-only | --scaling[=ROUNDS] | "
              "--probe]\n");
      return 2;
    }
  }
  fprintf(stderr, "cqd dispatch harness: %u CPUs, results to %s\n",
          std::thread::hardware_concurrency(), flags.out.c_str());

  std::vector<ThroughputRow> tput = RunThroughput(flags);
  AttachBounds(tput);

  const size_t samples = flags.quick ? 2000 : 20000;
  const double rate = 5000;  // completions per second
  std::vector<LatencyResult> lat;
  const double event_idle = flags.quick ? 1.0 : 3.0;
  lat.push_back(
      Probed([&] { return RunCqdLatency(/*busy=*/true, /*rtc=*/false, samples, rate, 1.0); }));
  lat.push_back(Probed(
      [&] { return RunCqdLatency(/*busy=*/false, /*rtc=*/false, samples, rate, event_idle); }));
  lat.push_back(
      Probed([&] { return RunCqdLatency(/*busy=*/true, /*rtc=*/true, samples, rate, 1.0); }));
  lat.push_back(Probed(
      [&] { return RunCqdLatency(/*busy=*/false, /*rtc=*/true, samples, rate, event_idle); }));
  Progress("latency eventfd ping-pong");
  lat.push_back(Probed([&] { return RunEventfdPingPong(samples, rate); }));
  Progress("latency spin handoff");
  lat.push_back(Probed([&] { return RunSpinHandoff(samples, rate); }));
  fprintf(stderr, "\n");

  // Open loop at fractions of the saturation measured above (cqd, batch 32, 1000 QPs).
  std::vector<OpenLoopRow> open;
  const double saturation = Mcps(Find(tput, "dispatch", "cqd", 32, 1000));
  for (double load : {0.1, 0.5, 0.9}) {
    Progress("open loop at " + std::to_string(static_cast<int>(load * 100)) + " %");
    open.push_back(RunOpenLoop(load, saturation, flags.quick ? 0.5 : 2.0));
  }
  fprintf(stderr, "\n");

  std::vector<AckRow> acks;
  for (uint32_t threshold : {1u, 4u, 16u, 64u}) {
    Progress("acks threshold " + std::to_string(threshold));
    acks.push_back(RunAcks(threshold, flags.quick ? 128 : 512));
  }
  fprintf(stderr, "\n");

  WriteJson(flags.out, command, tput, lat, open, acks);

  // The summary a person reads.
  printf("\nthroughput: M completions/s (CPU ns per completion, all threads), 1 consumer\n");
  printf("%-6s %6s", "qps", "batch");
  const char* impls[] = {"limit", "limit2", "cqd",      "cqd_rtc", "mutex",
                         "tbb",   "ceph",   "handlers", "copy"};
  for (const char* impl : impls) printf(" %16s", impl);
  printf("\n");
  for (int q : {1, 1000}) {
    for (int b : {1, 8, 32, 64}) {
      if (Find(tput, "dispatch", "cqd", b, q) == nullptr) continue;
      printf("%-6d %6d", q, b);
      for (const char* impl : impls) {
        const ThroughputRow* r = Find(tput, "dispatch", impl, b, q);
        printf(" %8.2f (%5.1f)", r ? r->mcps : 0, r ? r->cpu_ns : 0);
      }
      printf("\n");
    }
  }
  printf(
      "\nhandoffs against their bound: the smallest of limit, handlers and copy in this run "
      "(same batch and QPs)\n%-8s %-6s %6s %8s %8s %-9s %6s\n",
      "part", "impl", "batch", "qps", "M/s", "bound", "ratio");
  for (const auto& r : tput) {
    if (r.bound_mcps <= 0) continue;
    printf("%-8s %-6s %6d %8d %8.2f %8.2f %-9s %6.2f\n", r.part.c_str(), r.config.impl.c_str(),
           r.config.batch, r.config.qps, r.mcps, r.bound_mcps, ("(" + r.bound_by + ")").c_str(),
           r.mcps / r.bound_mcps);
  }
  printf(
      "\nlatency, ns: poll -> handler entry | completion added -> handler entry\n"
      "%-18s %8s %8s %8s | %8s %8s %8s %10s\n",
      "mode", "p50", "p99", "p99.9", "p50", "p99", "p99.9", "idle CPU");
  for (const auto& r : lat) {
    printf("%-18s %8.0f %8.0f %8.0f | %8.0f %8.0f %8.0f", r.mode.c_str(), r.p.p50, r.p.p99,
           r.p.p999, r.e2e.p50, r.e2e.p99, r.e2e.p999);
    if (r.idle_cpu >= 0) printf(" %9.2f%%", r.idle_cpu);
    printf("\n");
  }
  printf(
      "\nopen loop, default options (saturation %.2f M/s): added -> handler, ns\n"
      "%-6s %10s %10s %8s %8s %8s %10s\n",
      saturation, "load", "offered", "delivered", "p50", "p99", "p99.9", "CPU cores");
  for (const auto& o : open) {
    printf("%5.0f%% %10.2f %10.2f %8.0f %8.0f %8.0f %10.2f%s\n", o.load * 100, o.offered_mcps,
           o.delivered_mcps, o.lat.p50, o.lat.p99, o.lat.p999, o.cpu_cores,
           o.delivered < o.total ? "  (not all delivered in time)" : "");
  }
  printf("\nacks\n%-10s %8s %10s %16s\n", "threshold", "events", "ack calls", "calls per event");
  for (const auto& a : acks) {
    printf("%-10u %8" PRIu64 " %10" PRIu64 " %16.4f\n", a.threshold, a.events, a.ack_calls,
           double(a.ack_calls) / std::max<uint64_t>(1, a.events));
  }
  const double c32 = Mcps(Find(tput, "dispatch", "cqd", 32, 1000));
  printf("\nbatch 32, 1000 QPs: cqd/limit2 %.2f, cqd/mutex %.2f, cqd/tbb %.2f, cqd/ceph %.2f\n",
         c32 / Mcps(Find(tput, "dispatch", "limit2", 32, 1000)),
         c32 / Mcps(Find(tput, "dispatch", "mutex", 32, 1000)),
         c32 / Mcps(Find(tput, "dispatch", "tbb", 32, 1000)),
         c32 / Mcps(Find(tput, "dispatch", "ceph", 32, 1000)));
  printf(
      "1000 CQs (10 active) / 10 CQs: %.2f; 100000 QPs / 1000 QPs (random order): %.2f\n",
      Mcps(Find(tput, "cqs", "cqd", 32, 1000, 1000)) / Mcps(Find(tput, "cqs", "cqd", 32, 1000, 10)),
      Mcps(Find(tput, "qps", "cqd", 32, 100000)) / Mcps(Find(tput, "qps", "cqd", 32, 1000)));
  printf(
      "busy p50 / spin floor p50: %.2f, p99 / floor p99: %.2f; event end-to-end p50 / eventfd "
      "wake p50: handoff %.2f, run-to-completion %.2f\n",
      lat[0].p.p50 / lat[5].p.p50, lat[0].p.p99 / lat[5].p.p99, lat[1].e2e.p50 / lat[4].p.p50,
      lat[3].e2e.p50 / lat[4].p.p50);
  printf("wrote %s/dispatch.json\n", flags.out.c_str());
  return 0;
}

// cqd's dispatch harness: cqd beside the limit and the alternatives, in one process, on the
// simulated device.
//
//   bazel run -c opt //benchmarks:dispatch -- [--quick] [--seconds=S] [--out=DIR]
//
// Writes DIR/dispatch.json and, when gnuplot is installed, DIR/throughput.png and
// DIR/latency_cdf.png (DIR defaults to docs/perf in the workspace). Parts:
//   throughput  completions/s delivered to handlers, per pipeline (see pipelines.h), poll batch
//               1..64, 1 and 1000 QPs, 1 and 2 consumers; one poller thread, so this is also the
//               rate per poller core; median of 3 runs, threads pinned alike for every pipeline
//   latency     from a completion entering the CQ to its handler's entry, at a low fixed rate,
//               cqd busy-polling and in event mode, beside a two-thread eventfd ping-pong (the
//               cost of one wake: the floor for event mode)
//   idle CPU    CPU time of the whole process over a few seconds with no traffic
//   acks        ibv_ack_cq_events calls per completion event for several thresholds
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
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

void SleepFor(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// Pins the calling thread to `cpu` (latency runs: one side on CPU 0, the other on CPU 1).
void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

void Unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned i = 0; i < std::thread::hardware_concurrency(); ++i) CPU_SET(i, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct Flags {
  bool quick = false;
  double seconds = 0.3;
  std::string out;
};

void Progress(const std::string& line) {
  fprintf(stderr, "\r%-100s", line.c_str());
  fflush(stderr);
}

// ---- throughput ----

struct ThroughputRow {
  PipelineConfig config;
  double mcps = 0;  // million completions per second delivered
};

double MeasureOnce(const PipelineConfig& config, double seconds) {
  std::unique_ptr<Pipeline> pipeline = StartPipeline(config);
  SleepFor(std::min(0.2, seconds / 2));  // warm up: queues fill, caches settle
  uint64_t d0 = pipeline->Delivered();
  Clock::time_point t0 = Clock::now();
  SleepFor(seconds);
  uint64_t d1 = pipeline->Delivered();
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  pipeline->Stop();
  return (d1 - d0) / elapsed / 1e6;
}

// The median of three runs: single runs on a small shared machine are noisy.
double MeasureThroughput(const PipelineConfig& config, double seconds) {
  double runs[3];
  for (double& r : runs) r = MeasureOnce(config, seconds);
  std::sort(runs, runs + 3);
  return runs[1];
}

std::vector<ThroughputRow> RunThroughput(const Flags& flags) {
  std::vector<int> batches = {1, 8, 16, 32, 64};
  std::vector<int> qps = {1, 1000};
  std::vector<int> consumers = {1, 2};
  std::vector<std::string> impls = {"limit", "cqd", "mutex", "tbb", "ceph"};
  if (flags.quick) batches = {1, 32};
  std::vector<PipelineConfig> configs;
  for (int q : qps) {
    for (int c : consumers) {
      for (const std::string& impl : impls) {
        if (impl == "limit" && c != 1) continue;  // no consumers to vary
        for (int b : batches) configs.push_back({impl, b, q, c});
      }
    }
  }
  std::vector<ThroughputRow> rows;
  for (size_t i = 0; i < configs.size(); ++i) {
    const PipelineConfig& c = configs[i];
    char label[128];
    snprintf(label, sizeof(label), "[%zu/%zu] throughput %-5s batch %2d  qps %4d  consumers %d", i + 1,
             configs.size(), c.impl.c_str(), c.batch, c.qps, c.consumers);
    Progress(label);
    double mcps = MeasureThroughput(c, flags.seconds);
    rows.push_back({c, mcps});
    Progress(std::string(label) + "  " + std::to_string(mcps).substr(0, 6) + " M/s");
  }
  fprintf(stderr, "\n");
  return rows;
}

// ---- latency ----

struct Percentiles {
  double p50 = 0, p99 = 0, p999 = 0, min = 0, max = 0;
};

Percentiles Summarize(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return static_cast<double>(v[std::min(v.size() - 1, size_t(q * v.size()))]); };
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
  std::vector<uint64_t> samples;  // poll -> handler entry
  std::vector<uint64_t> end_to_end;  // completion added -> handler entry
  Percentiles p, e2e;
  double idle_cpu = -1;  // % of one core over the idle window after traffic
};

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
// Busy: the poller busy-polls and the consumer is this thread, spinning on Drain after each
// injection (two busy threads fit two cores). Event: the poller arms and sleeps at once and the
// consumer is a runtime thread that sleeps at once.
LatencyResult RunCqdLatency(bool busy, size_t samples, double rate, double idle_seconds) {
  RuntimeOptions options;
  options.pollers = 1;
  options.poller_cpus = {0};
  options.consumers.assign(1, ConsumerOptions{});
  if (busy) {
    options.busy_poll = true;
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
  } else {
    options.consumers[0].cpu = 1 % std::max(1u, std::thread::hardware_concurrency());
    options.idle_budget = std::chrono::microseconds(0);
    options.consumers[0].idle_spin = std::chrono::microseconds(0);
  }
  auto created = Runtime::Create(options);
  if (!created.ok()) {
    fprintf(stderr, "latency: %s\n", created.status().ToString().c_str());
    exit(1);
  }
  auto rt = std::move(created).value();
  if (busy) PinTo(1);  // this thread is the consumer
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
    if (busy) {
      while (handler.count.load(std::memory_order_acquire) <= i) rt->Drain(0, 64);
    }
    if (i % 256 == 0) {
      Progress((busy ? "latency cqd busy-poll " : "latency cqd event mode ") +
               std::to_string(i) + "/" + std::to_string(samples));
    }
  }
  while (handler.count.load(std::memory_order_acquire) < samples) std::this_thread::yield();

  LatencyResult result;
  result.mode = busy ? "cqd_busy_poll" : "cqd_event";
  result.samples = handler.from_poll;
  result.end_to_end = handler.from_inject;
  result.p = Summarize(result.samples);
  result.e2e = Summarize(result.end_to_end);
  SleepFor(0.2);  // let the poller and consumer reach their idle state
  double c0 = CpuSeconds();
  Clock::time_point t0 = Clock::now();
  SleepFor(idle_seconds);
  result.idle_cpu = 100.0 * (CpuSeconds() - c0) /
                    std::chrono::duration<double>(Clock::now() - t0).count();
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

std::string MachineJson() {
  utsname u{};
  uname(&u);
  std::string model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ostringstream o;
  o << "{\"cpus\": " << std::thread::hardware_concurrency() << ", \"cpu_model\": \"" << model
    << "\", \"kernel\": \"" << u.release << "\"}";
  return o.str();
}

void WriteOutputs(const std::string& dir, const std::vector<ThroughputRow>& tput,
                  const std::vector<LatencyResult>& lat, const std::vector<AckRow>& acks) {
  std::string cmd = "mkdir -p '" + dir + "'";
  if (system(cmd.c_str()) != 0) return;
  std::ofstream json(dir + "/dispatch.json");
  json << "{\n  \"machine\": " << MachineJson() << ",\n  \"throughput\": [\n";
  for (size_t i = 0; i < tput.size(); ++i) {
    const auto& r = tput[i];
    json << "    {\"impl\": \"" << r.config.impl << "\", \"batch\": " << r.config.batch
         << ", \"qps\": " << r.config.qps << ", \"consumers\": " << r.config.consumers
         << ", \"mcps\": " << r.mcps << "}" << (i + 1 < tput.size() ? "," : "") << "\n";
  }
  json << "  ],\n  \"latency_ns\": [\n";
  for (size_t i = 0; i < lat.size(); ++i) {
    const auto& r = lat[i];
    json << "    {\"mode\": \"" << r.mode << "\", \"samples\": " << r.samples.size()
         << ", \"poll_to_handler\": {\"p50\": " << r.p.p50 << ", \"p99\": " << r.p.p99
         << ", \"p999\": " << r.p.p999 << ", \"min\": " << r.p.min << ", \"max\": " << r.p.max
         << "}, \"added_to_handler\": {\"p50\": " << r.e2e.p50 << ", \"p99\": " << r.e2e.p99
         << ", \"p999\": " << r.e2e.p999 << "}";
    if (r.idle_cpu >= 0) json << ", \"idle_cpu_percent\": " << r.idle_cpu;
    json << "}" << (i + 1 < lat.size() ? "," : "") << "\n";
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
  json.close();

  // Data files for gnuplot: one throughput series per (impl, qps, consumers), one CDF per mode.
  std::map<std::string, std::ofstream> series;
  for (const auto& r : tput) {
    std::string name = r.config.impl + "_q" + std::to_string(r.config.qps) + "_c" +
                       std::to_string(r.config.consumers);
    auto& f = series[name];
    if (!f.is_open()) f.open(dir + "/tput_" + name + ".dat");
    f << r.config.batch << " " << r.mcps << "\n";
  }
  series.clear();
  for (const auto& r : lat) {
    std::ofstream f(dir + "/lat_" + r.mode + ".dat");
    std::vector<uint64_t> s = r.samples;  // poll -> handler
    std::sort(s.begin(), s.end());
    for (size_t i = 0; i < s.size(); i += std::max<size_t>(1, s.size() / 2000)) {
      f << s[i] << " " << double(i + 1) / s.size() << "\n";
    }
    f << s.back() << " 1\n";
  }
  std::ofstream gp(dir + "/plots.gp");
  gp << "set terminal pngcairo size 1200,500 font ',10'\n"
        "set output 'throughput.png'\n"
        "set multiplot layout 1,2 title 'Delivered completions/s vs poll batch (1 poller)'\n"
        "set logscale x 2\nset xlabel 'poll batch'\nset ylabel 'M completions/s'\n"
        "set key top left\nset grid\n";
  for (int q : {1, 1000}) {
    gp << "set title '" << q << (q == 1 ? " QP" : " QPs") << ", 1 consumer'\nplot ";
    bool first = true;
    for (const char* impl : {"limit", "cqd", "mutex", "tbb", "ceph"}) {
      gp << (first ? "" : ", ") << "'tput_" << impl << "_q" << q << "_c1.dat' with linespoints title '"
         << impl << "'";
      first = false;
    }
    gp << "\n";
  }
  gp << "unset multiplot\n"
        "set terminal pngcairo size 800,500 font ',10'\n"
        "set output 'latency_cdf.png'\n"
        "set title 'Latency CDF: poll -> handler entry (eventfd: write -> reader wakes)'\n"
        "set logscale x 10\nset xlabel 'ns'\nset ylabel 'fraction'\nset key bottom right\n"
        "set yrange [0:1]\n"
        "plot 'lat_cqd_busy_poll.dat' with lines lw 2 title 'cqd busy-poll', "
        "'lat_cqd_event.dat' with lines lw 2 title 'cqd event mode', "
        "'lat_eventfd_pingpong.dat' with lines lw 2 title 'eventfd wake (event floor)', "
        "'lat_spin_handoff.dat' with lines lw 2 title 'spin handoff (busy floor)'\n";
  gp.close();
  std::string plot = "cd '" + dir + "' && command -v gnuplot >/dev/null && gnuplot plots.gp";
  if (system(plot.c_str()) != 0) fprintf(stderr, "gnuplot not run: no plots written\n");
}

double Find(const std::vector<ThroughputRow>& rows, const std::string& impl, int batch, int qps,
            int consumers) {
  for (const auto& r : rows) {
    if (r.config.impl == impl && r.config.batch == batch && r.config.qps == qps &&
        r.config.consumers == consumers) {
      return r.mcps;
    }
  }
  return 0;
}

}  // namespace
}  // namespace cqd::bench

int main(int argc, char** argv) {
  using namespace cqd::bench;
  Flags flags;
  const char* workspace = getenv("BUILD_WORKSPACE_DIRECTORY");
  flags.out = std::string(workspace ? workspace : ".") + "/docs/perf";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      flags.quick = true;
      flags.seconds = 0.2;
    } else if (a.rfind("--seconds=", 0) == 0) {
      flags.seconds = atof(a.c_str() + 10);
    } else if (a.rfind("--out=", 0) == 0) {
      flags.out = a.substr(6);
    } else if (a.rfind("--only=", 0) == 0) {  // impl:batch:qps:consumers, for profiling
      PipelineConfig c;
      char impl[16] = {};
      if (sscanf(a.c_str() + 7, "%15[^:]:%d:%d:%d", impl, &c.batch, &c.qps, &c.consumers) != 4) {
        fprintf(stderr, "--only=impl:batch:qps:consumers\n");
        return 2;
      }
      c.impl = impl;
      printf("%s batch %d qps %d consumers %d: %.2f M completions/s\n", impl, c.batch, c.qps,
             c.consumers, MeasureThroughput(c, flags.seconds));
      return 0;
    } else {
      fprintf(stderr,
              "usage: dispatch [--quick] [--seconds=S] [--out=DIR] "
              "[--only=impl:batch:qps:consumers]\n");
      return 2;
    }
  }
  fprintf(stderr, "cqd dispatch harness: %u CPUs, results to %s\n",
          std::thread::hardware_concurrency(), flags.out.c_str());

  std::vector<ThroughputRow> tput = RunThroughput(flags);

  const size_t samples = flags.quick ? 2000 : 20000;
  const double rate = 5000;  // completions per second
  std::vector<LatencyResult> lat;
  lat.push_back(RunCqdLatency(/*busy=*/true, samples, rate, 1.0));
  lat.push_back(RunCqdLatency(/*busy=*/false, samples, rate, flags.quick ? 1.0 : 3.0));
  Progress("latency eventfd ping-pong");
  lat.push_back(RunEventfdPingPong(samples, rate));
  Progress("latency spin handoff");
  lat.push_back(RunSpinHandoff(samples, rate));
  fprintf(stderr, "\n");

  std::vector<AckRow> acks;
  for (uint32_t threshold : {1u, 4u, 16u, 64u}) {
    Progress("acks threshold " + std::to_string(threshold));
    acks.push_back(RunAcks(threshold, flags.quick ? 128 : 512));
  }
  fprintf(stderr, "\n");

  WriteOutputs(flags.out, tput, lat, acks);

  // The summary a person reads.
  printf("\nthroughput, M completions/s (1 poller; consumers as shown)\n");
  printf("%-6s %6s %10s %8s %8s %8s %8s %8s\n", "qps", "cons", "batch", "limit", "cqd", "mutex",
         "tbb", "ceph");
  for (int q : {1, 1000}) {
    for (int c : {1, 2}) {
      for (int b : {1, 8, 16, 32, 64}) {
        double cqd = Find(tput, "cqd", b, q, c);
        if (cqd == 0) continue;
        printf("%-6d %6d %10d %8.2f %8.2f %8.2f %8.2f %8.2f\n", q, c, b, Find(tput, "limit", b, q, 1),
               cqd, Find(tput, "mutex", b, q, c), Find(tput, "tbb", b, q, c),
               Find(tput, "ceph", b, q, c));
      }
    }
  }
  printf("\nlatency, ns: poll -> handler entry | completion added -> handler entry\n"
         "%-18s %8s %8s %8s | %8s %8s %8s %10s\n",
         "mode", "p50", "p99", "p99.9", "p50", "p99", "p99.9", "idle CPU");
  for (const auto& r : lat) {
    printf("%-18s %8.0f %8.0f %8.0f | %8.0f %8.0f %8.0f", r.mode.c_str(), r.p.p50, r.p.p99,
           r.p.p999, r.e2e.p50, r.e2e.p99, r.e2e.p999);
    if (r.idle_cpu >= 0) printf(" %9.2f%%", r.idle_cpu);
    printf("\n");
  }
  printf("\nacks\n%-10s %8s %10s %16s\n", "threshold", "events", "ack calls", "calls per event");
  for (const auto& a : acks) {
    printf("%-10u %8" PRIu64 " %10" PRIu64 " %16.4f\n", a.threshold, a.events, a.ack_calls,
           double(a.ack_calls) / std::max<uint64_t>(1, a.events));
  }
  double c32 = Find(tput, "cqd", 32, 1000, 1);
  printf("\nratios at batch 32, 1000 QPs, 1 consumer: cqd/limit %.2f, cqd/mutex %.2f, "
         "cqd/tbb %.2f, cqd/ceph %.2f\n",
         c32 / Find(tput, "limit", 32, 1000, 1), c32 / Find(tput, "mutex", 32, 1000, 1),
         c32 / Find(tput, "tbb", 32, 1000, 1), c32 / Find(tput, "ceph", 32, 1000, 1));
  printf("event mode p50 / eventfd wake p50: %.2f; busy-poll p50 / spin handoff p50: %.2f\n",
         lat[1].p.p50 / lat[2].p.p50, lat[0].p.p50 / lat[3].p.p50);
  printf("wrote %s/dispatch.json\n", flags.out.c_str());
  return 0;
}

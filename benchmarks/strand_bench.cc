// SPDX-License-Identifier: BSD-2-Clause
// Strand consumer vs owned consumers when a few QPs have slow handlers, on the simulated device.
//
//   bazel run -c opt //benchmarks:strand -- [--qps=1000] [--slow=10] [--unit_us=1]
//       [--slow_factor=100] [--per_qp=200] [--workers=2] [--out=FILE]
//
// The same completion stream (a SimTrafficSource, round robin over the QPs, per_qp completions
// each) goes through, one after the other in one run:
//   strand    one engine-driven consumer drained by a StrandConsumer on a task_arena of
//             `workers` worker threads (one strand per QP);
//   owned1    one runtime-owned consumer (ConsumerKind::kOwnedThread);
//   ownedN    `workers` owned consumers, the QPs spread round robin over them.
// Every handler spins for unit_us per completion (slow QPs: unit_us * slow_factor). For the fast
// QPs it prints completions/s (fast completions over the time from the start to the last fast
// completion handled) and the poll -> handler latency p50/p99 (SimCq::StampPollTime stamps each
// completion when polled; the handler subtracts), and the time until every completion was handled.
// The table goes to stdout and to FILE, the command line first.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/tbb.h"

namespace cqd::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Flags {
  int qps = 1000;
  int slow = 10;
  double unit_us = 1;
  int slow_factor = 100;
  int per_qp = 200;
  int workers = 2;
  std::string out;
};

// Spins `ns` of work per completion; fast handlers keep their poll -> handler latencies.
class SpinHandler : public QpHandler {
 public:
  SpinHandler(uint64_t work_ns, bool fast, size_t expected) : work_ns_(work_ns), fast_(fast) {
    if (fast_) latencies_.reserve(expected);
  }
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      const uint64_t start = NowNs();
      if (fast_)
        latencies_.push_back(static_cast<uint32_t>(static_cast<uint32_t>(start) - wc.src_qp));
      while (NowNs() - start < work_ns_) {
      }
    }
    last_ns_.store(NowNs(), std::memory_order_relaxed);
    done_.fetch_add(wcs.size(), std::memory_order_release);
  }
  uint64_t done() const { return done_.load(std::memory_order_acquire); }
  uint64_t last_ns() const { return last_ns_.load(std::memory_order_relaxed); }
  bool fast() const { return fast_; }
  const std::vector<uint32_t>& latencies() const { return latencies_; }

 private:
  const uint64_t work_ns_;
  const bool fast_;
  std::vector<uint32_t> latencies_;  // the QP's handler only; read after the run
  std::atomic<uint64_t> last_ns_{0};
  std::atomic<uint64_t> done_{0};
};

struct Row {
  std::string name;
  double fast_per_sec = 0;
  double p50_us = 0;
  double p99_us = 0;
  double all_done_s = 0;
  bool ok = false;
};

enum class Mode { kStrand, kOwned1, kOwnedN };

Row RunMode(Mode mode, const Flags& f) {
  Row row;
  row.name = mode == Mode::kStrand   ? "strand (arena, " + std::to_string(f.workers) + " workers)"
             : mode == Mode::kOwned1 ? "owned x1"
                                     : "owned x" + std::to_string(f.workers);
  RuntimeOptions options;
  options.pollers = 1;
  const int consumers = mode == Mode::kOwnedN ? f.workers : 1;
  options.consumers.assign(consumers, ConsumerOptions{});
  if (mode == Mode::kStrand) options.consumers[0].kind = ConsumerKind::kEngineDriven;
  auto rt = Runtime::Create(options).value();
  auto sim = SimDevice::Create();
  DeviceId dev = rt->AddSimDevice(sim).value();
  constexpr int kCqs = 8;
  std::vector<CqHandle> cqs;
  for (int i = 0; i < kCqs; ++i) {
    cqs.push_back(rt->CreateCq(dev, 0, {.depth = 8192}).value());
    cqs.back().sim()->StampPollTime(true);
  }
  ::tbb::task_arena arena(f.workers, 0);
  std::unique_ptr<StrandConsumer> strands;
  if (mode == Mode::kStrand) {
    strands = StrandConsumer::Create(*rt, arena, {.consumer = 0}).value();
  }
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<SpinHandler>> handlers;
  std::vector<Registration> regs;
  std::vector<StrandRegistration> strand_regs;
  const auto unit_ns = static_cast<uint64_t>(f.unit_us * 1000);
  for (int i = 0; i < f.qps; ++i) {
    SimCq* cq = cqs[i % kCqs].sim();
    qps.push_back(sim->CreateQp(cq, cq, {.max_send_wr = 1, .max_recv_wr = 1}).value());
    // Slow QPs spread over the stream: every (qps / slow)-th.
    const bool slow = f.slow > 0 && i % (f.qps / f.slow) == 0 && i / (f.qps / f.slow) < f.slow;
    handlers.push_back(
        std::make_unique<SpinHandler>(slow ? unit_ns * f.slow_factor : unit_ns, !slow, f.per_qp));
    if (mode == Mode::kStrand) {
      strand_regs.push_back(strands->RegisterQp(*qps.back(), *handlers.back()).value());
    } else {
      regs.push_back(
          rt->RegisterQp(*qps.back(), *handlers.back(), static_cast<ConsumerId>(i % consumers))
              .value());
    }
  }
  SimTrafficSource traffic(
      {.qps = qps, .completions_per_qp = static_cast<uint64_t>(f.per_qp), .burst = 16});
  const uint64_t start = NowNs();
  traffic.Start();
  const uint64_t total = static_cast<uint64_t>(f.qps) * f.per_qp;
  const uint64_t deadline = start + 600ull * 1000000000ull;
  for (;;) {
    uint64_t done = 0;
    for (const auto& h : handlers) done += h->done();
    if (done == total) {
      row.ok = true;
      break;
    }
    if (NowNs() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  row.all_done_s = static_cast<double>(NowNs() - start) / 1e9;
  traffic.Join();
  uint64_t fast_total = 0;
  uint64_t fast_end = start;
  std::vector<uint32_t> lat;
  for (const auto& h : handlers) {
    if (!h->fast()) continue;
    fast_total += h->done();
    fast_end = std::max(fast_end, h->last_ns());
    lat.insert(lat.end(), h->latencies().begin(), h->latencies().end());
  }
  row.fast_per_sec =
      static_cast<double>(fast_total) / (static_cast<double>(fast_end - start) / 1e9);
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    row.p50_us = lat[lat.size() / 2] / 1000.0;
    row.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)] / 1000.0;
  }
  if (strands) (void)strands->Stop();
  for (auto& r : strand_regs) r.Unregister();
  for (auto& r : regs) r.Unregister();
  return row;
}

bool ParseInt(const std::string& a, const char* name, int* v) {
  const std::string prefix = std::string("--") + name + "=";
  if (a.rfind(prefix, 0) != 0) return false;
  *v = std::atoi(a.c_str() + prefix.size());
  return true;
}

}  // namespace
}  // namespace cqd::bench

int main(int argc, char** argv) {
  using namespace cqd::bench;
  Flags f;
  std::string command = "bazel run -c opt //benchmarks:strand --";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    command += " " + a;
    if (ParseInt(a, "qps", &f.qps) || ParseInt(a, "slow", &f.slow) ||
        ParseInt(a, "slow_factor", &f.slow_factor) || ParseInt(a, "per_qp", &f.per_qp) ||
        ParseInt(a, "workers", &f.workers)) {
      continue;
    }
    if (a.rfind("--unit_us=", 0) == 0) {
      f.unit_us = std::atof(a.c_str() + 10);
    } else if (a.rfind("--out=", 0) == 0) {
      f.out = a.substr(6);
    } else {
      fprintf(stderr,
              "usage: strand [--qps=N] [--slow=N] [--unit_us=U] [--slow_factor=K] [--per_qp=N] "
              "[--workers=N] [--out=FILE]\n");
      return 2;
    }
  }
  if (f.qps < 1 || f.slow < 0 || f.slow > f.qps || f.unit_us < 0 || f.slow_factor < 1 ||
      f.per_qp < 1 || f.workers < 1) {
    fprintf(stderr, "strand: a flag is out of range\n");
    return 2;
  }
  // TBB starts at most (CPUs - 1) workers by default; the arena asks for `workers`.
  ::tbb::global_control control(::tbb::global_control::max_allowed_parallelism, f.workers + 1);
  char head[512];
  snprintf(head, sizeof(head),
           "%s\n# %d QPs (%d slow), %d completions each, fast handler %.2f us/completion, slow "
           "x%d; 1 poller, 8 CQs; %u CPUs\n",
           command.c_str(), f.qps, f.slow, f.per_qp, f.unit_us, f.slow_factor,
           std::thread::hardware_concurrency());
  std::string table = head;
  table +=
      "| consumers | fast QPs completions/s | fast p50 poll->handler us | fast p99 us | all done s "
      "|\n";
  table += "| --- | ---: | ---: | ---: | ---: |\n";
  printf("%s", table.c_str());
  for (Mode mode : {Mode::kStrand, Mode::kOwned1, Mode::kOwnedN}) {
    Row r = RunMode(mode, f);
    char line[256];
    snprintf(line, sizeof(line), "| %s | %.0f | %.1f | %.1f | %.2f%s |\n", r.name.c_str(),
             r.fast_per_sec, r.p50_us, r.p99_us, r.all_done_s, r.ok ? "" : " (incomplete)");
    table += line;
    printf("%s", line);
    fflush(stdout);
  }
  if (!f.out.empty()) {
    const char* workspace = getenv("BUILD_WORKSPACE_DIRECTORY");
    std::string path = f.out;
    if (workspace != nullptr && !path.empty() && path[0] != '/')
      path = std::string(workspace) + "/" + path;
    std::ofstream out(path);
    out << "# " << table;
    if (!out) {
      fprintf(stderr, "strand: cannot write %s\n", path.c_str());
      return 1;
    }
    printf("wrote %s\n", path.c_str());
  }
  return 0;
}

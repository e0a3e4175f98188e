// SPDX-License-Identifier: BSD-2-Clause
// cqd on rxe: a ping-pong and a stream between two RC QPs, both dispatched by one cqd runtime,
// for comparison with perftest's ib_send_lat and ib_send_bw in the same VM (benchmarks/rxe.sh).
//
//   rxe_bench pingpong SIZE ITERS MODE [GAP_US]   prints "pingpong <mode> <t_typical_us>
//                                                 <t_avg_us> <p99_us> <idle_cpu_percent>"
//   rxe_bench stream SIZE COUNT [rtc]             prints "stream <mode> <Mmsg_per_s>"
//
// One-way latency is half the round trip, as ib_send_lat reports it. MODE:
//   adaptive        the default options: the poller arms and sleeps after 50 us idle, handlers on
//                   a consumer thread
//   busy            the same, busy_poll
//   rtc             handlers on the poller thread (ConsumerKind::kRunToCompletion), adaptive
//   rtc_busy        the same, busy_poll
//   rtc_busy_split  two pollers, each side's handler run to completion on its own, busy_poll (the
//                   server's QP on poller 1), as ib_send_lat runs its two sides
//   verbs           no cqd: one thread polls both CQs and does the handlers' work, the floor of
//                   the one-thread structure the modes above share
//   verbs_split     no cqd, the server's side on a thread of its own
// GAP_US > 0 waits that long between a reply and the next ping (a low-rate ping-pong: with gaps
// past the idle budget the poller and the consumer really sleep). Ping-pong sends are not inline
// and are signaled every $CQD_BENCH_SIGNAL_EVERY-th (default 1: every one); the stream keeps 128
// sends in flight and signals every 32nd (ib_send_bw is run with -t 128 -Q 32 -I 0 to match).
// Both QPs' CQs are on one poller shard except in rtc_busy_split. The device is $CQD_RDMA_DEVICE
// or rxe0.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "tools/rdma/verbs_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace cqd;

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "rxe_bench: %s\n", what.c_str());
  exit(1);
}

template <typename T>
T Check(Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(r).value();
}

void Check(Status s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

constexpr int kSlots = 512;

// Ping-pong sends are signaled every CQD_BENCH_SIGNAL_EVERY-th (default 1: every one; perftest's
// ib_send_lat signals one in its cq_mod). Returns whether send number `n` (from 1) is signaled.
bool SignalSend(uint64_t n) {
  static const uint64_t every = [] {
    const char* v = getenv("CQD_BENCH_SIGNAL_EVERY");
    return v != nullptr && atoi(v) > 0 ? static_cast<uint64_t>(atoi(v)) : uint64_t{1};
  }();
  return n % every == 0;
}
constexpr int kWindow = 128;  // receives kept posted, sends in flight (stream)

// Two connected QPs with their own CQs on two shards, dispatched by one runtime.
struct Link {
  explicit Link(const RuntimeOptions& options) {
    rt = Check(Runtime::Create(options), "Runtime::Create");
    dev = Check(rt->OpenVerbsDevice(rxe::DeviceName()), "OpenVerbsDevice");
    ibv_context* context = Check(rt->VerbsContext(dev), "VerbsContext");
    pd = ibv_alloc_pd(context);
    if (pd == nullptr) Die("ibv_alloc_pd");
    Check(buffers.Register(pd, kSlots, 4096), "register memory");
    client_cq = Check(rt->CreateCq(dev, 0, CqOptions{.depth = 1024}), "CreateCq");
    server_cq =
        Check(rt->CreateCq(dev, options.pollers > 1 ? 1 : 0, CqOptions{.depth = 1024}), "CreateCq");
    client = Check(rxe::CreateRcQp(pd, client_cq.verbs(), client_cq.verbs(), 2 * kWindow), "qp");
    server = Check(rxe::CreateRcQp(pd, server_cq.verbs(), server_cq.verbs(), 2 * kWindow), "qp");
    int gid = rxe::FindGidIndex(context);
    Check(rxe::ConnectLoopback(client, server->qp_num, gid), "connect");
    Check(rxe::ConnectLoopback(server, client->qp_num, gid), "connect");
  }
  ~Link() {
    client_reg.Unregister();
    server_reg.Unregister();
    ibv_destroy_qp(client);
    ibv_destroy_qp(server);
    (void)rt->DestroyCq(client_cq);
    (void)rt->DestroyCq(server_cq);
    ibv_dereg_mr(buffers.mr);
    buffers.mr = nullptr;
    ibv_dealloc_pd(pd);
  }
  std::unique_ptr<Runtime> rt;
  DeviceId dev = 0;
  ibv_pd* pd = nullptr;
  rxe::Buffers buffers;
  CqHandle client_cq, server_cq;
  ibv_qp* client = nullptr;
  ibv_qp* server = nullptr;
  Registration client_reg, server_reg;
};

// Server side of both tests: every receive is reposted; with `echo`, answered with a send.
class Server : public QpHandler {
 public:
  Server(Link& link, uint32_t size, bool echo) : link_(link), size_(size), echo_(echo) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (wc.status != IBV_WC_SUCCESS) Die(ibv_wc_status_str(wc.status));
      if (!(wc.opcode & IBV_WC_RECV)) continue;  // our own send completions
      received.fetch_add(1, std::memory_order_relaxed);
      (void)rxe::PostRecv(link_.server, wc.wr_id, link_.buffers, static_cast<int>(wc.wr_id));
      if (echo_) {
        (void)rxe::PostSend(link_.server, 0, link_.buffers, 300, size_, false, SignalSend(++sent_));
      }
    }
  }
  std::atomic<uint64_t> received{0};

 private:
  Link& link_;
  uint32_t size_;
  bool echo_;
  uint64_t sent_ = 0;
};

// Client side of the ping-pong: each reply is timed and triggers the next ping.
class Client : public QpHandler {
 public:
  Client(Link& link, uint32_t size, int iters, bool chain)
      : link_(link), size_(size), chain_(chain), rtt_ns_(iters) {}
  void Ping() {
    sent_at_ = Clock::now();
    (void)rxe::PostSend(link_.client, 0, link_.buffers, 301, size_, false, SignalSend(++sent_));
  }
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (wc.status != IBV_WC_SUCCESS) Die(ibv_wc_status_str(wc.status));
      if (!(wc.opcode & IBV_WC_RECV)) continue;
      size_t i = done.load(std::memory_order_relaxed);
      rtt_ns_[i] = std::chrono::duration<double, std::nano>(Clock::now() - sent_at_).count();
      (void)rxe::PostRecv(link_.client, wc.wr_id, link_.buffers, static_cast<int>(wc.wr_id));
      done.store(i + 1, std::memory_order_release);
      if (chain_ && i + 1 < rtt_ns_.size()) Ping();
    }
  }

 private:
  Link& link_;
  uint32_t size_;
  bool chain_;  // the handler sends the next ping (no gap)

 public:
  std::vector<double> rtt_ns_;
  std::atomic<size_t> done{0};

 private:
  Clock::time_point sent_at_;
  uint64_t sent_ = 0;
};

// Prints the ping-pong line from round trips in ns: typical (median), average and p99, one way in
// us, and the process's CPU over 2 s after the run (idle cost) in % of one core.
void Report(const std::string& mode, std::vector<double> rtt_ns) {
  for (double& v : rtt_ns) v /= 2000.0;  // ns round trip -> us one way
  std::vector<double> sorted = rtt_ns;
  std::sort(sorted.begin(), sorted.end());
  double avg = 0;
  for (double v : rtt_ns) avg += v;
  avg /= rtt_ns.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  double c0 = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  double idle_cpu = 100.0 * (CpuSeconds() - c0) / 2.0;
  printf("pingpong %s %.2f %.2f %.2f %.2f\n", mode.c_str(), sorted[sorted.size() / 2], avg,
         sorted[sorted.size() * 99 / 100], idle_cpu);
}

// The same ping-pong without cqd (mode "verbs"): the same two QPs and CQs, and one thread that
// polls both CQs and does what the two handlers do. The floor of this one-thread structure, to
// tell cqd's cost from the structure's.
// With `split` (mode verbs_split), the server side runs on a thread of its own, busy-polling its
// CQ, as ib_send_lat's server process does.
void VerbsPingPong(uint32_t size, int iters, bool split) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* context = nullptr;
  for (int i = 0; i < n && context == nullptr; ++i) {
    if (rxe::DeviceName() == ibv_get_device_name(list[i])) context = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  if (context == nullptr) Die("no device " + rxe::DeviceName());
  ibv_pd* pd = ibv_alloc_pd(context);
  if (pd == nullptr) Die("ibv_alloc_pd");
  rxe::Buffers buffers;
  Check(buffers.Register(pd, kSlots, 4096), "register memory");
  ibv_cq* client_cq = ibv_create_cq(context, 1024, nullptr, nullptr, 0);
  ibv_cq* server_cq = ibv_create_cq(context, 1024, nullptr, nullptr, 0);
  if (client_cq == nullptr || server_cq == nullptr) Die("ibv_create_cq");
  ibv_qp* client = Check(rxe::CreateRcQp(pd, client_cq, client_cq, 2 * kWindow), "qp");
  ibv_qp* server = Check(rxe::CreateRcQp(pd, server_cq, server_cq, 2 * kWindow), "qp");
  const int gid = rxe::FindGidIndex(context);
  Check(rxe::ConnectLoopback(client, server->qp_num, gid), "connect");
  Check(rxe::ConnectLoopback(server, client->qp_num, gid), "connect");
  for (int i = 0; i < kWindow; ++i) {
    Check(rxe::PostRecv(server, i, buffers, i), "post recv");
    Check(rxe::PostRecv(client, kWindow + i, buffers, kWindow + i), "post recv");
  }
  std::vector<double> rtt_ns(iters);
  uint64_t client_sent = 0, server_sent = 0;
  // The server's side: reposts each receive and answers it.
  auto serve = [&](ibv_wc* wcs) {
    const int got = ibv_poll_cq(server_cq, 16, wcs);
    for (int k = 0; k < got; ++k) {
      if (wcs[k].status != IBV_WC_SUCCESS) Die(ibv_wc_status_str(wcs[k].status));
      if (!(wcs[k].opcode & IBV_WC_RECV)) continue;
      (void)rxe::PostRecv(server, wcs[k].wr_id, buffers, static_cast<int>(wcs[k].wr_id));
      (void)rxe::PostSend(server, 0, buffers, 300, size, false, SignalSend(++server_sent));
    }
  };
  std::atomic<bool> stop{false};
  std::thread server_thread;
  if (split) {
    server_thread = std::thread([&] {
      ibv_wc wcs[16];
      while (!stop.load(std::memory_order_relaxed)) serve(wcs);
    });
  }
  ibv_wc wcs[16];
  for (int i = 0; i < iters; ++i) {
    const Clock::time_point sent_at = Clock::now();
    Check(rxe::PostSend(client, 0, buffers, 301, size, false, SignalSend(++client_sent)), "send");
    bool replied = false;
    while (!replied) {
      if (!split) serve(wcs);
      const int got = ibv_poll_cq(client_cq, 16, wcs);
      for (int k = 0; k < got; ++k) {
        if (wcs[k].status != IBV_WC_SUCCESS) Die(ibv_wc_status_str(wcs[k].status));
        if (!(wcs[k].opcode & IBV_WC_RECV)) continue;
        rtt_ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - sent_at).count();
        (void)rxe::PostRecv(client, wcs[k].wr_id, buffers, static_cast<int>(wcs[k].wr_id));
        replied = true;
      }
    }
  }
  stop.store(true, std::memory_order_relaxed);
  if (split) server_thread.join();
  Report(split ? "verbs_split" : "verbs", std::move(rtt_ns));
  ibv_destroy_qp(client);
  ibv_destroy_qp(server);
  ibv_destroy_cq(client_cq);
  ibv_destroy_cq(server_cq);
  ibv_dereg_mr(buffers.mr);
  buffers.mr = nullptr;
  ibv_dealloc_pd(pd);
  ibv_close_device(context);
}

void PingPong(uint32_t size, int iters, const std::string& mode, int gap_us) {
  if (mode == "verbs" || mode == "verbs_split") {
    if (gap_us > 0) Die("mode " + mode + " has no gap");
    VerbsPingPong(size, iters, mode == "verbs_split");
    return;
  }
  // One poller and one consumer: the VM has 2 vCPUs, and rxe's own packet work needs one.
  // rtc_busy_split: two pollers, each running one side's handler to completion (the server's QP on
  // poller 1), as ib_send_lat's two processes do.
  const bool split = mode == "rtc_busy_split";
  const bool busy = mode == "busy" || mode == "rtc_busy" || split;
  RuntimeOptions options;
  options.pollers = split ? 2 : 1;
  options.consumers.assign(split ? 2 : 1, ConsumerOptions{});
  if (mode == "rtc" || mode == "rtc_busy" || split) {
    for (int c = 0; c < static_cast<int>(options.consumers.size()); ++c) {
      options.consumers[c].kind = ConsumerKind::kRunToCompletion;
      options.consumers[c].poller = c;
    }
  } else if (mode != "adaptive" && mode != "busy") {
    Die("unknown mode " + mode);
  }
  if (const char* spin = getenv("CQD_BENCH_SPIN_US")) {
    options.consumers[0].idle_spin = std::chrono::microseconds(atoi(spin));
  }
  if (const char* budget = getenv("CQD_BENCH_IDLE_US")) {
    options.idle_budget = std::chrono::microseconds(atoi(budget));
  }
  if (busy) options.busy_poll = true;
  Link link(options);
  Server server(link, size, /*echo=*/true);
  Client client(link, size, iters, /*chain=*/gap_us == 0);
  for (int i = 0; i < kWindow; ++i) {
    Check(rxe::PostRecv(link.server, i, link.buffers, i), "post recv");
    Check(rxe::PostRecv(link.client, kWindow + i, link.buffers, kWindow + i), "post recv");
  }
  link.server_reg = Check(link.rt->RegisterQp(link.server, server, split ? 1 : 0), "RegisterQp");
  link.client_reg = Check(link.rt->RegisterQp(link.client, client, 0), "RegisterQp");
  if (gap_us == 0) {
    client.Ping();
    while (client.done.load(std::memory_order_acquire) < static_cast<size_t>(iters)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    for (int i = 0; i < iters; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
      client.Ping();
      while (client.done.load(std::memory_order_acquire) <= static_cast<size_t>(i)) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us / 4 + 1));
      }
    }
  }
  Report(mode + (gap_us > 0 ? "_lowrate" : ""), client.rtt_ns_);
}

void Stream(uint32_t size, uint64_t count, bool rtc) {
  RuntimeOptions options;
  options.pollers = 1;
  options.consumers.assign(1, ConsumerOptions{});
  if (rtc) options.consumers[0].kind = ConsumerKind::kRunToCompletion;
  Link link(options);
  Server server(link, size, /*echo=*/false);
  // Every kSignal-th send is signaled (as perftest does); its completion frees kSignal slots of
  // the window.
  constexpr uint64_t kSignal = 32;
  struct Sender : QpHandler {
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      for (const ibv_wc& wc : wcs) {
        if (wc.status != IBV_WC_SUCCESS) Die(ibv_wc_status_str(wc.status));
      }
      completed.fetch_add(wcs.size() * kSignal, std::memory_order_release);
    }
    std::atomic<uint64_t> completed{0};
  } sender;
  for (int i = 0; i < 2 * kWindow; ++i) {
    Check(rxe::PostRecv(link.server, i, link.buffers, i % kSlots), "post recv");
  }
  link.server_reg = Check(link.rt->RegisterQp(link.server, server, 0), "RegisterQp");
  link.client_reg = Check(link.rt->RegisterQp(link.client, sender, 0), "RegisterQp");
  Clock::time_point start = Clock::now();
  uint64_t posted = 0;
  while (server.received.load(std::memory_order_relaxed) < count) {
    while (posted < count && posted - sender.completed.load(std::memory_order_acquire) < kWindow) {
      bool signaled = (posted + 1) % kSignal == 0 || posted + 1 == count;
      Check(rxe::PostSend(link.client, posted, link.buffers, 300, size, false, signaled),
            "post send");
      ++posted;
    }
    std::this_thread::yield();
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  while (sender.completed.load() < posted - posted % kSignal) std::this_thread::yield();
  printf("stream %s %.4f\n", rtc ? "rtc" : "handoff", count / seconds / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc == 5 || argc == 6) && strcmp(argv[1], "pingpong") == 0) {
    PingPong(atoi(argv[2]), atoi(argv[3]), argv[4], argc == 6 ? atoi(argv[5]) : 0);
    return 0;
  }
  if ((argc == 4 || argc == 5) && strcmp(argv[1], "stream") == 0) {
    Stream(atoi(argv[2]), strtoull(argv[3], nullptr, 10), argc == 5 && strcmp(argv[4], "rtc") == 0);
    return 0;
  }
  fprintf(stderr,
          "usage: rxe_bench pingpong SIZE ITERS "
          "adaptive|busy|rtc|rtc_busy|rtc_busy_split|verbs|verbs_split [GAP_US] | "
          "stream SIZE COUNT [rtc]\n");
  return 2;
}

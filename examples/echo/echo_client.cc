// SPDX-License-Identifier: BSD-2-Clause
// echo_client: many RC connections to echo_server, each checking every reply, coming and going.
//
//   echo_client --server=ADDR [--port=7471] [--device=NAME] [--connections=16] [--requests=200]
//               [--window=8] [--rounds=2] [--pollers=2] [--consumers=2] [--latency]
//
// Connection i sends requests * (1 + i % 3) requests per round, at most `window` outstanding,
// each 64 bytes naming the connection and sequence number; every reply must come back in order
// and equal to its request. A connection that finished its round disconnects with a drained
// TeardownQp (the main thread waits for it) and, if rounds remain, connects again, while the
// others keep running. Handlers run on runtime-owned consumer threads; connection setup runs in
// the CM channel's CmHandler on consumer 0.
//
// Prints "echo_client: running" once the first connection finished a round, and a summary at
// the end. Exit code 0 when every request of every round was verified and no teardown failed (one
// that ended at its deadline, as one may on a loaded emulator, is counted as teardowns_late: every
// reply was verified first, and what it left is orphaned); 1 otherwise. With --latency it also
// prints the round-trip time of the requests (from posting a request to verifying its reply, window
// queueing included) as one more line: "echo_client: latency_us samples=N mean=... p50=... p90=...
// p99=... p999=... max=...".
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "examples/common/client.h"
#include "examples/common/cm_util.h"
#include "examples/common/stats_out.h"

namespace cqd::examples {
namespace {

constexpr uint32_t kBytes = 64;
constexpr uint64_t kSendBit = 1ull << 32;

// --latency: round-trip times in nanoseconds, from every consumer thread at once. Log-linear
// buckets, 16 per power of two (a value is reported as its bucket's middle: within 3%).
class LatencyHistogram {
 public:
  static uint64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void Add(uint64_t ns) {
    buckets_[Bucket(ns)].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(ns, std::memory_order_relaxed);
    uint64_t max = max_.load(std::memory_order_relaxed);
    while (ns > max && !max_.compare_exchange_weak(max, ns, std::memory_order_relaxed)) {
    }
  }
  // The line --latency prints (after every connection finished).
  void Print() const {
    const uint64_t count = count_.load();
    if (count == 0) {
      printf("echo_client: latency_us samples=0\n");
      return;
    }
    printf("echo_client: latency_us samples=%" PRIu64
           " mean=%.1f p50=%.1f p90=%.1f p99=%.1f p999=%.1f max=%.1f\n",
           count, static_cast<double>(sum_.load()) / count / 1000, Quantile(0.5) / 1000,
           Quantile(0.9) / 1000, Quantile(0.99) / 1000, Quantile(0.999) / 1000,
           static_cast<double>(max_.load()) / 1000);
  }

 private:
  static constexpr int kSub = 16;
  static int Bucket(uint64_t ns) {
    if (ns < kSub) return static_cast<int>(ns);
    const int msb = 63 - __builtin_clzll(ns);
    return (msb - 3) * kSub + static_cast<int>(ns >> (msb - 4)) - kSub;
  }
  static double Middle(int bucket) {
    if (bucket < kSub) return bucket;
    const int shift = bucket / kSub - 1;
    const double low = static_cast<double>(static_cast<uint64_t>(kSub + bucket % kSub) << shift);
    return low + static_cast<double>(uint64_t{1} << shift) / 2;
  }
  double Quantile(double q) const {
    const uint64_t count = count_.load();
    const auto rank = static_cast<uint64_t>(q * static_cast<double>(count - 1)) + 1;
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += buckets_[b].load();
      if (seen >= rank) return std::min(Middle(b), static_cast<double>(max_.load()));
    }
    return static_cast<double>(max_.load());
  }
  static constexpr int kBuckets = 64 * kSub;
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
};

void Fill(char* out, uint32_t conn, uint32_t seq) {
  memcpy(out, &conn, 4);
  memcpy(out + 4, &seq, 4);
  for (uint32_t k = 8; k < kBytes; ++k) out[k] = static_cast<char>(conn * 31 + seq * 7 + k);
}

class Conn : public ClientConn {
 public:
  Conn(ClientEngine& client, uint32_t index, int window, uint32_t requests,
       LatencyHistogram* latency)
      : ClientConn(client, index), window_(window), requests_(requests), latency_(latency) {
    if (latency_ != nullptr) sent_at_.resize(window_);
  }
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;

 private:
  void Establish() noexcept override;
  bool PostRecv(int slot);
  bool PostRequest();

  const int window_;
  const uint32_t requests_;
  LatencyHistogram* const latency_;  // nullptr without --latency
  std::vector<uint64_t> sent_at_;    // --latency: when request seq was posted, at seq % window
  Region buffers_;                   // window receive slots, then window send slots
  uint32_t sent_ = 0;
  uint32_t received_ = 0;
};

void Conn::Establish() noexcept {
  Engine& e = client_.engine;
  QpShape shape;
  shape.send_wrs = window_ + 1;
  shape.recv_wrs = window_;
  if (!CreateQp(id(), e.pd, e.CqFor(index_), shape)) return Fail("rdma_create_qp");
  if (!buffers_.Register(e.pd, 2 * window_ * kBytes, IBV_ACCESS_LOCAL_WRITE)) {
    return Fail("ibv_reg_mr");
  }
  for (int i = 0; i < window_; ++i) {
    if (!PostRecv(i)) return Fail("ibv_post_recv");
  }
  if (!Register()) return;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = 6;  // both ends' transport retries; rxe takes 7 as "for ever"
  param.rnr_retry_count = 7;
  if (rdma_connect(id(), &param) != 0) Fail("rdma_connect");
}

bool Conn::PostRecv(int slot) {
  return examples::PostRecv(id()->qp, buffers_, buffers_.data + slot * kBytes, kBytes,
                            static_cast<uint64_t>(slot));
}

bool Conn::PostRequest() {
  const int slot = static_cast<int>(sent_ % window_);
  char* request = buffers_.data + (window_ + slot) * kBytes;
  Fill(request, index_, sent_);
  ibv_sge sge{reinterpret_cast<uintptr_t>(request), kBytes, buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kSendBit | sent_;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  if (latency_ != nullptr) sent_at_[slot] = LatencyHistogram::Now();
  if (ibv_post_send(id()->qp, &wr, &bad) != 0) return false;
  ++sent_;
  return true;
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  for (const ibv_wc& wc : wcs) {
    const ConnState state = this->state();
    if (state == ConnState::kDone || state == ConnState::kFailed) continue;  // flushed at the end
    if (FlushedWhileConnecting(wc)) continue;
    if (wc.status != IBV_WC_SUCCESS) {
      char why[160];
      snprintf(why, sizeof(why), "%s (wr_id %#" PRIx64 ", %s, sent %u, received %u)",
               ibv_wc_status_str(wc.status), wc.wr_id,
               state == ConnState::kRunning ? "running" : "before ESTABLISHED", sent_, received_);
      return Fail(why);
    }
    if (wc.wr_id & kSendBit) continue;
    // A reply: it must be the next one, byte for byte.
    const int slot = static_cast<int>(wc.wr_id);
    char expected[kBytes];
    Fill(expected, index_, received_);
    if (wc.byte_len != kBytes || memcmp(buffers_.data + slot * kBytes, expected, kBytes) != 0) {
      return Fail("a reply differs from its request");
    }
    if (latency_ != nullptr) latency_->Add(LatencyHistogram::Now() - sent_at_[received_ % window_]);
    ++received_;
    Verified(1);
    if (!PostRecv(slot)) return Fail("ibv_post_recv");
    if (received_ == requests_) {
      Done();
    } else if (sent_ < requests_ && !PostRequest()) {
      return Fail("ibv_post_send");
    }
  }
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  if (event.type == RDMA_CM_EVENT_ESTABLISHED) {
    Running();
    while (sent_ < requests_ && static_cast<int>(sent_) < window_) {
      if (!PostRequest()) return Fail("ibv_post_send");
    }
  } else {
    FailOnCmEvent(event);  // the server went away, refused, or never answered
  }
}

int Run(const Flags& flags) {
  ClientEngine client;
  if (!client.Start("echo_client", flags, 7471)) return 1;
  const int connections = static_cast<int>(flags.Int("connections", 16));
  const int window = static_cast<int>(flags.Int("window", 8));
  const uint32_t requests = static_cast<uint32_t>(flags.Int("requests", 200));
  const int rounds = static_cast<int>(flags.Int("rounds", 2));
  // Connection i sends requests * (1 + i % 3) requests in each of its rounds.
  uint64_t expected = 0;
  for (int i = 0; i < connections; ++i) expected += uint64_t{requests} * (1 + i % 3) * rounds;
  std::unique_ptr<LatencyHistogram> latency;
  if (flags.Has("latency")) latency = std::make_unique<LatencyHistogram>();
  LoopTotals totals;
  const bool started = RunConnections(
      client, connections, rounds,
      [&](int i) {
        return std::make_unique<Conn>(client, i, window, requests * (1 + i % 3), latency.get());
      },
      &totals);
  if (!started) return 1;
  printf("echo_client: connections=%d rounds=%d verified=%" PRIu64 " of %" PRIu64
         " teardowns_ok=%" PRIu64 " teardowns_late=%" PRIu64 " failures=%" PRIu64
         " setup_retries=%" PRIu64 "\n",
         connections, rounds, totals.verified, expected, totals.teardowns_ok, totals.teardowns_late,
         totals.failures, totals.setup_retries);
  if (latency != nullptr) latency->Print();
  client.Stop(flags);
  return totals.failures == 0 && totals.verified == expected ? 0 : 1;
}

}  // namespace
}  // namespace cqd::examples

int main(int argc, char** argv) {
  cqd::examples::Flags flags(
      argc, argv,
      "echo_client: many RC connections to echo_server, each checking every reply\n"
      "(examples/echo/README.md).\n\n"
      "usage: echo_client --server=HOST [flags]",
      {
          {"server", "HOST", "the server: a name, an IPv4 or an IPv6 address (required)"},
          {"port", "PORT", "the server's port, 1-65535 (default 7471)", 1, 65535},
          {"device", "NAME", "RDMA device (default: librdmacm's first)"},
          {"connections", "N", "connections at once (default 16)", 1, 4096},
          {"requests", "N", "requests per connection and round, times 1 + i % 3 (default 200)", 1,
           1073741824},
          {"window", "N", "requests outstanding per connection, at most 64 (default 8)", 1, 64},
          {"rounds", "N", "times each connection connects, runs and disconnects (default 2)", 1,
           1048576},
          {"pollers", "N", "poller threads (default 2)", 1, 256},
          {"consumers", "N", "consumer threads (default 2)", 1, 256},
          {"stats-json", "FILE|-", "write the runtime's stats as JSON there at exit"},
          {"latency", nullptr, "print the requests' round-trip times (p50, p99...) at the end"},
      });
  return cqd::examples::Run(flags);
}

// SPDX-License-Identifier: BSD-2-Clause
// benchmarks/pipelines.h: the dispatch pipelines the harness puts side by side.
//
// Every pipeline takes completions off simulated CQs in replay mode (an endless source with no
// producer thread, see SimCq::Replay), routes each by qp_num to its QP's handler, and calls the
// handler on the thread that owns the QP, one call per run of consecutive completions of one QP.
// They differ only in how completions travel from the polling thread to the handlers:
//   limit    no handoff: one thread polls and calls handlers itself (run to completion)
//   limit2   the same on two threads, each with its own CQ and half the QPs: the most two
//            threads can deliver, the bound for any two-thread handoff
//   handlers the handlers alone on the consumer's CPU, over the replay pattern: nothing polled,
//            nothing handed over; the consumer's floor
//   copy     the copy floor: the polled completions copied through a single-producer ring per
//            consumer to the other core, both sides spinning, and the handlers called; nothing
//            else (no depth, no lookup, no sleep): what moving the completions costs any handoff
//   cqd      the cqd runtime: one poller, `consumers` owned consumer threads, busy polling
//   cqd_rtc  the cqd runtime with one run-to-completion consumer: handlers on the poller thread
//   mutex    the strongest plain-mutex handoff: a preallocated vector per consumer, appended under
//            its mutex once per poll batch and swapped out whole by the consumer; the consumer
//            spins (idle_spin, as cqd's) before it blocks on a condition variable, and the
//            poller signals only a consumer that blocks
//   tbb      tbb::concurrent_bounded_queue per consumer carrying one pooled batch per poll batch
//   ceph     Ceph's RDMA receive path: the connection map locked once per poll batch,
//            completions grouped per connection, then per connection one lock of its own
//            queue, one append and one notification of its worker (a ready list the worker
//            spins on, then blocks: cheaper than Ceph's eventfd write per notification)
#ifndef CQD_BENCHMARKS_PIPELINES_H_
#define CQD_BENCHMARKS_PIPELINES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cqd/handler.h"
#include "cqd/sim.h"

namespace cqd::bench {

// Counts what it is given; one per QP.
class CountingHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    count.fetch_add(wcs.size(), std::memory_order_relaxed);
  }
  alignas(64) std::atomic<uint64_t> count{0};
};

struct PipelineConfig {
  std::string impl;  // limit, limit2, cqd, cqd_rtc, mutex, tbb, ceph, handlers, copy
  int batch = 32;    // completions per poll
  int qps = 1;
  int consumers = 1;  // handoff pipelines only
  // cqd only: CQs on the one poller, of which `active_cqs` replay traffic (the QPs spread over
  // them); the rest are registered, armed and idle.
  int cqs = 1;
  int active_cqs = 1;
  // The replayed completions come in a random order of QPs, every QP equally often (else round
  // robin).
  bool random_order = false;
  size_t queue_capacity = 1 << 16;
  // cqd only: true polls with busy_poll; false runs the default adaptive poller, which parks
  // idle CQs (RuntimeOptions::cq_park_after; parking is off under busy_poll).
  bool busy_poll = true;
  // CPU placement, the same for every pipeline: the polling thread on CPU cpu_base, consumer i
  // (or limit2's second thread) on CPU (cpu_base + 1 + i) % cpus. Off: the scheduler places them.
  bool pin = true;
  int cpu_base = 0;
  // Scaling: `shards` pairs of a polling thread and one consumer side by side, each with its own
  // CQ and `qps` QPs; shard s polls on CPU 2s and consumes on CPU 2s + 1. cqd and cqd_rtc: one
  // runtime with `shards` pollers (CQ s on poller s, its QPs on consumer s; cqd_rtc's consumer s
  // runs on poller s). The others: `shards` copies of the pipeline, copy s at cpu_base 2s.
  int shards = 1;
};

// Returns the CPU for consumer `i` under PipelineConfig::pin, counted from `base`.
int ConsumerCpu(int i, int base = 0);

// A running pipeline; Delivered() may be read from any thread while it runs.
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  virtual uint64_t Delivered() const = 0;
  virtual void Stop() = 0;  // stops and joins its threads
};

// Starts `config.impl` on a fresh simulated device; nullptr for an unknown impl.
std::unique_ptr<Pipeline> StartPipeline(const PipelineConfig& config);

}  // namespace cqd::bench

#endif  // CQD_BENCHMARKS_PIPELINES_H_

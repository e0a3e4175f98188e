// benchmarks/pipelines.h: the dispatch pipelines the harness puts side by side.
//
// Every pipeline takes completions off one simulated CQ in replay mode (an endless source with no
// producer thread, see SimCq::Replay), routes each by qp_num to its QP's handler, and calls the
// handler on the consumer thread that owns the QP, grouping consecutive completions of one QP into
// one call. They differ only in how completions travel from the polling thread to the consumers:
//   limit   no handoff: the polling thread calls handlers itself
//   cqd     the cqd runtime (moodycamel bulk enqueue, futex wakes)
//   mutex   std::mutex + std::deque per consumer, one lock per poll batch
//   tbb     tbb::concurrent_bounded_queue per consumer, one push per completion
//   ceph    map lookup under a global mutex per completion, then a mutex + deque push per
//           completion (the shape of Ceph's RDMADispatcher)
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
  std::string impl;     // limit, cqd, mutex, tbb, ceph
  int batch = 32;       // completions per poll
  int qps = 1;
  int consumers = 1;    // ignored by limit
  size_t queue_capacity = 1 << 16;
  // CPU placement, the same for every pipeline: the polling thread on CPU 0, consumer i on CPU
  // (1 + i) % cpus. Off: the scheduler places them.
  bool pin = true;
};

// Returns the CPU for consumer `i` under PipelineConfig::pin.
int ConsumerCpu(int i);

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

// SPDX-License-Identifier: BSD-2-Clause
#include "sim_engine.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <thread>
#include <utility>

#include "cqd/sim.h"

namespace engine {
namespace {

// Counts each wr_id. The runtime calls it for one QP one call at a time, each call
// happening-before the next; received() publishes the counts to the thread that waits.
class CountingHandler : public cqd::QpHandler {
 public:
  explicit CountingHandler(uint32_t count) : seen_(count + 1, 0) {}

  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    const uint64_t last = seen_.size() - 1;
    for (const ibv_wc& wc : wcs) {
      const bool good = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id < last;
      ++seen_[good ? wc.wr_id : last];
    }
    received_.fetch_add(wcs.size(), std::memory_order_release);
  }

  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  // The counts so far: once received() was read, or the QP unregistered.
  const std::vector<uint32_t>& seen() const { return seen_; }

 private:
  std::vector<uint32_t> seen_;
  std::atomic<uint64_t> received_{0};
};

}  // namespace

cqd::Result<std::vector<uint32_t>> DeliverOnSim(cqd::Runtime& runtime, cqd::ConsumerId consumer,
                                                uint32_t count) {
  std::shared_ptr<cqd::SimDevice> sim = cqd::SimDevice::Create();
  cqd::Result<cqd::DeviceId> dev = runtime.AddSimDevice(sim);
  if (!dev.ok()) return dev.status();
  cqd::Result<cqd::CqHandle> cq = runtime.CreateCq(*dev, /*shard=*/0, {.depth = 1024});
  if (!cq.ok()) return cq.status();
  cqd::Result<cqd::SimQp*> qp =
      sim->CreateQp(cq->sim(), cq->sim(), {.max_send_wr = 16, .max_recv_wr = 16});
  if (!qp.ok()) return qp.status();

  CountingHandler handler(count);
  cqd::Result<cqd::Registration> reg = runtime.RegisterQp(**qp, handler, consumer);
  if (!reg.ok()) return reg.status();
  for (uint32_t k = 0; k < count; ++k) {
    while ((*qp)->Complete(k) != 1) std::this_thread::yield();  // CQ full: the poller catches up
  }
  // Not a timing check: only how long to wait before calling a completion lost.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (handler.received() < count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  reg->Unregister();  // the handler is never called again once this returns
  std::vector<uint32_t> seen = handler.seen();

  if (cqd::Status s = sim->DestroyQp(*qp); !s.ok()) return s;
  if (cqd::Status s = runtime.DestroyCq(*cq); !s.ok()) return s;
  return seen;
}

}  // namespace engine

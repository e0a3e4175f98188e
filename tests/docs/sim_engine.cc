// SPDX-License-Identifier: BSD-2-Clause
// tests/docs/sim_engine.cc: the README's complete engine on the simulated device, built and run
// by //tests/docs:sim_engine_test (it exits 0 once its handler has every completion, in order).
// The README shows the region below; snippets_test checks that it is this text.
// [snippet sim-engine]
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <span>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"

// Runs on the QP's consumer thread, one batch of this QP's completions at a time, in order.
class Counter : public cqd::QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) in_order_ = in_order_ && wc.wr_id == next_++;
    received_.store(next_, std::memory_order_release);
  }
  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  bool in_order() const { return in_order_; }  // read once received() says all came

 private:
  uint64_t next_ = 0;  // the consumer thread's
  bool in_order_ = true;
  std::atomic<uint64_t> received_{0};
};

int main() {
  cqd::RuntimeOptions options;  // one poller thread, one runtime-owned consumer thread
  auto rt = cqd::Runtime::Create(options).value();
  std::shared_ptr<cqd::SimDevice> sim = cqd::SimDevice::Create();
  cqd::DeviceId dev = rt->AddSimDevice(sim).value();
  cqd::CqHandle cq = rt->CreateCq(dev, /*shard=*/0, {.depth = 256}).value();
  cqd::SimQp* qp =
      sim->CreateQp(cq.sim(), cq.sim(), {.max_send_wr = 16, .max_recv_wr = 16}).value();
  Counter handler;
  cqd::Registration reg = rt->RegisterQp(*qp, handler, /*consumer=*/0).value();

  constexpr uint64_t kCompletions = 10000;
  for (uint64_t wr_id = 0; wr_id < kCompletions; ++wr_id) {
    while (qp->Complete(wr_id) != 1) std::this_thread::yield();  // CQ full: the poller drains it
  }
  while (handler.received() < kCompletions) std::this_thread::yield();

  reg.Unregister();  // from here on the handler is never called again
  const bool ok = handler.in_order() && sim->DestroyQp(qp).ok() && rt->DestroyCq(cq).ok() &&
                  rt->Shutdown().ok();
  std::printf("sim_engine: %llu completions, %s\n",
              static_cast<unsigned long long>(handler.received()), ok ? "in order" : "FAILED");
  return ok ? 0 : 1;
}
// [end sim-engine]

// SPDX-License-Identifier: BSD-2-Clause
// tests/pkgconfig/consumer.cc: an engine built outside Bazel against the installed cqd
// (g++ -std=c++20 consumer.cc $(pkg-config --cflags --libs cqd)); run by pkgconfig_test.sh and
// the Debian autopkgtest, and shipped by libcqd-doc as its example (with a Makefile: `make check`).
//
// Creates a runtime with one poller and one runtime-owned consumer, a simulated device, a CQ and
// two QPs, completes kPerQp work requests on each, and checks that each QP's handler got all of
// them, in order, on one thread. Prints "consumer: OK <n> completions" and exits 0, or says
// what went wrong and exits 1. Built with -DCQD_CONSUMER_TBB against the oneTBB layer
// ($(pkg-config --cflags --libs cqd-tbb), or CMake's cqd::tbb), the consumer is engine-driven and
// a oneTBB arena drains it (cqd/tbb.h's ArenaConsumers) instead.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/version.h"
#ifdef CQD_CONSUMER_TBB
#include <oneapi/tbb/task_arena.h>

#include "cqd/tbb.h"
#endif

namespace {

constexpr uint64_t kPerQp = 1000;

class CountingHandler : public cqd::QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id != next_ || wc.status != IBV_WC_SUCCESS) bad_.fetch_add(1);
      next_ = wc.wr_id + 1;
    }
    received_.fetch_add(wcs.size(), std::memory_order_release);
  }
  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  uint64_t bad() const { return bad_.load(); }

 private:
  uint64_t next_ = 0;  // consumer thread only
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> bad_{0};
};

int Fail(const char* what, const cqd::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  // The library linked in is the one the headers describe.
  const cqd::VersionInfo version = cqd::Version();
  if (std::strcmp(version.string, CQD_VERSION_STRING) != 0 || version.major != CQD_VERSION_MAJOR ||
      version.minor != CQD_VERSION_MINOR || version.patch != CQD_VERSION_PATCH) {
    std::fprintf(stderr, "consumer: cqd::Version() is %s, the headers say %s\n", version.string,
                 CQD_VERSION_STRING);
    return 1;
  }
  cqd::RuntimeOptions options;
  options.pollers = 1;
  options.consumers = {cqd::ConsumerOptions{.name = "engine"}};
#ifdef CQD_CONSUMER_TBB
  options.consumers[0].kind = cqd::ConsumerKind::kEngineDriven;
#endif
  auto rt = cqd::Runtime::Create(options);
  if (!rt.ok()) return Fail("Runtime::Create", rt.status());
#ifdef CQD_CONSUMER_TBB
  tbb::task_arena arena(2);
  auto drained = cqd::ArenaConsumers::Create(**rt, arena, {.consumers = {0}});
  if (!drained.ok()) return Fail("ArenaConsumers::Create", drained.status());
#endif

  std::shared_ptr<cqd::SimDevice> sim = cqd::SimDevice::Create();
  auto dev = (*rt)->AddSimDevice(sim);
  if (!dev.ok()) return Fail("AddSimDevice", dev.status());
  auto cq = (*rt)->CreateCq(*dev, /*shard=*/0, {.depth = 4096});
  if (!cq.ok()) return Fail("CreateCq", cq.status());

  CountingHandler handlers[2];
  cqd::SimQp* qps[2] = {};
  cqd::Registration regs[2];
  for (int i = 0; i < 2; ++i) {
    auto qp = sim->CreateQp(cq->sim(), cq->sim(), {.max_send_wr = 16, .max_recv_wr = 16});
    if (!qp.ok()) return Fail("SimDevice::CreateQp", qp.status());
    qps[i] = *qp;
    auto reg = (*rt)->RegisterQp(*qps[i], handlers[i], /*consumer=*/0);
    if (!reg.ok()) return Fail("RegisterQp", reg.status());
    regs[i] = std::move(reg).value();
  }

  // Complete in steps the CQ can hold; the handlers run on the runtime's consumer thread.
  for (uint64_t k = 0; k < kPerQp; ++k) {
    for (cqd::SimQp* qp : qps) {
      while (qp->Complete(k) != 1) std::this_thread::yield();  // CQ full: wait for the poller
    }
  }
  // Not a timing check: only a bound on how long to wait before calling it lost.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (handlers[0].received() < kPerQp || handlers[1].received() < kPerQp) {
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  for (auto& reg : regs) reg.Unregister();
#ifdef CQD_CONSUMER_TBB
  if (cqd::Status s = (*drained)->Stop(); !s.ok()) return Fail("ArenaConsumers::Stop", s);
#endif
  const cqd::Stats stats = (*rt)->GetStats();
  int rc = 0;
  for (int i = 0; i < 2; ++i) {
    if (handlers[i].received() != kPerQp || handlers[i].bad() != 0) {
      std::fprintf(stderr, "consumer: QP %d: %llu of %llu completions, %llu out of order\n", i,
                   static_cast<unsigned long long>(handlers[i].received()),
                   static_cast<unsigned long long>(kPerQp),
                   static_cast<unsigned long long>(handlers[i].bad()));
      rc = 1;
    }
  }
  if (stats.consumers.size() != 1 || stats.consumers[0].delivered != 2 * kPerQp) {
    std::fprintf(stderr, "consumer: Stats do not show %llu delivered completions\n",
                 static_cast<unsigned long long>(2 * kPerQp));
    rc = 1;
  }
  for (cqd::SimQp* qp : qps) {
    if (cqd::Status s = sim->DestroyQp(qp); !s.ok()) return Fail("DestroyQp", s);
  }
  if (cqd::Status s = (*rt)->DestroyCq(*cq); !s.ok()) return Fail("DestroyCq", s);
  if (cqd::Status s = (*rt)->Shutdown(); !s.ok()) return Fail("Shutdown", s);
  if (rc == 0) {
    std::printf("consumer: OK %llu completions\n", static_cast<unsigned long long>(2 * kPerQp));
  }
  return rc;
}

// SPDX-License-Identifier: BSD-2-Clause
// Shutdown with traffic in flight returns, and everything already polled is delivered to a
// handler or the orphan handler: nothing polled is lost.
#include <chrono>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Topology;
using testing::WaitFor;

uint64_t Polled(const Stats& s) { return testing::SumPollers(s, &PollerStats::completions); }

TEST(Shutdown, UnderFullLoadLosesNothingPolled) {
  testing::OrphanLedger orphans;
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.orphan_handler = &orphans;
  for (auto& c : options.consumers) c.queue_capacity = 256;  // keep pollers in backpressure too
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 4, 64, /*depth=*/256));
  SimTrafficOptions traffic;
  traffic.qps = topo.qps;
  traffic.completions_per_qp = 1'000'000'000;  // never finishes on its own
  SimTrafficSource source(traffic);
  source.Start();
  ASSERT_TRUE(WaitFor([&] { return topo.received() > 100000; }));
  CQD_ASSERT_OK(topo.rt->Shutdown());
  source.Stop();
  source.Join();
  Stats s = topo.rt->GetStats();
  EXPECT_GT(Polled(s), 100000u);
  EXPECT_EQ(topo.received() + orphans.count.load(), Polled(s));
  for (const auto& c : s.consumers) EXPECT_EQ(c.queue_depth, 0u);
  for (const auto& h : topo.handlers) EXPECT_EQ(h->out_of_order(), 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(Shutdown, EngineDrivenConsumerDrainsAfterShutdown) {
  testing::OrphanLedger orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 2));
  for (uint64_t i = 0; i < 500; ++i) {
    ASSERT_EQ(topo.qps[0]->Complete(i), 1);
    ASSERT_EQ(topo.qps[1]->Complete(i), 1);
  }
  ASSERT_TRUE(WaitFor([&] { return Polled(topo.rt->GetStats()) == 1000; }));
  CQD_ASSERT_OK(topo.rt->Shutdown());
  while (topo.rt->Drain(0, 64) > 0) {
  }
  EXPECT_EQ(topo.received(), 1000u);
  EXPECT_EQ(orphans.count.load(), 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(Shutdown, UndrainedItemsGoToOrphansAtDestruction) {
  testing::OrphanLedger orphans;
  {
    RuntimeOptions options;
    options.orphan_handler = &orphans;
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
    Topology topo;
    CQD_ASSERT_OK(topo.Build(options, 1, 1));
    for (uint64_t i = 0; i < 300; ++i) ASSERT_EQ(topo.qps[0]->Complete(i), 1);
    ASSERT_TRUE(WaitFor([&] { return Polled(topo.rt->GetStats()) == 300; }));
    for (auto& r : topo.registrations) r.Unregister();
    CQD_ASSERT_OK(topo.sim->DestroyQp(topo.qps[0]));
    topo.qps.clear();
    // The runtime is destroyed with 300 items queued and nobody draining them.
  }
  EXPECT_EQ(orphans.count.load(), 300u);
}

// After Shutdown the pollers are stopped, and DestroyCq polls the CQ out on the calling thread,
// which holds the runtime's mutex meanwhile: the OrphanHandler runs there in a poller's place,
// and its calls are refused as on a poller (handler.h) instead of waiting for that mutex, held by
// their own thread.
class CallingOrphans : public OrphanHandler {
 public:
  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
    count += wcs.size();
    if (rt == nullptr) return;
    const Stats stats = rt->GetStats();  // leaves out the CQs, never waits
    stats_orphans = stats.orphans;
    create = rt->CreateCq(device, 0, {}).status();
    other->Unregister();  // does nothing here
  }
  Runtime* rt = nullptr;
  DeviceId device = 0;
  Registration* other = nullptr;
  uint64_t count = 0;
  uint64_t stats_orphans = 0;
  Status create;
};

TEST(Shutdown, AnOrphanHandlerRunByDestroyCqAfterShutdownIsRefused) {
  CallingOrphans orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, /*num_cqs=*/2, /*num_qps=*/2));  // QP i on CQ i
  CQD_ASSERT_OK(topo.rt->Shutdown());
  ASSERT_EQ(topo.qps[0]->Complete(7), 1);  // no poller runs: it stays in CQ 0
  topo.registrations[0].Unregister();
  CQD_ASSERT_OK(topo.sim->DestroyQp(topo.qps[0]));
  orphans.rt = topo.rt.get();
  orphans.device = topo.dev;
  orphans.other = &topo.registrations[1];
  CQD_ASSERT_OK(topo.rt->DestroyCq(topo.cqs[0]));  // hung here before: the handler's GetStats
  orphans.rt = nullptr;
  EXPECT_EQ(orphans.count, 1u);
  EXPECT_EQ(orphans.stats_orphans, 1u) << "GetStats on a runtime thread leaves out only the CQs";
  EXPECT_EQ(orphans.create.code(), StatusCode::kFailedPrecondition) << orphans.create.ToString();
  EXPECT_TRUE(topo.registrations[1].registered());
  topo.qps.erase(topo.qps.begin());
  topo.cqs.erase(topo.cqs.begin());
  CQD_ASSERT_OK(topo.TearDown());
}

// Runtime::Create whose start fails inside a cqd callback (here: a handler of another runtime;
// the stats socket's directory does not exist) returns its status: the runtime it began ran no
// callback, so stopping it waits for nobody's, and nothing terminates.
TEST(Shutdown, ACreateThatFailsInsideACallbackReturnsItsStatus) {
  struct Creating : QpHandler {
    Status created = Internal("not called");
    std::atomic<bool> done{false};
    void OnCompletions(std::span<const ibv_wc>) noexcept override {
      if (done.load(std::memory_order_relaxed)) return;
      RuntimeOptions options;
      options.stats_socket = "/nonexistent-cqd-dir/stats.sock";
      testing::Bed other;
      created = other.CreateRuntime(options);
      done.store(true, std::memory_order_release);
    }
  } handler;
  testing::OneQp one;
  CQD_ASSERT_OK(one.Build(testing::OwnedConsumers(1, 1)));
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(testing::InjectRecvs(one.qp, 0, 1));
  ASSERT_TRUE(testing::WaitFor([&] { return handler.done.load(std::memory_order_acquire); }));
  EXPECT_EQ(handler.created.code(), StatusCode::kInternal) << handler.created.ToString();
  EXPECT_NE(handler.created.message().find("nonexistent-cqd-dir"), std::string::npos)
      << handler.created.ToString();
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
}

// Destroying a runtime from a cqd callback (here: a handler of another runtime) cannot refuse and
// cannot go on (it would join threads still running): the process terminates, saying why,
// instead of freeing what those threads use.
class DestroyingHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc>) noexcept override { victim->reset(); }
  std::unique_ptr<Runtime>* victim = nullptr;
};

void DestroyAnotherRuntimeFromAHandler() {
  testing::Bed a, victim;
  if (!a.StartWithoutLedger(testing::OwnedConsumers(1, 1)).ok()) return;
  if (!victim.CreateRuntime(RuntimeOptions{}).ok()) return;
  auto cq = a.rt->CreateCq(a.dev, 0);
  if (!cq.ok()) return;
  auto qp = a.sim->CreateQp(cq->sim(), cq->sim());
  if (!qp.ok()) return;
  DestroyingHandler handler;
  handler.victim = &victim.rt;
  auto reg = a.rt->RegisterQp(**qp, handler, 0);
  if (!reg.ok() || !testing::InjectRecvs(*qp, 0, 1)) return;
  std::this_thread::sleep_for(std::chrono::seconds(30));  // the handler ends the process first
}

TEST(ShutdownDeathTest, DestroyingARuntimeFromACallbackTerminates) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(DestroyAnotherRuntimeFromAHandler(), "~Runtime: .*the process terminates");
}

}  // namespace
}  // namespace cqd

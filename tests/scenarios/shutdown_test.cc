// SPDX-License-Identifier: BSD-2-Clause
// Shutdown with traffic in flight returns, and everything already polled is delivered to a
// handler or the orphan handler: nothing polled is lost.
#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/test_util.h"

namespace cqd {
namespace {

using testing::SimTopology;
using testing::WaitFor;

uint64_t Polled(const Stats& s) { return testing::SumPollers(s, &PollerStats::completions); }

TEST(Shutdown, UnderFullLoadLosesNothingPolled) {
  testing::CountingOrphans orphans;
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.orphan_handler = &orphans;
  for (auto& c : options.consumers) c.queue_capacity = 256;  // keep pollers in backpressure too
  SimTopology topo;
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
  testing::CountingOrphans orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  SimTopology topo;
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
  testing::CountingOrphans orphans;
  {
    RuntimeOptions options;
    options.orphan_handler = &orphans;
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
    SimTopology topo;
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

}  // namespace
}  // namespace cqd

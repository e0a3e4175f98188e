// SPDX-License-Identifier: BSD-2-Clause
// Exactly-once, in-order delivery under load: 4 CQs on 2 pollers, 3 consumers, 1000 QPs and
// 10^6 completions, each carrying its per-QP sequence number in wr_id (docs/DESIGN.md section 4).
#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Topology;
using testing::WaitFor;

void RunExactlyOnce(RuntimeOptions options) {
  constexpr int kCqs = 4;
  constexpr int kQps = 1000;
  constexpr uint64_t kPerQp = 1000;  // 10^6 in all
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, kCqs, kQps, /*depth=*/1024));

  // Two sources, each feeding half the QPs, so CQs see interleaved producers.
  SimTrafficOptions a, b;
  for (int i = 0; i < kQps; ++i) (i % 2 ? a : b).qps.push_back(topo.qps[i]);
  a.completions_per_qp = b.completions_per_qp = kPerQp;
  a.burst = 7;
  b.burst = 32;
  SimTrafficSource source_a(a), source_b(b);
  source_a.Start();
  source_b.Start();
  source_a.Join();
  source_b.Join();
  ASSERT_EQ(source_a.injected() + source_b.injected(), kQps * kPerQp);

  ASSERT_TRUE(WaitFor([&] { return topo.received() == kQps * kPerQp; }))
      << "delivered " << topo.received() << " of " << kQps * kPerQp;
  for (const auto& h : topo.handlers) {
    ASSERT_EQ(h->received(), kPerQp) << "qp " << h->qp_num;
    ASSERT_EQ(h->out_of_order(), 0u) << "qp " << h->qp_num;
    ASSERT_EQ(h->wrong_qp(), 0u) << "qp " << h->qp_num;
    ASSERT_EQ(h->concurrent_calls(), 0u) << "qp " << h->qp_num;
  }
  Stats stats = topo.rt->GetStats();
  uint64_t delivered = 0;
  for (const auto& c : stats.consumers) delivered += c.delivered;
  EXPECT_EQ(delivered, kQps * kPerQp);
  EXPECT_EQ(testing::SumPollers(stats, &PollerStats::completions), kQps * kPerQp);
  EXPECT_EQ(stats.orphans, 0u);
  for (const auto& c : stats.consumers) EXPECT_GT(c.delivered, 0u) << c.name;
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(ExactlyOnce, AdaptivePollingThreeConsumers) {
  RuntimeOptions options = testing::OwnedConsumers(2, 3);
  options.idle_budget = std::chrono::microseconds(20);
  RunExactlyOnce(options);
}

TEST(ExactlyOnce, SmallQueuesForceBackpressure) {
  RuntimeOptions options = testing::OwnedConsumers(2, 3);
  for (auto& c : options.consumers) {
    c.queue_capacity = 64;
    c.dispatch_batch = 16;
  }
  options.poll_batch = 16;
  RunExactlyOnce(options);
}

}  // namespace
}  // namespace cqd

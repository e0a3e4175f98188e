// SPDX-License-Identifier: BSD-2-Clause
// Exactly-once, in-order delivery under load: 4 CQs on 2 pollers, 3 consumers, 1000 QPs and
// 10^6 completions, each carrying its per-QP sequence number in wr_id (docs/DESIGN.md section 4);
// and the same with more registrations than one chunk of slots, where consumers also prefetch
// each run's handler (Consumer::HandlersCold).
#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Topology;
using testing::WaitFor;

void RunExactlyOnce(RuntimeOptions options, int qps = 1000, uint64_t per_qp = 1000) {
  constexpr int kCqs = 4;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, kCqs, qps, /*depth=*/1024));

  // Two sources, each feeding half the QPs, so CQs see interleaved producers.
  SimTrafficOptions a, b;
  for (int i = 0; i < qps; ++i) (i % 2 ? a : b).qps.push_back(topo.qps[i]);
  a.completions_per_qp = b.completions_per_qp = per_qp;
  a.burst = 7;
  b.burst = 32;
  SimTrafficSource source_a(a), source_b(b);
  source_a.Start();
  source_b.Start();
  source_a.Join();
  source_b.Join();
  ASSERT_EQ(source_a.injected() + source_b.injected(), qps * per_qp);

  ASSERT_TRUE(WaitFor([&] { return topo.received() == qps * per_qp; }))
      << "delivered " << topo.received() << " of " << qps * per_qp;
  for (const auto& h : topo.handlers) {
    ASSERT_EQ(h->received(), per_qp) << "qp " << h->qp_num;
    ASSERT_EQ(h->out_of_order(), 0u) << "qp " << h->qp_num;
    ASSERT_EQ(h->wrong_qp(), 0u) << "qp " << h->qp_num;
    ASSERT_EQ(h->concurrent_calls(), 0u) << "qp " << h->qp_num;
  }
  Stats stats = topo.rt->GetStats();
  uint64_t delivered = 0;
  for (const auto& c : stats.consumers) delivered += c.delivered;
  EXPECT_EQ(delivered, qps * per_qp);
  EXPECT_EQ(testing::SumPollers(stats, &PollerStats::completions), qps * per_qp);
  EXPECT_EQ(stats.orphans, 0u);
  for (const auto& c : stats.consumers) EXPECT_GT(c.delivered, 0u) << c.name;
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(ExactlyOnce, AdaptivePollingThreeConsumers) {
  RuntimeOptions options = testing::OwnedConsumers(2, 3);
  options.idle_budget = std::chrono::microseconds(20);
  RunExactlyOnce(options);
}

TEST(ExactlyOnce, MoreRegistrationsThanOneChunkOfSlots) {
  RuntimeOptions options = testing::OwnedConsumers(2, 3);
  options.idle_budget = std::chrono::microseconds(20);
  RunExactlyOnce(options, /*qps=*/5000, /*per_qp=*/60);  // 3 x 10^5 in all
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

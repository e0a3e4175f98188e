// SPDX-License-Identifier: BSD-2-Clause
// Amortized acks (S2, S3): every completion event is acked exactly once, in at most
// events / threshold + (one flush per CQ) ibv_ack_cq_events calls, and CQ destroy never hangs,
// even while events race with it.
#include <atomic>
#include <random>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Topology;
using testing::WaitFor;

TEST(Acks, BatchedAndFlushedAtDestroy) {
  constexpr uint32_t kThreshold = 4;
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(0);
  options.ack_threshold = kThreshold;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 2));
  for (uint64_t i = 0; i < 100; ++i) {
    ASSERT_EQ(topo.qps[i % 2]->Complete(i / 2), 1);
    ASSERT_TRUE(WaitFor([&] { return topo.received() == i + 1; }));
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // let the poller sleep again
  }
  Stats before = topo.rt->GetStats();
  ASSERT_GT(before.cq_events, 2u * kThreshold) << "too few events to check batching";
  EXPECT_EQ(before.cq_acked_events, before.cq_ack_calls * kThreshold)
      << "below the destroy flush, every ack call covers exactly one threshold";
  // Destroy returns only if every event read was acked (the simulated device waits, as verbs).
  CQD_ASSERT_OK(topo.TearDown());
  Stats after = topo.rt->GetStats();
  EXPECT_EQ(after.cq_events, before.cq_events);
  EXPECT_EQ(after.cq_acked_events, after.cq_events);
  EXPECT_LE(after.cq_ack_calls, after.cq_events / kThreshold + 2);
}

// CQs created and destroyed while completions and spurious events (S5) arrive: destroy must
// neither hang on an unacked event nor ack one twice.
TEST(Acks, DestroyRacingEvents) {
  RuntimeOptions options = testing::OwnedConsumers(2, 1);
  options.idle_budget = std::chrono::microseconds(0);
  options.ack_threshold = 3;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  std::mt19937 rng(99);
  for (int round = 0; round < 300; ++round) {
    CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, round % 2));
    CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
    testing::Recorder handler;
    handler.qp_num = qp->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
    int n = 1 + rng() % 3;
    for (int i = 0; i < n; ++i) ASSERT_EQ(qp->Complete(i), 1);
    ASSERT_TRUE(WaitFor([&] { return handler.received() == uint64_t(n); }));
    for (int i = rng() % 3; i > 0; --i) sim->AddSpuriousEvent(cq.sim());
    if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
    reg.Unregister();
    CQD_ASSERT_OK(sim->DestroyQp(qp));
    CQD_ASSERT_OK(rt->DestroyCq(cq));
  }
  Stats s = rt->GetStats();
  EXPECT_GT(s.cq_events, 0u);
  EXPECT_EQ(s.cq_acked_events, s.cq_events);
}

// An event is counted before it is acked, and a Stats snapshot taken while events stream in
// never shows more acked than read (per CQ and in total). (Found by the fuzzer: GetStats read
// the two counters in the other order.)
TEST(Acks, SnapshotNeverShowsMoreAckedThanRead) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.ack_threshold = 1;  // every event acked at once: the closest race
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  std::atomic<bool> stop{false};
  std::thread events([&] {
    while (!stop.load()) sim->AddSpuriousEvent(cq.sim());
  });
  uint64_t snapshots = 0, bad = 0, seen_events = 0;
  while (seen_events < 20000 && snapshots < 5000000) {
    Stats s = rt->GetStats();
    ++snapshots;
    if (s.cq_acked_events > s.cq_events) ++bad;
    for (const CqStats& c : s.cqs) {
      if (c.acked_events > c.events) ++bad;
    }
    seen_events = s.cq_events;
  }
  stop.store(true);
  events.join();
  EXPECT_EQ(bad, 0u) << "of " << snapshots << " snapshots";
  EXPECT_GT(seen_events, 0u);
  CQD_ASSERT_OK(rt->DestroyCq(cq));
  Stats s = rt->GetStats();
  EXPECT_EQ(s.cq_acked_events, s.cq_events);
}

}  // namespace
}  // namespace cqd

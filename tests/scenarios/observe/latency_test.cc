// SPDX-License-Identifier: BSD-2-Clause
// The poll -> dispatch latency histogram: its buckets, its percentiles, and what it records.
#include <string>
#include <vector>

#include "tests/scenarios/observe/observe_checks.h"

namespace cqd::observe_test {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::WaitFor;

TEST(LatencyHistogram, BucketsCoverEveryValueNarrowly) {
  using internal::LatencyHistogram;
  uint32_t last_index = 0;
  for (uint64_t v = 0; v <= 0xffffffffu; v = v < 4096 ? v + 1 : v + v / 1000 + 1) {
    const uint32_t index = LatencyHistogram::Index(static_cast<uint32_t>(v));
    ASSERT_LT(index, LatencyHistogram::kBuckets);
    ASSERT_GE(index, last_index) << "not monotonic at " << v;
    last_index = index;
    const uint64_t upper = LatencyHistogram::UpperBound(index);
    const uint64_t lower = index == 0 ? 0 : LatencyHistogram::UpperBound(index - 1) + 1;
    ASSERT_LE(lower, v);
    ASSERT_GE(upper, v);
    ASSERT_LE(upper - lower, std::max<uint64_t>(1, lower / 16)) << "too wide at " << v;
  }
  EXPECT_EQ(LatencyHistogram::Index(0xffffffffu), LatencyHistogram::kBuckets - 1);
  // Every power of two is a bucket's upper bound (what the Prometheus ladder relies on).
  for (int k = 0; k <= 32; ++k) {
    const uint64_t p = uint64_t{1} << k;
    if (p > 0xffffffffu) {
      EXPECT_EQ(LatencyHistogram::UpperBound(LatencyHistogram::kBuckets - 1), p);
      continue;
    }
    const uint32_t index = LatencyHistogram::Index(static_cast<uint32_t>(p));
    EXPECT_EQ(LatencyHistogram::UpperBound(index), p) << k;
  }
}

TEST(LatencyHistogram, PercentilesAreOrderedAndBounded) {
  internal::LatencyHistogram h;
  EXPECT_EQ(h.Snapshot().count, 0u);
  h.Record(100, 500);
  h.Record(1000, 400);
  h.Record(10000, 90);
  h.Record(100000, 9);
  h.Record(1000000, 1);
  LatencyStats s = h.Snapshot();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_EQ(s.sum_ns, 100u * 500 + 1000u * 400 + 10000u * 90 + 100000u * 9 + 1000000u);
  EXPECT_EQ(s.max_ns, 1000000u);
  EXPECT_GE(s.p50_ns, 100u);
  EXPECT_LE(s.p50_ns, 100u + 100 / 16 + 1);
  EXPECT_GE(s.p90_ns, 1000u);
  EXPECT_LE(s.p90_ns, 1000u + 1000 / 16 + 1);
  EXPECT_GE(s.p99_ns, 10000u);
  EXPECT_LE(s.p99_ns, 10000u + 10000 / 16 + 1);
  EXPECT_GE(s.p999_ns, 100000u);
  EXPECT_LE(s.p999_ns, s.max_ns);
  uint64_t total = 0;
  for (const auto& b : s.buckets) total += b.count;
  EXPECT_EQ(total, s.count);
  EXPECT_EQ(s.buckets.size(), 5u);
}

// Traffic through a runtime whose consumers record latency: one figure per completion.
TEST(LatencyHistogram, RecordsEveryDeliveredCompletion) {
  RuntimeOptions options = testing::EngineAndOwned(2);
  for (auto& c : options.consumers) c.record_latency = true;
  testing::Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 4));
  constexpr uint64_t kPerQp = 500;
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, kPerQp));
  ASSERT_TRUE(testing::DrainUntil(*topo.rt, 0,
                                  [&] { return topo.received() == kPerQp * topo.qps.size(); }));
  const Stats s = topo.rt->GetStats();
  uint64_t recorded = 0;
  for (const ConsumerStats& c : s.consumers) {
    SCOPED_TRACE(c.name);
    const LatencyStats& l = c.latency;
    EXPECT_TRUE(l.enabled);
    EXPECT_EQ(l.count, c.delivered);
    EXPECT_EQ(l.count, kPerQp * 2) << "two QPs per consumer";
    EXPECT_GT(l.p50_ns, 0u);
    EXPECT_LE(l.p50_ns, l.p90_ns);
    EXPECT_LE(l.p90_ns, l.p99_ns);
    EXPECT_LE(l.p99_ns, l.p999_ns);
    EXPECT_LE(l.p999_ns, l.max_ns);
    EXPECT_GE(l.sum_ns, l.count) << "each latency is at least 1 ns";
    uint64_t total = 0;
    for (const auto& b : l.buckets) total += b.count;
    EXPECT_EQ(total, l.count);
    recorded += l.count;
  }
  EXPECT_EQ(recorded, kPerQp * topo.qps.size());
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(LatencyHistogram, OffByDefault) {
  testing::Topology topo;
  CQD_ASSERT_OK(topo.Build(testing::OwnedConsumers(1, 2), 1, 2));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 100));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));
  for (const ConsumerStats& c : topo.rt->GetStats().consumers) {
    EXPECT_FALSE(c.latency.enabled);
    EXPECT_EQ(c.latency.count, 0u);
    EXPECT_TRUE(c.latency.buckets.empty());
    EXPECT_EQ(c.delivered, 100u);
  }
  CQD_ASSERT_OK(topo.TearDown());
}

// One consumer records, the other does not: only the first has figures.
TEST(LatencyHistogram, PerConsumer) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  options.consumers[1].record_latency = true;
  testing::Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 2));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 100));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));
  const Stats s = topo.rt->GetStats();
  EXPECT_EQ(s.consumers[0].latency.count, 0u);
  EXPECT_EQ(s.consumers[1].latency.count, 100u);
  CQD_ASSERT_OK(topo.TearDown());
}

// ---- the endpoint ----

}  // namespace
}  // namespace cqd::observe_test

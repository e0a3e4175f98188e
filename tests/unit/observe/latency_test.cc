// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/latency.h from the consumer's side: RecordBatch records each run of one poll's
// completions (one stamp) once, for as many as the run holds, skips what is not a completion,
// and takes `now - stamp` modulo 2^32 (a stamp from before the 32-bit clock wrapped); and the
// histogram's buckets end at powers of two, so that the Prometheus ladder of powers of two
// (cqd/stats_format.h) counts exactly the latencies at or below each `le`.
#include "runtime/observe/latency.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cqd/stats_format.h"
#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

enum class Kind { kCompletion, kEvent };
struct Item {
  Kind kind;
  uint32_t stamp;
};

TEST(LatencyRecordBatch, EachRunOfOneStampIsOneRecordOfItsLength) {
  LatencyHistogram h;
  const Item items[] = {{Kind::kCompletion, 100}, {Kind::kCompletion, 100},
                        {Kind::kEvent, 100},      {Kind::kCompletion, 100},
                        {Kind::kCompletion, 90},  {Kind::kCompletion, 90}};
  h.RecordBatch(items, std::size(items), Kind::kCompletion, /*now=*/200);
  const LatencyStats s = h.Snapshot();
  EXPECT_EQ(s.count, 5u) << "the event is no completion";
  EXPECT_EQ(s.sum_ns, 3u * 100 + 2u * 110);
  EXPECT_EQ(s.max_ns, 110u);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_EQ(s.buckets[0].upper_ns, LatencyHistogram::UpperBound(LatencyHistogram::Index(100)));
  EXPECT_EQ(s.buckets[0].count, 3u);
  EXPECT_EQ(s.buckets[1].upper_ns, LatencyHistogram::UpperBound(LatencyHistogram::Index(110)));
  EXPECT_EQ(s.buckets[1].count, 2u);
  h.RecordBatch(items, 0, Kind::kCompletion, 200);  // an empty batch records nothing
  EXPECT_EQ(h.Snapshot().count, 5u);
}

TEST(LatencyRecordBatch, AStampFromBeforeTheClockWrappedIsRecordedModulo2To32) {
  LatencyHistogram h;
  const Item items[] = {{Kind::kCompletion, 0xfffffff0u}};
  h.RecordBatch(items, 1, Kind::kCompletion, /*now=*/5);
  const LatencyStats s = h.Snapshot();
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.sum_ns, 21u);
  EXPECT_EQ(s.max_ns, 21u);
}

TEST(LatencyHistogram, NothingRecordedIsAllZeroButEnabled) {
  const LatencyStats s = LatencyHistogram().Snapshot();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.p50_ns, 0u);
  EXPECT_EQ(s.max_ns, 0u);
  EXPECT_TRUE(s.buckets.empty());
  EXPECT_EQ(LatencyHistogram::Percentile(s, 0.99), 0u);
}

// cqd_consumer_latency_seconds_bucket of the consumer, by its `le` in nanoseconds.
std::map<double, double> Ladder(const std::string& text) {
  std::map<double, double> ladder;
  const std::string name = "cqd_consumer_latency_seconds_bucket{";
  for (size_t pos = 0; (pos = text.find(name, pos)) != std::string::npos;) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end;
    const size_t le = line.find("le=\"");
    const std::string bound = line.substr(le + 4, line.find('"', le + 4) - le - 4);
    const double value = std::stod(line.substr(line.rfind(' ') + 1));
    ladder[bound == "+Inf" ? INFINITY : std::stod(bound) * 1e9] = value;
  }
  return ladder;
}

TEST(LatencyHistogram, ThePrometheusLadderCountsExactlyWhatIsAtOrBelowEachPowerOfTwo) {
  LatencyHistogram h;
  // On each power of two, and one past it, up to the top of the 32-bit range.
  std::vector<uint64_t> recorded;
  for (int k = 4; k <= 31; ++k) {
    const uint32_t p = uint32_t{1} << k;
    h.Record(p, 1);
    h.Record(p + 1, 2);
    recorded.insert(recorded.end(), {p, p + 1, p + 1});
  }
  h.Record(3, 1);  // below the first rung
  recorded.push_back(3);
  Stats stats;
  stats.consumers.resize(1);
  stats.consumers[0].name = "c";
  stats.consumers[0].latency = h.Snapshot();
  const std::map<double, double> ladder = Ladder(StatsToPrometheus(stats));
  ASSERT_EQ(ladder.size(), 30u) << "16 ns .. 2^32 ns, and +Inf";
  for (const auto& [le_ns, count] : ladder) {
    uint64_t at_or_below = 0;
    for (uint64_t v : recorded) at_or_below += static_cast<double>(v) <= le_ns + 0.5 ? 1 : 0;
    EXPECT_EQ(count, static_cast<double>(at_or_below)) << "le " << le_ns << " ns";
  }
  EXPECT_EQ(ladder.at(INFINITY), static_cast<double>(recorded.size()));
}

}  // namespace
}  // namespace cqd::internal

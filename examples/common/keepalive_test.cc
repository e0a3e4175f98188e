// SPDX-License-Identifier: BSD-2-Clause
// examples/common/keepalive.h: an idle connection is probed after a period; a probe unanswered
// for kMissedPeriods periods ends it, but only once the connection's consumer has caught up (a
// backlog of the engine's own delays the verdict, never makes it); an answer, or any completion,
// resets the wait.
#include "examples/common/keepalive.h"

#include "gtest/gtest.h"

namespace cqd::examples {
namespace {

using std::chrono::milliseconds;
using Due = Keepalive::Due;

constexpr milliseconds kPeriod(100);

TEST(Keepalive, AnIdleConnectionIsProbedAndAnUnansweredProbeEndsIt) {
  Keepalive k;
  const Keepalive::Clock::time_point t0 = Keepalive::Clock::now();
  k.Heard(t0, false);
  EXPECT_EQ(k.Check(t0 + kPeriod / 2, kPeriod), Due::kNothing);
  EXPECT_EQ(k.Check(t0 + kPeriod, kPeriod), Due::kProbe);
  k.Probed(t0 + kPeriod, /*posted=*/true);
  EXPECT_EQ(k.Check(t0 + 4 * kPeriod, kPeriod), Due::kNothing);
  EXPECT_EQ(k.Check(t0 + 5 * kPeriod, kPeriod), Due::kGiveUp);
}

TEST(Keepalive, ABackloggedConsumerDelaysTheVerdictButDoesNotMakeIt) {
  Keepalive k;
  const Keepalive::Clock::time_point t0 = Keepalive::Clock::now();
  k.Probed(t0, true);
  // Four periods passed while the consumer still held undelivered entries: the answer may be
  // among them, so the peer is not judged yet.
  EXPECT_EQ(k.Check(t0 + 4 * kPeriod, kPeriod, /*caught_up=*/false), Due::kNothing);
  EXPECT_EQ(k.Check(t0 + 40 * kPeriod, kPeriod, /*caught_up=*/false), Due::kNothing);
  std::string ended = k.Tick(
      t0 + 40 * kPeriod, kPeriod, [] { return true; }, false);
  EXPECT_TRUE(ended.empty()) << ended;
  // The backlog delivered the answer: the connection lives.
  k.Heard(t0 + 41 * kPeriod, /*answer=*/true);
  EXPECT_EQ(k.Check(t0 + 41 * kPeriod, kPeriod, true), Due::kNothing);
  // Another probe, and the consumer caught up with no answer: the peer is judged.
  k.Probed(t0 + 42 * kPeriod, true);
  EXPECT_EQ(k.Check(t0 + 46 * kPeriod, kPeriod, false), Due::kNothing);
  ended = k.Tick(
      t0 + 46 * kPeriod, kPeriod, [] { return true; }, true);
  EXPECT_EQ(ended, "keepalive unanswered for 400 ms");
}

TEST(Keepalive, AnyCompletionRestartsTheProbesWaitAndAFailedPostIsNoProbe) {
  Keepalive k;
  const Keepalive::Clock::time_point t0 = Keepalive::Clock::now();
  k.Probed(t0, true);
  k.Heard(t0 + 3 * kPeriod, /*answer=*/false);  // the peer spoke: its wait starts again
  EXPECT_EQ(k.Check(t0 + 5 * kPeriod, kPeriod), Due::kNothing);
  EXPECT_EQ(k.Check(t0 + 7 * kPeriod, kPeriod), Due::kGiveUp);
  Keepalive failed;
  failed.Probed(t0, /*posted=*/false);
  EXPECT_EQ(failed.WaitedMs(t0 + 10 * kPeriod), 0);
  EXPECT_EQ(failed.Check(t0 + 10 * kPeriod, kPeriod), Due::kProbe);  // probes again, no verdict
}

}  // namespace
}  // namespace cqd::examples

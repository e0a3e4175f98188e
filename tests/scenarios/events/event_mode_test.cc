// SPDX-License-Identifier: BSD-2-Clause
// Event mode: idle pollers arm their CQs and sleep; the next completion wakes them. The stress
// test races injection against the poller's arm / re-poll / sleep so that a lost wakeup would
// leave a completion undelivered (and the test waiting on it until its timeout).
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Topology;
using testing::WaitFor;

using testing::SumPollers;
using testing::WaitForPollersAsleep;

TEST(EventMode, IdlePollersSleepAndWakeForTraffic) {
  RuntimeOptions options = testing::OwnedConsumers(2, 1);
  options.idle_budget = std::chrono::microseconds(100);
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 2));
  // Both pollers go to sleep: their poll counts stop moving.
  ASSERT_TRUE(WaitForPollersAsleep(*topo.rt));
  uint64_t polls = SumPollers(topo.rt->GetStats(), &PollerStats::polls);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(SumPollers(topo.rt->GetStats(), &PollerStats::polls), polls)
      << "an idle poller kept polling";
  uint64_t sleeps = SumPollers(topo.rt->GetStats(), &PollerStats::sleeps);

  for (int round = 0; round < 3; ++round) {
    for (size_t q = 0; q < topo.qps.size(); ++q) ASSERT_EQ(topo.qps[q]->Complete(round), 1);
    ASSERT_TRUE(WaitFor([&] { return topo.received() == 2u * (round + 1); }));
  }
  Stats s = topo.rt->GetStats();
  EXPECT_GT(s.cq_events, 0u);
  EXPECT_GT(SumPollers(s, &PollerStats::sleeps), sleeps);
  for (const auto& p : s.pollers) EXPECT_GT(p.arms, 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

// How many times each of this process's runtime threads (named cqd-*) has been run, by thread id
// (/proc/self/task/*/schedstat's third field: timeslices run on a CPU).
std::map<int, uint64_t> RuntimeThreadRuns() {
  std::map<int, uint64_t> runs;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("cqd-", 0) != 0) continue;
    std::ifstream schedstat(task.path() / "schedstat");
    uint64_t on_cpu_ns = 0, waited_ns = 0, timeslices = 0;
    schedstat >> on_cpu_ns >> waited_ns >> timeslices;
    runs[std::stoi(task.path().filename().string())] = timeslices;
  }
  return runs;
}

// An idle runtime costs no CPU: once its pollers sleep, no thread of it (pollers, consumers, the
// event thread, the teardown worker) runs until something happens, after traffic and a teardown
// that ended as after none.
TEST(EventMode, AnIdleRuntimeRunsNoThread) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.idle_budget = std::chrono::microseconds(100);
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 3));
  for (size_t q = 0; q < topo.qps.size(); ++q) ASSERT_EQ(topo.qps[q]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return topo.received() == topo.qps.size(); }));
  CQD_ASSERT_OK_AND_ASSIGN(teardown, topo.rt->TeardownQp(topo.registrations.back()));
  CQD_ASSERT_OK(teardown.Wait());
  ASSERT_TRUE(WaitForPollersAsleep(*topo.rt));
  // Settled: a 150 ms stretch in which no runtime thread ran (consumers past their idle_spin, the
  // teardown worker past its last scan), however long a loaded machine takes to get there. A
  // thread that wakes on its own at least that often never settles.
  ASSERT_TRUE(WaitFor([] {
    const std::map<int, uint64_t> start = RuntimeThreadRuns();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return RuntimeThreadRuns() == start;
  })) << "a runtime thread kept running while the runtime was idle";
  const std::map<int, uint64_t> before = RuntimeThreadRuns();
  ASSERT_GE(before.size(), 5u);  // 2 pollers, 2 consumers, the event thread, the teardown worker
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const std::map<int, uint64_t> after = RuntimeThreadRuns();
  for (const auto& [tid, runs] : after) {
    const auto was = before.find(tid);
    ASSERT_NE(was, before.end()) << "thread " << tid << " started while idle";
    EXPECT_EQ(runs, was->second) << "runtime thread " << tid << " ran while the runtime was idle";
  }
  CQD_ASSERT_OK(topo.TearDown());
}

// PollerStats::asleep: 1 only once the poller has armed its CQs and sleeps, so that the next
// completion is found through the completion channel; never 1 for a busy-polling poller.
TEST(EventMode, TheAsleepGaugeMeansTheNextCompletionComesByEvent) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(100);
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 1));
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(WaitFor([&] { return topo.rt->GetStats().pollers[0].asleep == 1; })) << round;
    const uint64_t events = topo.rt->GetStats().cq_events;
    ASSERT_EQ(topo.qps[0]->Complete(round), 1);
    ASSERT_TRUE(WaitFor([&] { return topo.received() == uint64_t(round) + 1; })) << round;
    EXPECT_GT(topo.rt->GetStats().cq_events, events)
        << "round " << round << ": said asleep, yet found the completion without an event";
  }
  CQD_ASSERT_OK(topo.TearDown());

  options.busy_poll = true;
  Topology busy;
  CQD_ASSERT_OK(busy.Build(options, 1, 1));
  uint64_t polls = 0;
  for (int sample = 0; sample < 50; ++sample) {
    // Each sample after the poller has polled again: it runs, and says so.
    ASSERT_TRUE(WaitFor([&] { return busy.rt->GetStats().pollers[0].polls > polls; }));
    const PollerStats p = busy.rt->GetStats().pollers[0];
    polls = p.polls;
    EXPECT_EQ(p.asleep, 0u) << "a busy-polling poller said it sleeps";
    EXPECT_EQ(p.sleeps, 0u);
  }
  CQD_ASSERT_OK(busy.TearDown());
}

// Stress: single completions at random moments, each waited for before the next, on 4 CQs over
// 2 pollers that arm immediately when idle (idle_budget 0).
TEST(EventMode, NoLostWakeups) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.idle_budget = std::chrono::microseconds(0);
  options.ack_threshold = 8;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 4, 8));
  std::mt19937 rng(12345);
  constexpr int kRounds = 4000;
  std::vector<uint64_t> next(topo.qps.size(), 0);
  for (int i = 0; i < kRounds; ++i) {
    size_t q = rng() % topo.qps.size();
    // Land in different phases of the poller's idle path: right away, after a spin, or after a
    // short sleep (poller likely parked).
    switch (rng() % 3) {
      case 0:
        break;
      case 1:
        for (int k = rng() % 2000; k > 0; --k) asm volatile("");
        break;
      case 2:
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
        break;
    }
    ASSERT_EQ(topo.qps[q]->Complete(next[q]++), 1);
    ASSERT_TRUE(
        WaitFor([&] { return topo.received() == uint64_t(i) + 1; }, std::chrono::seconds(20)))
        << "lost wakeup: completion " << i << " never delivered";
  }
  for (const auto& h : topo.handlers) EXPECT_EQ(h->out_of_order(), 0u);
  Stats s = topo.rt->GetStats();
  EXPECT_GT(s.cq_events, 0u) << "the pollers never slept: the test did not exercise events";
  CQD_ASSERT_OK(topo.TearDown());
}

// Rounds of one completion per QP, each round after the pollers fell asleep and a pause long
// enough for the owned consumers to pass their idle_spin and sleep too. Returns false if a round's
// completions were not all delivered.
bool CompleteAfterSleeps(Topology& topo, int round) {
  if (!testing::WaitForPollersAsleep(*topo.rt)) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (SimQp* qp : topo.qps) {
    if (qp->Complete(static_cast<uint64_t>(round)) != 1) return false;
  }
  return WaitFor([&] { return topo.received() == topo.qps.size() * (round + 1u); });
}

// A CQ whose QPs all go to one owned consumer: its event wakes that consumer with the poller
// (ConsumerStats::pre_wakes), and every completion still arrives, in order.
TEST(EventMode, ASleepingConsumerIsWokenWithThePollerOfACqItAloneUses) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  options.idle_budget = std::chrono::microseconds(100);
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 4));  // CQ 0: QPs 0 and 2, consumer 0; CQ 1: 1 and 3, 1
  auto pre_woken = [&] {
    const Stats s = topo.rt->GetStats();
    return s.consumers[0].pre_wakes > 0 && s.consumers[1].pre_wakes > 0;
  };
  // A round counts a pre-wake only if the consumer slept when the event came (the pre-wake comes
  // before the poller's wake, so no hand-over can wake it first); a loaded machine may keep one
  // from sleeping for a while, so this takes as many rounds as it needs, up to 50.
  int round = 0;
  for (; round < 50 && !pre_woken(); ++round) {
    ASSERT_TRUE(CompleteAfterSleeps(topo, round)) << "round " << round;
  }
  EXPECT_TRUE(pre_woken()) << "no pre-wake in " << round << " rounds";
  for (const auto& h : topo.handlers) EXPECT_EQ(h->out_of_order(), 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

// A CQ whose QPs go to two consumers wakes neither ahead of its poller; once one consumer's QP
// unregistered, the other is the CQ's alone and is pre-woken.
TEST(EventMode, ACqSharedByConsumersPreWakesNoneUntilOneConsumerIsLeft) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  options.idle_budget = std::chrono::microseconds(100);
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 2));  // one CQ: QP 0 to consumer 0, QP 1 to consumer 1
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(CompleteAfterSleeps(topo, round)) << "round " << round;
  }
  Stats s = topo.rt->GetStats();
  EXPECT_GT(s.cq_events, 0u) << "the poller never slept: the test did not exercise events";
  EXPECT_EQ(s.consumers[0].pre_wakes, 0u);
  EXPECT_EQ(s.consumers[1].pre_wakes, 0u);

  topo.registrations[1].Unregister();  // the CQ's QPs now all go to consumer 0
  const uint64_t before = topo.received();
  uint64_t sent = 0;
  for (int round = 0; round < 50 && topo.rt->GetStats().consumers[0].pre_wakes == 0; ++round) {
    ASSERT_TRUE(testing::WaitForPollersAsleep(*topo.rt));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(topo.qps[0]->Complete(static_cast<uint64_t>(10 + round)), 1);
    ++sent;
    ASSERT_TRUE(WaitFor([&] { return topo.received() == before + sent; })) << "round " << round;
  }
  s = topo.rt->GetStats();
  EXPECT_GT(s.consumers[0].pre_wakes, 0u) << "no pre-wake in " << sent << " rounds";
  EXPECT_EQ(s.consumers[1].pre_wakes, 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

// Solicited-only CQs: the poller sleeps through unsolicited receives and wakes for a solicited
// one or an error (S8); everything that arrived is then delivered.
TEST(EventMode, SolicitedOnlyCqWakesOnSolicitedAndErrors) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(0);
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqOptions solicited;
  solicited.solicited_only = true;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0, solicited));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
  testing::Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  ASSERT_TRUE(WaitForPollersAsleep(*rt));
  uint64_t sleeps = rt->GetStats().pollers[0].sleeps;
  ASSERT_EQ(qp->Complete(0), 1);  // unsolicited: no wake expected
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Stats s = rt->GetStats();
  EXPECT_EQ(handler.received(), 0u) << "woke for an unsolicited receive";
  EXPECT_EQ(s.pollers[0].sleeps, sleeps);
  ASSERT_EQ(qp->Complete(1, IBV_WC_RECV, IBV_WC_SUCCESS, /*solicited=*/true), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 2; }));
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().pollers[0].sleeps > sleeps; }));
  ASSERT_EQ(qp->Complete(2, IBV_WC_RECV, IBV_WC_REM_ABORT_ERR), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 3; }));
  reg.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

}  // namespace
}  // namespace cqd

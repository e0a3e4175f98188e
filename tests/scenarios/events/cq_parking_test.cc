// SPDX-License-Identifier: BSD-2-Clause
// CQ parking (RuntimeOptions::cq_park_after): a CQ left empty while its poller stays busy is
// armed and left out of the passes until its event. Parked CQs must still deliver every
// completion exactly once and in order, events must still follow completions, and control calls
// (grow, destroy) must work on them. Solicited-only CQs, busy_poll and cq_park_after = 0 never
// park. Tests wait for states (with WaitFor's generous deadline); none asserts a speed.
#include <atomic>
#include <random>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::SumPollers;
using testing::Topology;
using testing::WaitFor;

// A poller that never sleeps on its own (idle_budget of an hour) but parks CQs idle for 200 µs.
RuntimeOptions ParkingOptions(int pollers = 1) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.idle_budget = std::chrono::hours(1);
  options.cq_park_after = std::chrono::microseconds(200);
  return options;
}

uint64_t Parked(const Runtime& rt) { return SumPollers(rt.GetStats(), &PollerStats::parked_cqs); }

TEST(CqParking, IdleCqsParkAndTheirFirstCompletionUnparksThem) {
  Topology t;
  constexpr int kCqs = 100;
  CQD_ASSERT_OK(t.Build(ParkingOptions(2), kCqs, kCqs));
  ASSERT_TRUE(WaitFor([&] { return Parked(*t.rt) == kCqs; }));

  // All parked: the pollers poll nothing while nothing happens.
  const uint64_t polls = SumPollers(t.rt->GetStats(), &PollerStats::polls);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(SumPollers(t.rt->GetStats(), &PollerStats::polls), polls);

  // One completion per QP, in random order: each wakes its parked CQ.
  std::vector<int> order(kCqs);
  for (int i = 0; i < kCqs; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (int i : order) ASSERT_TRUE(InjectRecvs(t.qps[i], 0, 1));
  ASSERT_TRUE(WaitFor([&] { return t.received() == kCqs; }));
  // And a burst per QP, after which they park again.
  for (int i : order) ASSERT_TRUE(InjectRecvs(t.qps[i], 1, 50));
  ASSERT_TRUE(WaitFor([&] { return t.received() == 51u * kCqs; }));
  for (const auto& h : t.handlers) {
    EXPECT_EQ(h->received(), 51u);
    EXPECT_EQ(h->out_of_order(), 0u);
    EXPECT_EQ(h->wrong_qp(), 0u);
  }
  ASSERT_TRUE(WaitFor([&] { return Parked(*t.rt) == kCqs; }));
  EXPECT_GE(SumPollers(t.rt->GetStats(), &PollerStats::parks), 2u * kCqs);
  CQD_ASSERT_OK(t.TearDown());  // destroys parked CQs
  EXPECT_EQ(Parked(*t.rt), 0u);
  CQD_ASSERT_OK(t.rt->Shutdown());
}

// One hot QP keeps the poller busy while 40 others get bursts at random gaps around the park
// threshold: parking and unparking race with injection all the time; nothing is lost, doubled or
// reordered, and the default sleep path (idle_budget 50 µs) is exercised too.
TEST(CqParking, BurstsAroundTheThresholdLoseNothing) {
  for (bool sleepy : {false, true}) {
    RuntimeOptions options = ParkingOptions(2);
    options.cq_park_after = std::chrono::microseconds(50);
    if (sleepy) options.idle_budget = std::chrono::microseconds(50);
    Topology t;
    constexpr int kQps = 41;
    CQD_ASSERT_OK(t.Build(options, kQps, kQps));
    std::atomic<bool> stop{false};
    uint64_t hot_sent = 0;
    std::thread hot([&] {
      while (!stop.load()) {
        if (t.qps[0]->Complete(hot_sent) == 1) ++hot_sent;
        if (hot_sent % 64 == 0) std::this_thread::yield();
      }
    });
    constexpr int kBursts = 150;
    std::vector<std::thread> injectors;
    for (int w = 0; w < 2; ++w) {
      injectors.emplace_back([&, w] {
        std::mt19937 rng(w + 1);
        std::vector<uint64_t> next(kQps, 0);
        for (int b = 0; b < kBursts; ++b) {
          for (int i = 1 + w; i < kQps; i += 2) {
            const int n = 1 + static_cast<int>(rng() % 8);
            for (int k = 0; k < n; ++k) {
              while (t.qps[i]->Complete(next[i]) != 1) std::this_thread::yield();
              ++next[i];
            }
            if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
          }
        }
        for (int i = 1 + w; i < kQps; i += 2) {
          ASSERT_TRUE(WaitFor([&] { return t.handlers[i]->received() == next[i]; }))
              << "qp " << i << " got " << t.handlers[i]->received() << " of " << next[i];
        }
      });
    }
    for (auto& th : injectors) th.join();
    stop.store(true);
    hot.join();
    ASSERT_TRUE(WaitFor([&] { return t.handlers[0]->received() == hot_sent; }));
    for (const auto& h : t.handlers) {
      EXPECT_EQ(h->out_of_order(), 0u);
      EXPECT_EQ(h->concurrent_calls(), 0u);
    }
    EXPECT_GT(SumPollers(t.rt->GetStats(), &PollerStats::parks), 0u) << "sleepy " << sleepy;
    CQD_ASSERT_OK(t.TearDown());
    CQD_ASSERT_OK(t.rt->Shutdown());
  }
}

// An async event for a QP whose CQ is parked follows the completions that were in the CQ.
TEST(CqParking, EventOnAParkedCqFollowsItsCompletions) {
  testing::OneQp one;
  CQD_ASSERT_OK(one.Build(ParkingOptions()));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(WaitFor([&] { return Parked(*one.rt) == 1; }));
    ASSERT_TRUE(InjectRecvs(one.qp, round * 30, 30));
    CQD_ASSERT_OK(one.sim->RaiseQpEvent(one.qp, IBV_EVENT_COMM_EST));
    ASSERT_TRUE(WaitFor([&] { return handler.events() == static_cast<uint64_t>(round + 1); }));
  }
  std::vector<Recorder::Entry> log = handler.log();
  ASSERT_EQ(log.size(), 20u * 31);
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 30; ++i) {
      const Recorder::Entry& e = log[round * 31 + i];
      EXPECT_FALSE(e.event);
      EXPECT_EQ(e.wr_id, static_cast<uint64_t>(round * 30 + i));
    }
    EXPECT_TRUE(log[round * 31 + 30].event);
  }
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// Registering a QP that makes a parked CQ grow (ibv_resize_cq) brings it back, and its
// completions still arrive.
TEST(CqParking, GrowingAParkedCqKeepsItsCompletionsFlowing) {
  testing::OneQp one;
  CqOptions cq_options;
  cq_options.depth = 16;
  CQD_ASSERT_OK(one.Build(ParkingOptions(), cq_options));
  testing::Recorder first;
  first.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, first, 0).value();
  ASSERT_TRUE(WaitFor([&] { return Parked(*one.rt) == 1; }));
  SimQpOptions big;
  big.max_send_wr = 64;
  big.max_recv_wr = 64;
  SimQp* qp2 = one.sim->CreateQp(one.cq.sim(), one.cq.sim(), big).value();
  testing::Recorder second;
  second.qp_num = qp2->qp_num();
  Registration reg2 = one.rt->RegisterQp(*qp2, second, 0).value();
  ASSERT_GT(one.cq.sim()->depth(), 16);
  for (int round = 0; round < 5; ++round) {
    ASSERT_TRUE(WaitFor([&] { return Parked(*one.rt) == 1; }));
    ASSERT_TRUE(InjectRecvs(qp2, round * 10, 10));
    ASSERT_TRUE(InjectRecvs(one.qp, round * 10, 10));
    ASSERT_TRUE(WaitFor([&] { return first.received() + second.received() == (round + 1) * 20u; }));
  }
  EXPECT_EQ(first.out_of_order() + second.out_of_order(), 0u);
  reg.Unregister();
  reg2.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(qp2));
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// Nothing parks with parking off, with busy_poll, or on a solicited-only CQ (whose unsolicited
// completions raise no event). The poller keeps polling them: completions keep arriving.
TEST(CqParking, NeverParkedWhereAnEventCouldNotWakeIt) {
  struct Case {
    const char* name;
    bool busy;
    std::chrono::microseconds park_after;
    bool solicited_only;
  };
  for (const Case& c : {Case{"off", false, std::chrono::microseconds(0), false},
                        Case{"busy_poll", true, std::chrono::microseconds(200), false},
                        Case{"solicited_only", false, std::chrono::microseconds(200), true}}) {
    RuntimeOptions options = ParkingOptions();
    options.busy_poll = c.busy;
    options.cq_park_after = c.park_after;
    testing::OneQp one;
    CqOptions cq_options;
    cq_options.solicited_only = c.solicited_only;
    CQD_ASSERT_OK(one.Build(options, cq_options));
    testing::Recorder handler;
    handler.qp_num = one.qp->qp_num();
    Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
    for (int round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // 50 times cq_park_after
      ASSERT_TRUE(InjectRecvs(one.qp, round * 5, 5));              // unsolicited
      ASSERT_TRUE(WaitFor([&] { return handler.received() == (round + 1) * 5u; })) << c.name;
    }
    Stats stats = one.rt->GetStats();
    EXPECT_EQ(SumPollers(stats, &PollerStats::parks), 0u) << c.name;
    EXPECT_EQ(SumPollers(stats, &PollerStats::parked_cqs), 0u) << c.name;
    reg.Unregister();
    CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
    CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
  }
}

// A CQ whose arm fails is not parked; it stays in the passes and parks at a later try.
TEST(CqParking, AFailedArmKeepsTheCqPolled) {
  testing::OneQp one;
  CQD_ASSERT_OK(one.Build(ParkingOptions()));
  testing::Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(WaitFor([&] { return Parked(*one.rt) == 1; }));
  // Its event unparks it; the next three arms fail.
  one.sim->FailRequestNotify(one.cq.sim(), EIO, 3);
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 1));
  ASSERT_TRUE(
      WaitFor([&] { return SumPollers(one.rt->GetStats(), &PollerStats::arm_failures) >= 3; }));
  ASSERT_TRUE(InjectRecvs(one.qp, 1, 4));  // into a CQ that could not be armed: still polled
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 5; }));
  ASSERT_TRUE(WaitFor([&] { return Parked(*one.rt) == 1; }));
  ASSERT_TRUE(InjectRecvs(one.qp, 5, 5));
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 10; }));
  EXPECT_EQ(handler.out_of_order(), 0u);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// A device that fails brings its parked CQs back into the passes (no event will wake them).
TEST(CqParking, DeviceFatalUnparks) {
  Topology t;
  CQD_ASSERT_OK(t.Build(ParkingOptions(), 4, 4));
  ASSERT_TRUE(WaitFor([&] { return Parked(*t.rt) == 4; }));
  t.sim->RaiseDeviceFatal();
  ASSERT_TRUE(WaitFor([&] { return Parked(*t.rt) == 0; }));
  for (auto& r : t.registrations) r.Unregister();
  CQD_ASSERT_OK(t.rt->Shutdown());
}

TEST(CqParking, NegativeParkAfterIsRefused) {
  RuntimeOptions options;
  options.cq_park_after = std::chrono::microseconds(-1);
  testing::Bed bed;
  const Status refused = bed.CreateRuntime(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("cq_park_after"), std::string::npos);
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// An async event reaches the QP's handler after every completion polled before it was read,
// also while the consumer is backed up, and also when the QP's CQs are on two shards.
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::DrainUntil;
using testing::InjectRecvs;
using testing::Recorder;
using testing::SumPollers;
using testing::WaitFor;

// Returns the index of the first event in `log`, or log.size().
size_t FirstEvent(const std::vector<Recorder::Entry>& log) {
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].event) return i;
  }
  return log.size();
}

RuntimeOptions BackedUpEngineConsumer(int pollers) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  options.consumers[0].queue_capacity = 8;
  return options;
}

// The consumer's queue is full when the event comes: the completions polled before it wait in
// the poller, and the event must wait behind them.
TEST(EventOrder, EventFollowsCompletionsPolledBeforeIt) {
  for (ibv_event_type type : {IBV_EVENT_QP_FATAL, IBV_EVENT_QP_LAST_WQE_REACHED}) {
    testing::OneQp bed;
    CQD_ASSERT_OK(bed.Build(BackedUpEngineConsumer(1)));
    Runtime* rt = bed.rt.get();
    SimQp* qp = bed.qp;
    Recorder handler;
    CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));

    ASSERT_TRUE(InjectRecvs(qp, 0, 8));  // fills the queue
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().consumers[0].queue_depth == 8; }));
    ASSERT_TRUE(InjectRecvs(qp, 8, 20));  // polled, but held by the poller
    ASSERT_TRUE(
        WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::completions) == 28; }));
    CQD_ASSERT_OK(bed.sim->RaiseQpEvent(qp, type));
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().async_events == 1; }));

    ASSERT_TRUE(DrainUntil(*rt, 0, [&] { return handler.events() == 1; }));
    ASSERT_TRUE(DrainUntil(*rt, 0, [&] { return handler.completions() == 28; }));
    std::vector<Recorder::Entry> log = handler.log();
    ASSERT_EQ(log.size(), 29u);
    EXPECT_EQ(FirstEvent(log), 28u) << "event type " << type << " overtook completions";
    for (size_t i = 0; i < 28; ++i) EXPECT_EQ(log[i].wr_id, i);
    reg.Unregister();
  }
}

// Completions still in the CQ when the event is read (the poller sleeps on a solicited-only arm)
// come first too: the poller polls the QP's CQs before it places the event.
TEST(EventOrder, EventFollowsCompletionsStillInTheCq) {
  CqOptions solicited;
  solicited.solicited_only = true;
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build({}, solicited));
  Runtime* rt = bed.rt.get();
  SimDevice* sim = bed.sim.get();
  SimQp* qp = bed.qp;
  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(testing::WaitForPollersAsleep(*rt));
    ASSERT_TRUE(InjectRecvs(qp, round * 30, 30));  // unsolicited: nobody polls them yet
    CQD_ASSERT_OK(sim->RaiseQpEvent(qp, IBV_EVENT_QP_LAST_WQE_REACHED));
    ASSERT_TRUE(WaitFor([&] { return handler.events() == static_cast<uint64_t>(round + 1); }));
    std::vector<Recorder::Entry> log = handler.log();
    ASSERT_EQ(log.size(), static_cast<size_t>(31 * (round + 1)));
    EXPECT_TRUE(log.back().event) << "round " << round;
  }
  reg.Unregister();
}

// Send CQ on shard 0, recv CQ on shard 1: the event waits for both pollers.
TEST(EventOrder, EventFollowsCompletionsOfBothShards) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(BackedUpEngineConsumer(2)));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(send_cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(recv_cq, rt->CreateCq(dev, 1));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(send_cq.sim(), recv_cq.sim()));
  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));

  for (uint64_t i = 0; i < 20; ++i) ASSERT_EQ(qp->Complete(i, IBV_WC_SEND), 1);
  for (uint64_t i = 100; i < 120; ++i) ASSERT_EQ(qp->Complete(i, IBV_WC_RECV), 1);
  ASSERT_TRUE(WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::completions) == 40; }));
  CQD_ASSERT_OK(sim->RaiseQpEvent(qp, IBV_EVENT_QP_FATAL));
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().async_events == 1; }));
  ASSERT_TRUE(
      DrainUntil(*rt, 0, [&] { return handler.events() == 1 && handler.completions() == 40; }));
  std::vector<Recorder::Entry> log = handler.log();
  ASSERT_EQ(log.size(), 41u);
  EXPECT_EQ(FirstEvent(log), 40u);
  reg.Unregister();
}

// Events and completions interleaved under traffic on an owned consumer: for each event, every
// completion polled before the event was read precedes it. The test raises the event only after
// the pollers report having taken completion k, so completions 0..k must come first.
TEST(EventOrder, InterleavedUnderTraffic) {
  RuntimeOptions options;
  options.pollers = 2;
  options.consumers[0].queue_capacity = 64;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(send_cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(recv_cq, rt->CreateCq(dev, 1));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(send_cq.sim(), recv_cq.sim()));
  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));

  constexpr int kEvents = 50;
  std::vector<uint64_t> polled_before(kEvents);
  uint64_t next = 0;
  for (int e = 0; e < kEvents; ++e) {
    for (int i = 0; i < 40; ++i, ++next) {
      while (qp->Complete(next, next % 2 ? IBV_WC_RECV : IBV_WC_SEND) != 1) {
        std::this_thread::yield();
      }
    }
    ASSERT_TRUE(
        WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::completions) == next; }));
    polled_before[e] = next;
    CQD_ASSERT_OK(sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  }
  ASSERT_TRUE(
      WaitFor([&] { return handler.events() == kEvents && handler.completions() == next; }));
  std::vector<Recorder::Entry> log = handler.log();
  uint64_t completions_seen = 0;
  int events_seen = 0;
  for (const auto& entry : log) {
    if (entry.event) {
      EXPECT_GE(completions_seen, polled_before[events_seen]) << "event " << events_seen;
      ++events_seen;
    } else {
      ++completions_seen;
    }
  }
  EXPECT_EQ(events_seen, kEvents);
  reg.Unregister();
}

}  // namespace
}  // namespace cqd

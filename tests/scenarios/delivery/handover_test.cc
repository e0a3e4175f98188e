// SPDX-License-Identifier: BSD-2-Clause
// How a poller hands what it polls to queued consumers. A runtime-owned poller whose polls keep
// coming back full gathers up to about four consumer batches in its spill before it hands over
// (one hand-over per few batches, not per poll); it must never keep anything once the CQ is
// drained, in either idle mode, whatever poll_batch and dispatch_batch are. An engine-driven shard
// hands over what each PollShard polled before it returns.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::OneQp;
using testing::Recorder;
using testing::WaitFor;

struct Case {
  const char* name;
  int poll_batch;
  int dispatch_batch;
  bool busy_poll;
};

// Bursts of every size up to past what a poller gathers (four consumer batches), each waited for
// before the next: what a burst's full polls gathered reaches the handler once the CQ is drained,
// in order.
TEST(HandOver, EveryBurstReachesTheHandlerOnceTheCqDrains) {
  for (const Case& c : {Case{"poll 1, batch 64", 1, 64, false}, Case{"poll 1, busy", 1, 64, true},
                        Case{"poll 4, batch 16", 4, 16, false}, Case{"poll 4, busy", 4, 16, true},
                        Case{"poll 8, batch 8", 8, 8, false}, Case{"poll 32, batch 1", 32, 1, true},
                        Case{"poll 3, batch 1024", 3, 1024, false}}) {
    SCOPED_TRACE(c.name);
    RuntimeOptions options;
    options.poll_batch = c.poll_batch;
    options.busy_poll = c.busy_poll;
    options.consumers.assign(1, ConsumerOptions{});
    options.consumers[0].dispatch_batch = c.dispatch_batch;
    OneQp one;
    CQD_ASSERT_OK(one.Build(options));
    Recorder handler;
    handler.qp_num = one.qp->qp_num();
    Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
    uint64_t sent = 0;
    for (int burst = 1; burst <= 5 * c.dispatch_batch + 2 && burst <= 400; burst += 1 + burst / 4) {
      ASSERT_TRUE(InjectRecvs(one.qp, sent, burst));
      sent += static_cast<uint64_t>(burst);
      ASSERT_TRUE(WaitFor([&] { return handler.received() == sent; }))
          << "burst of " << burst << ": " << handler.received() << " of " << sent;
    }
    EXPECT_EQ(handler.out_of_order(), 0u);
    EXPECT_EQ(handler.wrong_qp(), 0u);
    // The consumer counts a batch and frees its depth after the handlers returned: wait for it.
    EXPECT_TRUE(WaitFor([&] {
      const Stats stats = one.rt->GetStats();
      return stats.consumers[0].queue_depth == 0 && stats.consumers[0].delivered == sent;
    })) << "queue_depth "
        << one.rt->GetStats().consumers[0].queue_depth << ", delivered "
        << one.rt->GetStats().consumers[0].delivered << " of " << sent;
    reg.Unregister();
    CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
    CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
  }
}

// A CQ that stays full while another consumer's CQ trickles: the trickle's completions are not
// held behind the busy CQ's gathering (a poll short of full hands everything over), and the
// busy stream, which keeps every poll full, still reaches its handler in order.
//
// That the trickle arrives proves little by itself: a poller that held a short poll's completions
// for all of the gathering's 16 passes would still deliver them within microseconds. So the first
// part holds the poller at a known point and looks. The rule (docs/THREADING.md, "Threading
// model"): a poll that comes back short of full hands everything over at once, in the pass that
// made it. Each round:
//   - with the poller asleep, the busy CQ gets two completions of its QP, then a probe (a
//     completion of no registered QP), then more of its QP's. The busy CQ is solicited-only, so
//     these raise no event and the poller sleeps on;
//   - one completion on the trickle CQ raises the event that wakes the poller. Its first pass
//     polls both CQs: the busy CQ's poll is full (poll_batch is 2), the trickle CQ's is short;
//   - the next pass's poll of the busy CQ takes the probe, which the poller routes to the
//     OrphanHandler on its own thread, where the ledger's hook holds it.
// With the poller held a whole pass after the short poll, the trickle's completion must be with
// its consumer already, which delivers it on its own thread while the poller stays held. Held
// instead with the busy CQ's gathering, it would still be in the poller's spill, and nothing
// would hand it over while the poller is held: the round fails (after a generous wait: for a
// state, not a speed). No figure of time is asserted; the pass the probe arrives in is set by
// what the CQs hold.
TEST(HandOver, ATrickleIsNotHeldBehindABusyCq) {
  RuntimeOptions options;
  options.poll_batch = 2;
  options.consumers.assign(2, ConsumerOptions{});
  for (ConsumerOptions& consumer : options.consumers) consumer.dispatch_batch = 256;
  {
    constexpr uint64_t kProbe = 1u << 20;  // the probe's wr_id
    constexpr uint64_t kPerRound = 64;     // the busy QP's completions per round
    constexpr uint64_t kRounds = 20;
    std::atomic<uint64_t> held{0};      // probes that reached the hook
    std::atomic<uint64_t> let_go{0};    // probes the test let go of
    std::atomic<uint64_t> returned{0};  // probes whose hook returned
    testing::Bed bed;
    bed.orphans.before = [&](std::span<const ibv_wc> wcs) {
      for (const ibv_wc& wc : wcs) {
        if (wc.wr_id != kProbe) continue;
        const uint64_t probe = held.fetch_add(1) + 1;
        while (let_go.load() < probe) std::this_thread::yield();
        returned.fetch_add(1);
      }
    };
    CQD_ASSERT_OK(bed.Start(options));
    CqHandle busy_cq = bed.Cq(0, CqOptions{.depth = 1 << 16, .solicited_only = true});
    CqHandle trickle_cq = bed.Cq(0);
    SimQp* busy_qp = bed.Qp(busy_cq);
    SimQp* trickle_qp = bed.Qp(trickle_cq);
    Recorder busy;
    Recorder trickle;
    busy.qp_num = busy_qp->qp_num();
    trickle.qp_num = trickle_qp->qp_num();
    Registration busy_reg = bed.rt->RegisterQp(*busy_qp, busy, 0).value();
    Registration trickle_reg = bed.rt->RegisterQp(*trickle_qp, trickle, 1).value();
    auto polled = [&](CqHandle cq) {
      for (const CqStats& c : bed.rt->GetStats().cqs) {
        if (c.id == cq.id()) return c.completions;
      }
      return uint64_t{0};
    };
    for (uint64_t round = 0; round < kRounds; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      ASSERT_TRUE(testing::WaitForPollersAsleep(*bed.rt));
      std::vector<ibv_wc> wcs(kPerRound + 1);
      for (uint64_t i = 0, wr_id = round * kPerRound; i < wcs.size(); ++i) {
        wcs[i].qp_num = i == 2 ? 0xabcde : busy_qp->qp_num();  // the third: the probe
        wcs[i].wr_id = i == 2 ? kProbe : wr_id++;
        wcs[i].opcode = IBV_WC_RECV;
      }
      ASSERT_EQ(busy_cq.sim()->Inject(wcs), static_cast<int>(wcs.size()));  // unsolicited
      ASSERT_TRUE(InjectRecvs(trickle_qp, round, 1));                       // wakes the poller
      ASSERT_TRUE(WaitFor([&] { return held.load() == round + 1; })) << "the probe never came";
      // Held in the second pass since the wake: the first polled the trickle's completion.
      const uint64_t trickle_polled = polled(trickle_cq);
      const bool delivered = WaitFor([&] { return trickle.received() == round + 1; });
      let_go.store(round + 1);
      ASSERT_TRUE(WaitFor([&] { return returned.load() == round + 1; }));
      ASSERT_EQ(trickle_polled, round + 1) << "the trickle's completion was not polled before "
                                              "the probe: the rounds do not test the hand-over";
      ASSERT_TRUE(delivered) << "a pass after the poll short of full that took it, the trickle's "
                                "completion was still held by the poller";
      ASSERT_TRUE(WaitFor([&] { return busy.received() == (round + 1) * kPerRound; }));
    }
    EXPECT_EQ(busy.out_of_order(), 0u);
    EXPECT_EQ(trickle.out_of_order(), 0u);
    EXPECT_EQ(busy.wrong_qp() + trickle.wrong_qp(), 0u);
    EXPECT_EQ(bed.orphans.count.load(), kRounds);  // the probes, and nothing else
    busy_reg.Unregister();
    trickle_reg.Unregister();
  }
  // Under load: a feeder keeps the busy CQ full while the trickle's completions come one by one.
  testing::Bed bed;
  CQD_ASSERT_OK(bed.Start(options));
  CqHandle busy_cq = bed.Cq(0, CqOptions{.depth = 1 << 16});
  CqHandle trickle_cq = bed.Cq(0);
  SimQp* busy_qp = bed.Qp(busy_cq);
  SimQp* trickle_qp = bed.Qp(trickle_cq);
  Recorder busy;
  Recorder trickle;
  busy.qp_num = busy_qp->qp_num();
  trickle.qp_num = trickle_qp->qp_num();
  Registration busy_reg = bed.rt->RegisterQp(*busy_qp, busy, 0).value();
  Registration trickle_reg = bed.rt->RegisterQp(*trickle_qp, trickle, 1).value();
  constexpr uint64_t kBusy = 40000;
  std::thread feeder([&] {
    for (uint64_t i = 0; i < kBusy; i += 100) ASSERT_TRUE(InjectRecvs(busy_qp, i, 100));
  });
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(InjectRecvs(trickle_qp, i, 1));
    ASSERT_TRUE(WaitFor([&] { return trickle.received() == i + 1; })) << "trickle " << i;
  }
  feeder.join();
  ASSERT_TRUE(WaitFor([&] { return busy.received() == kBusy; })) << busy.received();
  EXPECT_EQ(busy.out_of_order(), 0u);
  EXPECT_EQ(trickle.out_of_order(), 0u);
  EXPECT_EQ(busy.wrong_qp() + trickle.wrong_qp(), 0u);
  busy_reg.Unregister();
  trickle_reg.Unregister();
}

// PollShard's contract: what a step polled is handed over before it returns, so the engine's
// owned consumer gets each completion after the step that took it, with nothing left to poll.
TEST(HandOver, AnEngineStepHandsOverWhatItPolled) {
  RuntimeOptions options;
  options.poll_batch = 1;
  options.engine_shards = {0};
  options.consumers.assign(1, ConsumerOptions{});
  options.consumers[0].dispatch_batch = 64;
  OneQp one;
  CQD_ASSERT_OK(one.Build(options));
  Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 10));
  for (uint64_t i = 1; i <= 10; ++i) {
    ASSERT_GE(one.rt->PollShard(0, 1), 1);  // one full poll of one completion
    ASSERT_TRUE(WaitFor([&] { return handler.received() == i; }))
        << "step " << i << ": " << handler.received();
  }
  EXPECT_EQ(handler.out_of_order(), 0u);
  reg.Unregister();
  while (one.rt->PollShard(0, 16) > 0) {
  }
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

}  // namespace
}  // namespace cqd

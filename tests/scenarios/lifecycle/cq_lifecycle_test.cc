// SPDX-License-Identifier: BSD-2-Clause
// CQs that leave while they still hold completions, handles from elsewhere, and the event
// counts of released CQs.
#include <algorithm>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::OrphanLedger;
using testing::Recorder;
using testing::WaitFor;
using testing::WaitForPollersAsleep;

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// A solicited-only CQ whose poller sleeps keeps unsolicited completions until something else
// wakes the poller. Destroying it must hand them to the orphan handler (SRQ buffers come back).
TEST(CqLifecycle, DestroyCqPollsItEmptyIntoTheOrphanHandler) {
  OrphanLedger orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  CqOptions solicited;
  solicited.solicited_only = true;
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options, solicited));
  Recorder handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(WaitForPollersAsleep(*bed.rt));

  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 10));  // unsolicited: the solicited-only arm stays quiet
  reg.Unregister();
  CQD_ASSERT_OK(bed.sim->DestroyQp(bed.qp));
  CQD_ASSERT_OK(bed.rt->DestroyCq(bed.cq));

  EXPECT_EQ(handler.received() + orphans.count.load(), 10u);
  std::vector<uint64_t> seen = orphans.wr_ids();
  for (uint64_t i = 0; i < handler.received(); ++i) seen.push_back(i);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, Range(0, 10));
}

// The same when an adopted CQ is released: what it holds is polled out before the runtime lets
// go of it.
TEST(CqLifecycle, ReleasingAnAdoptedCqPollsItEmpty) {
  OrphanLedger orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(engine_cq, sim->CreateCq(256, channel));
  CqOptions solicited;
  solicited.solicited_only = true;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->AdoptCq(dev, 0, engine_cq, solicited));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(engine_cq, engine_cq));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  ASSERT_TRUE(WaitForPollersAsleep(*rt));

  ASSERT_TRUE(InjectRecvs(qp, 0, 7));
  reg.Unregister();
  CQD_ASSERT_OK(rt->DestroyCq(cq));  // released, not destroyed: the QP may stay
  EXPECT_EQ(handler.received() + orphans.count.load(), 7u);
  EXPECT_EQ(engine_cq->size(), 0);
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(engine_cq));
}

// Destroy racing a busy poller: every completion ends up delivered or orphaned, once.
TEST(CqLifecycle, DestroyRacingThePollerLosesNothing) {
  for (int round = 0; round < 20; ++round) {
    OrphanLedger orphans;
    RuntimeOptions options;
    options.orphan_handler = &orphans;
    options.busy_poll = round % 2 == 0;
    testing::Bed bed;
    CQD_ASSERT_OK(bed.StartWithoutLedger(options));
    auto& rt = bed.rt;
    auto& sim = bed.sim;
    const DeviceId dev = bed.dev;
    CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
    CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
    Recorder handler;
    handler.qp_num = qp->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
    ASSERT_TRUE(InjectRecvs(qp, 0, 1000));
    reg.Unregister();
    CQD_ASSERT_OK(sim->DestroyQp(qp));
    CQD_ASSERT_OK(rt->DestroyCq(cq));
    rt.reset();  // what is still queued is orphaned at the latest here
    EXPECT_EQ(handler.received() + orphans.count.load(), 1000u) << "round " << round;
    EXPECT_EQ(handler.out_of_order(), 0u);
  }
}

// A handle names its runtime: another runtime refuses it and keeps its own CQ of the same id.
TEST(CqLifecycle, ForeignAndStaleHandlesAreRefused) {
  testing::Bed first, second;
  CQD_ASSERT_OK(first.CreateRuntime({}));
  CQD_ASSERT_OK(second.CreateRuntime({}));
  CQD_ASSERT_OK(first.AddDevice());
  CQD_ASSERT_OK(second.AddDevice());
  auto& rt1 = first.rt;
  auto& rt2 = second.rt;
  auto& sim2 = second.sim;
  const DeviceId dev1 = first.dev;
  const DeviceId dev2 = second.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq1, rt1->CreateCq(dev1, 0));
  CQD_ASSERT_OK_AND_ASSIGN(cq2, rt2->CreateCq(dev2, 0));
  ASSERT_EQ(cq1.id(), cq2.id());

  Status foreign = rt2->DestroyCq(cq1);
  EXPECT_EQ(foreign.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.message().find("another runtime"), std::string::npos) << foreign.ToString();

  // rt2's CQ still works.
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim2->CreateQp(cq2.sim(), cq2.sim()));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt2->RegisterQp(*qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(qp, 0, 3));
  EXPECT_TRUE(WaitFor([&] { return handler.received() == 3; }));
  reg.Unregister();
  CQD_ASSERT_OK(sim2->DestroyQp(qp));

  CQD_ASSERT_OK(rt2->DestroyCq(cq2));
  EXPECT_EQ(rt2->DestroyCq(cq2).code(), StatusCode::kNotFound);  // stale
  CQD_ASSERT_OK(rt1->DestroyCq(cq1));
}

// Events read for a released adopted CQ are acked by the runtime and show up in its totals.
TEST(CqLifecycle, StatsCountEventsOfReleasedCqs) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger({}));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(engine_cq, sim->CreateCq(64, channel));
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->AdoptCq(dev, 0, engine_cq));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
  const Stats before = rt->GetStats();

  sim->AddSpuriousEvent(engine_cq);  // still on the runtime's channel: read and acked there
  ASSERT_TRUE(WaitFor([&] {
    Stats s = rt->GetStats();
    return s.cq_events == before.cq_events + 1 && s.cq_acked_events == before.cq_acked_events + 1;
  })) << "events "
      << rt->GetStats().cq_events << ", acked " << rt->GetStats().cq_acked_events;
  CQD_ASSERT_OK(sim->DestroyCq(engine_cq));  // would block if the event were not acked (S2)
}

// Without a drained teardown, a QP can leave completions in a CQ nobody polls (here: an adopted
// CQ that was released). When the device gives its qp_num to a new QP on another CQ and the old
// CQ is polled again, the leftovers are orphans: they reach neither the new QP's handler (it does
// not use that CQ) nor its consumer's queue, whose bound holds. (Found by the fuzzer.)
TEST(CqLifecycle, LeftoversOfAReusedQpNumberOnAnotherCqAreOrphans) {
  OrphanLedger orphans;
  RuntimeOptions options;
  options.pollers = 2;
  options.orphan_handler = &orphans;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  options.consumers[0].queue_capacity = 1;
  options.consumers[0].spill_capacity = 1;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(old_cq, sim->CreateCq(16, channel));
  CQD_ASSERT_OK_AND_ASSIGN(adopted, rt->AdoptCq(dev, 0, old_cq));
  CQD_ASSERT_OK_AND_ASSIGN(other, rt->CreateCq(dev, 1));
  CQD_ASSERT_OK_AND_ASSIGN(old_qp, sim->CreateQp(old_cq, old_cq));
  const uint32_t number = old_qp->qp_num();
  CQD_ASSERT_OK(rt->DestroyCq(adopted));  // released: nobody polls it
  ASSERT_TRUE(InjectRecvs(old_qp, 0, 8));
  CQD_ASSERT_OK(sim->DestroyQp(old_qp));
  CQD_ASSERT_OK_AND_ASSIGN(new_qp, sim->CreateQp(other.sim(), other.sim()));
  ASSERT_EQ(new_qp->qp_num(), number);
  Recorder handler;
  handler.qp_num = number;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*new_qp, handler, 0));
  CQD_ASSERT_OK_AND_ASSIGN(again, rt->AdoptCq(dev, 0, old_cq));
  ASSERT_TRUE(WaitFor([&] { return orphans.count.load() == 8; }));
  EXPECT_EQ(rt->Drain(0, 64), 0);
  EXPECT_EQ(handler.received(), 0u);
  EXPECT_LE(rt->GetStats().consumers[0].high_water, 1u);
  reg.Unregister();
  CQD_ASSERT_OK(rt->DestroyCq(again));
  CQD_ASSERT_OK(sim->DestroyQp(new_qp));
  CQD_ASSERT_OK(sim->DestroyCq(old_cq));
}

}  // namespace
}  // namespace cqd

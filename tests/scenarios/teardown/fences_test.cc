// SPDX-License-Identifier: BSD-2-Clause
// No completion of a retired QP reaches a later registration, whatever retired it and whatever
// the device accepted of its teardown: the fences of runtime/core/fences.h, on the simulated
// device, with a thread-owned and an engine-driven shard and with shared and split CQs. Each
// case holds the QP's CQ back behind a consumer that is not drained (a busy machine), so that the
// QP's completions are still in the CQ when its number is reused; each failed on 13847e6:
//   - a teardown whose receive marker found the receive queue full (its receives went to the
//     next QP with the number, or, on a shared CQ, that QP's completions to the orphan handler);
//   - two markers on one CQ with the receive marker first (it was orphaned, and the receive
//     side's commitment stayed on the CQ for good);
//   - an SRQ QP whose receive CQ is its own (its receives went to the next QP);
//   - a plain Unregister with completions still in the CQ (they went to the next QP);
//   - a plain Unregister of a QP that completed more once its fence was over (they went to the
//     next QP; it failed on 7b051c2, found by an adversarial review).
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/engine_loop.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::EngineLoop;
using testing::InjectRecvs;
using testing::OrphanLedger;
using testing::Recorder;
using testing::WaitFor;

struct Shape {
  bool engine_shard;  // shard 0 driven by a reactor thread of the test
  bool split;         // the QP's send CQ is not its receive CQ
};

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  return std::string(info.param.engine_shard ? "EngineShard" : "OwnedShard") +
         (info.param.split ? "SplitCqs" : "SharedCq");
}

constexpr int kDepth = 64;
constexpr uint64_t kOld = 100;  // wr_ids of the retired QP's completions

// Consumer 0 (owned) serves the QPs under test; consumer 1 (engine-driven, never drained, queue
// and spill of 2) serves a blocker QP on the receive CQ whose completions fill it, so that the
// receive CQ is not polled until the blocker is unregistered.
class Bed : public testing::Bed {
 public:
  explicit Bed(Shape shape, SimDeviceOptions device = {}) : shape_(shape) {
    RuntimeOptions options;
    options.pollers = 1;
    options.consumers.assign(2, ConsumerOptions{});
    options.consumers[1].kind = ConsumerKind::kEngineDriven;
    options.consumers[1].queue_capacity = 2;
    options.consumers[1].spill_capacity = 2;
    if (shape.engine_shard) options.engine_shards = {0};
    EXPECT_TRUE(Start(options, device).ok());
    if (shape.engine_shard) loop = std::make_unique<EngineLoop>(*rt, 0);
    CqOptions fixed;
    fixed.depth = kDepth;
    fixed.grow = false;
    recv_cq = rt->CreateCq(dev, 0, fixed).value();
    send_cq = shape.split ? rt->CreateCq(dev, 0, fixed).value() : recv_cq;
    blocker = sim->CreateQp(recv_cq.sim(), recv_cq.sim()).value();
    blocker_reg = rt->RegisterQp(*blocker, blocker_handler, 1).value();
  }
  ~Bed() {
    blocker_reg.Unregister();
    if (loop) loop->Stop();
  }

  // Fills consumer 1's queue and spill: from now on the receive CQ is not polled.
  void HoldBack() {
    ASSERT_TRUE(InjectRecvs(blocker, 0, 8));
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().consumers[1].spill_depth == 2; }));
  }
  // Lets the receive CQ be polled again; returns once it is empty.
  void Release() {
    blocker_reg.Unregister();
    ASSERT_TRUE(WaitFor([&] { return recv_cq.sim()->size() == 0 && send_cq.sim()->size() == 0; }));
  }
  SimQp* Qp(SimQpOptions options = {}) {
    return sim->CreateQp(send_cq.sim(), recv_cq.sim(), options).value();
  }
  // Registers `qp` on consumer 0, releasing the held-back CQ if the runtime refuses it for now
  // (UNAVAILABLE: a retired QP's completions with its number are still in a CQ it uses).
  Registration RegisterReleasing(SimQp* qp, QpHandler& handler) {
    Result<Registration> reg = rt->RegisterQp(*qp, handler, 0);
    if (!reg.ok()) {
      EXPECT_EQ(reg.status().code(), StatusCode::kUnavailable) << reg.status().ToString();
      refused = true;
      Release();
      EXPECT_TRUE(WaitFor([&] {
        reg = rt->RegisterQp(*qp, handler, 0);
        return reg.ok();
      })) << reg.status().ToString();
    }
    return reg.ok() ? std::move(reg).value() : Registration{};
  }

  Shape shape_;
  std::unique_ptr<EngineLoop> loop;
  CqHandle recv_cq;
  CqHandle send_cq;
  SimQp* blocker = nullptr;
  Recorder blocker_handler;
  Registration blocker_reg;
  bool refused = false;
};

// The successor `next` (a QP that got the retired one's number) is registered, then given its own
// completions 0..2; it must see those and nothing else, and the retired QP's `old` ones must
// have gone to the orphan handler, with no teardown marker among the orphans.
void ExpectOnlyItsOwn(Bed& bed, SimQp* next, const std::vector<uint64_t>& old) {
  Recorder handler;
  Registration reg = bed.RegisterReleasing(next, handler);
  ASSERT_TRUE(reg.registered());
  bed.Release();  // if it was not refused: now the old completions come out
  ASSERT_TRUE(InjectRecvs(next, 0, 3));
  ASSERT_TRUE(WaitFor([&] { return handler.completions() >= 3; }));
  for (const auto& e : handler.log()) {
    EXPECT_LT(e.wr_id, 3u) << "a completion (wr_id " << e.wr_id << ") of the retired QP reached "
                           << "the QP that reused its number";
  }
  EXPECT_EQ(handler.completions(), 3u);
  const std::vector<uint64_t> orphaned = bed.orphans.wr_ids();
  for (uint64_t id : old) {
    EXPECT_NE(std::find(orphaned.begin(), orphaned.end(), id), orphaned.end())
        << "the retired QP's completion " << id << " was not orphaned";
  }
  for (uint64_t id : orphaned) {
    EXPECT_LT(id, 1000u) << "a teardown marker (wr_id " << id << ") reached the orphan handler";
  }
  reg.Unregister();
}

// The engine destroys the retired `old_qp` and makes a QP with `options`, which gets its number;
// that one must see only its own completions (ExpectOnlyItsOwn).
void DestroyAndReuseItsNumber(Bed& bed, SimQp* old_qp, const std::vector<uint64_t>& old,
                              const SimQpOptions& options = {}) {
  const uint32_t number = old_qp->qp_num();
  CQD_ASSERT_OK(bed.sim->DestroyQp(old_qp));
  SimQp* next = bed.Qp(options);
  ASSERT_EQ(next->qp_num(), number);
  ExpectOnlyItsOwn(bed, next, old);
}

class Fences : public ::testing::TestWithParam<Shape> {};

// Item 2 of issue 28: the receive queue is full and its flushes cannot be written (the CQ is
// full), so the receive marker cannot be posted; the teardown ends at its deadline.
TEST_P(Fences, ReceiveMarkerWithNoRoomStillFencesTheReceiveCq) {
  SimDeviceOptions device;
  device.flush_sends_at_post = false;  // the send marker is posted even when the CQ is full
  Bed bed(GetParam(), device);
  SimQpOptions wrs;
  wrs.max_send_wr = 4;
  wrs.max_recv_wr = 4;
  SimQp* old_qp = bed.Qp(wrs);
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  bed.HoldBack();
  const std::vector<uint64_t> old = {kOld, kOld + 1, kOld + 2, kOld + 3};
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 4));
  for (int i = 0; i < 5; ++i) CQD_ASSERT_OK(old_qp->PostRecv(kOld + 10 + i));  // full
  while (bed.blocker->Complete(7) == 1) {
  }  // the receive CQ is full: the posted receives cannot flush
  TeardownOptions deadline;
  deadline.timeout = std::chrono::milliseconds(50);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(old_reg, deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  DestroyAndReuseItsNumber(bed, old_qp, old, wrs);
  EXPECT_EQ(old_handler.completions(), 0u);
}

// Item 3: both markers on one CQ, the receive marker first (the device flushes receives first and
// a send posted in error only at the next move to error). Once both are polled the QP's whole
// commitment is back: a QP that needs all of the CQ is admitted.
TEST_P(Fences, MarkersEndTheirFencesInEitherOrder) {
  SimDeviceOptions device;
  device.flush_sends_at_post = false;
  Bed bed(GetParam(), device);
  SimQpOptions wrs;
  wrs.max_send_wr = 4;
  wrs.max_recv_wr = 4;
  SimQp* old_qp = bed.Qp(wrs);
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  bed.HoldBack();
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 2));
  TeardownOptions deadline;
  deadline.timeout = std::chrono::milliseconds(30);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(old_reg, deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  CQD_ASSERT_OK(bed.sim->DestroyQp(old_qp));
  bed.Release();  // both markers are polled, the receive marker first
  // The blocker and the old QP are gone: each CQ is free but for nothing. A QP that needs the
  // whole receive CQ (its two markers included) fits once both fences have ended.
  SimQpOptions whole;  // with a marker per queue: all of each CQ
  whole.max_send_wr = bed.shape_.split ? kDepth - 1 : kDepth / 2 - 1;
  whole.max_recv_wr = whole.max_send_wr;
  SimQp* wide = bed.Qp(whole);
  Recorder wide_handler;
  Result<Registration> admitted = Status(StatusCode::kInternal, "not tried");
  EXPECT_TRUE(WaitFor([&] {
    admitted = bed.rt->RegisterQp(*wide, wide_handler, 0);
    return admitted.ok();
  })) << "the retired QP's commitment stayed on the CQ: "
      << admitted.status().ToString();
  for (uint64_t id : bed.orphans.wr_ids()) {
    EXPECT_LT(id, 1000u) << "a teardown marker (wr_id " << id << ") reached the orphan handler";
  }
  EXPECT_EQ(old_handler.completions(), 0u);
}

// Item 4: an SRQ QP (here with a receive CQ of its own, when split) on a device that never raises
// LAST_WQE_REACHED, whose teardown ends at its deadline, before the grace period: no marker
// stands behind its receives.
TEST_P(Fences, SrqReceivesAreFencedWithoutLastWqeReached) {
  SimDeviceOptions device;
  device.last_wqe_reached = false;  // as rxe
  Bed bed(GetParam(), device);
  SimQpOptions srq;
  srq.srq = true;
  SimQp* old_qp = bed.Qp(srq);
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  bed.HoldBack();
  const std::vector<uint64_t> old = {kOld, kOld + 1, kOld + 2};
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 3));  // receives it took from the SRQ
  TeardownOptions deadline;
  deadline.timeout = std::chrono::milliseconds(30);  // before last_wqe_grace (200 ms)
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(old_reg, deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  DestroyAndReuseItsNumber(bed, old_qp, old);
}

// A plain Unregister while the QP's completions are still in its CQ (the engine destroyed the QP
// at once): the next QP with the number gets none of them.
TEST_P(Fences, PlainUnregisterFencesWhatIsStillInTheCq) {
  Bed bed(GetParam());
  SimQp* old_qp = bed.Qp();
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  bed.HoldBack();
  const std::vector<uint64_t> old = {kOld, kOld + 1};
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 2));
  old_reg.Unregister();
  DestroyAndReuseItsNumber(bed, old_qp, old);
  EXPECT_TRUE(bed.refused) << "registered while the old completions were still in the CQ";
}

// What a QP completes after a plain Unregister, once that Unregister's fence is over (the CQ was
// polled past it) and before the engine destroys the QP (a receive its peer sent in between):
// those completions wait in the CQ, and the next QP with the number gets none of them, since
// RegisterQp polls a number that retired on the CQ out of it first (retired_numbers.h).
TEST_P(Fences, WhatAQpCompletesAfterUnregisterNeverReachesTheNext) {
  Bed bed(GetParam());
  SimQp* old_qp = bed.Qp();
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  SimQp* probe = bed.Qp();
  Recorder probe_handler;
  Registration probe_reg = bed.rt->RegisterQp(*probe, probe_handler, 0).value();
  old_reg.Unregister();
  // A poll after the Unregister found the CQ empty behind the probe: its fence is over.
  ASSERT_TRUE(InjectRecvs(probe, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return probe_handler.completions() == 1; }));
  bed.HoldBack();
  const std::vector<uint64_t> old = {kOld, kOld + 1};
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 2));
  DestroyAndReuseItsNumber(bed, old_qp, old);
  EXPECT_TRUE(bed.refused) << "registered while the old completions were still in the CQ";
  EXPECT_EQ(old_handler.completions(), 0u);
  probe_reg.Unregister();
}

// The capacity guard keeps a plainly unregistered QP's commitment while its completions may be in
// the CQ, and gives it back once they are polled.
TEST_P(Fences, PlainUnregisterKeepsTheCommitmentUntilPolled) {
  Bed bed(GetParam());
  SimQpOptions half;
  half.max_send_wr = 14;
  half.max_recv_wr = 14;  // 30 of the 64 with its markers, or of each CQ's when split
  SimQp* old_qp = bed.Qp(half);
  Recorder old_handler;
  Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
  bed.HoldBack();
  ASSERT_TRUE(InjectRecvs(old_qp, kOld, 14));
  old_reg.Unregister();
  SimQpOptions rest;
  // 34 of the shared CQ, or 62 of each split one: too many beside the old QP's 30 (15).
  rest.max_send_wr = bed.shape_.split ? kDepth - 3 : 16;
  rest.max_recv_wr = rest.max_send_wr;
  SimQp* other = bed.Qp(rest);
  Recorder other_handler;
  Result<Registration> refused = bed.rt->RegisterQp(*other, other_handler, 0);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted)
      << "admitted while the unregistered QP's completions were still in the CQ";
  bed.Release();
  Result<Registration> admitted = Status(StatusCode::kInternal, "not tried");
  EXPECT_TRUE(WaitFor([&] {
    admitted = bed.rt->RegisterQp(*other, other_handler, 0);
    return admitted.ok();
  })) << admitted.status().ToString();
}

// Plain Unregister while traffic still flows (each QP goes on completing work until the engine
// destroys it, some of it after the Unregister), from four threads at once, in rounds whose new
// QPs get the numbers of the last round's: every handler sees only its own QP's completions,
// from wr_id 0 in order, and everything injected is delivered or orphaned. (On 7b051c2 a new
// QP now and then got an old one's completions: 1 run in 20 under ASan, none in 30 without it,
// since the poller must lag behind the traffic; WhatAQpCompletesAfterUnregisterNeverReachesTheNext
// is the deterministic case.)
TEST(FencesUnderTraffic, QpsUnregisteredWhileTrafficFlowsKeepTheirCompletions) {
  testing::Bed bed;
  ASSERT_TRUE(bed.Start().ok());
  CqHandle cq = bed.Cq(0, {.depth = 8192});
  uint64_t injected = 0;
  uint64_t delivered = 0;
  for (int round = 0; round < 30; ++round) {
    std::vector<SimQp*> qps;
    std::vector<std::unique_ptr<testing::Recorder>> handlers;
    std::vector<Registration> regs;
    for (int i = 0; i < 4; ++i) {
      qps.push_back(bed.Qp(cq, {.max_send_wr = 4, .max_recv_wr = 4}));
      handlers.push_back(std::make_unique<testing::Recorder>());
      handlers.back()->qp_num = qps.back()->qp_num();
      Result<Registration> reg = Status(StatusCode::kInternal, "not tried");
      // UNAVAILABLE while the last round's completions of the number are polled out: later.
      ASSERT_TRUE(WaitFor([&] {
        reg = bed.rt->RegisterQp(*qps.back(), *handlers.back(), 0);
        return reg.status().code() != StatusCode::kUnavailable;
      }));
      ASSERT_TRUE(reg.ok()) << reg.status().ToString();
      regs.push_back(std::move(reg).value());
    }
    SimTrafficSource source({.qps = qps, .completions_per_qp = 300});
    source.Start();
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (round % 7)));  // vary the cut
    std::vector<std::thread> unregistering;
    for (Registration& reg : regs) unregistering.emplace_back([&reg] { reg.Unregister(); });
    for (std::thread& t : unregistering) t.join();
    source.Join();  // the QPs complete the rest of their work, for nobody
    injected += source.total();
    for (SimQp* qp : qps) CQD_ASSERT_OK(bed.sim->DestroyQp(qp));
    for (const auto& handler : handlers) {
      EXPECT_EQ(handler->out_of_order(), 0u) << "round " << round;
      EXPECT_EQ(handler->wrong_qp(), 0u) << "round " << round;
      delivered += handler->received();
    }
  }
  CQD_ASSERT_OK(bed.rt->DestroyCq(cq));
  CQD_ASSERT_OK(bed.rt->Shutdown());
  EXPECT_EQ(delivered + bed.rt->GetStats().orphans, injected);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fences,
                         ::testing::Values(Shape{false, false}, Shape{false, true},
                                           Shape{true, false}, Shape{true, true}),
                         ShapeName);

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// FenceList (runtime/core/fences.h): every way a polled completion meets a retired QP's fence
// (its marker in either order, behind a marker, another qp_num, another CQ), every way a fence
// ends (marker, catch-up by an empty poll or a depth's worth, the CQ's removal), and the counters
// and commitments it keeps on the CQ; a QP in the error state registering makes a fence that
// awaits a marker wait for it.
#include "runtime/core/fences.h"

#include "gtest/gtest.h"
#include "tests/unit/core/fake_cq.h"

namespace cqd::internal {
namespace {

constexpr uint32_t kQp = 0x101;
constexpr uint64_t kSendMarker = 0x7f0000001000;
constexpr uint64_t kRecvMarker = kSendMarker + 1;

class FenceListTest : public ::testing::Test {
 protected:
  FenceListTest() {
    cq.cq = &fake;
    other.cq = &other_fake;
  }
  Fence Side(CqRecord& on, uint64_t marker, uint64_t commit, bool unfenced = false) {
    Fence f;
    f.cq = &on;
    f.qp_num = kQp;
    f.marker = marker;
    f.unfenced = unfenced;
    f.commit = commit;
    return f;
  }
  static ibv_wc Wc(uint32_t qp_num, uint64_t wr_id) {
    ibv_wc wc{};
    wc.qp_num = qp_num;
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    return wc;
  }

  FakeCq fake{64};
  FakeCq other_fake{64};
  CqRecord cq;
  CqRecord other;
  FenceList fences;
};

using Taken = FenceList::Taken;

// The retired QP itself registers again, in the error state: its fence that awaits a marker
// outlasts the catch-up (the marker may come after it), keeps holding, and ends with its marker.
// Another QP object in error, or any QP not in error, lets catch-ups end fences as before.
TEST_F(FenceListTest, AFenceAwaitingAMarkerOutlastsACatchUpWhenItsOwnQpRegistersInError) {
  int retired_qp = 0;
  int other_qp = 0;
  Fence f = Side(cq, kRecvMarker, 7);
  f.qp = &retired_qp;
  fences.Add(f, false);
  fences.AwaitMarkers(&cq, kQp, &retired_qp);
  fences.StartCatchUps(&cq, kQp);
  EXPECT_EQ(cq.catch_ups, 1u);
  fences.Polled(&cq, 0, /*empty=*/true);
  EXPECT_EQ(cq.catch_ups, 0u) << "the catch-up is over";
  EXPECT_TRUE(fences.Holds(&cq, kQp)) << "but the marker has not come back";
  EXPECT_EQ(cq.leftover_commit.load(), 7u);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kRecvMarker)), Taken::kMarker);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);

  for (const void* registering :
       {static_cast<const void*>(&other_qp), static_cast<const void*>(nullptr)}) {
    Fence g = Side(cq, kSendMarker, 5);
    g.qp = &retired_qp;
    fences.Add(g, false);
    fences.AwaitMarkers(&cq, kQp, &retired_qp);  // refused once as the retired QP in error
    fences.AwaitMarkers(&cq, kQp, registering);  // then another QP registers
    fences.StartCatchUps(&cq, kQp);
    fences.Polled(&cq, 0, true);
    EXPECT_FALSE(fences.Holds(&cq, kQp));
    EXPECT_EQ(cq.awaited_markers, 0u);
    EXPECT_EQ(cq.fences.load(), 0u);
  }
}

TEST_F(FenceListTest, AFenceWithNothingToWaitForIsNotAdded) {
  fences.Add(Side(cq, 0, 5), /*catch_up=*/false);
  EXPECT_EQ(fences.size(), 0u);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(cq.fences.load(), 0u);
}

TEST_F(FenceListTest, MarkersEndTheirFencesSendFirst) {
  fences.Add(Side(cq, kSendMarker, 5), false);
  fences.Add(Side(cq, kRecvMarker, 7), false);
  EXPECT_EQ(cq.awaited_markers, 2u);
  EXPECT_EQ(cq.leftover_commit.load(), 12u);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, 42)), Taken::kBehindMarker);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kSendMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 7u);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, 43)), Taken::kBehindMarker);  // the receive side's
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kRecvMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(cq.awaited_markers, 0u);
  EXPECT_EQ(cq.fences.load(), 0u);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
}

TEST_F(FenceListTest, MarkersEndTheirFencesReceiveFirst) {
  fences.Add(Side(cq, kSendMarker, 5), false);
  fences.Add(Side(cq, kRecvMarker, 7), false);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kRecvMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 5u);
  EXPECT_TRUE(fences.Holds(&cq, kQp));
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kSendMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(fences.size(), 0u);
}

TEST_F(FenceListTest, AfterItsMarkerAQpNumberRoutesAsUsual) {
  fences.Add(Side(cq, kSendMarker, 5), false);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kSendMarker)), Taken::kMarker);
  EXPECT_EQ(cq.awaited_markers, 0u);  // the poller stops asking
  fences.Add(Side(cq, kRecvMarker, 1), false);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kSendMarker)), Taken::kBehindMarker);  // not awaited now
}

TEST_F(FenceListTest, AnotherQpNumberOrAnotherCqIsNotFenced) {
  fences.Add(Side(cq, kSendMarker, 5), false);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp + 1, 42)), Taken::kNotFenced);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp + 1, kSendMarker)), Taken::kNotFenced);
  EXPECT_EQ(fences.Take(&other, Wc(kQp, kSendMarker)), Taken::kNotFenced);  // wrong CQ
  EXPECT_FALSE(fences.Holds(&other, kQp));
  EXPECT_TRUE(fences.Holds(&cq, kQp));
}

TEST_F(FenceListTest, AnUnfencedSideOutlivesItsMarkerAndEndsOnlyByACatchUp) {
  Fence side = Side(cq, kRecvMarker, 3, /*unfenced=*/true);
  fences.Add(side, false);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kRecvMarker)), Taken::kMarker);
  EXPECT_TRUE(fences.Holds(&cq, kQp));  // still: nothing says the rest is out
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, 5)), Taken::kNotFenced);
  fences.StartCatchUps(&cq, kQp);
  EXPECT_EQ(cq.catch_ups, 1u);
  fences.Polled(&cq, 0, /*empty=*/true);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(cq.catch_ups, 0u);
}

TEST_F(FenceListTest, ACatchUpEndsAfterADepthsWorthOrAnEmptyPoll) {
  fences.Add(Side(cq, 0, 4, true), /*catch_up=*/true);  // a plain Unregister's
  fences.Polled(&cq, 32, false);
  EXPECT_TRUE(fences.Holds(&cq, kQp));
  fences.Polled(&cq, 31, false);
  EXPECT_TRUE(fences.Holds(&cq, kQp));  // 63 of 64
  fences.Polled(&cq, 1, false);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.catch_ups, 0u);
  fences.Add(Side(cq, 0, 4, true), true);
  fences.Polled(&cq, 100, false);  // past the depth in one poll
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.catch_ups, 0u);
  fences.Add(Side(cq, 0, 4, true), true);
  fences.Polled(&other, 0, true);  // another CQ's empty poll says nothing of this one
  EXPECT_TRUE(fences.Holds(&cq, kQp));
  fences.Polled(&cq, 3, true);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
}

TEST_F(FenceListTest, ACatchUpEndsAMarkerFenceToo) {
  // At reuse the old QP is destroyed: what it left is in the CQ, or was cleaned out of it with
  // its marker (mlx5), so a catch-up ends the wait for the marker.
  fences.Add(Side(cq, kSendMarker, 5), false);
  fences.StartCatchUps(&cq, kQp + 1);  // another number: nothing starts
  EXPECT_EQ(cq.catch_ups, 0u);
  fences.StartCatchUps(&cq, kQp);
  fences.Polled(&cq, 10, true);
  EXPECT_EQ(fences.size(), 0u);
  EXPECT_EQ(cq.awaited_markers, 0u);
}

// RegisterQp's own catch-up of a retired number (retired_numbers.h) is told apart from the
// fences the retirement made, per number and CQ, and ends as any catch-up does.
TEST_F(FenceListTest, AReuseCatchUpIsKnownByNumberAndCq) {
  fences.Add(Side(cq, 0, 4, true), /*catch_up=*/true);  // a plain Unregister's
  EXPECT_FALSE(fences.HoldsForReuse(&cq, kQp));
  Fence reuse;
  reuse.cq = &cq;
  reuse.qp_num = kQp;
  reuse.for_reuse = true;
  fences.Add(reuse, /*catch_up=*/true);
  EXPECT_TRUE(fences.HoldsForReuse(&cq, kQp));
  EXPECT_FALSE(fences.HoldsForReuse(&cq, kQp + 1));
  EXPECT_FALSE(fences.HoldsForReuse(&other, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 4u);  // the reuse catch-up holds no commitment
  fences.Polled(&cq, 2, true);
  EXPECT_FALSE(fences.HoldsForReuse(&cq, kQp));
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.catch_ups, 0u);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
}

TEST_F(FenceListTest, DroppingACqEndsItsFencesOnly) {
  fences.Add(Side(cq, kSendMarker, 5), false);
  fences.Add(Side(other, kRecvMarker, 6), false);
  fences.DropCq(&cq);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_TRUE(fences.Holds(&other, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(other.leftover_commit.load(), 6u);
}

}  // namespace
}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// FenceList (runtime/core/fences.h): every way a polled completion meets a retired QP's fence
// (its marker in either order, behind a marker, another qp_num, another CQ), every way a fence
// ends (marker, catch-up by an empty poll or a depth's worth, the CQ's removal), and the counters
// and commitments it keeps on the CQ; a QP in the error state registering makes a fence that
// awaits a marker wait for it; and, against a plain list that scans everything, the same answers
// and counters for thousands of fences on two CQs ended in every way and order (the hash chains,
// the marking of ended fences and the compaction).
#include "runtime/core/fences.h"

#include <algorithm>
#include <random>
#include <vector>

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
  EXPECT_EQ(cq.fenced.catch_ups, 1u);
  fences.Polled(&cq, 0, /*empty=*/true);
  EXPECT_EQ(cq.fenced.catch_ups, 0u) << "the catch-up is over";
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
    EXPECT_EQ(cq.fenced.awaited_markers, 0u);
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
  EXPECT_EQ(cq.fenced.awaited_markers, 2u);
  EXPECT_EQ(cq.leftover_commit.load(), 12u);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, 42)), Taken::kBehindMarker);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kSendMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 7u);
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, 43)), Taken::kBehindMarker);  // the receive side's
  EXPECT_EQ(fences.Take(&cq, Wc(kQp, kRecvMarker)), Taken::kMarker);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(cq.fenced.awaited_markers, 0u);
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
  EXPECT_EQ(cq.fenced.awaited_markers, 0u);  // the poller stops asking
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
  EXPECT_EQ(cq.fenced.catch_ups, 1u);
  fences.Polled(&cq, 0, /*empty=*/true);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(cq.fenced.catch_ups, 0u);
}

TEST_F(FenceListTest, ACatchUpEndsAfterADepthsWorthOrAnEmptyPoll) {
  fences.Add(Side(cq, 0, 4, true), /*catch_up=*/true);  // a plain Unregister's
  fences.Polled(&cq, 32, false);
  EXPECT_TRUE(fences.Holds(&cq, kQp));
  fences.Polled(&cq, 31, false);
  EXPECT_TRUE(fences.Holds(&cq, kQp));  // 63 of 64
  fences.Polled(&cq, 1, false);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.fenced.catch_ups, 0u);
  fences.Add(Side(cq, 0, 4, true), true);
  fences.Polled(&cq, 100, false);  // past the depth in one poll
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.fenced.catch_ups, 0u);
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
  EXPECT_EQ(cq.fenced.catch_ups, 0u);
  fences.StartCatchUps(&cq, kQp);
  fences.Polled(&cq, 10, true);
  EXPECT_EQ(fences.size(), 0u);
  EXPECT_EQ(cq.fenced.awaited_markers, 0u);
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
  EXPECT_EQ(cq.fenced.catch_ups, 0u);
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

// The reference: every fence in one vector, every question a scan, an ended fence erased at once
// (what FenceList did before it had chains). Only the verdicts and what the CQ is told matter.
class ScanningFences {
 public:
  void Add(const Fence& fence, bool catch_up, int depth) {
    if (fence.marker == 0 && !fence.unfenced && !catch_up) return;
    Side& f = list_.emplace_back(Side{fence});
    f.catch_up_left = catch_up ? depth : -1;
  }
  FenceList::Taken Take(const CqRecord* cq, const ibv_wc& wc) {
    bool awaited = false;
    for (size_t i = 0; i < list_.size(); ++i) {
      Side& f = list_[i];
      if (f.cq != cq || f.marker == 0 || f.qp_num != wc.qp_num) continue;
      if (f.marker != wc.wr_id) {
        awaited = true;
        continue;
      }
      f.marker = 0;
      if (!f.unfenced) list_.erase(list_.begin() + static_cast<std::ptrdiff_t>(i));
      return FenceList::Taken::kMarker;
    }
    return awaited ? FenceList::Taken::kBehindMarker : FenceList::Taken::kNotFenced;
  }
  void Polled(const CqRecord* cq, int n, bool empty) {
    std::erase_if(list_, [&](Side& f) {
      if (f.cq != cq || f.catch_up_left < 0) return false;
      f.catch_up_left = std::max<int64_t>(0, f.catch_up_left - n);
      if (!empty && f.catch_up_left > 0) return false;
      if (!f.marker_first || f.marker == 0) return true;
      f.catch_up_left = -1;
      return false;
    });
  }
  void StartCatchUps(const CqRecord* cq, uint32_t qp_num, int depth) {
    for (Side& f : list_) {
      if (f.cq == cq && f.qp_num == qp_num && f.catch_up_left < 0) f.catch_up_left = depth;
    }
  }
  void AwaitMarkers(const CqRecord* cq, uint32_t qp_num, const void* in_error_qp) {
    for (Side& f : list_) {
      if (f.cq == cq && f.qp_num == qp_num)
        f.marker_first = in_error_qp != nullptr && f.qp == in_error_qp;
    }
  }
  bool Holds(const CqRecord* cq, uint32_t qp_num, bool for_reuse_only = false) const {
    return std::any_of(list_.begin(), list_.end(), [&](const Side& f) {
      return f.cq == cq && f.qp_num == qp_num && (f.for_reuse || !for_reuse_only);
    });
  }
  void DropCq(const CqRecord* cq) {
    std::erase_if(list_, [&](const Side& f) { return f.cq == cq; });
  }
  // What FenceList keeps in the CQ's counters, recomputed.
  void ExpectCounters(const CqRecord& cq) const {
    uint32_t markers = 0, catch_ups = 0, fences = 0;
    uint64_t commit = 0;
    for (const Side& f : list_) {
      if (f.cq != &cq) continue;
      markers += f.marker != 0;
      catch_ups += f.catch_up_left >= 0;
      ++fences;
      commit += f.commit;
    }
    ASSERT_EQ(cq.fenced.awaited_markers, markers);
    ASSERT_EQ(cq.fenced.catch_ups, catch_ups);
    ASSERT_EQ(cq.fences.load(), fences);
    ASSERT_EQ(cq.leftover_commit.load(), commit);
  }
  size_t size() const { return list_.size(); }

 private:
  struct Side : Fence {
    int64_t catch_up_left = -1;  // completions the CQ may still yield; < 0: no catch-up running
  };
  std::vector<Side> list_;
};

// FenceList and the scan, told the same things: every answer and every count compared.
struct FenceListAndScan {
  FenceList fences;
  ScanningFences model;

  void Add(const Fence& f, bool catch_up) {
    fences.Add(f, catch_up);
    model.Add(f, catch_up, f.cq->cq->depth());
  }
  void Take(CqRecord* on, const ibv_wc& wc) { ASSERT_EQ(fences.Take(on, wc), model.Take(on, wc)); }
  void Polled(CqRecord* on, int n, bool empty) {
    fences.Polled(on, n, empty);
    model.Polled(on, n, empty);
  }
  void StartCatchUps(CqRecord* on, uint32_t qp_num) {
    fences.StartCatchUps(on, qp_num);
    model.StartCatchUps(on, qp_num, on->cq->depth());
  }
  void AwaitMarkers(CqRecord* on, uint32_t qp_num, const void* in_error) {
    fences.AwaitMarkers(on, qp_num, in_error);
    model.AwaitMarkers(on, qp_num, in_error);
  }
  void DropCq(CqRecord* on) {
    fences.DropCq(on);
    model.DropCq(on);
  }
  void Holds(CqRecord* on, uint32_t qp_num) {
    ASSERT_EQ(fences.Holds(on, qp_num), model.Holds(on, qp_num));
    ASSERT_EQ(fences.HoldsForReuse(on, qp_num), model.Holds(on, qp_num, true));
  }
  void SameSize() { ASSERT_EQ(fences.size(), model.size()); }
};

TEST_F(FenceListTest, ThousandsOfFencesAnswerAsAScanOfThemAllWould) {
  std::mt19937_64 rng(29);
  FenceListAndScan both;
  CqRecord* cqs[] = {&cq, &other};
  int qp_objects[64] = {};
  uint64_t next_marker = kSendMarker;
  std::vector<uint64_t> markers;  // every marker handed out, awaited or not
  auto pick = [&](uint64_t n) { return static_cast<uint32_t>(rng() % n); };
  for (int round = 0; round < 6; ++round) {
    // Grow to thousands (the chains rehash several times), then end most of them.
    const int adds = round % 2 == 0 ? 6000 : 400;
    for (int step = 0; step < 12000; ++step) {
      CqRecord* on = cqs[pick(2)];
      const uint32_t qp_num = 0x100 + pick(round % 3 == 0 ? 3000 : 40);  // sparse, then crowded
      const int op = static_cast<int>(pick(100));
      if (op < adds / 100) {
        Fence f;
        f.cq = on;
        f.qp_num = qp_num;
        f.marker = pick(4) == 0 ? 0 : next_marker++;
        if (f.marker != 0) markers.push_back(f.marker);
        f.unfenced = pick(5) == 0;
        f.commit = pick(9);
        f.qp = &qp_objects[pick(64)];
        f.for_reuse = f.marker == 0 && pick(3) == 0;
        both.Add(f, /*catch_up=*/pick(3) == 0);
      } else if (op < 75) {
        ibv_wc wc = Wc(qp_num, markers.empty() || pick(3) == 0 ? 7 : markers[pick(markers.size())]);
        ASSERT_NO_FATAL_FAILURE(both.Take(on, wc)) << "step " << step;
      } else if (op < 85) {
        const int n = static_cast<int>(pick(40));  // drawn in this order, n first
        both.Polled(on, n, /*empty=*/pick(4) == 0);
      } else if (op < 92) {
        both.StartCatchUps(on, qp_num);
      } else if (op < 97) {
        both.AwaitMarkers(on, qp_num, pick(2) == 0 ? nullptr : &qp_objects[pick(64)]);
      } else if (op < 98 && round % 2 == 1) {
        both.DropCq(on);
      } else {
        ASSERT_NO_FATAL_FAILURE(both.Holds(on, qp_num)) << "step " << step;
      }
      ASSERT_NO_FATAL_FAILURE(both.SameSize()) << "round " << round << " step " << step;
    }
    ASSERT_NO_FATAL_FAILURE(both.model.ExpectCounters(cq));
    ASSERT_NO_FATAL_FAILURE(both.model.ExpectCounters(other));
  }
  for (CqRecord* on : cqs) {
    both.DropCq(on);
    ASSERT_NO_FATAL_FAILURE(both.model.ExpectCounters(*on));
  }
  EXPECT_EQ(both.fences.size(), 0u);
}

// A CQ whose depth the test changes between a catch-up's start and its end.
class ResizedCq : public FakeCq {
 public:
  ResizedCq() : FakeCq(8) {}
  int depth() const noexcept override { return resized_depth; }
  int resized_depth = 8;
};

// The catch-up clock (catch_up_polled, catch_up_due) against the plain scan, where its shortcuts
// could go wrong: a depth that changes while catch-ups run (down to 0), polls that take nothing,
// Polled on a CQ with no catch-up, catch-ups restarted mid-way, and few numbers, so that chains
// hold several fences. Every counter is compared after every step, over several seeds.
TEST(FenceListClock, CatchUpsEndAsAScanWouldWhateverTheDepthAndThePolls) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t n) { return static_cast<uint32_t>(rng() % n); };
    ResizedCq devices[2];
    CqRecord records[2];
    records[0].cq = &devices[0];
    records[1].cq = &devices[1];
    FenceListAndScan both;
    int qp_objects[8] = {};
    uint64_t next_marker = 1;
    for (int step = 0; step < 20000; ++step) {
      const int which = static_cast<int>(pick(2));
      CqRecord* on = &records[which];
      const uint32_t qp_num = pick(6);
      const int op = static_cast<int>(pick(100));
      if (op < 30) {
        Fence f;
        f.cq = on;
        f.qp_num = qp_num;
        f.marker = pick(3) == 0 ? 0 : next_marker++;
        f.unfenced = pick(4) == 0;
        f.commit = uint64_t{1} << pick(20);  // tells which fence ended, not only how many
        f.qp = &qp_objects[pick(8)];
        f.for_reuse = f.marker == 0 && pick(3) == 0;
        both.Add(f, /*catch_up=*/pick(2) == 0);
      } else if (op < 55) {
        ibv_wc wc{};
        wc.qp_num = qp_num;
        wc.wr_id = 1 + pick(next_marker);  // a marker handed out, or the next one
        ASSERT_NO_FATAL_FAILURE(both.Take(on, wc)) << "seed " << seed << " step " << step;
      } else if (op < 80) {
        const int n = pick(3) == 0 ? 0 : static_cast<int>(pick(12));
        const bool empty = pick(6) == 0;
        // The poller calls Polled only with catch-ups running; now and then the test does anyway.
        if (on->fenced.catch_ups != 0 || pick(4) == 0) both.Polled(on, n, empty);
      } else if (op < 88) {
        both.StartCatchUps(on, qp_num);
      } else if (op < 92) {
        both.AwaitMarkers(on, qp_num, pick(2) == 0 ? nullptr : &qp_objects[pick(8)]);
      } else if (op < 96) {
        devices[which].resized_depth = static_cast<int>(pick(20));
      } else if (op < 97) {
        both.DropCq(on);
      } else {
        ASSERT_NO_FATAL_FAILURE(both.Holds(on, qp_num)) << "seed " << seed << " step " << step;
      }
      ASSERT_NO_FATAL_FAILURE(both.SameSize()) << "seed " << seed << " step " << step;
      ASSERT_NO_FATAL_FAILURE(both.model.ExpectCounters(records[0])) << "seed " << seed;
      ASSERT_NO_FATAL_FAILURE(both.model.ExpectCounters(records[1])) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace cqd::internal

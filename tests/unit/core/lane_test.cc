// SPDX-License-Identifier: BSD-2-Clause
// Lane (runtime/core/lane.h): the ring a poller fills for one consumer. The spill's room and
// fullness, FIFO order through Publish, the ring edge (contiguous, IndexOf, wrap), the physical
// bound that holds once entries are handed over but not released, Filter, and event entries.
#include "runtime/core/lane.h"

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

// Appends one completion entry tagged with `tag` (in wr_id and slot).
void Push(Lane& lane, uint64_t tag) {
  ASSERT_GT(lane.room(), 0u);
  const uint32_t at = lane.tail_at();
  lane.wc(at) = ibv_wc{};
  lane.wc(at).wr_id = tag;
  lane.meta(at) = {static_cast<uint32_t>(tag), static_cast<uint32_t>(tag * 3),
                   EntryKind::kCompletion, 0, 0};
  lane.Append();
}

// Takes up to `max` entries off the front of the spill, as a hand-over does; returns their tags.
std::vector<uint64_t> Take(Lane& lane, uint32_t max) {
  std::vector<uint64_t> out;
  const uint64_t begin = lane.published();
  const uint32_t n = std::min(max, lane.spill_size());
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t at = lane.IndexOf(begin + k);
    EXPECT_EQ(lane.meta(at).slot, static_cast<uint32_t>(lane.wc(at).wr_id));
    out.push_back(lane.wc(at).wr_id);
  }
  lane.Publish(n);
  return out;
}

using Tags = std::vector<uint64_t>;

TEST(Lane, StartsEmpty) {
  Lane lane(3, 16, 32);
  EXPECT_EQ(lane.index(), 3u);
  EXPECT_EQ(lane.size(), 48u);
  EXPECT_TRUE(lane.spill_empty());
  EXPECT_FALSE(lane.spill_full());
  EXPECT_EQ(lane.spill_size(), 0u);
  EXPECT_EQ(lane.room(), 16u);
  EXPECT_EQ(lane.contiguous(), 48u);
  EXPECT_EQ(lane.high_water.load(), 0u);
  EXPECT_EQ(lane.stalls.load(), 0u);
}

TEST(Lane, SpillRoomAndFullTrackAppendsAndPops) {
  Lane lane(0, 4, 8);
  for (uint64_t t = 0; t < 4; ++t) Push(lane, t);
  EXPECT_TRUE(lane.spill_full());
  EXPECT_EQ(lane.room(), 0u);
  EXPECT_EQ(Take(lane, 1), Tags({0}));
  EXPECT_FALSE(lane.spill_full());
  EXPECT_EQ(lane.room(), 1u);
  EXPECT_EQ(Take(lane, 10), Tags({1, 2, 3}));
  EXPECT_TRUE(lane.spill_empty());
  EXPECT_EQ(lane.room(), 4u);
}

TEST(Lane, SpillLimitOfOne) {
  Lane lane(0, 1, 1);
  Push(lane, 7);
  EXPECT_EQ(lane.room(), 0u);
  EXPECT_EQ(Take(lane, 5), Tags({7}));
  EXPECT_EQ(lane.room(), 1u);
}

TEST(Lane, HandedOverEntriesHoldTheRingUntilReleased) {
  // queue 4 + spill 4: 8 entries. Hand 4 over, refill the spill: the ring is full until the
  // consumer releases.
  Lane lane(0, 4, 4);
  for (uint64_t t = 0; t < 4; ++t) Push(lane, t);
  EXPECT_EQ(Take(lane, 4), Tags({0, 1, 2, 3}));  // handed over, not released
  for (uint64_t t = 4; t < 8; ++t) Push(lane, t);
  EXPECT_EQ(Take(lane, 4), Tags({4, 5, 6, 7}));  // a forced hand-over past the queue bound
  EXPECT_EQ(lane.room(), 0u)
      << "8 entries unreleased: the ring is full although the spill is empty";
  lane.Recycle(2);
  EXPECT_EQ(lane.room(), 2u);
  lane.Recycle(8);
  EXPECT_EQ(lane.room(), 4u);
  EXPECT_EQ(lane.tail_at(), 0u);
}

TEST(Lane, ContiguousStopsAtTheRingEdgeAndPositionsWrap) {
  Lane lane(0, 3, 2);  // a ring of 5
  for (uint64_t t = 0; t < 3; ++t) Push(lane, t);
  EXPECT_EQ(lane.contiguous(), 2u);
  EXPECT_EQ(Take(lane, 3), Tags({0, 1, 2}));
  lane.Recycle(3);
  for (uint64_t t = 3; t < 6; ++t) Push(lane, t);  // positions 3, 4 and 5 (index 0)
  EXPECT_EQ(lane.tail_at(), 1u);
  EXPECT_EQ(lane.IndexOf(5), 0u);
  EXPECT_EQ(lane.contiguous(), 4u);
  EXPECT_EQ(Take(lane, 10), Tags({3, 4, 5}));
}

TEST(Lane, AdvanceCommitsEntriesWrittenInPlace) {
  Lane lane(0, 8, 8);
  const uint32_t at = lane.tail_at();
  for (uint32_t k = 0; k < 5; ++k) {
    lane.wc(at + k).wr_id = 100 + k;
    lane.meta(at + k) = {100 + k, 0, EntryKind::kCompletion, 0, 0};
  }
  lane.Advance(5);
  EXPECT_EQ(lane.spill_size(), 5u);
  EXPECT_EQ(Take(lane, 10), Tags({100, 101, 102, 103, 104}));
}

TEST(Lane, EventEntriesCarryTheirJoin) {
  Lane lane(0, 4, 4);
  auto* fake = reinterpret_cast<EventJoin*>(uintptr_t{0x1234560});
  const uint32_t at = lane.tail_at();
  lane.SetJoin(at, fake);
  lane.meta(at) = {9, 2, EntryKind::kEventPart, 0, 0};
  lane.Append();
  EXPECT_EQ(lane.join(at), fake);
  EXPECT_EQ(lane.meta(at).kind, EntryKind::kEventPart);
}

TEST(Lane, FilterKeepsOrderAcrossTheEdgeAndReturnsHowManyItRemoved) {
  Lane lane(0, 6, 1);  // a ring of 7
  for (uint64_t t = 0; t < 4; ++t) Push(lane, t);
  Take(lane, 4);
  lane.Recycle(4);
  for (uint64_t t = 10; t < 16; ++t) Push(lane, t);  // wraps after two
  const uint32_t removed =
      lane.Filter([&](const EntryMeta& meta, uint32_t) { return meta.slot % 2 == 0; });
  EXPECT_EQ(removed, 3u);
  EXPECT_EQ(lane.spill_size(), 3u);
  EXPECT_EQ(lane.tail_at(), lane.IndexOf(lane.tail()));
  EXPECT_EQ(Take(lane, 10), Tags({10, 12, 14}));
}

TEST(Lane, FilterOnlyTouchesTheSpill) {
  Lane lane(0, 4, 4);
  for (uint64_t t = 0; t < 3; ++t) Push(lane, t);
  Take(lane, 2);  // 0 and 1 handed over: Filter must not see them
  Push(lane, 3);
  std::vector<uint32_t> seen;
  lane.Filter([&](const EntryMeta& meta, uint32_t) {
    seen.push_back(meta.slot);
    return meta.slot != 2;
  });
  EXPECT_EQ(seen, std::vector<uint32_t>({2, 3}));
  EXPECT_EQ(Take(lane, 10), Tags({3}));
}

TEST(Lane, AKeptUpLaneRewindsToItsStartAndAnUnreleasedOneDoesNot) {
  Lane lane(0, 64, 4096);  // 4160 entries
  // Up to the rewind point with everything released, then past it with ranges held back.
  uint64_t tag = 0;
  while (lane.tail_at() < 1000) {
    for (int k = 0; k < 50; ++k) Push(lane, tag++);
    Take(lane, 64);
    lane.Recycle(lane.published());
  }
  const uint64_t held = lane.published();  // from here on the consumer releases nothing
  while (lane.tail_at() < 1400) {
    for (int k = 0; k < 50; ++k) Push(lane, tag++);
    Take(lane, 64);
  }
  EXPECT_GE(lane.tail_at(), 1400u) << "entries unreleased: no rewind";
  EXPECT_GT(lane.published(), held);
  const uint32_t at = lane.tail_at();
  lane.Recycle(lane.published());
  for (int k = 0; k < 300; ++k) {  // the next check comes at most kRewindEvery entries later
    Push(lane, tag++);
    Take(lane, 1);
    lane.Recycle(lane.published());
    if (lane.tail_at() < at) break;
  }
  EXPECT_LT(lane.tail_at(), 64u) << "everything released: back at the ring's start";
  EXPECT_EQ(lane.tail(), lane.published());
  EXPECT_EQ(lane.IndexOf(lane.tail()), lane.tail_at());
  EXPECT_EQ(lane.room(), 64u);
  // The positions go on: a range handed over after the rewind reads back what was written.
  Push(lane, 777);
  EXPECT_EQ(Take(lane, 1), Tags({777}));
}

TEST(Lane, AHandOverThatCutsARunCapsItSoAFilterCannotChangeWhatItCovers) {
  Lane lane(0, 16, 16);
  auto append = [&](uint32_t slot, uint16_t run) {
    const uint32_t at = lane.tail_at();
    lane.wc(at) = ibv_wc{};
    lane.meta(at) = {slot, 1, EntryKind::kCompletion, run, 0};
    lane.Append();
  };
  for (uint16_t run = 4; run > 0; --run) append(5, run);  // one run of slot 5
  append(6, 2);
  append(6, 1);
  lane.CapRunsAt(lane.published() + 2);
  lane.Publish(2);
  EXPECT_EQ(lane.meta(0).run, 2);
  EXPECT_EQ(lane.meta(1).run, 1);
  EXPECT_EQ(lane.meta(2).run, 2) << "the spill's own counts stay";
  // Slot 5 unregistered: its spill entries go, and slot 6's move up into their place. The runs
  // handed over still end where they were cut.
  EXPECT_EQ(lane.Filter([](const EntryMeta& meta, uint32_t) { return meta.slot != 5; }), 2u);
  EXPECT_EQ(lane.meta(0).run, 2);
  EXPECT_EQ(lane.meta(2).slot, 6u);
  EXPECT_EQ(lane.meta(2).run, 2);
}

TEST(Lane, RandomAppendsTakesReleasesAndFiltersMatchAModel) {
  std::mt19937 rng(7);
  Lane lane(0, 5, 6);           // a ring of 11
  std::deque<uint64_t> spill;   // the model of the spill
  std::deque<uint64_t> handed;  // handed over, not released
  uint64_t released = 0;
  uint64_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    switch (rng() % 4) {
      case 0:  // append while both the spill bound and the ring allow
        if (spill.size() < 5 && handed.size() + spill.size() < 11) {
          Push(lane, next);
          spill.push_back(next++);
        } else {
          EXPECT_EQ(lane.room(), 0u);
        }
        break;
      case 1: {  // hand over up to the queue bound of 6
        uint32_t n = std::min<uint32_t>(rng() % 4, static_cast<uint32_t>(spill.size()));
        n = std::min<uint32_t>(n, static_cast<uint32_t>(6 - std::min<size_t>(6, handed.size())));
        Tags got = Take(lane, n);
        for (uint64_t tag : got) {
          EXPECT_EQ(tag, spill.front());
          spill.pop_front();
          handed.push_back(tag);
        }
        break;
      }
      case 2:  // the consumer releases some
        if (!handed.empty()) {
          uint32_t n = 1 + rng() % handed.size();
          for (uint32_t k = 0; k < n; ++k) handed.pop_front();
          released += n;
          lane.Recycle(released);
        }
        break;
      case 3:
        if (rng() % 8 == 0) {  // purge odd tags
          lane.Filter([](const EntryMeta& meta, uint32_t) { return meta.slot % 2 == 0; });
          std::erase_if(spill, [](uint64_t t) { return t % 2 == 1; });
        }
        break;
    }
    ASSERT_EQ(lane.spill_size(), spill.size());
  }
}

}  // namespace
}  // namespace cqd::internal

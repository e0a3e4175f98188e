// Spill (runtime/core/spill.h): the poller's bounded FIFO of Items for one consumer: room and
// fullness, FIFO order through Front/PopFront, wrap-around at the ring's power-of-two edge, Filter,
// and the stats' starting values.
#include "runtime/core/spill.h"

#include <chrono>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

// Appends one item tagged with `tag` (in wr_id and slot).
void Push(Spill& spill, uint64_t tag) {
  ASSERT_GT(spill.room(), 0u);
  Item& item = spill.Append();
  item = Item();
  item.wc.wr_id = tag;
  item.slot = static_cast<uint32_t>(tag);
  item.generation = static_cast<uint32_t>(tag * 3);
}

// Takes everything off the spill through Front/PopFront, `max` at a time; returns the tags in the
// order they came out.
std::vector<uint64_t> DrainAll(Spill& spill, uint32_t max) {
  std::vector<uint64_t> out;
  while (!spill.empty()) {
    uint32_t n = 0;
    const Item* items = spill.Front(max, &n);
    EXPECT_GT(n, 0u);
    if (n == 0) break;
    for (uint32_t i = 0; i < n; ++i) out.push_back(items[i].wc.wr_id);
    spill.PopFront(n);
  }
  return out;
}

using Tags = std::vector<uint64_t>;

TEST(Spill, StartsEmpty) {
  Spill spill(16);
  EXPECT_TRUE(spill.empty());
  EXPECT_FALSE(spill.full());
  EXPECT_EQ(spill.size(), 0u);
  EXPECT_EQ(spill.room(), 16u);
  uint32_t n = 99;
  spill.Front(8, &n);
  EXPECT_EQ(n, 0u);
}

TEST(Spill, RoomAndFullTrackAppendsAndPops) {
  Spill spill(4);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(spill.room(), 4 - i);
    EXPECT_FALSE(spill.full());
    Push(spill, i);
    EXPECT_EQ(spill.size(), i + 1);
    EXPECT_FALSE(spill.empty());
  }
  EXPECT_TRUE(spill.full());
  EXPECT_EQ(spill.room(), 0u);

  spill.PopFront(1);
  EXPECT_FALSE(spill.full());
  EXPECT_EQ(spill.room(), 1u);
  EXPECT_EQ(spill.size(), 3u);
  spill.PopFront(3);
  EXPECT_TRUE(spill.empty());
  EXPECT_EQ(spill.room(), 4u);
}

TEST(Spill, LimitNotAPowerOfTwoIsFullAtTheLimit) {
  Spill spill(5);  // a ring of 8
  for (uint64_t i = 0; i < 5; ++i) Push(spill, i);
  EXPECT_TRUE(spill.full());
  EXPECT_EQ(spill.room(), 0u);
  EXPECT_EQ(spill.size(), 5u);
  EXPECT_EQ(DrainAll(spill, 100), Tags({0, 1, 2, 3, 4}));
}

TEST(Spill, LimitOfOne) {
  Spill spill(1);
  for (uint64_t round = 0; round < 5; ++round) {
    Push(spill, round);
    EXPECT_TRUE(spill.full());
    EXPECT_EQ(DrainAll(spill, 10), Tags({round}));
  }
}

TEST(Spill, ItemsLeaveInArrivalOrderWithTheirFields) {
  Spill spill(8);
  for (uint64_t i = 10; i < 16; ++i) Push(spill, i);
  uint32_t n = 0;
  const Item* items = spill.Front(100, &n);
  ASSERT_EQ(n, 6u);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(items[i].wc.wr_id, 10 + i);
    EXPECT_EQ(items[i].slot, 10 + i);
    EXPECT_EQ(items[i].generation, 3 * (10 + i));
    EXPECT_EQ(items[i].kind, ItemKind::kCompletion);
  }
}

TEST(Spill, FrontIsBoundedByMaxAndDoesNotPop) {
  Spill spill(8);
  for (uint64_t i = 0; i < 6; ++i) Push(spill, i);
  uint32_t n = 0;
  const Item* items = spill.Front(2, &n);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(items[0].wc.wr_id, 0u);
  EXPECT_EQ(items[1].wc.wr_id, 1u);
  // Front alone takes nothing off.
  EXPECT_EQ(spill.size(), 6u);
  items = spill.Front(2, &n);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(items[0].wc.wr_id, 0u);

  spill.PopFront(2);
  items = spill.Front(0, &n);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(DrainAll(spill, 3), Tags({2, 3, 4, 5}));
}

TEST(Spill, FrontReturnsOnlyTheContiguousPartAtTheRingEdge) {
  Spill spill(8);
  for (uint64_t i = 0; i < 6; ++i) Push(spill, i);
  spill.PopFront(6);
  // The next items go to ring positions 6, 7, 0, 1, 2.
  for (uint64_t i = 100; i < 105; ++i) Push(spill, i);
  EXPECT_EQ(spill.size(), 5u);

  uint32_t n = 0;
  const Item* items = spill.Front(100, &n);
  ASSERT_EQ(n, 2u);  // up to the ring's end
  EXPECT_EQ(items[0].wc.wr_id, 100u);
  EXPECT_EQ(items[1].wc.wr_id, 101u);
  spill.PopFront(n);

  items = spill.Front(100, &n);
  ASSERT_EQ(n, 3u);  // the rest, from the ring's start
  EXPECT_EQ(items[0].wc.wr_id, 102u);
  EXPECT_EQ(items[1].wc.wr_id, 103u);
  EXPECT_EQ(items[2].wc.wr_id, 104u);
  spill.PopFront(n);
  EXPECT_TRUE(spill.empty());
}

TEST(Spill, FullSpillWrapsAtTheRingEdge) {
  Spill spill(8);
  for (uint64_t i = 0; i < 3; ++i) Push(spill, i);
  spill.PopFront(3);
  for (uint64_t i = 10; i < 18; ++i) Push(spill, i);  // positions 3..7, then 0..2
  EXPECT_TRUE(spill.full());
  uint32_t n = 0;
  spill.Front(100, &n);
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(DrainAll(spill, 100), Tags({10, 11, 12, 13, 14, 15, 16, 17}));
}

TEST(Spill, FilterKeepsOrderAndReturnsHowManyItRemoved) {
  Spill spill(16);
  for (uint64_t i = 0; i < 10; ++i) Push(spill, i);
  uint32_t removed = spill.Filter([](const Item& item) { return item.wc.wr_id % 3 != 0; });
  EXPECT_EQ(removed, 4u);  // 0, 3, 6, 9
  EXPECT_EQ(spill.size(), 6u);
  EXPECT_EQ(spill.room(), 10u);
  // The kept items keep their other fields too.
  uint32_t n = 0;
  const Item* items = spill.Front(100, &n);
  ASSERT_EQ(n, 6u);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(items[i].slot, items[i].wc.wr_id);
    EXPECT_EQ(items[i].generation, 3 * items[i].wc.wr_id);
  }
  EXPECT_EQ(DrainAll(spill, 100), Tags({1, 2, 4, 5, 7, 8}));
}

TEST(Spill, FilterThatKeepsEverythingOrNothing) {
  Spill spill(8);
  for (uint64_t i = 0; i < 5; ++i) Push(spill, i);
  EXPECT_EQ(spill.Filter([](const Item&) { return true; }), 0u);
  EXPECT_EQ(spill.size(), 5u);
  EXPECT_EQ(spill.Filter([](const Item&) { return false; }), 5u);
  EXPECT_TRUE(spill.empty());
  EXPECT_EQ(spill.room(), 8u);
  EXPECT_EQ(spill.Filter([](const Item&) { return false; }), 0u);  // empty: nothing to remove
  // Usable afterwards.
  for (uint64_t i = 20; i < 28; ++i) Push(spill, i);
  EXPECT_TRUE(spill.full());
  EXPECT_EQ(DrainAll(spill, 100), Tags({20, 21, 22, 23, 24, 25, 26, 27}));
}

TEST(Spill, FilterSeesEachItemOnceInOrder) {
  Spill spill(8);
  for (uint64_t i = 0; i < 6; ++i) Push(spill, i);
  spill.PopFront(2);
  std::vector<uint64_t> seen;
  spill.Filter([&](const Item& item) {
    seen.push_back(item.wc.wr_id);
    return true;
  });
  EXPECT_EQ(seen, Tags({2, 3, 4, 5}));
}

TEST(Spill, FilterAcrossTheRingEdge) {
  Spill spill(8);
  for (uint64_t i = 0; i < 5; ++i) Push(spill, i);
  spill.PopFront(5);
  for (uint64_t i = 0; i < 8; ++i) Push(spill, i);  // positions 5, 6, 7, 0, ..., 4
  EXPECT_EQ(spill.Filter([](const Item& item) { return item.wc.wr_id % 2 == 1; }), 4u);
  EXPECT_EQ(spill.size(), 4u);
  for (uint64_t i = 100; i < 104; ++i) Push(spill, i);  // fills the room Filter made
  EXPECT_TRUE(spill.full());
  EXPECT_EQ(DrainAll(spill, 100), Tags({1, 3, 5, 7, 100, 101, 102, 103}));
}

TEST(Spill, FilterWithALimitNotAPowerOfTwo) {
  Spill spill(6);  // a ring of 8
  for (uint64_t i = 0; i < 6; ++i) Push(spill, i);
  spill.PopFront(4);
  for (uint64_t i = 6; i < 10; ++i) Push(spill, i);  // 4, 5 at positions 4, 5; 6..9 at 6, 7, 0, 1
  EXPECT_TRUE(spill.full());
  EXPECT_EQ(spill.Filter([](const Item& item) { return item.wc.wr_id != 5 && item.wc.wr_id != 8; }),
            2u);
  EXPECT_EQ(spill.room(), 2u);
  EXPECT_EQ(DrainAll(spill, 100), Tags({4, 6, 7, 9}));
}

// Many wraps with random appends, pops and filters, checked against a std::deque.
TEST(Spill, MatchesAModelQueueOverManyWraps) {
  for (uint32_t limit : {1u, 3u, 8u, 13u, 64u}) {
    SCOPED_TRACE(limit);
    Spill spill(limit);
    std::deque<uint64_t> model;
    std::mt19937 rng(limit);
    uint64_t next = 0;
    for (int step = 0; step < 20000; ++step) {
      switch (rng() % 8) {
        case 0:
        case 1:
        case 2: {  // append up to the room
          uint32_t count = rng() % (limit + 1);
          for (uint32_t i = 0; i < count && spill.room() > 0; ++i) {
            Push(spill, next);
            model.push_back(next++);
          }
          break;
        }
        case 3:
        case 4:
        case 5: {  // take some off the front
          uint32_t n = 0;
          const Item* items = spill.Front(1 + rng() % limit, &n);
          ASSERT_LE(n, model.size());
          if (!model.empty()) {
            ASSERT_GT(n, 0u);
          }
          uint32_t take = n == 0 ? 0 : rng() % (n + 1);
          for (uint32_t i = 0; i < take; ++i) {
            ASSERT_EQ(items[i].wc.wr_id, model.front());
            model.pop_front();
          }
          spill.PopFront(take);
          break;
        }
        case 6: {  // drop one residue class
          uint64_t mod = 2 + rng() % 3;
          uint64_t drop = rng() % mod;
          uint32_t expected = 0;
          std::deque<uint64_t> kept;
          for (uint64_t tag : model) {
            if (tag % mod == drop) {
              ++expected;
            } else {
              kept.push_back(tag);
            }
          }
          ASSERT_EQ(spill.Filter([&](const Item& item) { return item.wc.wr_id % mod != drop; }),
                    expected);
          model.swap(kept);
          break;
        }
        default:
          break;
      }
      ASSERT_EQ(spill.size(), model.size());
      ASSERT_EQ(spill.room(), limit - model.size());
      ASSERT_EQ(spill.full(), model.size() == limit);
      ASSERT_EQ(spill.empty(), model.empty());
    }
    EXPECT_EQ(DrainAll(spill, limit), Tags(model.begin(), model.end()));
  }
}

TEST(Spill, StatsAndPollerFlagsStartCleared) {
  Spill spill(4);
  EXPECT_EQ(spill.depth_stat.load(), 0u);
  EXPECT_EQ(spill.high_water.load(), 0u);
  EXPECT_EQ(spill.stalls.load(), 0u);
  EXPECT_EQ(spill.stalled_ns.load(), 0u);
  EXPECT_FALSE(spill.stalled);
  EXPECT_FALSE(spill.listed);
  EXPECT_FALSE(spill.direct);
  EXPECT_EQ(spill.full_since, std::chrono::steady_clock::time_point{});
}

}  // namespace
}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// Registry pieces (runtime/core/registry.h): the packed slot state and its helpers, SlotPool's
// allocation, reuse and growth (read from another thread while it grows), Slot's checks, and
// QpTable's qp_num -> Slot map across pages up to the 24-bit maximum, looked up concurrently.
#include "runtime/core/registry.h"

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/route.h"  // the state word's decoding

namespace cqd::internal {
namespace {

constexpr uint32_t kMaxQpNum = (1u << 24) - 1;

TEST(SlotState, PacksAndUnpacksEveryField) {
  const uint64_t s = MakeState(7, 12, /*live=*/true, /*draining=*/true);
  EXPECT_EQ(StateGeneration(s), 7u);
  EXPECT_EQ(StateConsumer(s), 12u);
  EXPECT_TRUE(StateLive(s));
  EXPECT_TRUE(StateTearingDown(s));

  const uint64_t dead = MakeState(7, 12, /*live=*/false);
  EXPECT_EQ(StateGeneration(dead), 7u);
  EXPECT_EQ(StateConsumer(dead), 12u);
  EXPECT_FALSE(StateLive(dead));
  EXPECT_FALSE(StateTearingDown(dead));  // draining defaults to false

  const uint64_t draining_only = MakeState(1, 0, /*live=*/false, /*draining=*/true);
  EXPECT_FALSE(StateLive(draining_only));
  EXPECT_TRUE(StateTearingDown(draining_only));
}

TEST(SlotState, ZeroIsNotLive) {
  EXPECT_FALSE(StateLive(0));
  EXPECT_FALSE(StateTearingDown(0));
  EXPECT_EQ(StateGeneration(0), 0u);
  EXPECT_EQ(StateConsumer(0), 0u);
  EXPECT_FALSE(StateLiveAs(0, 0));
}

TEST(SlotState, FieldsDoNotBleedIntoEachOther) {
  // The widest values: a 32-bit generation and a 30-bit consumer.
  const uint64_t s = MakeState(0xffffffffu, 0x3fffffffu, /*live=*/false, /*draining=*/false);
  EXPECT_EQ(StateGeneration(s), 0xffffffffu);
  EXPECT_EQ(StateConsumer(s), 0x3fffffffu);
  EXPECT_FALSE(StateLive(s));
  EXPECT_FALSE(StateTearingDown(s));

  const uint64_t flags = MakeState(0, 0, /*live=*/true, /*draining=*/true);
  EXPECT_EQ(StateGeneration(flags), 0u);
  EXPECT_EQ(StateConsumer(flags), 0u);

  // A consumer index above 30 bits is cut to its low 30 bits, never into the generation or flags.
  const uint64_t wide = MakeState(5, 0xffffffffu, /*live=*/false);
  EXPECT_EQ(StateGeneration(wide), 5u);
  EXPECT_EQ(StateConsumer(wide), 0x3fffffffu);
  EXPECT_FALSE(StateLive(wide));
  EXPECT_FALSE(StateTearingDown(wide));
}

TEST(SlotState, LiveAsNeedsLiveAndTheSameGeneration) {
  EXPECT_TRUE(StateLiveAs(MakeState(3, 1, true), 3));
  EXPECT_TRUE(StateLiveAs(MakeState(3, 1, true, /*draining=*/true), 3));
  EXPECT_FALSE(StateLiveAs(MakeState(3, 1, false), 3));
  EXPECT_FALSE(StateLiveAs(MakeState(3, 1, true), 2));
  EXPECT_FALSE(StateLiveAs(MakeState(3, 1, true), 4));
  EXPECT_TRUE(StateLiveAs(MakeState(0xffffffffu, 0, true), 0xffffffffu));
}

TEST(SlotState, IsUsableAtCompileTime) {
  static_assert(StateLive(MakeState(1, 2, true)));
  static_assert(StateGeneration(MakeState(9, 2, true)) == 9);
  static_assert(StateConsumer(MakeState(9, 2, true)) == 2);
  static_assert(StateLiveAs(MakeState(9, 2, true), 9));
  static_assert(!StateLiveAs(MakeState(9, 2, true), 8));
  SUCCEED();
}

// The control path's copy says what it last published in the state word, field for field, so
// that the control path never decodes the word routing reads.
TEST(Slot, PublishKeepsTheControlCopyAndTheStateWordAlike) {
  Slot slot;
  EXPECT_FALSE(slot.control.LiveAs(0));
  slot.Publish(7, 12, /*live=*/true, /*tearing_down=*/false, std::memory_order_release);
  EXPECT_EQ(slot.state.load(), MakeState(7, 12, true, false));
  EXPECT_TRUE(slot.control.LiveAs(7));
  EXPECT_FALSE(slot.control.LiveAs(6));
  EXPECT_EQ(slot.control.consumer, 12u);
  EXPECT_FALSE(slot.control.tearing_down);
  slot.Publish(7, 12, true, /*tearing_down=*/true, std::memory_order_seq_cst);
  EXPECT_EQ(slot.state.load(), MakeState(7, 12, true, true));
  EXPECT_TRUE(slot.control.tearing_down);
  slot.Publish(8, 12, /*live=*/false, false, std::memory_order_seq_cst);  // retired
  EXPECT_EQ(slot.state.load(), MakeState(8, 12, false, false));
  EXPECT_FALSE(slot.control.LiveAs(8));
  EXPECT_EQ(slot.control.generation, 8u);  // the next registration's
}

TEST(Slot, HoldsAndUses) {
  Slot slot;
  EXPECT_FALSE(StateLive(slot.state.load()));
  slot.qp_num.store(0x123456);
  slot.device.store(2);
  slot.send_cq.store(10);
  slot.recv_cq.store(11);
  EXPECT_TRUE(slot.Holds(2, 0x123456));
  EXPECT_FALSE(slot.Holds(3, 0x123456));
  EXPECT_FALSE(slot.Holds(2, 0x123457));
  EXPECT_TRUE(slot.Uses(10));
  EXPECT_TRUE(slot.Uses(11));
  EXPECT_FALSE(slot.Uses(12));
}

TEST(SlotPool, HandsOutFreshIndexesUpToCapacityThenMinusOne) {
  SlotPool pool(5);
  EXPECT_EQ(pool.capacity(), 5u);
  std::set<int64_t> got;
  for (int i = 0; i < 5; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    ASSERT_LT(index, 5);
    got.insert(index);
  }
  EXPECT_EQ(got.size(), 5u);  // all different
  EXPECT_EQ(pool.Allocate(), -1);
  EXPECT_EQ(pool.Allocate(), -1);  // and stays so
}

TEST(SlotPool, ZeroCapacityIsAlwaysFull) {
  SlotPool pool(0);
  EXPECT_EQ(pool.capacity(), 0u);
  EXPECT_EQ(pool.Allocate(), -1);
  EXPECT_EQ(pool.allocated(), 0u);
}

TEST(SlotPool, FreedSlotsComeBackFirstInFirstOutWhenFull) {
  SlotPool pool(8);
  for (int i = 0; i < 8; ++i) ASSERT_GE(pool.Allocate(), 0);
  ASSERT_EQ(pool.Allocate(), -1);
  pool.Free(5);
  pool.Free(2);
  pool.Free(7);
  EXPECT_EQ(pool.Allocate(), 5);
  EXPECT_EQ(pool.Allocate(), 2);
  pool.Free(0);
  EXPECT_EQ(pool.Allocate(), 7);
  EXPECT_EQ(pool.Allocate(), 0);
  EXPECT_EQ(pool.Allocate(), -1);
}

TEST(SlotPool, AJustFreedSlotIsNotHandedOutAgainSoon) {
  SlotPool pool(1000);
  const int64_t first = pool.Allocate();
  ASSERT_GE(first, 0);
  pool.Free(static_cast<uint32_t>(first));
  const int64_t next = pool.Allocate();
  ASSERT_GE(next, 0);
  EXPECT_NE(next, first);  // fresh slots are left, so the freed one waits
}

// Frees many slots while fresh ones are left: some are reused eventually, each at most once while
// allocated, in the order they were freed; no index is ever held twice at once.
TEST(SlotPool, ReusesFreedSlotsInOrderOnceEnoughHaveGathered) {
  constexpr uint32_t kCapacity = 3000;
  SlotPool pool(kCapacity);
  std::vector<uint32_t> freed;
  std::set<uint32_t> live;
  for (int i = 0; i < 1000; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    ASSERT_TRUE(live.insert(static_cast<uint32_t>(index)).second);
  }
  // Free every other one, in descending order, so the FIFO order differs from index order.
  for (uint32_t index = 999; index < 1000; index -= 2) {
    pool.Free(index);
    freed.push_back(index);
    live.erase(index);
  }
  std::vector<uint32_t> reused;
  for (uint32_t i = 0; i < 1000; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    ASSERT_LT(index, kCapacity);
    ASSERT_TRUE(live.insert(static_cast<uint32_t>(index)).second) << "handed out twice: " << index;
    if (index < 1000) reused.push_back(static_cast<uint32_t>(index));
  }
  ASSERT_FALSE(reused.empty());
  EXPECT_EQ(reused, std::vector<uint32_t>(freed.begin(), freed.begin() + reused.size()));
}

TEST(SlotPool, FillsCompletelyWithReuse) {
  constexpr uint32_t kCapacity = 200;
  SlotPool pool(kCapacity);
  std::set<int64_t> live;
  for (uint32_t i = 0; i < kCapacity; ++i) live.insert(pool.Allocate());
  ASSERT_EQ(live.size(), kCapacity);
  ASSERT_EQ(live.count(-1), 0u);
  // Free and reallocate many times: every allocation succeeds and never duplicates a live one.
  for (int round = 0; round < 1000; ++round) {
    int64_t victim = (round * 37) % kCapacity;
    if (live.erase(victim) == 0) continue;
    pool.Free(static_cast<uint32_t>(victim));
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    ASSERT_TRUE(live.insert(index).second);
    ASSERT_EQ(pool.Allocate(), -1);
  }
}

TEST(SlotPool, SlotsKnowTheirIndexAcrossChunks) {
  constexpr uint32_t kCapacity = SlotPool::kChunkSize + 100;
  SlotPool pool(kCapacity);
  EXPECT_EQ(pool.allocated(), 0u);  // no chunk before the first registration needs one
  std::vector<Slot*> addresses;
  uint32_t allocated = 0;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_EQ(index, static_cast<int64_t>(i));  // fresh indexes, nothing freed
    ASSERT_GT(pool.allocated(), i);             // the index is valid
    ASSERT_LE(pool.allocated(), kCapacity);
    ASSERT_GE(pool.allocated(), allocated);  // grows, never shrinks
    allocated = pool.allocated();
    ASSERT_EQ(pool.slot(i).index, i);
    addresses.push_back(&pool.slot(i));
  }
  EXPECT_EQ(pool.allocated(), kCapacity);
  EXPECT_EQ(pool.Allocate(), -1);
  // Slots stay where they were: the first chunk was kept when the second was added.
  for (uint32_t i = 0; i < kCapacity; ++i) ASSERT_EQ(&pool.slot(i), addresses[i]) << i;
  for (uint32_t i = 0; i + 1 < kCapacity; ++i) ASSERT_NE(addresses[i], addresses[i + 1]);
}

TEST(SlotPool, FreshSlotsAreNotLive) {
  SlotPool pool(10);
  for (int i = 0; i < 10; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    const Slot& slot = pool.slot(static_cast<uint32_t>(index));
    EXPECT_FALSE(StateLive(slot.state.load()));
    EXPECT_EQ(slot.handler.load(), nullptr);
    EXPECT_EQ(slot.teardown.load(), nullptr);
  }
}

// allocated() and slot() may be called on any thread while the control thread grows the pool:
// every index below allocated() is a slot that knows its index.
TEST(SlotPool, ReadersSeeValidSlotsWhileThePoolGrows) {
  constexpr uint32_t kCapacity = 3 * SlotPool::kChunkSize + 7;
  SlotPool pool(kCapacity);
  std::atomic<uint64_t> wrong{0};
  std::thread reader([&] {
    uint32_t checked = 0;
    while (checked < kCapacity) {
      const uint32_t n = pool.allocated();
      for (; checked < n; ++checked) {
        if (pool.slot(checked).index != checked) wrong.fetch_add(1);
      }
      std::this_thread::yield();
    }
  });
  for (uint32_t i = 0; i < kCapacity; ++i) ASSERT_EQ(pool.Allocate(), static_cast<int64_t>(i));
  reader.join();  // ends: the pool reaches its capacity, so allocated() does too
  EXPECT_EQ(wrong.load(), 0u);
}

TEST(QpTable, EmptyTableFindsNothing) {
  QpTable table;
  for (uint32_t qp : {0u, 1u, 4095u, 4096u, 0x123456u, kMaxQpNum}) {
    EXPECT_EQ(table.Lookup(qp), nullptr) << qp;
  }
}

TEST(QpTable, SetLookupClear) {
  QpTable table;
  Slot a, b;
  table.Set(17, &a);
  EXPECT_EQ(table.Lookup(17), &a);
  EXPECT_EQ(table.Lookup(16), nullptr);  // same page, other entries stay empty
  EXPECT_EQ(table.Lookup(18), nullptr);
  table.Set(17, &b);  // replaced
  EXPECT_EQ(table.Lookup(17), &b);
  table.Clear(17);
  EXPECT_EQ(table.Lookup(17), nullptr);
  table.Set(17, &a);  // the page is kept and reusable
  EXPECT_EQ(table.Lookup(17), &a);
}

TEST(QpTable, QpNumsInDifferentPages) {
  QpTable table;
  // Page and entry boundaries: the first and last entry of several pages, and the 24-bit maximum.
  static_assert(QpTable::kPageSize == 0x1000);
  const std::vector<uint32_t> qps = {0,        1,        0xfff,    0x1000,   0x1001,   0x1fff,
                                     0x7ff000, 0x7fffff, 0x800000, 0xfff000, 0xffeffe, kMaxQpNum};
  std::vector<Slot> slots(qps.size());
  for (size_t i = 0; i < qps.size(); ++i) table.Set(qps[i], &slots[i]);
  for (size_t i = 0; i < qps.size(); ++i) EXPECT_EQ(table.Lookup(qps[i]), &slots[i]) << qps[i];
  // Numbers next to them that were never set.
  for (uint32_t qp :
       {2u, 0x1002u, 0x1ffeu, 0x2000u, 0x7ffffeu, 0x800001u, 0xfff001u, kMaxQpNum - 1}) {
    EXPECT_EQ(table.Lookup(qp), nullptr) << qp;
  }
  // Clearing one leaves the others, in its page and in other pages.
  table.Clear(0x1000);
  EXPECT_EQ(table.Lookup(0x1000), nullptr);
  EXPECT_EQ(table.Lookup(0x1001), &slots[4]);
  EXPECT_EQ(table.Lookup(0xfff), &slots[2]);
  table.Clear(kMaxQpNum);
  EXPECT_EQ(table.Lookup(kMaxQpNum), nullptr);
  EXPECT_EQ(table.Lookup(0xfff000), &slots[9]);
  EXPECT_EQ(table.Lookup(0), &slots[0]);
}

TEST(QpTable, ClearOfANumberNeverSetIsHarmless) {
  QpTable table;
  table.Clear(0x345678);  // its page was never allocated
  EXPECT_EQ(table.Lookup(0x345678), nullptr);
  Slot slot;
  table.Set(0x345000, &slot);
  table.Clear(0x345678);  // page exists, entry empty
  EXPECT_EQ(table.Lookup(0x345678), nullptr);
  EXPECT_EQ(table.Lookup(0x345000), &slot);
}

// Lookup is lock-free and may run on any thread while control sets and clears entries. A reader
// that finds a slot and loads its state (acquire) sees the fields control wrote before publishing.
TEST(QpTable, LookupOnAnotherThreadSeesPublishedSlots) {
  constexpr uint32_t kQps = 2000;
  // Spread over many pages, up to the 24-bit maximum.
  auto qp_of = [](uint32_t i) { return kMaxQpNum - i * 8191; };
  SlotPool pool(kQps);
  QpTable table;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> found{0};
  std::atomic<uint64_t> wrong{0};
  std::thread reader([&] {
    bool last = false;
    while (!last) {
      last = done.load(std::memory_order_acquire);
      for (uint32_t i = 0; i < kQps; ++i) {
        Slot* slot = table.Lookup(qp_of(i));
        if (slot == nullptr) continue;
        const uint64_t state = slot->state.load(std::memory_order_acquire);
        if (!StateLiveAs(state, i + 1) || !slot->Holds(1, qp_of(i)) ||
            slot->handler.load(std::memory_order_relaxed) != nullptr ||
            StateConsumer(state) != i % 4) {
          wrong.fetch_add(1);
        }
        if (last) found.fetch_add(1);
      }
    }
  });
  for (uint32_t i = 0; i < kQps; ++i) {
    int64_t index = pool.Allocate();
    ASSERT_GE(index, 0);
    Slot& slot = pool.slot(static_cast<uint32_t>(index));
    slot.qp_num.store(qp_of(i), std::memory_order_relaxed);
    slot.device.store(1, std::memory_order_relaxed);
    slot.state.store(MakeState(i + 1, i % 4, /*live=*/true), std::memory_order_release);
    table.Set(qp_of(i), &slot);
  }
  // Clear every other one.
  for (uint32_t i = 0; i < kQps; i += 2) table.Clear(qp_of(i));
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(found.load(), kQps / 2);  // the last pass, after every change
}

}  // namespace
}  // namespace cqd::internal

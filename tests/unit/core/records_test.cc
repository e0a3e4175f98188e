// SPDX-License-Identifier: BSD-2-Clause
// AckCounter (runtime/core/records.h): Add returns nothing below the threshold and the whole
// count at or above it, TakeAll returns what is left, and with several threads adding at once
// every event is returned exactly once.
#include "runtime/core/records.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

TEST(AckCounter, StartsEmpty) {
  AckCounter acks;
  EXPECT_EQ(acks.TakeAll(), 0u);
}

TEST(AckCounter, BelowTheThresholdAddReturnsZeroAndKeepsTheCount) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(1, 10), 0u);
  EXPECT_EQ(acks.Add(3, 10), 0u);
  EXPECT_EQ(acks.Add(5, 10), 0u);  // 9: still below
  EXPECT_EQ(acks.TakeAll(), 9u);
  EXPECT_EQ(acks.TakeAll(), 0u);  // taken once
}

TEST(AckCounter, ReachingTheThresholdReturnsTheWholeCount) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(4, 10), 0u);
  EXPECT_EQ(acks.Add(6, 10), 10u);  // exactly at the threshold
  EXPECT_EQ(acks.TakeAll(), 0u);    // nothing left behind
  EXPECT_EQ(acks.Add(9, 10), 0u);
  EXPECT_EQ(acks.Add(5, 10), 14u);  // above it: all of it, not just the threshold
  EXPECT_EQ(acks.TakeAll(), 0u);
}

TEST(AckCounter, OneAddAtOrAboveTheThresholdReturnsItself) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(10, 10), 10u);
  EXPECT_EQ(acks.Add(25, 10), 25u);
  EXPECT_EQ(acks.Add(1, 1), 1u);
  EXPECT_EQ(acks.TakeAll(), 0u);
}

TEST(AckCounter, AddingZeroChangesNothing) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(0, 5), 0u);
  EXPECT_EQ(acks.Add(3, 5), 0u);
  EXPECT_EQ(acks.Add(0, 5), 0u);
  EXPECT_EQ(acks.TakeAll(), 3u);
}

TEST(AckCounter, CountsAgainAfterTakeAll) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(7, 8), 0u);
  EXPECT_EQ(acks.TakeAll(), 7u);
  EXPECT_EQ(acks.Add(7, 8), 0u);  // started over from 0, so 7 is below 8 again
  EXPECT_EQ(acks.Add(1, 8), 8u);
}

TEST(AckCounter, ThresholdMayChangeBetweenCalls) {
  AckCounter acks;
  EXPECT_EQ(acks.Add(5, 100), 0u);
  EXPECT_EQ(acks.Add(1, 6), 6u);  // the count so far reaches the new, lower threshold
}

// Several threads add at once, as the event thread and a destroyer do: the sum of what every Add
// returned and a final TakeAll is exactly the sum added; nothing is returned twice or lost.
TEST(AckCounter, ConcurrentAddsReturnEveryEventExactlyOnce) {
  constexpr int kThreads = 4;
  constexpr int kAddsPerThread = 20000;
  constexpr uint32_t kThreshold = 16;
  AckCounter acks;
  std::vector<uint64_t> added(kThreads, 0);
  std::vector<uint64_t> returned(kThreads, 0);
  std::vector<uint64_t> nonzero_returns(kThreads, 0);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int i = 0; i < kAddsPerThread; ++i) {
        const uint32_t n = 1 + static_cast<uint32_t>((i * 7 + t) % 5);  // 1 to 5
        added[t] += n;
        const uint32_t take = acks.Add(n, kThreshold);
        returned[t] += take;
        if (take != 0) ++nonzero_returns[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  uint64_t total_added = 0;
  uint64_t total_returned = 0;
  uint64_t takes = 0;
  for (int t = 0; t < kThreads; ++t) {
    total_added += added[t];
    total_returned += returned[t];
    takes += nonzero_returns[t];
  }
  const uint64_t rest = acks.TakeAll();
  // Any Add that brought the count to the threshold went on to take it, so what is left is below.
  EXPECT_LT(rest, kThreshold);
  EXPECT_EQ(total_returned + rest, total_added);
  EXPECT_GT(takes, 0u);
  EXPECT_EQ(acks.TakeAll(), 0u);
}

// Adders and a thread flushing with TakeAll at the same time (a CQ being retired while events
// still arrive): still exactly once.
TEST(AckCounter, ConcurrentAddsAndTakeAllsReturnEveryEventExactlyOnce) {
  constexpr int kAdders = 3;
  constexpr int kAddsPerThread = 20000;
  AckCounter acks;
  std::vector<uint64_t> added(kAdders, 0);
  std::vector<uint64_t> returned(kAdders, 0);
  std::atomic<int> adders_done{0};
  uint64_t flushed = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kAdders; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        const uint32_t n = 1 + static_cast<uint32_t>((i + t) % 3);
        added[t] += n;
        returned[t] += acks.Add(n, 64);
      }
      adders_done.fetch_add(1);
    });
  }
  std::thread flusher([&] {
    while (adders_done.load() < kAdders) {
      flushed += acks.TakeAll();
      std::this_thread::yield();
    }
  });
  for (std::thread& thread : threads) thread.join();
  flusher.join();
  uint64_t total_added = 0;
  uint64_t total_returned = flushed + acks.TakeAll();
  for (int t = 0; t < kAdders; ++t) {
    total_added += added[t];
    total_returned += returned[t];
  }
  EXPECT_EQ(total_returned, total_added);
  EXPECT_EQ(acks.TakeAll(), 0u);
}

}  // namespace
}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/retired_numbers.h: a set of 24-bit qp_nums, one bit each, in pages made on first
// use and freed when their last number leaves.
#include "runtime/core/retired_numbers.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

TEST(RetiredNumbers, HoldsWhatWasAddedUntilRemoved) {
  RetiredNumbers set;
  EXPECT_FALSE(set.Contains(7));
  set.Add(7);
  set.Add(7);  // twice: one number
  set.Add(0);
  set.Add(0xffffff);
  EXPECT_TRUE(set.Contains(7));
  EXPECT_TRUE(set.Contains(0));
  EXPECT_TRUE(set.Contains(0xffffff));
  EXPECT_FALSE(set.Contains(6));
  EXPECT_FALSE(set.Contains(8));
  EXPECT_FALSE(set.Contains(7 + 4096));  // the same bit of the next page
  EXPECT_EQ(set.size(), 3u);
  set.Remove(7);
  set.Remove(7);      // twice: harmless
  set.Remove(12345);  // never added: harmless
  EXPECT_FALSE(set.Contains(7));
  EXPECT_TRUE(set.Contains(0));
  EXPECT_EQ(set.size(), 2u);
}

TEST(RetiredNumbers, APageLivesWhileItHoldsANumber) {
  RetiredNumbers set;
  set.Add(1);
  set.Add(4095);  // the same page
  set.Add(4096);  // the next
  EXPECT_EQ(set.pages(), 2u);
  set.Remove(1);
  EXPECT_EQ(set.pages(), 2u);
  set.Remove(4095);
  EXPECT_EQ(set.pages(), 1u);
  EXPECT_TRUE(set.Contains(4096));
  set.Remove(4096);
  EXPECT_EQ(set.pages(), 0u);
  EXPECT_EQ(set.size(), 0u);
}

TEST(RetiredNumbers, EveryNumberOfAWholeRangeInAnyOrder) {
  RetiredNumbers set;
  constexpr uint32_t kCount = 20000;
  for (uint32_t i = 0; i < kCount; ++i) set.Add((i * 7919u) % kCount * 3);
  EXPECT_EQ(set.size(), kCount);
  for (uint32_t n = 0; n < kCount * 3; ++n) EXPECT_EQ(set.Contains(n), n % 3 == 0) << n;
  for (uint32_t n = 0; n < kCount * 3; n += 3) set.Remove(n);
  EXPECT_EQ(set.size(), 0u);
  EXPECT_EQ(set.pages(), 0u);
}

}  // namespace
}  // namespace cqd::internal

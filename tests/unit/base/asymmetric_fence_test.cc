// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/asymmetric_fence.h: Dekker's pattern with the light fence on one side and the heavy
// one on the other never lets both loads miss both stores.
#include "runtime/base/asymmetric_fence.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

TEST(AsymmetricFence, TheChoiceIsStable) {
  EXPECT_EQ(AsymmetricFenceExpedited(), AsymmetricFenceExpedited());
}

// Spins briefly, then yields (the test must pass beside busy loops on two cores).
template <typename Pred>
void SpinUntil(Pred pred) {
  for (int spins = 0; !pred(); ++spins) {
    if (spins > 2000) std::this_thread::yield();
  }
}

// Each round both threads start together; the hot one stores x and loads y with LightFence between
// (what a consumer does per handler call), the rare one stores y and loads x with HeavyFence
// between (what Unregister does), after a delay that varies by round so that the two overlap in
// every way. With a compiler barrier on both sides instead, a machine that buffers stores (x86-64
// among them) lets both loads read 0 in some of these rounds.
TEST(AsymmetricFence, OneSideAlwaysSeesTheOther) {
  constexpr int kRounds = 4000;
  const bool expedited = AsymmetricFenceExpedited();
  std::atomic<int> x{0}, y{0};
  std::atomic<int> ready{-1};  // the hot thread waits for round r
  std::atomic<int> round{-1};  // round r may start
  std::atomic<int> done{-1};   // the hot thread's load of round r is in hot_saw[r]
  std::vector<int> hot_saw(kRounds);
  std::thread hot([&] {
    for (int r = 0; r < kRounds; ++r) {
      ready.store(r, std::memory_order_release);
      SpinUntil([&] { return round.load(std::memory_order_acquire) == r; });
      x.store(1, std::memory_order_relaxed);
      LightFence(expedited);
      hot_saw[r] = y.load(std::memory_order_relaxed);
      done.store(r, std::memory_order_release);
    }
  });
  int both_missed = 0;
  for (int r = 0; r < kRounds; ++r) {
    x.store(0, std::memory_order_relaxed);
    y.store(0, std::memory_order_relaxed);
    SpinUntil([&] { return ready.load(std::memory_order_acquire) == r; });
    round.store(r, std::memory_order_release);
    for (volatile int k = 0; k < (r % 64) * 4; k = k + 1) {
    }
    y.store(1, std::memory_order_relaxed);
    HeavyFence();
    const int rare_saw = x.load(std::memory_order_relaxed);
    SpinUntil([&] { return done.load(std::memory_order_acquire) == r; });
    if (rare_saw == 0 && hot_saw[r] == 0) ++both_missed;
  }
  hot.join();
  EXPECT_EQ(both_missed, 0) << "expedited: " << expedited;
}

}  // namespace
}  // namespace cqd::internal

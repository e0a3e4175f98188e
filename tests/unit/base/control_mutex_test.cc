// SPDX-License-Identifier: BSD-2-Clause
// ControlMutex (runtime/base/thread_role.h): callers take it in the order they asked; a caller
// with a wait duty serves the duty while it waits; a holder sees what the one before it wrote.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {
namespace {

// Spins (yielding) until `done` is set. The test's timeout is the hang guard.
void Await(const std::atomic<bool>& done) {
  while (!done.load(std::memory_order_acquire)) std::this_thread::yield();
}

struct Duty {
  std::atomic<int> served{0};
  static void Serve(void* owner) {
    static_cast<Duty*>(owner)->served.fetch_add(1, std::memory_order_relaxed);
  }
};

TEST(ControlMutex, AWaiterWithADutyServesItUntilItsTurn) {
  ControlMutex mu;
  Duty duty;
  std::atomic<bool> locked{false};
  mu.Lock();
  std::thread waiter([&] {
    HostedDispatchScope scope(&Duty::Serve, &duty);
    mu.Lock();
    locked.store(true, std::memory_order_release);
    mu.Unlock();
  });
  while (duty.served.load(std::memory_order_relaxed) < 3) std::this_thread::yield();
  EXPECT_FALSE(locked.load(std::memory_order_acquire)) << "took the lock while it was held";
  mu.Unlock();
  waiter.join();
  EXPECT_TRUE(locked.load());
}

// The starvation this lock exists to prevent: a thread making control calls back to back must
// not hold off a run-to-completion handler's call that asked before it. The duty waiter takes its
// ticket before the looping thread starts, so it must hold the lock before the loop's first turn.
// (An unfair mutex fails this whenever the looping thread reaches the lock first.)
TEST(ControlMutex, TurnsPassInTheOrderAsked) {
  ControlMutex mu;
  std::vector<char> order;  // guarded by mu
  std::atomic<bool> duty_waiting{false};
  mu.Lock();
  std::thread handler([&] {
    HostedDispatchScope scope(
        [](void* owner) {
          auto* waiting = static_cast<std::atomic<bool>*>(owner);
          waiting->store(true, std::memory_order_release);
        },
        &duty_waiting);
    mu.Lock();
    order.push_back('H');
    mu.Unlock();
  });
  std::thread busy([&] {
    Await(duty_waiting);
    for (int i = 0; i < 2000; ++i) {
      mu.Lock();
      order.push_back('B');
      mu.Unlock();
    }
  });
  Await(duty_waiting);
  // Lets the looping thread reach the lock, so that both wait when the holder lets go.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  mu.Unlock();
  handler.join();
  busy.join();
  ASSERT_EQ(order.size(), 2001u);
  EXPECT_EQ(order.front(), 'H') << "a caller that asked later took the lock first";
}

TEST(ControlMutex, AHolderSeesWhatTheOneBeforeWrote) {
  ControlMutex mu;
  int value = 0;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        mu.Lock();
        ++value;
        mu.Unlock();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(value, 40000);
}

}  // namespace
}  // namespace cqd::internal

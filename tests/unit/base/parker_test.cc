// SPDX-License-Identifier: BSD-2-Clause
// Parker (runtime/base/parker.h): Prepare / re-check / Cancel-or-Park. A Wake after Prepare makes
// Park return; a parked thread is woken from another; one waker of many wins; the eventfd mode; no
// lost wake-up over many ping-pong rounds.
#include "runtime/base/parker.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

TEST(Parker, WakeWithNoSleeperDoesNothing) {
  Parker parker;
  EXPECT_FALSE(parker.sleeping());
  EXPECT_FALSE(parker.Wake());
  EXPECT_FALSE(parker.sleeping());
}

TEST(Parker, PrepareAnnouncesTheSleeperAndCancelWithdrawsIt) {
  Parker parker;
  parker.Prepare();
  EXPECT_TRUE(parker.sleeping());
  parker.Cancel();
  EXPECT_FALSE(parker.sleeping());
  EXPECT_FALSE(parker.Wake());  // nobody to wake after Cancel
}

TEST(Parker, WakeBetweenPrepareAndParkMakesParkReturn) {
  Parker parker;
  const uint32_t ticket = parker.Prepare();
  EXPECT_TRUE(parker.Wake());
  EXPECT_FALSE(parker.sleeping());
  EXPECT_FALSE(parker.Wake());  // one wake per Prepare
  // Returns at once: the wake came after the ticket.
  parker.Park(ticket);
  EXPECT_FALSE(parker.sleeping());
}

TEST(Parker, WakeBetweenPrepareAndParkForMakesParkForReturn) {
  Parker parker;
  const uint32_t ticket = parker.Prepare();
  EXPECT_TRUE(parker.Wake());
  // A long timeout: only the wake can make this return in a passing run.
  parker.ParkFor(ticket, std::chrono::hours(1));
  EXPECT_FALSE(parker.sleeping());
}

TEST(Parker, ParkForReturnsWithoutAWake) {
  Parker parker;
  const uint32_t ticket = parker.Prepare();
  parker.ParkFor(ticket, std::chrono::milliseconds(1));
  EXPECT_FALSE(parker.sleeping());
  EXPECT_FALSE(parker.Wake());  // the sleeper is gone
}

TEST(Parker, TryCancelTellsWhetherAWakerGotThereFirst) {
  Parker parker;
  parker.Prepare();
  EXPECT_TRUE(parker.TryCancel());  // no waker: cancelled
  EXPECT_FALSE(parker.sleeping());
  EXPECT_FALSE(parker.Wake());

  const uint32_t ticket = parker.Prepare();
  EXPECT_TRUE(parker.Wake());
  EXPECT_FALSE(parker.TryCancel());  // the waker got there first
  parker.Park(ticket);               // and its wake is there to be consumed
}

TEST(Parker, AWakeBeforePrepareIsNotKept) {
  Parker parker;
  EXPECT_FALSE(parker.Wake());
  const uint32_t ticket = parker.Prepare();
  // The sleeper must rely on its re-check for work published before Prepare; the stale Wake did
  // not count, so a fresh one is needed and succeeds.
  EXPECT_TRUE(parker.sleeping());
  EXPECT_TRUE(parker.Wake());
  parker.Park(ticket);
}

TEST(Parker, ParkedThreadIsWokenByAnotherThread) {
  Parker parker;
  std::atomic<bool> prepared{false};
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    const uint32_t ticket = parker.Prepare();
    prepared.store(true, std::memory_order_seq_cst);
    parker.Park(ticket);
    woke.store(true, std::memory_order_seq_cst);
  });
  while (!prepared.load(std::memory_order_seq_cst)) std::this_thread::yield();
  // The sleeper has announced itself, so this Wake is the one that must wake it; it may come
  // before or after the sleeper enters the futex wait.
  EXPECT_TRUE(parker.Wake());
  sleeper.join();  // returns only if Park did
  EXPECT_TRUE(woke.load());
  EXPECT_FALSE(parker.sleeping());
}

TEST(Parker, ExactlyOneOfManyConcurrentWakersWakes) {
  constexpr int kWakers = 4;
  constexpr int kRounds = 200;
  Parker parker;
  std::atomic<int> round_started{-1};
  std::atomic<int> wakers_done{0};
  std::vector<int> successes(kRounds, 0);  // written by the sleeper after each round
  std::vector<std::atomic<int>> wins(kRounds);
  std::vector<std::thread> wakers;
  for (int w = 0; w < kWakers; ++w) {
    wakers.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        while (round_started.load(std::memory_order_seq_cst) < r) std::this_thread::yield();
        if (parker.Wake()) wins[r].fetch_add(1, std::memory_order_relaxed);
        wakers_done.fetch_add(1, std::memory_order_seq_cst);
      }
    });
  }
  for (int r = 0; r < kRounds; ++r) {
    const uint32_t ticket = parker.Prepare();
    round_started.store(r, std::memory_order_seq_cst);
    // Every waker tries once; whichever comes first wakes, the others find no sleeper.
    parker.Park(ticket);
    while (wakers_done.load(std::memory_order_seq_cst) < (r + 1) * kWakers) {
      std::this_thread::yield();
    }
    successes[r] = wins[r].load(std::memory_order_relaxed);
  }
  for (std::thread& t : wakers) t.join();
  for (int r = 0; r < kRounds; ++r) EXPECT_EQ(successes[r], 1) << "round " << r;
}

TEST(Parker, EventFdModeWritesOneTokenPerWake) {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  Parker parker;
  parker.UseEventFd(fd);

  EXPECT_FALSE(parker.Wake());  // no sleeper: nothing written
  uint64_t value = 0;
  EXPECT_LT(read(fd, &value, sizeof(value)), 0);  // EAGAIN: the counter is 0

  parker.Prepare();
  EXPECT_TRUE(parker.Wake());
  EXPECT_FALSE(parker.Wake());
  ASSERT_EQ(read(fd, &value, sizeof(value)), static_cast<ssize_t>(sizeof(value)));
  EXPECT_EQ(value, 1u);
  EXPECT_FALSE(parker.sleeping());

  // Another thread's wake reaches the fd the sleeper watches.
  parker.Prepare();
  std::thread waker([&] { EXPECT_TRUE(parker.Wake()); });
  waker.join();
  ASSERT_EQ(read(fd, &value, sizeof(value)), static_cast<ssize_t>(sizeof(value)));
  EXPECT_EQ(value, 1u);
  close(fd);
}

// Two threads pass a ball back and forth, each sleeping on its own Parker while the other has it.
// A lost wake-up would leave both asleep (the test would hang); every round is counted on both
// sides.
TEST(Parker, PingPongLosesNoWakeUp) {
  constexpr int kRounds = 5000;
  Parker parkers[2];
  std::atomic<int> turn{0};  // whose turn it is: 0 or 1
  int rounds[2] = {0, 0};    // each written by its player only

  auto player = [&](int me) {
    const int other = 1 - me;
    for (int r = 0; r < kRounds; ++r) {
      // Wait for the ball: Prepare, re-check, then Cancel or Park.
      while (turn.load(std::memory_order_seq_cst) != me) {
        const uint32_t ticket = parkers[me].Prepare();
        if (turn.load(std::memory_order_seq_cst) == me) {
          parkers[me].Cancel();
          break;
        }
        parkers[me].Park(ticket);
      }
      ++rounds[me];
      // Publish the hand-over (seq_cst), then wake the other.
      turn.store(other, std::memory_order_seq_cst);
      parkers[other].Wake();
    }
  };
  std::thread zero(player, 0);
  std::thread one(player, 1);
  zero.join();
  one.join();
  EXPECT_EQ(rounds[0], kRounds);
  EXPECT_EQ(rounds[1], kRounds);
  EXPECT_EQ(turn.load(), 0);  // 2 * kRounds hand-overs
}

}  // namespace
}  // namespace cqd::internal

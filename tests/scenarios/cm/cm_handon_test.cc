// SPDX-License-Identifier: BSD-2-Clause
// The CM hand-on rule (runtime/core/cm_router.h) under races, without rdma_cm (cm_handon_rig.h):
// made-up events of two bound ids are routed through real pollers and consumers, as the event
// thread routes what it reads, while engine threads drain the QPs' consumers one item at a time
// (so that parts wait in queues and spills) and other threads end the registrations the way
// Unregister does. Half the rounds route each event in two parts (send and receive CQs on two
// shards). In the second test the rounds stop as Shutdown does once the events are routed (the
// pollers hand over and stop, the CmHandler's consumer closes) and only then end the
// registrations, so that what is handed on is held and run by the threads that handed it on.
// tests/fuzz/cm_handon_fuzz.cc drives the same rig with sequences the fuzzer chooses.
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cm_handon_rig.h"

namespace cqd::internal::testing {
namespace {

constexpr int kEvents = 40;  // per id and round

void RunRound(uint32_t seed, bool shut_down) {
  const bool two_shards = seed % 2 == 0;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << (two_shards ? ", two shards" : ""));
  std::mt19937 rng(seed);
  HandOnRig::Options options;
  options.two_shards = two_shards;
  options.qp_handler_time = std::chrono::microseconds(100);
  HandOnRig rig(options);
  for (int k = 0; k < rig.ids(); ++k) rig.Register(k);
  std::atomic<bool> routed{false};
  std::vector<std::thread> threads;
  for (int k = 0; k < rig.ids(); ++k) {  // engine threads, now and then pausing
    const uint32_t pause_every = 1 + rng() % 8;
    threads.emplace_back([&, k, pause_every] {
      for (uint32_t n = 1; !routed.load() || rig.Pending(k); ++n) {
        rig.Drain(k, 1);
        if (n % pause_every == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  // The ends: the control path (one at a time), racing the engine threads and, unless the round
  // models Shutdown (which stops the event thread first), the event thread.
  std::mutex control;
  std::vector<std::thread> enders;
  auto start_ends = [&] {
    for (int k = 0; k < rig.ids(); ++k) {
      const uint32_t delay_us = rng() % 3000;
      enders.emplace_back([&, k, delay_us] {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        std::lock_guard<std::mutex> lock(control);
        rig.End(k);
      });
    }
  };
  if (!shut_down) start_ends();
  for (int seq = 1; seq <= kEvents; ++seq) {  // the event thread
    for (int k = 0; k < rig.ids(); ++k) rig.Route(k);
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
  }
  if (shut_down) {
    rig.StopLikeShutdown();  // with events still queued and spilled
    start_ends();
  }
  for (std::thread& t : enders) t.join();
  routed = true;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(rig.Settle()) << "some event never reached a handler: " << rig.Check();
  EXPECT_EQ(rig.Check(), "");
}

TEST(CmHandOn, EventsLeaveInReadOrderWhateverEndsTheRegistration) {
  for (uint32_t seed = 1; seed <= 60 && !::testing::Test::HasFailure(); ++seed) {
    RunRound(seed, /*shut_down=*/false);
  }
}

TEST(CmHandOn, AfterShutdownHeldEventsRunOneThreadAtATimeInOrder) {
  for (uint32_t seed = 1; seed <= 60 && !::testing::Test::HasFailure(); ++seed) {
    RunRound(seed, /*shut_down=*/true);
  }
}

// Unregister purges its consumer's entries from the pollers' spills (Shard::PurgeDead). When that
// consumer is also a channel's CmHandler consumer (as in examples/reactor), the spills may hold
// its listener events, which name no registration (kNoSlot): the purge passes over them, and
// they reach the CmHandler in order. (It once read the slot pool at kNoSlot, past its end: the
// reactor server's segfault beside two busy loops.)
TEST(CmHandOn, APurgeOfTheCmHandlersConsumerKeepsItsListenerEvents) {
  HandOnRig::Options options;
  options.ids = 1;
  options.listener_engine_driven = true;
  HandOnRig rig(options);
  constexpr int kListenerEvents = 6;
  for (int seq = 1; seq <= kListenerEvents; ++seq) rig.Route(0);  // id 0 is bound to nothing
  // The queue takes one; the rest wait in poller 0's spill (or its inbox: purged the same way).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rig.ListenerSpilled() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(rig.ListenerSpilled(), 2u);
  rig.PurgeListener();
  EXPECT_TRUE(rig.Settle()) << "some event never reached a handler: " << rig.Check();
  EXPECT_EQ(rig.Check(), "");
}

}  // namespace
}  // namespace cqd::internal::testing

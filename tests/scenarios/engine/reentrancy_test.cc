// SPDX-License-Identifier: BSD-2-Clause
// Handlers that call back into the runtime: Drain from handlers, and Unregister while other
// handlers of the same consumer are blocked. A deadlock here shows as the test's timeout.
#include <functional>
#include <mutex>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Recorder;
using testing::WaitFor;

// One CQ; QP i registered on consumer owners[i], with handlers[i] (whose `before` hook a test
// sets to act in its calls).
struct OneCq : testing::Bed {
  OneCq(const RuntimeOptions& options, std::vector<ConsumerId> owners) {
    const Status started = StartWithoutLedger(options);
    EXPECT_TRUE(started.ok()) << started.ToString();
    cq = Cq(0);
    for (ConsumerId c : owners) {
      qps.push_back(sim->CreateQp(cq.sim(), cq.sim()).value());
      handlers.push_back(std::make_unique<Recorder>());
      handlers.back()->qp_num = qps.back()->qp_num();
      registrations.push_back(rt->RegisterQp(*qps.back(), *handlers.back(), c).value());
    }
  }
  ~OneCq() {
    registrations.clear();
    for (SimQp* qp : qps) EXPECT_TRUE(sim->DestroyQp(qp).ok());
    EXPECT_TRUE(rt->DestroyCq(cq).ok());
  }
  uint64_t Queued(ConsumerId c) const { return rt->GetStats().consumers[c].queue_depth; }

  CqHandle cq;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<Recorder>> handlers;
  std::vector<Registration> registrations;
};

RuntimeOptions EngineDriven(int consumers) {
  RuntimeOptions options;
  options.consumers.assign(consumers, ConsumerOptions{});
  for (auto& c : options.consumers) c.kind = ConsumerKind::kEngineDriven;
  return options;
}

TEST(Reentrancy, DrainFromOwnHandlerIsRefused) {
  OneCq s(EngineDriven(1), {0, 0});
  int inner = 0;
  s.handlers[0]->before = [&](auto) { inner = s.rt->Drain(0, 64); };
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(s.qps[0]->Complete(i), 1);
    ASSERT_EQ(s.qps[1]->Complete(i), 1);
  }
  ASSERT_TRUE(WaitFor([&] { return s.Queued(0) == 8; }));
  // queue_depth counts items a poller reserved before they are visible to a dequeue: drain
  // until every handler got its four, not until a Drain finds nothing.
  EXPECT_TRUE(WaitFor([&] {
    s.rt->Drain(0, 3);
    return s.handlers[0]->received() == 4 && s.handlers[1]->received() == 4;
  }));
  EXPECT_EQ(inner, -EBUSY);
  EXPECT_EQ(s.handlers[0]->received(), 4u);
  EXPECT_EQ(s.handlers[1]->received(), 4u);
}

// An OrphanHandler runs on a poller, where the handlers a Drain would run could not call the
// runtime (their Unregister would do nothing): Drain from there is refused.
TEST(Reentrancy, DrainFromAnOrphanHandlerOnAPollerIsRefused) {
  class DrainingOrphans : public OrphanHandler {
   public:
    void OnOrphans(std::span<const ibv_wc>) noexcept override {
      if (Runtime* r = rt.load(); r != nullptr) drained.store(r->Drain(0, 64));
    }
    std::atomic<Runtime*> rt{nullptr};
    std::atomic<int> drained{1};
  };
  DrainingOrphans orphans;
  RuntimeOptions options = EngineDriven(1);
  options.orphan_handler = &orphans;
  options.max_registrations = 1;
  OneCq s(options, {0});
  ASSERT_EQ(s.qps[0]->Complete(0), 1);  // queued for consumer 0
  ASSERT_TRUE(WaitFor([&] { return s.Queued(0) == 1; }));
  orphans.rt.store(s.rt.get());
  CQD_ASSERT_OK_AND_ASSIGN(stranger, s.sim->CreateQp(s.cq.sim(), s.cq.sim()));
  ASSERT_EQ(stranger->Complete(0), 1);  // no registration: an orphan, on the poller
  ASSERT_TRUE(WaitFor([&] { return orphans.drained.load() != 1; }));
  EXPECT_EQ(orphans.drained.load(), -EBUSY);
  EXPECT_EQ(s.handlers[0]->received(), 0u) << "a handler ran inside the OrphanHandler";
  EXPECT_TRUE(WaitFor([&] {
    s.rt->Drain(0, 64);
    return s.handlers[0]->received() == 1;
  }));
  CQD_ASSERT_OK(s.sim->DestroyQp(stranger));
}

// One thread drains a consumer at a time: another thread's Drain meanwhile returns -EBUSY at
// once (it raced the first one's dispatch before).
TEST(Reentrancy, ASecondThreadsDrainIsRefusedWhileOneIsInProgress) {
  OneCq s(EngineDriven(1), {0});
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  s.handlers[0]->before = [&](auto) {
    inside.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  ASSERT_EQ(s.qps[0]->Complete(0), 1);
  ASSERT_EQ(s.qps[0]->Complete(1), 1);
  std::thread first([&] { testing::DrainUntil(*s.rt, 0, [&] { return inside.load(); }); });
  ASSERT_TRUE(WaitFor([&] { return inside.load(); }));
  EXPECT_EQ(s.rt->Drain(0, 64), -EBUSY);
  EXPECT_EQ(s.rt->Drain(0, 0), -EBUSY);  // a Drain of nothing too (it returned 0 before)
  release.store(true);
  first.join();
  EXPECT_TRUE(WaitFor([&] {
    s.rt->Drain(0, 64);
    return s.handlers[0]->received() == 2;
  }));
}

// The engine thread drives consumers 0 and 1; a handler of 0 drains 1, whose handler unregisters
// an idle QP of consumer 0 (whose batch is in progress on this very thread).
TEST(Reentrancy, NestedDrainOfAnotherConsumerThenUnregister) {
  OneCq s(EngineDriven(2), {0, 1, 0});
  s.handlers[0]->before = [&](auto) { EXPECT_GE(s.rt->Drain(1, 64), 0); };
  s.handlers[1]->before = [&](auto) { s.registrations[2].Unregister(); };
  ASSERT_EQ(s.qps[1]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return s.Queued(1) == 1; }));
  ASSERT_EQ(s.qps[0]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return s.Queued(0) == 1; }));
  // queue_depth counts what the poller reserved before it is visible: once the poller sleeps,
  // both items are in their queues.
  ASSERT_TRUE(testing::WaitForPollersAsleep(*s.rt));
  EXPECT_EQ(s.rt->Drain(0, 64), 1);
  EXPECT_EQ(s.handlers[1]->received(), 1u);
  EXPECT_FALSE(s.registrations[2].registered());
}

// Unregister(Q) must not wait for an unrelated QP's handler: here that handler waits for a lock
// the unregistering thread holds.
TEST(Reentrancy, UnregisterDoesNotWaitForOtherQpsHandlers) {
  OneCq s(testing::OwnedConsumers(1, 1), {0, 0});
  std::mutex engine_lock;
  std::atomic<bool> entered{false};
  s.handlers[1]->before = [&](auto) {
    entered.store(true);
    std::lock_guard<std::mutex> lock(engine_lock);
  };
  std::unique_lock<std::mutex> held(engine_lock);
  ASSERT_EQ(s.qps[1]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return entered.load(); }));
  s.registrations[0].Unregister();  // QP 0 is not in the batch that is blocked
  EXPECT_FALSE(s.registrations[0].registered());
  held.unlock();
  ASSERT_TRUE(WaitFor([&] { return s.handlers[1]->received() == 1; }));
}

// Unregister waits for its QP's handler call, not for the batch around it: here QP 0's completion
// is in the batch whose first handler (QP 1's) waits for a lock the unregistering thread holds.
// QP 0's handler then never runs: the consumer enters its call, reads it unregistered, and hands
// the completion to the orphan handler.
TEST(Reentrancy, UnregisterDoesNotWaitForTheRestOfItsQpsBatch) {
  OneCq s(EngineDriven(1), {0, 0});
  std::mutex engine_lock;
  std::atomic<bool> entered{false};
  s.handlers[1]->before = [&](auto) {
    entered.store(true);
    std::lock_guard<std::mutex> lock(engine_lock);
  };
  ASSERT_EQ(s.qps[1]->Complete(0), 1);
  ASSERT_EQ(s.qps[0]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return s.Queued(0) == 2; }));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*s.rt));  // both entries are in the lane
  std::unique_lock<std::mutex> held(engine_lock);
  int drained = 0;
  std::thread engine([&] { drained = s.rt->Drain(0, 64); });  // one batch: QP 1's, then QP 0's
  ASSERT_TRUE(WaitFor([&] { return entered.load(); }));
  s.registrations[0].Unregister();  // QP 1's handler is still blocked
  EXPECT_FALSE(s.registrations[0].registered());
  held.unlock();
  engine.join();
  EXPECT_EQ(drained, 2);
  EXPECT_EQ(s.handlers[1]->received(), 1u);
  EXPECT_EQ(s.handlers[0]->received(), 0u) << "a handler ran after its Unregister returned";
}

// The OrphanHandler the consumer calls for a run it found unregistered is nobody's handler call:
// an Unregister (here of a QP registered since in the retired QP's slot: max_registrations 1
// leaves no other) does not wait for it, even while it blocks on a lock the unregistering thread
// holds.
TEST(Reentrancy, UnregisterDoesNotWaitForTheOrphanHandler) {
  class BlockingOrphans : public OrphanHandler {
   public:
    void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
      entered.store(true);
      std::lock_guard<std::mutex> lock(mu);
      count.fetch_add(wcs.size());
    }
    std::mutex mu;
    std::atomic<bool> entered{false};
    std::atomic<uint64_t> count{0};
  };
  BlockingOrphans orphans;
  RuntimeOptions options = EngineDriven(1);
  options.orphan_handler = &orphans;
  options.max_registrations = 1;
  OneCq s(options, {0});
  ASSERT_EQ(s.qps[0]->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return s.Queued(0) == 1; }));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*s.rt));  // handed over: the consumer will orphan it
  s.registrations[0].Unregister();
  CQD_ASSERT_OK_AND_ASSIGN(next, s.sim->CreateQp(s.cq.sim(), s.cq.sim()));
  testing::Recorder next_handler;
  CQD_ASSERT_OK_AND_ASSIGN(next_reg, s.rt->RegisterQp(*next, next_handler, 0));
  std::unique_lock<std::mutex> held(orphans.mu);
  int drained = 0;
  std::thread engine([&] { drained = s.rt->Drain(0, 64); });
  ASSERT_TRUE(WaitFor([&] { return orphans.entered.load(); }));
  next_reg.Unregister();  // the OrphanHandler is still blocked
  EXPECT_FALSE(next_reg.registered());
  held.unlock();
  engine.join();
  EXPECT_EQ(drained, 1);
  EXPECT_EQ(orphans.count.load(), 1u);
  EXPECT_EQ(s.handlers[0]->received(), 0u);
  CQD_ASSERT_OK(s.sim->DestroyQp(next));
}

// Starting a replay raises the event an armed, sleeping poller waits for.
TEST(Reentrancy, ReplayWakesASleepingPoller) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(0);
  OneCq s(options, {0});
  ASSERT_TRUE(WaitFor([&] { return s.rt->GetStats().pollers[0].sleeps > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<ibv_wc> pattern(16);
  for (auto& wc : pattern) {
    wc.qp_num = s.qps[0]->qp_num();
    wc.opcode = IBV_WC_RECV;
  }
  s.cq.sim()->Replay(pattern, 1000);
  EXPECT_TRUE(WaitFor([&] { return s.handlers[0]->received() == 1000; }))
      << "delivered " << s.handlers[0]->received() << " of 1000";
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// Engine-driven shards (RuntimeOptions::engine_shards): the engine's loop is the shard's poller
// (Runtime::PollShard, TrySleepShard, ShardFd). The guarantees of runtime-owned shards hold:
// order and exactly-once, events behind completions, no lost wakeup across the sleep protocol,
// the budget, Unregister, TeardownQp, control calls from handlers and from other threads (also
// while nobody polls the shard), Shutdown, and bad input.
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/engine_loop.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::EngineLoop;
using testing::InjectRecvs;
using testing::OneQp;
using testing::OrphanLedger;
using testing::Recorder;
using testing::WaitFor;

// `pollers` engine-driven shards; consumer i runs to completion on shard i, and consumer
// `pollers` (if `owned`) is a runtime-owned thread.
RuntimeOptions EngineOptions(int pollers, bool owned = false) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.consumers.assign(pollers, ConsumerOptions{});
  for (int i = 0; i < pollers; ++i) {
    options.engine_shards.push_back(i);
    options.consumers[i].kind = ConsumerKind::kRunToCompletion;
    options.consumers[i].poller = i;
  }
  if (owned) options.consumers.push_back(ConsumerOptions{});
  return options;
}

TEST(EngineShard, BadInputIsRefusedWithAStatus) {
  RuntimeOptions options = EngineOptions(1);
  options.engine_shards = {1};
  testing::Bed refused;
  Status status = refused.CreateRuntime(options);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("engine_shards"), std::string::npos);
  options.pollers = 2;
  options.engine_shards = {1, 1};
  status = refused.CreateRuntime(options);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("twice"), std::string::npos);

  RuntimeOptions mixed;
  mixed.pollers = 2;
  mixed.engine_shards = {1};
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(mixed));
  auto& rt = bed.rt;
  EXPECT_EQ(rt->PollShard(0, 16), -EINVAL);  // a thread of the runtime polls shard 0
  EXPECT_EQ(rt->PollShard(2, 16), -EINVAL);
  EXPECT_EQ(rt->PollShard(-1, 16), -EINVAL);
  EXPECT_EQ(rt->PollShard(1, 0), -EINVAL);
  EXPECT_EQ(rt->TrySleepShard(0), -EINVAL);
  EXPECT_EQ(rt->TrySleepShard(7), -EINVAL);
  EXPECT_EQ(rt->ShardFd(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->ShardFd(9).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rt->ShardFd(1).ok());
  EXPECT_GE(*rt->ShardFd(1), 0);
  EXPECT_EQ(rt->PollShard(1, 16), 0);  // nothing to do
  Stats stats = rt->GetStats();
  ASSERT_EQ(stats.pollers.size(), 2u);
  EXPECT_EQ(stats.pollers[0].engine_driven, 0);
  EXPECT_EQ(stats.pollers[1].engine_driven, 1);
}

// Nothing polls an engine-driven shard but the engine: its completions wait in the CQ until
// PollShard, which runs the run-to-completion handlers on the calling thread, in order.
TEST(EngineShard, PollShardRunsHandlersInlineInOrder) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 100));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(handler.received(), 0u);  // no thread of the runtime took them
  int work = 0;
  while (handler.received() < 100) {
    int n = one.rt->PollShard(0, 1000);
    ASSERT_GE(n, 0);
    work += n;
    if (n == 0) break;
  }
  EXPECT_EQ(handler.received(), 100u);
  EXPECT_EQ(handler.out_of_order(), 0u);
  EXPECT_EQ(handler.calls_off(std::this_thread::get_id()), 0u);
  EXPECT_GE(work, 100);  // 100 polled, and 100 dispatched
  EXPECT_EQ(one.rt->PollShard(0, 1000), 0);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// The budget bounds the completions one call takes, and a pass it cuts short resumes at the
// CQ it left out: two busy CQs take turns.
TEST(EngineShard, BudgetBoundsEachCallAndRotates) {
  RuntimeOptions options = EngineOptions(1);
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle a = rt->CreateCq(dev, 0).value();
  CqHandle b = rt->CreateCq(dev, 0).value();
  SimQp* qa = sim->CreateQp(a.sim(), a.sim()).value();
  SimQp* qb = sim->CreateQp(b.sim(), b.sim()).value();
  Recorder ha, hb;
  ha.qp_num = qa->qp_num();
  hb.qp_num = qb->qp_num();
  Registration ra = rt->RegisterQp(*qa, ha, 0).value();
  Registration rb = rt->RegisterQp(*qb, hb, 0).value();
  ASSERT_TRUE(InjectRecvs(qa, 0, 100));
  ASSERT_TRUE(InjectRecvs(qb, 0, 100));
  auto polled = [&](CqHandle cq) {
    for (const CqStats& c : rt->GetStats().cqs) {
      if (c.id == cq.id()) return c.completions;
    }
    return uint64_t{0};
  };
  ASSERT_GT(rt->PollShard(0, 10), 0);
  EXPECT_EQ(rt->GetStats().pollers[0].completions, 10u);
  ASSERT_GT(rt->PollShard(0, 10), 0);
  EXPECT_EQ(polled(a), 10u);
  EXPECT_EQ(polled(b), 10u);
  while (rt->PollShard(0, 7) > 0) {
  }
  EXPECT_EQ(ha.received(), 100u);
  EXPECT_EQ(hb.received(), 100u);
  EXPECT_EQ(ha.out_of_order() + hb.out_of_order(), 0u);
  ra.Unregister();
  rb.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qa));
  CQD_ASSERT_OK(sim->DestroyQp(qb));
  CQD_ASSERT_OK(rt->DestroyCq(a));
  CQD_ASSERT_OK(rt->DestroyCq(b));
}

// The sleep protocol: 0 while there is work (the poll once more found it), 1 when idle; from
// then on a completion makes the fd readable.
TEST(EngineShard, TrySleepSaysWhetherSleepingIsSafeAndTheFdWakes) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  const int fd = one.rt->ShardFd(0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 3));
  EXPECT_EQ(one.rt->TrySleepShard(0), 0);  // found the three, routed them
  while (one.rt->PollShard(0, 64) > 0) {
  }
  EXPECT_EQ(handler.completions(), 3u);
  for (int round = 0; round < 50; ++round) {
    ASSERT_EQ(one.rt->TrySleepShard(0), 1) << round;
    ASSERT_EQ(one.rt->TrySleepShard(0), 1) << round;  // twice in a row is harmless
    EXPECT_EQ(one.rt->GetStats().pollers[0].asleep, 1u) << round;
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0) << round;  // nothing yet: not readable
    ASSERT_TRUE(InjectRecvs(one.qp, 3 + round, 1));
    ASSERT_EQ(poll(&p, 1, 30000), 1) << round;  // the event thread made it readable
    EXPECT_EQ(one.rt->GetStats().pollers[0].asleep, 0u) << round;  // woken: no longer asleep
    while (one.rt->PollShard(0, 64) > 0) {
    }
    ASSERT_EQ(handler.completions(), 4u + round);
    EXPECT_EQ(one.rt->GetStats().pollers[0].asleep, 0u) << round;
  }
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// TrySleepShard's 2: after a failed arm, and for good once the shard's completion channel failed,
// the engine may sleep only briefly, since no event would wake it; nothing is lost meanwhile, and
// a later sleep whose arm succeeds is unbounded again.
TEST(EngineShard, AFailedArmOrChannelBoundsTheSleep) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  const int fd = one.rt->ShardFd(0).value();
  auto poll_until = [&](uint64_t completions) {
    return WaitFor([&] {
      (void)one.rt->PollShard(0, 64);
      return handler.completions() == completions;
    });
  };
  auto drain_fd = [&] {
    while (one.rt->PollShard(0, 64) > 0) {
    }
  };

  // An arm that fails: a bounded sleep; the completion that comes meanwhile raises no event, and
  // polling finds it.
  one.sim->FailRequestNotify(one.cq.sim(), EIO, 1);
  EXPECT_EQ(one.rt->TrySleepShard(0), 2);
  EXPECT_EQ(one.rt->GetStats().pollers[0].arm_failures, 1u);
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 1));
  ASSERT_TRUE(poll_until(1));

  // The next sleep arms it for real: unbounded, and the fd wakes the engine.
  ASSERT_EQ(one.rt->TrySleepShard(0), 1);
  ASSERT_TRUE(InjectRecvs(one.qp, 1, 1));
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 30000), 1);
  ASSERT_TRUE(poll_until(2));
  drain_fd();

  // The channel fails while the shard sleeps on it: the completion that raised the failing event
  // still arrives, and every sleep from then on is bounded.
  CQD_ASSERT_OK_AND_ASSIGN(channel, one.rt->SimChannelFor(one.dev, 0));
  ASSERT_EQ(one.rt->TrySleepShard(0), 1);
  one.sim->FailGetEvent(channel, EIO, 1 << 30);
  ASSERT_TRUE(InjectRecvs(one.qp, 2, 1));
  ASSERT_TRUE(WaitFor([&] { return one.rt->GetStats().failed_fds == 1; }));
  ASSERT_TRUE(poll_until(3));
  int bounded = 0;
  for (int round = 0; round < 20; ++round) {
    const int verdict = one.rt->TrySleepShard(0);
    EXPECT_NE(verdict, 1) << round << ": an unbounded sleep on a failed channel";
    if (verdict == 2) ++bounded;
    drain_fd();
    ASSERT_TRUE(InjectRecvs(one.qp, 3 + round, 1));
    ASSERT_TRUE(poll_until(4 + round));
  }
  EXPECT_GT(bounded, 0);
  one.sim->FailGetEvent(channel, 0, 0);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// No lost wakeup: every time the reactor is asleep in epoll with no timeout, one completion,
// one async event, or a CQ created on its shard (then used) wakes it.
TEST(EngineShard, ASleepingReactorAlwaysWakes) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  EngineLoop loop(*one.rt, 0);
  for (int round = 0; round < 100; ++round) {
    ASSERT_TRUE(WaitFor([&] { return loop.asleep(); })) << round;
    if (round % 4 == 3) {
      CQD_ASSERT_OK(one.sim->RaiseQpEvent(one.qp, IBV_EVENT_COMM_EST));
      ASSERT_TRUE(WaitFor([&] { return handler.events() == static_cast<uint64_t>(round + 1) / 4; }))
          << round;
    } else {
      const uint64_t before = handler.completions();
      ASSERT_TRUE(InjectRecvs(one.qp, round, 1));
      ASSERT_TRUE(WaitFor([&] { return handler.completions() == before + 1; })) << round;
    }
  }
  // A CQ added while the reactor sleeps is armed before the next sleep.
  ASSERT_TRUE(WaitFor([&] { return loop.asleep(); }));
  CqHandle late = one.rt->CreateCq(one.dev, 0).value();
  SimQp* qp2 = one.sim->CreateQp(late.sim(), late.sim()).value();
  Recorder second;
  second.qp_num = qp2->qp_num();
  Registration reg2 = one.rt->RegisterQp(*qp2, second, 0).value();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(WaitFor([&] { return loop.asleep(); })) << round;
    ASSERT_TRUE(InjectRecvs(qp2, round, 1));
    ASSERT_TRUE(WaitFor([&] { return second.received() == round + 1u; })) << round;
  }
  EXPECT_EQ(second.out_of_order(), 0u);
  EXPECT_GT(one.rt->GetStats().pollers[0].sleeps, 0u);
  loop.Stop();
  EXPECT_EQ(loop.errors(), 0);
  reg.Unregister();
  reg2.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.sim->DestroyQp(qp2));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
  CQD_ASSERT_OK(one.rt->DestroyCq(late));
}

// Two reactors, each with its shard, plus an owned consumer fed by both: exactly once and in
// order under concurrent injection; run-to-completion handlers run on their reactor's thread.
TEST(EngineShard, ReactorsAndAnOwnedConsumerDeliverExactlyOnceInOrder) {
  RuntimeOptions options = EngineOptions(2, /*owned=*/true);
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  std::vector<CqHandle> cqs = {rt->CreateCq(dev, 0).value(), rt->CreateCq(dev, 1).value()};
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<Recorder>> handlers;
  std::vector<std::thread::id> expected_threads;
  std::vector<Registration> regs;
  std::vector<std::unique_ptr<EngineLoop>> loops;
  for (int s = 0; s < 2; ++s) loops.push_back(std::make_unique<EngineLoop>(*rt, s, 16));
  for (int i = 0; i < 6; ++i) {
    const int shard = i % 2;
    const ConsumerId consumer = i < 4 ? shard : 2;  // QPs 4 and 5 go to the owned consumer
    qps.push_back(sim->CreateQp(cqs[shard].sim(), cqs[shard].sim()).value());
    handlers.push_back(std::make_unique<Recorder>());
    handlers.back()->qp_num = qps.back()->qp_num();
    expected_threads.push_back(consumer == 2 ? std::thread::id() : loops[shard]->id());
    regs.push_back(rt->RegisterQp(*qps.back(), *handlers.back(), consumer).value());
  }
  constexpr int kPerQp = 4000;
  std::vector<std::thread> injectors;
  for (int i = 0; i < 6; ++i) {
    injectors.emplace_back([&, i] {
      for (int k = 0; k < kPerQp; ++k) {
        while (qps[i]->Complete(k) != 1) std::this_thread::yield();  // CQ full: retry
      }
    });
  }
  for (auto& t : injectors) t.join();
  ASSERT_TRUE(WaitFor([&] {
    uint64_t sum = 0;
    for (auto& h : handlers) sum += h->received();
    return sum == 6u * kPerQp;
  }));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(handlers[i]->received(), static_cast<uint64_t>(kPerQp)) << i;
    EXPECT_EQ(handlers[i]->out_of_order(), 0u) << i;
    EXPECT_EQ(handlers[i]->concurrent_calls(), 0u) << i;
    if (i < 4) {
      EXPECT_EQ(handlers[i]->calls_off(expected_threads[i]), 0u) << i;
    }
  }
  for (auto& loop : loops) {
    loop->Stop();
    EXPECT_EQ(loop->errors(), 0);
  }
  regs.clear();
  for (SimQp* qp : qps) CQD_ASSERT_OK(sim->DestroyQp(qp));
  for (CqHandle cq : cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
  CQD_ASSERT_OK(rt->Shutdown());
}

// An async event follows every completion that was in the QP's CQ when it was read, though the
// event thread posts it while the engine polls on its own schedule.
TEST(EngineShard, EventsFollowCompletions) {
  CqOptions cq_options;
  cq_options.solicited_only = true;
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1), cq_options));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 40));
  CQD_ASSERT_OK(one.sim->RaiseQpEvent(one.qp, IBV_EVENT_COMM_EST));
  ASSERT_TRUE(WaitFor([&] {
    one.rt->PollShard(0, 8);
    return handler.events() == 1;
  }));
  std::vector<Recorder::Entry> log = handler.log();
  ASSERT_EQ(log.size(), 41u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_FALSE(log[i].event) << i;
    EXPECT_EQ(log[i].wr_id, static_cast<uint64_t>(i));
  }
  EXPECT_TRUE(log[40].event);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// Control calls never wait for the engine to come back: with nobody polling the shard, CQs are
// created and destroyed and QPs registered and unregistered from another thread; a teardown
// ends by its deadline, and what it left goes to the orphan handler once the engine polls.
TEST(EngineShard, ControlCallsFinishWhileNobodyPolls) {
  OrphanLedger orphans;
  RuntimeOptions options = EngineOptions(1);
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  for (int round = 0; round < 20; ++round) {
    CqHandle cq = rt->CreateCq(dev, 0).value();
    SimQp* qp = sim->CreateQp(cq.sim(), cq.sim()).value();
    Recorder handler;
    handler.qp_num = qp->qp_num();
    Registration reg = rt->RegisterQp(*qp, handler, 0).value();
    ASSERT_TRUE(InjectRecvs(qp, 0, 5));
    reg.Unregister();  // the five are still in the CQ: nobody polled
    CQD_ASSERT_OK(sim->DestroyQp(qp));
    CQD_ASSERT_OK(rt->DestroyCq(cq));  // polls the CQ empty itself: five orphans
    EXPECT_EQ(handler.received(), 0u);
  }
  EXPECT_EQ(orphans.count.load(), 100u);

  CqHandle cq = rt->CreateCq(dev, 0).value();
  SimQp* qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  Recorder handler;
  handler.qp_num = qp->qp_num();
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(qp, 0, 5));
  TeardownOptions teardown_options;
  teardown_options.timeout = std::chrono::milliseconds(100);
  Teardown teardown = rt->TeardownQp(reg, teardown_options).value();
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);  // this thread never polled
  EXPECT_EQ(handler.received(), 0u);
  while (rt->PollShard(0, 64) > 0) {
  }
  // The five, and the QP's flushed receives, are leftovers: orphans, never the handler.
  EXPECT_EQ(handler.received(), 0u);
  EXPECT_GE(orphans.count.load(), 105u);
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// A teardown completes while the engine polls; Wait is refused on the thread that polls the
// QP's shard (it would wait for itself) and works elsewhere.
TEST(EngineShard, TeardownDrainsAndWaitIsRefusedOnTheDriver) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 10));
  while (one.rt->PollShard(0, 64) > 0) {
  }
  Teardown teardown = one.rt->TeardownQp(reg).value();
  Status refused = teardown.Wait();  // this thread polled the shard
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("engine-driven shard"), std::string::npos);
  ASSERT_TRUE(WaitFor([&] {
    one.rt->PollShard(0, 64);
    return teardown.done();
  }));
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_EQ(handler.completions(), 10u);
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));

  // From another thread, while a reactor polls: OK.
  SimQp* qp2 = one.sim->CreateQp(one.cq.sim(), one.cq.sim()).value();
  Recorder second;
  Registration reg2 = one.rt->RegisterQp(*qp2, second, 0).value();
  EngineLoop loop(*one.rt, 0);
  ASSERT_TRUE(InjectRecvs(qp2, 0, 7));
  ASSERT_TRUE(WaitFor([&] { return second.completions() == 7; }));
  Teardown t2 = one.rt->TeardownQp(reg2).value();
  CQD_ASSERT_OK(t2.Wait());
  EXPECT_FALSE(reg2.registered());
  loop.Stop();
  CQD_ASSERT_OK(one.sim->DestroyQp(qp2));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// A handler on the shard makes control calls that need its own shard (CreateCq, RegisterQp,
// Unregister of itself) while another thread makes control calls on the same shard: all finish.
// PollShard from inside the shard's own handler is refused with -EBUSY.
TEST(EngineShard, ControlCallsFromHandlersAndOtherThreadsFinish) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Runtime& rt = *one.rt;
  struct Handler : QpHandler {
    Runtime* rt;
    DeviceId dev;
    std::shared_ptr<SimDevice> sim;
    Registration* self;
    std::atomic<int> made{0};
    std::atomic<int> busy{0};
    std::atomic<bool> unregistered_self{false};
    std::vector<CqHandle> cqs;  // the handler's thread only
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      if (rt->PollShard(0, 4) == -EBUSY) busy.fetch_add(1);
      for (const ibv_wc& wc : wcs) {
        if (wc.wr_id == 1000) {
          self->Unregister();  // its own registration, from its handler
          unregistered_self.store(true);
          return;
        }
        auto cq = rt->CreateCq(dev, 0);
        if (cq.ok()) {
          cqs.push_back(*cq);
          made.fetch_add(1);
        }
      }
    }
  } handler;
  Registration reg;
  handler.rt = &rt;
  handler.dev = one.dev;
  handler.sim = one.sim;
  handler.self = &reg;
  reg = rt.RegisterQp(*one.qp, handler, 0).value();
  EngineLoop loop(rt, 0, 4);
  std::atomic<bool> stop{false};
  std::atomic<int> other_rounds{0};
  std::thread other([&] {
    while (!stop.load()) {
      auto cq = rt.CreateCq(one.dev, 0);
      if (!cq.ok()) continue;
      (void)rt.DestroyCq(*cq);
      other_rounds.fetch_add(1);
    }
  });
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(InjectRecvs(one.qp, i, 1));
    ASSERT_TRUE(WaitFor([&] { return handler.made.load() == i + 1; })) << i;
  }
  ASSERT_TRUE(InjectRecvs(one.qp, 1000, 1));
  ASSERT_TRUE(WaitFor([&] { return handler.unregistered_self.load(); }));
  ASSERT_TRUE(WaitFor([&] { return other_rounds.load() > 10; }));
  stop.store(true);
  other.join();
  loop.Stop();
  EXPECT_FALSE(reg.registered());
  EXPECT_EQ(handler.busy.load(), 51);
  for (CqHandle cq : handler.cqs) CQD_ASSERT_OK(rt.DestroyCq(cq));
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(rt.DestroyCq(one.cq));
}

// Unregister from another thread while the reactor delivers: once it returns the handler is
// never called again; everything injected reached the handler or the orphan handler.
TEST(EngineShard, UnregisterFromAnotherThreadEndsCalls) {
  OrphanLedger orphans;
  RuntimeOptions options = EngineOptions(1);
  options.orphan_handler = &orphans;
  OneQp one;
  CQD_ASSERT_OK(one.Build(options));
  std::atomic<bool> unregistered{false};
  std::atomic<uint64_t> late{0}, delivered{0};
  struct Handler : QpHandler {
    std::atomic<bool>* unregistered;
    std::atomic<uint64_t>* late;
    std::atomic<uint64_t>* delivered;
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      if (unregistered->load(std::memory_order_acquire)) late->fetch_add(1);
      delivered->fetch_add(wcs.size());
    }
  } handler;
  handler.unregistered = &unregistered;
  handler.late = &late;
  handler.delivered = &delivered;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  EngineLoop loop(*one.rt, 0, 8);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> injected{0};
  std::thread injector([&] {
    for (uint64_t i = 0; !stop.load(); ++i) {
      if (one.qp->Complete(i) == 1) injected.fetch_add(1);
    }
  });
  ASSERT_TRUE(WaitFor([&] { return delivered.load() > 1000; }));
  reg.Unregister();
  unregistered.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.store(true);
  injector.join();
  ASSERT_TRUE(WaitFor([&] { return delivered.load() + orphans.count.load() == injected.load(); }));
  EXPECT_EQ(late.load(), 0u);
  loop.Stop();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// Shutdown from another thread while the reactor runs: what the shard had polled is still
// delivered by the engine's next PollShard calls, which then return 0 for good; nothing is lost.
TEST(EngineShard, ShutdownLosesNothing) {
  OrphanLedger orphans;
  RuntimeOptions options = EngineOptions(1);
  options.orphan_handler = &orphans;
  options.poll_batch = 128;
  options.consumers[0].dispatch_batch = 1;  // a step dispatches 4 of the 100 it polls
  OneQp one;
  CQD_ASSERT_OK(one.Build(options));
  Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 500));
  // Polled, not yet all dispatched.
  ASSERT_GT(one.rt->PollShard(0, 100), 0);
  std::thread shutdown([&] { CQD_ASSERT_OK(one.rt->Shutdown()); });
  shutdown.join();
  int rounds = 0;
  while (one.rt->PollShard(0, 64) > 0) ++rounds;
  EXPECT_EQ(one.rt->PollShard(0, 64), 0);
  EXPECT_EQ(one.rt->TrySleepShard(0), 1);
  const uint64_t polled = one.rt->GetStats().pollers[0].completions;
  EXPECT_EQ(handler.received() + orphans.count.load(), polled);
  EXPECT_EQ(handler.out_of_order(), 0u);
  EXPECT_EQ(polled, 100u);
  EXPECT_EQ(handler.received(), 100u);
  EXPECT_GT(rounds, 0);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
}

// Driving a shard from inside a cqd callback would nest one poller's pass in another's batch:
// PollShard and TrySleepShard are refused there (-EBUSY), from a run-to-completion handler of any
// shard, an owned consumer's handler and an OrphanHandler; control calls from the same handler
// still finish.
TEST(EngineShard, DrivingAShardFromACallbackIsRefused) {
  struct Orphans : OrphanHandler {
    Runtime* rt = nullptr;
    std::atomic<int> refused{0};
    std::atomic<int> calls{0};
    void OnOrphans(std::span<const ibv_wc>) noexcept override {
      calls.fetch_add(1);
      if (rt->PollShard(0, 4) == -EBUSY && rt->TrySleepShard(1) == -EBUSY) refused.fetch_add(1);
    }
  } orphans;
  RuntimeOptions options = EngineOptions(2, /*owned=*/true);
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  orphans.rt = rt.get();
  CQD_ASSERT_OK(bed.AddDevice());
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle cq0 = rt->CreateCq(dev, 0).value();
  struct Handler : QpHandler {
    Runtime* rt;
    DeviceId dev;
    std::atomic<int> refused{0};
    std::atomic<int> made{0};
    std::vector<CqHandle> cqs;
    void OnCompletions(std::span<const ibv_wc>) noexcept override {
      if (rt->PollShard(1, 16) == -EBUSY && rt->TrySleepShard(1) == -EBUSY &&
          rt->PollShard(0, 16) == -EBUSY && rt->TrySleepShard(0) == -EBUSY) {
        refused.fetch_add(1);
      }
      auto cq = rt->CreateCq(dev, 0);  // needs this very shard
      if (cq.ok()) {
        cqs.push_back(*cq);
        made.fetch_add(1);
      }
    }
  } rtc, owned;
  rtc.rt = owned.rt = rt.get();
  rtc.dev = owned.dev = dev;
  SimQp* qa = sim->CreateQp(cq0.sim(), cq0.sim()).value();
  SimQp* qb = sim->CreateQp(cq0.sim(), cq0.sim()).value();
  Registration ra = rt->RegisterQp(*qa, rtc, 0).value();    // run to completion on shard 0
  Registration rb = rt->RegisterQp(*qb, owned, 2).value();  // the owned consumer
  ASSERT_TRUE(InjectRecvs(qa, 0, 1));
  ASSERT_TRUE(InjectRecvs(qb, 0, 1));
  ASSERT_TRUE(WaitFor([&] {
    rt->PollShard(0, 16);
    return rtc.made.load() == 1 && owned.made.load() == 1;
  }));
  EXPECT_EQ(rtc.refused.load(), 1);
  EXPECT_EQ(owned.refused.load(), 1);
  rb.Unregister();
  ASSERT_TRUE(InjectRecvs(qb, 1, 1));  // no registration: an orphan, inside PollShard
  ASSERT_TRUE(WaitFor([&] {
    rt->PollShard(0, 16);
    return orphans.calls.load() == 1;
  }));
  EXPECT_EQ(orphans.refused.load(), 1);
  ra.Unregister();
  for (CqHandle cq : rtc.cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
  for (CqHandle cq : owned.cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
  CQD_ASSERT_OK(sim->DestroyQp(qa));
  CQD_ASSERT_OK(sim->DestroyQp(qb));
  CQD_ASSERT_OK(rt->DestroyCq(cq0));
}

// The same refusal from the two callbacks that run on no poller: TeardownOptions::on_done (on the
// runtime's teardown thread, which would otherwise run the shard's pass and its run-to-completion
// handlers, or become the shard's sleeper) and the log sink (which may run under the runtime's
// mutex). The shard's work stays for its engine, which delivers it afterwards.
TEST(EngineShard, DrivingAShardFromOnDoneOrTheLogSinkIsRefused) {
  std::atomic<Runtime*> sink_rt{nullptr};
  std::atomic<int> sink_calls{0};
  std::atomic<int> sink_refused{0};
  RuntimeOptions options = EngineOptions(1);
  options.log = [&](LogLevel, std::string_view) {
    Runtime* rt = sink_rt.load();
    if (rt == nullptr) return;
    sink_calls.fetch_add(1);
    if (rt->PollShard(0, 16) == -EBUSY && rt->TrySleepShard(0) == -EBUSY) sink_refused.fetch_add(1);
  };
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  sink_rt.store(rt.get());
  CQD_ASSERT_OK(bed.AddDevice());  // logs that the device was added
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  sink_rt.store(nullptr);
  EXPECT_GT(sink_calls.load(), 0);
  EXPECT_EQ(sink_refused.load(), sink_calls.load());

  CqHandle cq = rt->CreateCq(dev, 0).value();
  SimQp* qa = sim->CreateQp(cq.sim(), cq.sim()).value();
  SimQp* qb = sim->CreateQp(cq.sim(), cq.sim()).value();
  Recorder ha, hb;
  ha.qp_num = qa->qp_num();
  hb.qp_num = qb->qp_num();
  Registration ra = rt->RegisterQp(*qa, ha, 0).value();
  Registration rb = rt->RegisterQp(*qb, hb, 0).value();
  ASSERT_TRUE(InjectRecvs(qb, 0, 3));  // waiting for the shard's engine: this thread
  std::atomic<int> poll_result{1}, sleep_result{1};
  std::atomic<bool> done{false};
  TeardownOptions teardown;
  teardown.timeout = std::chrono::milliseconds(20);
  teardown.on_done = [&](const Status&) {
    poll_result.store(rt->PollShard(0, 16));
    sleep_result.store(rt->TrySleepShard(0));
    done.store(true);
  };
  auto td = rt->TeardownQp(ra, teardown);
  ASSERT_TRUE(td.ok()) << td.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return done.load(); }));  // the deadline ends it: nobody polls
  EXPECT_EQ(poll_result.load(), -EBUSY);
  EXPECT_EQ(sleep_result.load(), -EBUSY);
  EXPECT_EQ(hb.received(), 0u);  // nothing ran on the teardown thread
  // The engine drives the shard as before: qb's completions come here, in order.
  ASSERT_TRUE(WaitFor([&] {
    rt->PollShard(0, 16);
    return hb.received() == 3;
  }));
  EXPECT_EQ(hb.calls_off(std::this_thread::get_id()), 0u);
  EXPECT_EQ(hb.out_of_order(), 0u);
  EXPECT_EQ(hb.wrong_qp(), 0u);
  rb.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qa));
  CQD_ASSERT_OK(sim->DestroyQp(qb));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// One thread sleeps on a shard at a time: another thread's PollShard or TrySleepShard while it
// sleeps wakes it (its fd becomes readable) and returns 0, and takes nothing the sleeper relies
// on; the sleeper's next PollShard reads the fd and the protocol starts afresh.
TEST(EngineShard, AnotherThreadsCallWakesTheSleeper) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  const int fd = one.rt->ShardFd(0).value();
  auto readable = [&](int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1;
  };
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(one.rt->TrySleepShard(0), 1);  // this thread sleeps on the shard
    ASSERT_FALSE(readable(0));
    int other = -1;
    std::thread([&] {
      other = round == 0 ? one.rt->PollShard(0, 64) : one.rt->TrySleepShard(0);
    }).join();
    EXPECT_EQ(other, 0) << round;
    EXPECT_TRUE(readable(0)) << "the sleeper was not woken, round " << round;
    EXPECT_EQ(one.rt->PollShard(0, 64), 0);
    EXPECT_FALSE(readable(0)) << "PollShard did not read the wake, round " << round;
  }
  // The protocol goes on as before: sleep, a completion wakes the fd, the poll delivers it.
  ASSERT_EQ(one.rt->TrySleepShard(0), 1);
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 1));
  ASSERT_TRUE(readable(30000));
  while (one.rt->PollShard(0, 64) > 0) {
  }
  EXPECT_EQ(handler.completions(), 1u);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// Edge-triggered: once the fd reported a wake, asking to sleep again (before polling) says poll
// again, since the edge is spent.
TEST(EngineShard, AskingAgainAfterAWakeSaysPollAgain) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.fd = one.rt->ShardFd(0).value();
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, ev.data.fd, &ev), 0);
  epoll_event out[1];
  ASSERT_EQ(one.rt->TrySleepShard(0), 1);
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 1));
  ASSERT_EQ(epoll_wait(ep, out, 1, 30000), 1);
  EXPECT_EQ(one.rt->TrySleepShard(0), 0);
  while (one.rt->PollShard(0, 64) > 0) {
  }
  EXPECT_EQ(handler.completions(), 1u);
  ASSERT_EQ(one.rt->TrySleepShard(0), 1);  // and the next round has an edge again
  ASSERT_TRUE(InjectRecvs(one.qp, 1, 1));
  ASSERT_EQ(epoll_wait(ep, out, 1, 30000), 1);
  while (one.rt->PollShard(0, 64) > 0) {
  }
  EXPECT_EQ(handler.completions(), 2u);
  close(ep);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// A consumer the shard feeds is full: the shard may still sleep without bound (1), since the
// consumer's next batch makes the fd readable (it was 2, a 1 ms nap, on 13847e6: an engine-driven
// shard behind a stuck consumer crawled at one completion per nap).
TEST(EngineShard, AConsumerThatFreesRoomWakesTheShard) {
  RuntimeOptions options = EngineOptions(1);
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  options.consumers[0].queue_capacity = 1;
  options.consumers[0].spill_capacity = 1;
  OneQp one;
  CQD_ASSERT_OK(one.Build(options));
  Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  ASSERT_TRUE(InjectRecvs(one.qp, 0, 5));
  while (one.rt->PollShard(0, 64) > 0) {
  }
  const int fd = one.rt->ShardFd(0).value();
  auto readable = [&] {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
  };
  EXPECT_EQ(one.rt->TrySleepShard(0), 1);  // the queue and the spill are full: sleep
  EXPECT_FALSE(readable());
  EXPECT_GT(one.rt->Drain(0, 1), 0);  // frees room
  EXPECT_TRUE(readable()) << "the consumer freed room and the shard was not woken";
  ASSERT_TRUE(WaitFor([&] {
    one.rt->Drain(0, 64);
    one.rt->PollShard(0, 64);
    return handler.received() == 5;
  }));
  EXPECT_EQ(handler.out_of_order(), 0u);
  EXPECT_EQ(one.rt->TrySleepShard(0), 1);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

// The sleep check must not sleep on an event it made placeable itself. Consumer C's event E waits
// for the catch-up of CQ Q, which consumer Y's full spill holds back; consumer W's event E2 waits
// for room in W's lane (W is never drained). Y is drained with no sleep in between, so it owes
// the shard no wake. In the sleep check, E2's catch-up polls W's CQ, and its flush hands Y's whole
// spill over: E can now be placed, and nothing else will wake the shard (C is idle, Y was never
// asked for room, W is stuck). TrySleepShard must say "poll again", or the fd must be readable.
TEST(EngineShard, ASleepCheckWhoseCatchUpFreedRoomDoesNotSleepOnTheEvent) {
  RuntimeOptions options = EngineOptions(1);
  options.consumers.assign(3, ConsumerOptions{});  // C, Y, W: engine-driven, drained by the test
  for (ConsumerOptions& c : options.consumers) {
    c.kind = ConsumerKind::kEngineDriven;
    c.queue_capacity = 2;
    c.spill_capacity = 2;
  }
  constexpr ConsumerId kC = 0, kY = 1, kW = 2;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.Start(options));
  CqHandle q = bed.Cq(0);   // C's and Y's QPs
  CqHandle q2 = bed.Cq(0);  // W's QPs
  SimQp* qp_c = bed.Qp(q);
  SimQp* qp_y = bed.Qp(q);
  SimQp* qp_w = bed.Qp(q2);
  SimQp* qp_w2 = bed.Qp(q2);
  Recorder c_handler, y_handler, w_handler, w2_handler;
  Registration reg_c = bed.rt->RegisterQp(*qp_c, c_handler, kC).value();
  Registration reg_y = bed.rt->RegisterQp(*qp_y, y_handler, kY).value();
  Registration reg_w = bed.rt->RegisterQp(*qp_w, w_handler, kW).value();
  Registration reg_w2 = bed.rt->RegisterQp(*qp_w2, w2_handler, kW).value();
  auto poll_out = [&] {
    while (bed.rt->PollShard(0, 64) > 0) {
    }
  };
  auto spill = [&](ConsumerId c) { return bed.rt->GetStats().consumers[c].spill_depth; };

  // Y's queue and spill full: Q is not polled, so C's event waits for its catch-up.
  ASSERT_TRUE(InjectRecvs(qp_y, 0, 4));
  poll_out();
  ASSERT_EQ(spill(kY), 2u);
  // W's queue and spill full, with W2's completions: E2 waits for room in W's lane.
  ASSERT_TRUE(InjectRecvs(qp_w2, 0, 4));
  poll_out();
  ASSERT_EQ(spill(kW), 2u);
  CQD_ASSERT_OK(bed.sim->RaiseQpEvent(qp_c, IBV_EVENT_COMM_EST));
  CQD_ASSERT_OK(bed.sim->RaiseQpEvent(qp_w, IBV_EVENT_COMM_EST));
  ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().async_events >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // read, then posted
  poll_out();
  // W2 goes: its entries leave W's spill (room for E2's catch-up), W's queue stays full.
  reg_w2.Unregister();
  ASSERT_EQ(spill(kW), 0u);
  ASSERT_TRUE(InjectRecvs(qp_w, 0, 2));  // what E2's catch-up will poll, filling W's spill
  // Y's queue is drained without a sleep in between: Y owes the shard no wake.
  while (bed.rt->Drain(kY, 64) > 0) {
  }
  ASSERT_EQ(spill(kY), 2u);

  const int fd = bed.rt->ShardFd(0).value();
  auto readable_within = [&](int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN) != 0;
  };
  // The engine's loop, as the protocol has it (asking to sleep right after work is allowed):
  // sleep on the fd when TrySleepShard allows it, then poll while there is work. C's event must
  // arrive.
  ASSERT_TRUE(WaitFor([&] {
    if (bed.rt->TrySleepShard(0) == 1) {
      EXPECT_TRUE(readable_within(3000))
          << "the shard was allowed to sleep with C's event placeable, and nothing woke it";
    }
    while (bed.rt->PollShard(0, 64) > 0) {
    }
    bed.rt->Drain(kC, 64);
    bed.rt->Drain(kY, 64);
    return c_handler.events() == 1;
  }));
  EXPECT_EQ(y_handler.completions(), 4u);
  reg_c.Unregister();
  reg_y.Unregister();
  reg_w.Unregister();
}

// Two threads calling PollShard on one shard at once: one drives, the other gets 0; handlers
// never run on two threads at once, and everything arrives once, in order.
TEST(EngineShard, ConcurrentPollersOfOneShardTakeTurns) {
  OneQp one;
  CQD_ASSERT_OK(one.Build(EngineOptions(1)));
  Recorder handler;
  handler.qp_num = one.qp->qp_num();
  Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
  constexpr int kTotal = 20000;
  std::atomic<bool> stop{false};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 2; ++t) {
    pollers.emplace_back([&] {
      while (!stop.load()) one.rt->PollShard(0, 16);
    });
  }
  for (int k = 0; k < kTotal; ++k) {
    while (one.qp->Complete(k) != 1) std::this_thread::yield();
  }
  ASSERT_TRUE(WaitFor([&] { return handler.received() == kTotal; }));
  stop.store(true);
  for (auto& t : pollers) t.join();
  EXPECT_EQ(handler.out_of_order(), 0u);
  EXPECT_EQ(handler.concurrent_calls(), 0u);
  reg.Unregister();
  CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
  CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
}

}  // namespace
}  // namespace cqd

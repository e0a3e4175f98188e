// SPDX-License-Identifier: BSD-2-Clause
// ArenaConsumers (cqd/tbb.h) on the simulated device: engine-driven consumers drained by tasks of
// a task_arena, with the watcher thread and with the engine's own epoll loop calling OnReadable;
// exactly once and in order per QP, at most one drainer per consumer at a time, handlers on arena
// threads, the linger (no wake lost with none, the default or the longest; a lingering task holds
// no other consumer back for good; only a drain that emptied its consumer lingers), Stop leaving
// the rest to the engine, Drain from a handler, refused Stop, the NUMA constraints helper, and bad
// input.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/tbb.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::WaitFor;

::tbb::global_control& Parallelism() {
  static ::tbb::global_control control(::tbb::global_control::max_allowed_parallelism, 8);
  return control;
}

// Counts calls that overlap another call of a handler of the same consumer.
struct DrainerGuard {
  std::atomic<int> inside{0};
  std::atomic<uint64_t> overlaps{0};
  std::atomic<uint64_t> off_arena{0};  // calls on a thread outside any arena
};

class GuardedHandler : public Recorder {
 public:
  explicit GuardedHandler(DrainerGuard* guard) : guard_(guard) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (guard_->inside.fetch_add(1, std::memory_order_acq_rel) != 0) {
      guard_->overlaps.fetch_add(1, std::memory_order_relaxed);
    }
    if (::tbb::this_task_arena::current_thread_index() == ::tbb::task_arena::not_initialized) {
      guard_->off_arena.fetch_add(1, std::memory_order_relaxed);
    }
    Recorder::OnCompletions(wcs);
    std::this_thread::yield();  // widen the window a second drainer would need
    guard_->inside.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  DrainerGuard* guard_;
};

// `engine` engine-driven consumers (0..engine-1) and one owned consumer after them.
struct Bed : testing::Bed {
  std::vector<CqHandle> cqs;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<DrainerGuard>> guards;
  std::vector<std::unique_ptr<GuardedHandler>> handlers;
  std::vector<Registration> regs;

  // `dispatch_batch`: the engine-driven consumers' (most entries one Drain call takes).
  Status Build(int engine, int num_cqs, int num_qps, int dispatch_batch = 64) {
    (void)Parallelism();
    RuntimeOptions options;
    options.pollers = 2;
    options.consumers.assign(engine + 1, ConsumerOptions{});
    for (int i = 0; i < engine; ++i) {
      options.consumers[i].kind = ConsumerKind::kEngineDriven;
      options.consumers[i].dispatch_batch = dispatch_batch;
    }
    if (Status s = Start(options); !s.ok()) return s;
    for (int i = 0; i < num_cqs; ++i) {
      auto cq = rt->CreateCq(dev, i % 2);
      if (!cq.ok()) return cq.status();
      cqs.push_back(*cq);
    }
    for (int i = 0; i < engine; ++i) guards.push_back(std::make_unique<DrainerGuard>());
    for (int i = 0; i < num_qps; ++i) {
      auto qp = sim->CreateQp(cqs[i % num_cqs].sim(), cqs[i % num_cqs].sim());
      if (!qp.ok()) return qp.status();
      qps.push_back(*qp);
      handlers.push_back(std::make_unique<GuardedHandler>(guards[i % engine].get()));
      handlers.back()->qp_num = (*qp)->qp_num();
      auto reg = rt->RegisterQp(**qp, *handlers.back(), static_cast<ConsumerId>(i % engine));
      if (!reg.ok()) return reg.status();
      regs.push_back(std::move(reg).value());
    }
    return Status::Ok();
  }
  uint64_t received() const {
    uint64_t n = 0;
    for (const auto& h : handlers) n += h->received();
    return n;
  }
  // `all_on_arena`: every call ran on an arena thread (false once the engine drained itself).
  void Check(uint64_t per_qp, bool all_on_arena = true) const {
    for (const auto& h : handlers) {
      EXPECT_EQ(h->received(), per_qp);
      EXPECT_EQ(h->out_of_order(), 0u);
      EXPECT_EQ(h->wrong_qp(), 0u);
      EXPECT_EQ(h->concurrent_calls(), 0u);
    }
    for (const auto& g : guards) {
      EXPECT_EQ(g->overlaps.load(), 0u);  // at most one drainer per consumer at a time
      if (all_on_arena) {
        EXPECT_EQ(g->off_arena.load(), 0u);
      }
    }
  }
};

TEST(ArenaConsumers, WatcherDrainsEveryConsumerExactlyOnceInOrder) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/3, /*cqs=*/4, /*qps=*/96));
  ::tbb::task_arena arena(4, 0);
  ArenaConsumersOptions options;
  options.consumers = {0, 1, 2};
  options.drain_budget = 16;  // many re-enqueued tasks
  CQD_ASSERT_OK_AND_ASSIGN(hosted, ArenaConsumers::Create(*bed.rt, arena, options));
  constexpr uint64_t kPerQp = 500;
  SimTrafficSource traffic({.qps = bed.qps, .completions_per_qp = kPerQp, .burst = 4});
  traffic.Start();
  traffic.Join();
  ASSERT_TRUE(WaitFor([&] { return bed.received() == bed.qps.size() * kPerQp; })) << bed.received();
  bed.Check(kPerQp);
  CQD_ASSERT_OK(hosted->Stop());  // waits for the drain task in flight, which counts last
  ArenaStats stats = hosted->GetStats();
  EXPECT_GE(stats.dispatched, bed.qps.size() * kPerQp);
  EXPECT_GT(stats.drain_tasks, 3u);
  EXPECT_EQ(stats.enqueue_failures, 0u);
  CQD_ASSERT_OK(hosted->Stop());  // idempotent
}

// Slow traffic: the consumers go idle and are woken again and again (the lost-wakeup path).
// With every linger: none (each completion needs a new task), the default, and the longest (a
// task mostly still waits on the fd when the next completion comes).
class ArenaLinger : public ::testing::TestWithParam<std::chrono::microseconds> {};

TEST_P(ArenaLinger, NoWakeupIsLostAtLowRate) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/2, /*cqs=*/2, /*qps=*/4));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(
      hosted, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0, 1}, .linger = GetParam()}));
  for (uint64_t k = 0; k < 300; ++k) {
    for (SimQp* qp : bed.qps) ASSERT_TRUE(InjectRecvs(qp, k, 1));
    // Each completion is handled before the next is injected: every one needs a fresh wake.
    ASSERT_TRUE(WaitFor([&] { return bed.received() == (k + 1) * bed.qps.size(); }))
        << "completion " << k << ": " << bed.received();
  }
  bed.Check(300);
  CQD_ASSERT_OK(hosted->Stop());
  const ArenaStats stats = hosted->GetStats();
  EXPECT_LE(stats.linger_hits, stats.lingers);
  if (GetParam().count() == 0) {
    EXPECT_EQ(stats.lingers, 0u);
  }
}

// One arena thread, two consumers, the longest linger: a task waiting on one consumer's fd holds
// the other's task back for the linger at most, never for good, and Stop ends a linger in
// progress by waiting it out.
TEST_P(ArenaLinger, ALingeringTaskHoldsNoOtherConsumerBackForGood) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/2, /*cqs=*/2, /*qps=*/2));
  ::tbb::task_arena arena(1, 0);
  CQD_ASSERT_OK_AND_ASSIGN(
      hosted, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0, 1}, .linger = GetParam()}));
  for (uint64_t k = 0; k < 50; ++k) {
    // Consumer 0's QP, then consumer 1's: the second waits behind a task that may be lingering.
    ASSERT_TRUE(InjectRecvs(bed.qps[0], k, 1));
    ASSERT_TRUE(WaitFor([&] { return bed.handlers[0]->received() == k + 1; })) << k;
    ASSERT_TRUE(InjectRecvs(bed.qps[1], k, 1));
    ASSERT_TRUE(WaitFor([&] { return bed.handlers[1]->received() == k + 1; })) << k;
  }
  bed.Check(50);
  if (GetParam().count() > 0) {
    // Each task whose Drain took an entry and found no other task queued lingered.
    ASSERT_TRUE(WaitFor([&] { return hosted->GetStats().lingers > 0; }));
  }
  CQD_ASSERT_OK(hosted->Stop());
  EXPECT_LE(hosted->GetStats().linger_hits, hosted->GetStats().lingers);
}

// A Drain call takes at most the consumer's dispatch_batch (here 1) and leaves the notify fd
// readable while more is queued: the task drains again at once and begins no linger until its
// Drain has emptied the consumer (at most one linger here: it comes last, nothing refills it).
TEST_P(ArenaLinger, OnlyADrainThatEmptiedTheConsumerLingers) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/1, /*cqs=*/1, /*qps=*/1, /*dispatch_batch=*/1));
  constexpr int kCount = 200;
  ASSERT_TRUE(InjectRecvs(bed.qps[0], 0, kCount));
  // Everything handed over to the consumer's queue before any drain task runs.
  ASSERT_TRUE(WaitFor([&] {
    const ConsumerStats s = bed.rt->GetStats().consumers[0];
    return s.queue_depth == kCount && s.spill_depth == 0;
  }));
  ::tbb::task_arena arena(1, 0);
  CQD_ASSERT_OK_AND_ASSIGN(
      hosted, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}, .linger = GetParam()}));
  ASSERT_TRUE(WaitFor([&] { return bed.received() == kCount; })) << bed.received();
  bed.Check(kCount);
  CQD_ASSERT_OK(hosted->Stop());
  const ArenaStats stats = hosted->GetStats();
  EXPECT_EQ(stats.dispatched, static_cast<uint64_t>(kCount));
  EXPECT_LE(stats.lingers, GetParam().count() == 0 ? 0u : 1u);
  EXPECT_EQ(stats.linger_hits, 0u);  // nothing came after the consumer was emptied
}

INSTANTIATE_TEST_SUITE_P(Lingers, ArenaLinger,
                         ::testing::Values(std::chrono::microseconds(0),
                                           ArenaConsumersOptions{}.linger,
                                           std::chrono::microseconds(10000)),
                         [](const ::testing::TestParamInfo<std::chrono::microseconds>& info) {
                           return "us" + std::to_string(info.param.count());
                         });

// The engine's own epoll loop watches the notify fds and calls OnReadable.
TEST(ArenaConsumers, EngineLoopCallsOnReadable) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/2, /*cqs=*/2, /*qps=*/32));
  ::tbb::task_arena arena(3, 0);
  ArenaConsumersOptions options;
  options.consumers = {0, 1};
  options.watcher_thread = false;
  CQD_ASSERT_OK_AND_ASSIGN(hosted, ArenaConsumers::Create(*bed.rt, arena, options));
  int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  int stop = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(stop, 0);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u32 = 1000;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, stop, &ev), 0);
  for (ConsumerId c : {0u, 1u}) {
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = c;
    ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, bed.rt->NotifyFd(c).value(), &ev), 0);
  }
  std::atomic<uint64_t> unknown{0};
  std::thread loop([&] {
    epoll_event events[8];
    for (;;) {
      int n = epoll_wait(ep, events, 8, -1);
      if (n < 0 && errno == EINTR) continue;
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u32 == 1000) return;
        if (!hosted->OnReadable(events[i].data.u32)) unknown.fetch_add(1);
      }
    }
  });
  constexpr uint64_t kPerQp = 400;
  SimTrafficSource traffic({.qps = bed.qps, .completions_per_qp = kPerQp});
  traffic.Start();
  traffic.Join();
  EXPECT_TRUE(WaitFor([&] { return bed.received() == bed.qps.size() * kPerQp; })) << bed.received();
  uint64_t one = 1;
  ASSERT_EQ(write(stop, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  loop.join();
  close(ep);
  close(stop);
  bed.Check(kPerQp);
  EXPECT_EQ(unknown.load(), 0u);
  EXPECT_FALSE(hosted->OnReadable(2));  // the owned consumer is not hosted
  EXPECT_FALSE(hosted->OnReadable(99));
}

// After Stop nothing is drained by the arena: the work stays for the engine's own Drain.
TEST(ArenaConsumers, StopLeavesTheRestToTheEngine) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/1, /*cqs=*/1, /*qps=*/2));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(hosted, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}}));
  for (SimQp* qp : bed.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 10));
  ASSERT_TRUE(WaitFor([&] { return bed.received() == 20; }));
  CQD_ASSERT_OK(hosted->Stop());
  const uint64_t tasks = hosted->GetStats().drain_tasks;
  for (SimQp* qp : bed.qps) ASSERT_TRUE(InjectRecvs(qp, 10, 10));
  EXPECT_TRUE(hosted->OnReadable(0));  // hosted, but stopped: schedules nothing
  int drained = 0;
  ASSERT_TRUE(WaitFor([&] {
    int n = bed.rt->Drain(0, 1024);
    if (n > 0) drained += n;
    return bed.received() == 40;
  }));
  EXPECT_EQ(drained, 20);  // the engine, not the arena, delivered them
  EXPECT_EQ(hosted->GetStats().drain_tasks, tasks);
  bed.Check(20, /*all_on_arena=*/false);
}

// A handler: Drain of its own consumer is -EBUSY, Stop is refused, both without harm.
class ReentrantHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (done.load()) return;
    drain_result = rt->Drain(0, 16);
    stop_status = hosted->Stop();
    seen = wcs.size();
    done.store(true);
  }
  Runtime* rt = nullptr;
  ArenaConsumers* hosted = nullptr;
  int drain_result = 0;
  size_t seen = 0;
  Status stop_status;
  std::atomic<bool> done{false};
};

TEST(ArenaConsumers, HandlerCallsAreRefusedWhereTheyWouldWaitForThemselves) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/1, /*cqs=*/1, /*qps=*/1));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(hosted, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}}));
  ReentrantHandler handler;
  handler.rt = bed.rt.get();
  handler.hosted = hosted.get();
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.sim->CreateQp(bed.cqs[0].sim(), bed.cqs[0].sim()));
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return handler.done.load(); }));
  EXPECT_EQ(handler.drain_result, -EBUSY);
  EXPECT_EQ(handler.stop_status.code(), StatusCode::kFailedPrecondition);
  // Still running: more completions arrive.
  ASSERT_TRUE(InjectRecvs(bed.qps[0], 0, 5));
  ASSERT_TRUE(WaitFor([&] { return bed.received() == 5; }));
  CQD_ASSERT_OK(hosted->Stop());
}

// Stop waits for drain tasks, whose handlers may wait for other threads (a control call, an
// Unregister of a QP whose consumer is busy): so it is refused from another object's drain task
// and from the runtime's own handlers, not only from its own tasks.
class StopCaller : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc>) noexcept override {
    if (called.exchange(true)) return;
    stop_status = target->Stop();
    done.store(true);
  }
  ArenaConsumers* target = nullptr;
  std::atomic<bool> called{false};
  std::atomic<bool> done{false};
  Status stop_status;
};

TEST(ArenaConsumers, StopFromAnyCallbackIsRefused) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/2, /*cqs=*/1, /*qps=*/2));  // consumer 2 is owned
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(first, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}}));
  CQD_ASSERT_OK_AND_ASSIGN(second, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {1}}));
  StopCaller from_first_task, from_owned;
  from_first_task.target = second.get();
  from_owned.target = first.get();
  CQD_ASSERT_OK_AND_ASSIGN(qp_a, bed.sim->CreateQp(bed.cqs[0].sim(), bed.cqs[0].sim()));
  CQD_ASSERT_OK_AND_ASSIGN(qp_b, bed.sim->CreateQp(bed.cqs[0].sim(), bed.cqs[0].sim()));
  CQD_ASSERT_OK_AND_ASSIGN(reg_a, bed.rt->RegisterQp(*qp_a, from_first_task, 0));
  CQD_ASSERT_OK_AND_ASSIGN(reg_b, bed.rt->RegisterQp(*qp_b, from_owned, 2));
  ASSERT_TRUE(InjectRecvs(qp_a, 0, 1));
  ASSERT_TRUE(InjectRecvs(qp_b, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return from_first_task.done.load() && from_owned.done.load(); }));
  EXPECT_EQ(from_first_task.stop_status.code(), StatusCode::kFailedPrecondition)
      << from_first_task.stop_status.ToString();
  EXPECT_EQ(from_owned.stop_status.code(), StatusCode::kFailedPrecondition)
      << from_owned.stop_status.ToString();
  // Neither object stopped: both consumers are still drained.
  ASSERT_TRUE(InjectRecvs(bed.qps[0], 0, 3));
  ASSERT_TRUE(InjectRecvs(bed.qps[1], 0, 3));
  ASSERT_TRUE(WaitFor([&] { return bed.received() == 6; }));
  CQD_ASSERT_OK(first->Stop());
  CQD_ASSERT_OK(second->Stop());
  bed.Check(3);
}

TEST(ArenaConsumers, ConstraintsForADevice) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/1, /*cqs=*/1, /*qps=*/1));
  CQD_ASSERT_OK_AND_ASSIGN(c, ArenaConstraintsFor(*bed.rt, bed.dev, 3));
  EXPECT_EQ(c.numa_id, -1);  // the simulated device has no NUMA node
  EXPECT_EQ(c.max_concurrency, 3);
  CQD_ASSERT_OK_AND_ASSIGN(automatic, ArenaConstraintsFor(*bed.rt, bed.dev));
  EXPECT_EQ(automatic.max_concurrency, -1);
  ::tbb::task_arena arena(c);  // usable as is
  EXPECT_EQ(arena.max_concurrency(), 3);
  auto missing = ArenaConstraintsFor(*bed.rt, bed.dev + 17);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  auto zero = ArenaConstraintsFor(*bed.rt, bed.dev, 0);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
}

// A stopped object hosts nothing: another may host its consumers (and a runtime made later at a
// destroyed one's address, which tbb.h allows once Stop has returned, is not taken for it).
TEST(ArenaConsumers, AStoppedObjectNoLongerHostsItsConsumers) {
  (void)Parallelism();
  RuntimeOptions options;
  options.consumers.assign(1, ConsumerOptions{});
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  ::tbb::task_arena arena(2, 0);
  auto first = ArenaConsumers::Create(*rt, arena, {.consumers = {0}});
  CQD_ASSERT_OK(first.status());
  auto while_hosted = ArenaConsumers::Create(*rt, arena, {.consumers = {0}});
  EXPECT_EQ(while_hosted.status().code(), StatusCode::kAlreadyExists);
  CQD_ASSERT_OK((*first)->Stop());
  auto second = ArenaConsumers::Create(*rt, arena, {.consumers = {0}});
  CQD_ASSERT_OK(second.status());
  auto strands = StrandConsumer::Create(*rt, arena, {.consumer = 0});
  EXPECT_EQ(strands.status().code(), StatusCode::kAlreadyExists) << "the second hosts it now";
  CQD_ASSERT_OK((*second)->Stop());
  strands = StrandConsumer::Create(*rt, arena, {.consumer = 0});
  CQD_ASSERT_OK(strands.status());
  CQD_ASSERT_OK((*strands)->Stop());
  auto after_strands = ArenaConsumers::Create(*rt, arena, {.consumers = {0}});
  CQD_ASSERT_OK(after_strands.status());
  CQD_ASSERT_OK((*after_strands)->Stop());
}

TEST(ArenaConsumers, BadInput) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*engine=*/2, /*cqs=*/1, /*qps=*/2));
  ::tbb::task_arena arena(2, 0);
  auto owned = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {2}});
  EXPECT_EQ(owned.status().code(), StatusCode::kInvalidArgument) << owned.status().ToString();
  EXPECT_NE(owned.status().message().find("ArenaConsumers::Create"), std::string::npos);
  auto missing = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {9}});
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  auto twice = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0, 0}});
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status().ToString();
  auto none = ArenaConsumers::Create(*bed.rt, arena, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  auto budget = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}, .drain_budget = 0});
  EXPECT_EQ(budget.status().code(), StatusCode::kInvalidArgument);
  for (const auto linger : {std::chrono::microseconds(-1), std::chrono::microseconds(10001)}) {
    auto wrong = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}, .linger = linger});
    EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
    EXPECT_NE(wrong.status().message().find("linger"), std::string::npos);
  }
  CQD_ASSERT_OK_AND_ASSIGN(first, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}}));
  auto again = ArenaConsumers::Create(*bed.rt, arena, {.consumers = {1, 0}});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  // A failed Create hosts nothing: consumer 1 is still free.
  CQD_ASSERT_OK_AND_ASSIGN(second, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {1}}));
  first.reset();  // and a destroyed one gives its consumers back
  CQD_ASSERT_OK_AND_ASSIGN(third, ArenaConsumers::Create(*bed.rt, arena, {.consumers = {0}}));
  for (SimQp* qp : bed.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 3));
  ASSERT_TRUE(WaitFor([&] { return bed.received() == 6; }));
  bed.Check(3);
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// StrandConsumer (cqd/tbb.h) on the simulated device: exactly once and in order per QP under many
// QPs, a blocked QP that does not hold up the others, Unregister from another thread and from the
// QP's own handler, TeardownQp that ends only after the user handler saw every flushed
// completion, events behind completions, Shutdown then Stop with nothing lost, refused waits and
// bad input. Nothing here asserts on time: blocked handlers wait on latches the test opens.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "cqd/tbb.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::FirstCallLatch;
using testing::InjectRecvs;
using testing::OrphanLedger;
using testing::Recorder;
using testing::WaitFor;
using testing::WaitForPollersAsleep;

// TBB starts at most (CPUs - 1) workers unless told otherwise; the tests block some on purpose.
::tbb::global_control& Parallelism() {
  static ::tbb::global_control control(::tbb::global_control::max_allowed_parallelism, 8);
  return control;
}

// A runtime with consumer 0 engine-driven and `cqs` CQs on a simulated device.
struct Bed : testing::Bed {
  std::vector<CqHandle> cqs;

  Status Build(int num_cqs, bool solicited_only = false, int pollers = 1) {
    (void)Parallelism();
    RuntimeOptions options;
    options.pollers = pollers;
    options.consumers.assign(2, ConsumerOptions{});
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
    if (Status s = Start(options); !s.ok()) return s;
    for (int i = 0; i < num_cqs; ++i) {
      CqOptions cq_options;
      cq_options.solicited_only = solicited_only;
      auto cq = rt->CreateCq(dev, i % pollers, cq_options);
      if (!cq.ok()) return cq.status();
      cqs.push_back(*cq);
    }
    return Status::Ok();
  }
  Result<SimQp*> Qp(int i) {
    return sim->CreateQp(cqs[i % cqs.size()].sim(), cqs[i % cqs.size()].sim());
  }
};

uint64_t Delivered(const Runtime& rt, int consumer) {
  return rt.GetStats().consumers[consumer].delivered;
}

TEST(StrandConsumer, ExactlyOnceInOrderPerQpUnderManyQps) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(/*cqs=*/4, false, /*pollers=*/2));
  ::tbb::task_arena arena(4, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  constexpr int kQps = 200;
  constexpr uint64_t kPerQp = 300;
  std::vector<std::unique_ptr<Recorder>> handlers;
  std::vector<StrandRegistration> regs;
  std::vector<SimQp*> qps;
  for (int i = 0; i < kQps; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(i));
    qps.push_back(qp);
    handlers.push_back(std::make_unique<Recorder>());
    handlers.back()->qp_num = qp->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, *handlers.back()));
    EXPECT_EQ(reg.qp_num(), qp->qp_num());
    regs.push_back(std::move(reg));
  }
  SimTrafficSource traffic({.qps = qps, .completions_per_qp = kPerQp, .burst = 8});
  traffic.Start();
  traffic.Join();
  auto total = [&] {
    uint64_t n = 0;
    for (const auto& h : handlers) n += h->received();
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return total() == kQps * kPerQp; })) << total();
  for (const auto& h : handlers) {
    EXPECT_EQ(h->received(), kPerQp);
    EXPECT_EQ(h->out_of_order(), 0u);
    EXPECT_EQ(h->wrong_qp(), 0u);
    EXPECT_EQ(h->concurrent_calls(), 0u);
  }
  CQD_ASSERT_OK(strands->Stop());  // waits for the strand tasks, which count after each call
  StrandStats stats = strands->GetStats();
  EXPECT_EQ(stats.delivered, kQps * kPerQp);
  EXPECT_EQ(stats.orphans, 0u);
  EXPECT_EQ(stats.strands, static_cast<uint64_t>(kQps));
  EXPECT_GT(stats.drain.drain_tasks, 0u);
  EXPECT_EQ(bed.orphans.count.load(), 0u);
  for (auto& r : regs) r.Unregister();
  EXPECT_EQ(strands->GetStats().strands, 0u);
  EXPECT_EQ(bed.rt->GetStats().registrations, 0u);
}

// One QP's handler blocks; the others' completions, queued behind it on the same consumer, all
// reach their handlers while it is still blocked. Then it catches up, in order.
TEST(StrandConsumer, BlockedQpDoesNotHoldUpTheOthers) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(2));
  ::tbb::task_arena arena(3, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  FirstCallLatch slow_latch;  // holds its first call until opened
  Recorder slow;
  slow.before = slow_latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(slow_qp, bed.Qp(0));
  slow.qp_num = slow_qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(slow_reg, strands->RegisterQp(*slow_qp, slow));
  constexpr int kFast = 20;
  constexpr int kPerQp = 100;
  std::vector<std::unique_ptr<Recorder>> fast;
  std::vector<StrandRegistration> regs;
  std::vector<SimQp*> fast_qps;
  for (int i = 0; i < kFast; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(i));
    fast_qps.push_back(qp);
    fast.push_back(std::make_unique<Recorder>());
    fast.back()->qp_num = qp->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, *fast.back()));
    regs.push_back(std::move(reg));
  }
  ASSERT_TRUE(InjectRecvs(slow_qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return slow_latch.entered.load(); }));
  // Interleaved: the slow QP's next completions sit between the fast ones in the same CQs.
  for (int k = 0; k < kPerQp; ++k) {
    ASSERT_TRUE(InjectRecvs(slow_qp, 1 + k, 1));
    for (SimQp* qp : fast_qps) ASSERT_TRUE(InjectRecvs(qp, k, 1));
  }
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& h : fast) {
      if (h->received() != kPerQp) return false;
    }
    return true;
  }));
  EXPECT_EQ(slow.received(), 0u);  // still inside its first call
  EXPECT_EQ(slow_latch.calls.load(), 1u);
  slow_latch.Open();
  ASSERT_TRUE(WaitFor([&] { return slow.received() == kPerQp + 1; }));
  EXPECT_EQ(slow.out_of_order(), 0u);
  EXPECT_EQ(slow.concurrent_calls(), 0u);
  for (const auto& h : fast) EXPECT_EQ(h->out_of_order(), 0u);
}

// Unregister from another thread while the handler is inside a call: it returns only after that
// call, the handler is never called again, and what was queued in the strand is orphaned.
TEST(StrandConsumer, UnregisterFromAnotherThreadWaitsAndOrphansTheQueue) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(2, 0);
  OrphanLedger strand_orphans;
  CQD_ASSERT_OK_AND_ASSIGN(
      strands,
      StrandConsumer::Create(*bed.rt, arena, {.consumer = 0, .orphan_handler = &strand_orphans}));
  FirstCallLatch latch;  // holds its first call until opened
  Recorder handler;
  handler.before = latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  ASSERT_TRUE(InjectRecvs(qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return latch.entered.load(); }));
  ASSERT_TRUE(InjectRecvs(qp, 1, 50));
  ASSERT_TRUE(WaitFor([&] { return Delivered(*bed.rt, 0) == 51; }));  // all in the strand now
  std::atomic<bool> returned{false};
  std::thread unregister([&] {
    reg.Unregister();
    returned.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(returned.load());  // the handler is still inside its call
  EXPECT_EQ(latch.calls.load(), 1u);
  latch.Open();
  unregister.join();
  EXPECT_EQ(latch.calls.load(), 1u);  // never called again
  EXPECT_EQ(handler.received(), 1u);
  EXPECT_EQ(strand_orphans.count.load(), 50u);
  EXPECT_EQ(strands->GetStats().orphans, 50u);
  ASSERT_TRUE(InjectRecvs(qp, 51, 5));  // after Unregister: the runtime's orphans
  ASSERT_TRUE(WaitFor([&] { return bed.orphans.count.load() == 5; }));
  EXPECT_EQ(latch.calls.load(), 1u);
  EXPECT_EQ(strands->GetStats().strands, 0u);
}

// A handler that unregisters its own QP when it sees wr_id 10: no call after that one.
class SelfUnregistering : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (unregistered.load()) calls_after.fetch_add(1);
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id != next) out_of_order.fetch_add(1);
      next = wc.wr_id + 1;
      received.fetch_add(1);
    }
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id == 10) {
        reg->Unregister();
        EXPECT_FALSE(reg->registered());
        unregistered.store(true);
      }
    }
  }
  StrandRegistration* reg = nullptr;
  uint64_t next = 0;
  std::atomic<bool> unregistered{false};
  std::atomic<uint64_t> calls_after{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> out_of_order{0};
};

TEST(StrandConsumer, UnregisterFromItsOwnHandler) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(
      strands,
      StrandConsumer::Create(*bed.rt, arena, {.consumer = 0, .orphan_handler = &bed.orphans}));
  SelfUnregistering handler;
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  handler.reg = &reg;
  ASSERT_TRUE(InjectRecvs(qp, 0, 100));
  // Every completion ends up either with the handler or with an orphan handler (the runtime's for
  // what it still held, the strand's for what was queued in it: the same counter here).
  ASSERT_TRUE(WaitFor([&] {
    return handler.unregistered.load() && handler.received.load() + bed.orphans.count.load() == 100;
  })) << handler.received.load()
      << " + " << bed.orphans.count.load();
  EXPECT_TRUE(handler.unregistered.load());
  EXPECT_EQ(handler.calls_after.load(), 0u);
  EXPECT_EQ(handler.out_of_order.load(), 0u);
  EXPECT_GE(handler.received.load(), 11u);
  EXPECT_FALSE(reg.registered());
}

// TeardownQp: the QP's completions are held in its strand behind a blocked call; the runtime's
// teardown is over once they reached the strand, but the StrandTeardown only once the user
// handler has seen every one of them, flushed ones included.
TEST(StrandConsumer, TeardownEndsOnlyAfterTheUserHandlerSawEverything) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1, /*solicited_only=*/true));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  FirstCallLatch latch;  // holds its first call until opened
  Recorder handler;
  handler.before = latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  ASSERT_TRUE(InjectRecvs(qp, 0, 1, /*solicited=*/true));
  ASSERT_TRUE(WaitFor([&] { return latch.entered.load(); }));
  ASSERT_TRUE(WaitForPollersAsleep(*bed.rt));
  ASSERT_TRUE(InjectRecvs(qp, 1, 20));  // unsolicited: they wait in the CQ
  for (uint64_t i = 21; i < 25; ++i) {  // flushed sends
    ASSERT_EQ(qp->Complete(i, IBV_WC_SEND, IBV_WC_WR_FLUSH_ERR), 1);
  }
  std::atomic<int> on_done_calls{0};
  std::atomic<uint64_t> seen_at_done{0};
  std::promise<Status> done_status;
  TeardownOptions options;
  options.on_done = [&](const Status& s) {
    seen_at_done.store(handler.received());
    if (on_done_calls.fetch_add(1) == 0) done_status.set_value(s);
  };
  CQD_ASSERT_OK_AND_ASSIGN(teardown, strands->TeardownQp(reg, options));
  EXPECT_FALSE(reg.registered());
  // The runtime delivers everything to the strand (its own teardown ends), not to the handler.
  ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().registrations == 0; }));
  EXPECT_FALSE(teardown.done());
  EXPECT_EQ(on_done_calls.load(), 0);
  latch.Open();
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_TRUE(teardown.done());
  EXPECT_EQ(handler.received(), 25u);
  EXPECT_EQ(handler.out_of_order(), 0u);
  CQD_ASSERT_OK(done_status.get_future().get());
  EXPECT_EQ(seen_at_done.load(), 25u);
  EXPECT_EQ(on_done_calls.load(), 1);
  EXPECT_EQ(bed.orphans.count.load(), 0u);
  EXPECT_EQ(strands->GetStats().strands, 0u);
  CQD_ASSERT_OK(bed.sim->DestroyQp(qp));
}

// A teardown of an idle strand ends on the runtime's teardown thread, OK.
TEST(StrandConsumer, TeardownOfAnIdleQp) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  ASSERT_TRUE(InjectRecvs(qp, 0, 10));
  ASSERT_TRUE(WaitFor([&] { return handler.completions() == 10; }));
  CQD_ASSERT_OK_AND_ASSIGN(teardown, strands->TeardownQp(reg));
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_EQ(handler.completions(), 10u);
}

// Async events travel through the strand behind the completions dispatched before them.
// (Raised after each round of 50, so event k comes after at least 50 * k completions.)
TEST(StrandConsumer, EventsAfterTheCompletionsBeforeThem) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(InjectRecvs(qp, round * 50, 50));
    CQD_ASSERT_OK(bed.sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  }
  ASSERT_TRUE(WaitFor([&] { return handler.completions() == 1000 && handler.events() == 20; }));
  const auto log = handler.log();
  uint64_t completions = 0;
  int events = 0;
  for (const auto& e : log) {
    if (e.event) {
      ++events;
      // After every completion injected before it was raised (and maybe some injected later,
      // before the runtime read it).
      EXPECT_GE(completions, static_cast<uint64_t>(events) * 50) << "event " << events;
    } else {
      EXPECT_EQ(e.wr_id, completions);
      ++completions;
    }
  }
  EXPECT_EQ(events, 20);
}

// Runtime::Shutdown, then Stop: everything polled reaches the handlers, including what was held
// in a strand behind a blocked call.
TEST(StrandConsumer, ShutdownThenStopLosesNothing) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(2));
  ::tbb::task_arena arena(3, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  FirstCallLatch blocked_latch;  // holds its first call until opened
  Recorder blocked;
  blocked.before = blocked_latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_qp, bed.Qp(0));
  blocked.qp_num = blocked_qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_reg, strands->RegisterQp(*blocked_qp, blocked));
  std::vector<std::unique_ptr<Recorder>> handlers;
  std::vector<StrandRegistration> regs;
  std::vector<SimQp*> qps;
  for (int i = 0; i < 30; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(i));
    qps.push_back(qp);
    handlers.push_back(std::make_unique<Recorder>());
    handlers.back()->qp_num = qp->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, *handlers.back()));
    regs.push_back(std::move(reg));
  }
  ASSERT_TRUE(InjectRecvs(blocked_qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return blocked_latch.entered.load(); }));
  ASSERT_TRUE(InjectRecvs(blocked_qp, 1, 99));
  SimTrafficSource traffic({.qps = qps, .completions_per_qp = 200});
  traffic.Start();
  traffic.Join();
  ASSERT_TRUE(
      WaitFor([&] { return bed.cqs[0].sim()->size() == 0 && bed.cqs[1].sim()->size() == 0; }));
  CQD_ASSERT_OK(bed.rt->Shutdown());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    blocked_latch.Open();
  });
  CQD_ASSERT_OK(strands->Stop());  // waits for the blocked strand too
  opener.join();
  EXPECT_EQ(blocked.received(), 100u);
  for (const auto& h : handlers) {
    EXPECT_EQ(h->received(), 200u);
    EXPECT_EQ(h->out_of_order(), 0u);
  }
  EXPECT_EQ(strands->GetStats().orphans, 0u);
  EXPECT_EQ(bed.orphans.count.load(), 0u);
  CQD_ASSERT_OK(strands->Stop());  // idempotent
  auto late = strands->RegisterQp(*qps[0], *handlers[0]);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition) << late.status().ToString();
}

// Waits that could wait for themselves are refused on strand threads.
class RefusingHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc>) noexcept override {
    if (called.exchange(true)) return;
    in_callback = Runtime::InCallback();  // a strand task calls it, not the runtime's batch
    wait_status = teardown->Wait();
    stop_status = strands->Stop();
    default_wait = StrandTeardown().Wait();
    done.store(true);
  }
  StrandTeardown* teardown = nullptr;
  StrandConsumer* strands = nullptr;
  std::atomic<bool> called{false};
  std::atomic<bool> done{false};
  bool in_callback = true;
  Status wait_status, stop_status, default_wait;
};

TEST(StrandConsumer, WaitsFromStrandTasksAreRefused) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(3, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  // A teardown that cannot end while `blocked` is inside its first call.
  FirstCallLatch blocked_latch;  // holds its first call until opened
  Recorder blocked;
  blocked.before = blocked_latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_qp, bed.Qp(0));
  blocked.qp_num = blocked_qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_reg, strands->RegisterQp(*blocked_qp, blocked));
  ASSERT_TRUE(InjectRecvs(blocked_qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return blocked_latch.entered.load(); }));
  CQD_ASSERT_OK_AND_ASSIGN(pending, strands->TeardownQp(blocked_reg));
  RefusingHandler handler;
  handler.teardown = &pending;
  handler.strands = strands.get();
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  ASSERT_TRUE(InjectRecvs(qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return handler.done.load(); }));
  EXPECT_EQ(handler.wait_status.code(), StatusCode::kFailedPrecondition)
      << handler.wait_status.ToString();
  EXPECT_EQ(handler.stop_status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(handler.default_wait.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(handler.in_callback) << "runtime.h: a strand's user handler is not InCallback()";
  EXPECT_FALSE(pending.done());
  blocked_latch.Open();
  CQD_ASSERT_OK(pending.Wait());  // on this thread it waits, and then the result stays
  CQD_ASSERT_OK(pending.Wait());
  EXPECT_EQ(StrandTeardown().Wait().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(StrandTeardown().done());
}

// The same waits from the runtime's own callbacks (a handler of an owned consumer, a runtime
// teardown's on_done) are refused too: the strands they wait for may need those threads (a
// strand handler unregistering a QP of that owned consumer waits for its batch).
TEST(StrandConsumer, WaitsFromRuntimeCallbacksAreRefused) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(3, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  FirstCallLatch blocked_latch;  // holds its first call until opened
  Recorder blocked;
  blocked.before = blocked_latch.Hook();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_qp, bed.Qp(0));
  blocked.qp_num = blocked_qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(blocked_reg, strands->RegisterQp(*blocked_qp, blocked));
  ASSERT_TRUE(InjectRecvs(blocked_qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return blocked_latch.entered.load(); }));
  CQD_ASSERT_OK_AND_ASSIGN(pending, strands->TeardownQp(blocked_reg));
  RefusingHandler owned;  // on the runtime's owned consumer 1, not a strand
  owned.teardown = &pending;
  owned.strands = strands.get();
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*qp, owned, 1));
  ASSERT_TRUE(InjectRecvs(qp, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return owned.done.load(); }));
  EXPECT_EQ(owned.wait_status.code(), StatusCode::kFailedPrecondition)
      << owned.wait_status.ToString();
  EXPECT_EQ(owned.stop_status.code(), StatusCode::kFailedPrecondition)
      << owned.stop_status.ToString();
  std::promise<std::pair<Status, Status>> from_on_done;
  TeardownOptions options;
  options.on_done = [&](const Status&) {
    from_on_done.set_value({pending.Wait(), strands->Stop()});
  };
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(reg, options));
  auto got = from_on_done.get_future();
  ASSERT_EQ(got.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto [wait, stop] = got.get();
  EXPECT_EQ(wait.code(), StatusCode::kFailedPrecondition) << wait.ToString();
  EXPECT_EQ(stop.code(), StatusCode::kFailedPrecondition) << stop.ToString();
  CQD_ASSERT_OK(teardown.Wait());
  // Nothing was stopped: the strand still delivers, and the teardown ends on this thread.
  EXPECT_FALSE(pending.done());
  blocked_latch.Open();
  CQD_ASSERT_OK(pending.Wait());
  CQD_ASSERT_OK(strands->Stop());
}

// StrandRegistration::Unregister on a poller (here: the runtime's OrphanHandler) does nothing,
// as Registration::Unregister there, and a StrandRegistration destroyed there hands its strand to
// the StrandConsumer instead of freeing a handler the runtime still calls; the next call of the
// StrandConsumer on another thread unregisters it. (It freed the strand: use after free.)
class UnregisteringOrphans : public OrphanHandler {
 public:
  void OnOrphans(std::span<const ibv_wc>) noexcept override {
    if (fired.exchange(true)) return;
    keep->Unregister();
    still_registered = keep->registered();
    { StrandRegistration dropped = std::move(*drop); }  // destroyed on the poller
    done.store(true, std::memory_order_release);
  }
  StrandRegistration* keep = nullptr;
  StrandRegistration* drop = nullptr;
  std::atomic<bool> fired{false};
  std::atomic<bool> done{false};
  bool still_registered = false;
};

TEST(StrandConsumer, UnregisterOnAPollerDoesNothingAndADropThereIsHandedOver) {
  (void)Parallelism();
  UnregisteringOrphans orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle cq = rt->CreateCq(dev, 0, {}).value();
  ::tbb::task_arena arena(2, 0);
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*rt, arena, {.consumer = 0}));
  Recorder kept_handler, dropped_handler;
  SimQp* kept_qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  SimQp* dropped_qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  SimQp* stranger = sim->CreateQp(cq.sim(), cq.sim()).value();  // never registered
  kept_handler.qp_num = kept_qp->qp_num();
  dropped_handler.qp_num = dropped_qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(kept, strands->RegisterQp(*kept_qp, kept_handler));
  CQD_ASSERT_OK_AND_ASSIGN(dropped, strands->RegisterQp(*dropped_qp, dropped_handler));
  orphans.keep = &kept;
  orphans.drop = &dropped;
  ASSERT_TRUE(InjectRecvs(stranger, 0, 1));  // an orphan: the handler runs on the poller
  ASSERT_TRUE(WaitFor([&] { return orphans.done.load(std::memory_order_acquire); }));
  EXPECT_TRUE(orphans.still_registered);
  EXPECT_TRUE(kept.registered());
  EXPECT_FALSE(dropped.registered());
  EXPECT_EQ(rt->GetStats().registrations, 2u);
  // Both strands still deliver: the runtime still has both registrations.
  ASSERT_TRUE(InjectRecvs(kept_qp, 0, 3));
  ASSERT_TRUE(InjectRecvs(dropped_qp, 0, 3));
  ASSERT_TRUE(
      WaitFor([&] { return kept_handler.received() == 3 && dropped_handler.received() == 3; }));
  // The next StrandConsumer call on this thread unregisters the handed-over strand.
  Recorder third_handler;
  SimQp* third_qp = sim->CreateQp(cq.sim(), cq.sim()).value();
  CQD_ASSERT_OK_AND_ASSIGN(third, strands->RegisterQp(*third_qp, third_handler));
  EXPECT_EQ(rt->GetStats().registrations, 2u);  // kept and third
  ASSERT_TRUE(InjectRecvs(dropped_qp, 3, 2));   // now orphans
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().orphans >= 3; }));
  EXPECT_EQ(dropped_handler.received(), 3u);
  kept.Unregister();
  EXPECT_FALSE(kept.registered());
  third.Unregister();
  CQD_ASSERT_OK(strands->Stop());
  EXPECT_EQ(kept_handler.out_of_order(), 0u);
  EXPECT_EQ(dropped_handler.out_of_order(), 0u);
}

TEST(StrandConsumer, BadInput) {
  Bed bed;
  CQD_ASSERT_OK(bed.Build(1));
  ::tbb::task_arena arena(2, 0);
  auto owned = StrandConsumer::Create(*bed.rt, arena, {.consumer = 1});
  EXPECT_EQ(owned.status().code(), StatusCode::kInvalidArgument) << owned.status().ToString();
  EXPECT_NE(owned.status().message().find("runtime-owned"), std::string::npos);
  auto missing = StrandConsumer::Create(*bed.rt, arena, {.consumer = 7});
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  auto budget = StrandConsumer::Create(*bed.rt, arena, {.consumer = 0, .strand_budget = 0});
  EXPECT_EQ(budget.status().code(), StatusCode::kInvalidArgument);
  auto drain_budget = StrandConsumer::Create(*bed.rt, arena, {.consumer = 0, .drain_budget = -1});
  EXPECT_EQ(drain_budget.status().code(), StatusCode::kInvalidArgument);

  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, {.consumer = 0}));
  auto twice = StrandConsumer::Create(*bed.rt, arena, {.consumer = 0});
  EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists) << twice.status().ToString();
  ArenaConsumersOptions arena_options;
  arena_options.consumers = {0};
  auto hosted = ArenaConsumers::Create(*bed.rt, arena, arena_options);
  EXPECT_EQ(hosted.status().code(), StatusCode::kAlreadyExists);

  Recorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(qp, bed.Qp(0));
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, handler));
  auto again = strands->RegisterQp(*qp, handler);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  auto null_qp = strands->RegisterQp(static_cast<ibv_qp*>(nullptr), handler);
  EXPECT_FALSE(null_qp.ok());
  auto null_id = strands->RegisterQp(static_cast<rdma_cm_id*>(nullptr), handler);
  EXPECT_EQ(null_id.status().code(), StatusCode::kInvalidArgument);
  StrandRegistration none;
  auto no_teardown = strands->TeardownQp(none);
  EXPECT_EQ(no_teardown.status().code(), StatusCode::kInvalidArgument);
  TeardownOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  auto bad_timeout = strands->TeardownQp(reg, zero);
  EXPECT_EQ(bad_timeout.status().code(), StatusCode::kInvalidArgument)
      << bad_timeout.status().ToString();
  EXPECT_TRUE(reg.registered());  // a refused teardown leaves the registration as it was

  // Another StrandConsumer's registration.
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  testing::Bed second;
  CQD_ASSERT_OK(second.CreateRuntime(options));
  CQD_ASSERT_OK_AND_ASSIGN(other, StrandConsumer::Create(*second.rt, arena, {.consumer = 0}));
  auto foreign = other->TeardownQp(reg);
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument) << foreign.status().ToString();
  EXPECT_TRUE(reg.registered());
  reg.Unregister();
  EXPECT_FALSE(reg.registered());
  reg.Unregister();  // idempotent
}

// A handler that counts what it gets, in order, and may drain its own consumer from its strand
// (which tbb.h allows: -EBUSY while a drain task drains it).
class DrainingHandler : public QpHandler {
 public:
  DrainingHandler(Runtime* rt, bool drains) : rt_(rt), drains_(drains) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (inside_.exchange(true)) concurrent.fetch_add(1);
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id < next_) out_of_order.fetch_add(1);
      next_ = wc.wr_id + 1;
    }
    received.fetch_add(wcs.size(), std::memory_order_release);
    if (drains_) (void)rt_->Drain(0, 1);
    inside_.store(false);
  }
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> out_of_order{0};
  std::atomic<uint64_t> concurrent{0};

 private:
  Runtime* const rt_;
  const bool drains_;
  std::atomic<bool> inside_{false};
  uint64_t next_ = 0;
};

RuntimeOptions OneEngineConsumer(int dispatch_batch) {
  RuntimeOptions options;
  options.consumers.assign(1, ConsumerOptions{});
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  options.consumers[0].dispatch_batch = dispatch_batch;
  return options;
}

// Stop after Shutdown delivers everything polled even while a strand's handler drains the
// consumer itself. Stop's own drain loop ended at the -EBUSY that handler's Drain caused, and
// returned OK with most of the consumer's queue undelivered.
TEST(StrandConsumer, StopDeliversEverythingWhileAHandlerDrains) {
  (void)Parallelism();
  for (int run = 0; run < 5; ++run) {
    OrphanLedger orphans;
    RuntimeOptions options = OneEngineConsumer(/*dispatch_batch=*/1);  // many Drain calls
    options.orphan_handler = &orphans;
    testing::Bed bed;
    CQD_ASSERT_OK(bed.StartWithoutLedger(options));
    auto& rt = bed.rt;
    auto& sim = bed.sim;
    const DeviceId dev = bed.dev;
    CqHandle cq = rt->CreateCq(dev, 0, {.depth = 1 << 13}).value();
    SimQp* qa = sim->CreateQp(cq.sim(), cq.sim()).value();
    SimQp* qb = sim->CreateQp(cq.sim(), cq.sim()).value();
    DrainingHandler a(rt.get(), /*drains=*/true);
    DrainingHandler b(rt.get(), /*drains=*/false);
    ::tbb::task_arena arena(4, 0);
    StrandConsumerOptions strand_options;
    strand_options.consumer = 0;
    strand_options.watcher_thread = false;  // nothing drains before Stop: its own loop does it all
    auto strands = StrandConsumer::Create(*rt, arena, strand_options).value();
    StrandRegistration ra = strands->RegisterQp(*qa, a).value();
    StrandRegistration rb = strands->RegisterQp(*qb, b).value();
    constexpr uint64_t kEach = 2000;
    for (uint64_t i = 0; i < kEach; ++i) {
      ASSERT_EQ(qa->Complete(i), 1);
      ASSERT_EQ(qb->Complete(i), 1);
    }
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().pollers[0].completions == 2 * kEach; }));
    CQD_ASSERT_OK(rt->Shutdown());  // everything polled is in consumer 0 now
    CQD_ASSERT_OK(strands->Stop());
    EXPECT_EQ(a.received.load(), kEach) << "run " << run;
    EXPECT_EQ(b.received.load(), kEach) << "run " << run;
    EXPECT_EQ(rt->GetStats().consumers[0].queue_depth, 0u) << "run " << run;
    EXPECT_EQ(a.out_of_order.load() + b.out_of_order.load(), 0u);
    EXPECT_EQ(a.concurrent.load() + b.concurrent.load(), 0u);
    ra.Unregister();
    rb.Unregister();
  }
}

// No wakeup is lost when a strand's handler drains the consumer: a drain task whose Drain got
// -EBUSY cleared the consumer's whole schedule word, a wake that had come meanwhile with it, and
// the edge-triggered watcher got no new edge while the consumer held work (it stayed unarmed).
// Each burst must be delivered; the wait is only there to turn a stall into a failure.
TEST(StrandConsumer, NoWakeupIsLostWhileAHandlerDrains) {
  (void)Parallelism();
  OrphanLedger orphans;
  RuntimeOptions options = OneEngineConsumer(/*dispatch_batch=*/2);
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle cq = rt->CreateCq(dev, 0, {.depth = 1 << 12}).value();
  ::tbb::task_arena arena(4, 0);
  StrandConsumerOptions strand_options;
  strand_options.consumer = 0;
  strand_options.drain_budget = 1;
  auto strands = StrandConsumer::Create(*rt, arena, strand_options).value();
  constexpr int kQps = 8;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<DrainingHandler>> handlers;
  std::vector<StrandRegistration> regs;
  for (int i = 0; i < kQps; ++i) {
    qps.push_back(sim->CreateQp(cq.sim(), cq.sim()).value());
    handlers.push_back(std::make_unique<DrainingHandler>(rt.get(), /*drains=*/i < kQps / 2));
    regs.push_back(strands->RegisterQp(*qps.back(), *handlers.back()).value());
  }
  auto received = [&] {
    uint64_t n = 0;
    for (const auto& h : handlers) n += h->received.load();
    return n;
  };
  uint64_t total = 0;
  for (int round = 0; round < 3000; ++round) {
    // A small burst, then wait for it: the consumer goes idle (arms) between bursts.
    for (int k = 0; k <= round % 7; ++k) {
      SimQp* qp = qps[(round + k) % kQps];
      while (qp->Complete(total) != 1) std::this_thread::yield();
      ++total;
    }
    ASSERT_TRUE(WaitFor([&] { return received() == total; }))
        << "round " << round << ": " << received() << " of " << total << " delivered";
  }
  CQD_ASSERT_OK(rt->Shutdown());
  CQD_ASSERT_OK(strands->Stop());
  for (auto& reg : regs) reg.Unregister();
}

}  // namespace
}  // namespace cqd

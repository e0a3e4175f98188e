// SPDX-License-Identifier: BSD-2-Clause
// Teardowns at their edges, on the simulated device: which threads may wait for one (and that
// the others are refused, not hung), teardowns that end without draining (deadline, device
// failure, Shutdown) and what they leave in the CQs, and teardowns that must not wait on each
// other. Each test below failed (or hung) before the rule in runtime.h, "Waiting for a
// teardown", and the leftovers of poller.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <string_view>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::Bed;
using testing::InjectRecvs;
using testing::OrphanLedger;
using testing::Recorder;
using testing::WaitFor;

// A handler that blocks in its first call until released.
class BlockingHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    inside.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen.fetch_add(wcs.size());
  }
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  std::atomic<uint64_t> seen{0};
};

// Consumer 0 a runtime-owned thread, consumer 1 engine-driven (and, in these tests, not drained
// unless a test says so).
RuntimeOptions OwnedAndEngine() {
  RuntimeOptions options;
  options.consumers.assign(2, ConsumerOptions{});
  options.consumers[1].kind = ConsumerKind::kEngineDriven;
  return options;
}

struct Sim : Bed {
  void Build(RuntimeOptions options) { CQD_ASSERT_OK(Start(options)); }
};

// 1. A run-to-completion handler that waits for the teardown of a QP on its own poller is
// refused (it hung for ever: the markers are polled by the thread that waits), and the teardown
// still drains once the handler returns.
TEST(TeardownWaits, RunToCompletionHandlerOnTheQpsPollerIsRefused) {
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kRunToCompletion;
  options.consumers[0].poller = 0;
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* victim = s.Qp(cq);
  SimQp* actor = s.Qp(cq);
  Recorder victim_handler;
  Recorder actor_handler;  // acts in its first call (OnFirstCall)
  Registration victim_reg = s.rt->RegisterQp(*victim, victim_handler, 0).value();
  std::promise<Status> waited;
  Teardown teardown;
  actor_handler.before = testing::OnFirstCall([&] {
    auto td = s.rt->TeardownQp(victim_reg);
    if (!td.ok()) return waited.set_value(td.status());
    teardown = *td;
    waited.set_value(teardown.Wait());
  });
  Registration actor_reg = s.rt->RegisterQp(*actor, actor_handler, 0).value();
  ASSERT_TRUE(InjectRecvs(victim, 0, 3));
  ASSERT_TRUE(InjectRecvs(actor, 0, 1));
  auto result = waited.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), StatusCode::kFailedPrecondition);
  CQD_ASSERT_OK(teardown.Wait());  // from this thread it drains
  EXPECT_EQ(victim_handler.completions(), 3u);
}

// 2. A run-to-completion handler waiting for the teardown of a QP on another poller would stall
// every control call that needs its poller (they hold the control mutex): it is refused, and a
// control call made meanwhile on another thread finishes.
TEST(TeardownWaits, RunToCompletionHandlerWaitingForAnotherPollerIsRefused) {
  RuntimeOptions options;
  options.pollers = 2;
  options.consumers.assign(2, ConsumerOptions{});
  options.consumers[0].kind = ConsumerKind::kRunToCompletion;
  options.consumers[0].poller = 0;
  options.consumers[1].kind = ConsumerKind::kEngineDriven;  // not drained while the handler runs
  Sim s;
  s.Build(options);
  CqHandle cq0 = s.Cq(0);
  CqHandle cq1 = s.Cq(1);
  SimQp* victim = s.Qp(cq1);
  SimQp* actor = s.Qp(cq0);
  Recorder victim_handler;
  Recorder actor_handler;  // acts in its first call (OnFirstCall)
  Registration victim_reg = s.rt->RegisterQp(*victim, victim_handler, 1).value();
  std::promise<Status> waited;
  std::atomic<bool> control_done{false};
  Teardown teardown;
  actor_handler.before = testing::OnFirstCall([&] {
    TeardownOptions td_options;
    td_options.timeout = std::chrono::hours(1);
    auto td = s.rt->TeardownQp(victim_reg, td_options);
    if (!td.ok()) return waited.set_value(td.status());
    teardown = *td;
    waited.set_value(teardown.Wait());
  });
  Registration actor_reg = s.rt->RegisterQp(*actor, actor_handler, 0).value();
  std::thread control([&] {
    // Needs poller 0 (a CQ of its shard) while the handler may be waiting.
    auto cq = s.rt->CreateCq(s.dev, 0);
    if (cq.ok()) (void)s.rt->DestroyCq(*cq);
    control_done.store(true);
  });
  ASSERT_TRUE(InjectRecvs(actor, 0, 1));
  auto result = waited.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(WaitFor([&] { return control_done.load(); }));
  control.join();
  ASSERT_TRUE(testing::DrainUntil(*s.rt, 1, [&] { return teardown.done(); }));
  CQD_ASSERT_OK(teardown.Wait());
}

// 3. An owned consumer's handler that tears down another consumer's QP and waits for it is
// refused (it deadlocked with the teardown thread when another teardown's marker was in its
// batch); both teardowns then finish OK.
TEST(TeardownWaits, OwnedHandlerWaitIsRefusedAndNothingDeadlocks) {
  RuntimeOptions options;
  options.consumers.assign(2, ConsumerOptions{});  // both runtime-owned threads
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* first = s.Qp(cq);   // consumer 0: its marker shares the actor's batch
  SimQp* second = s.Qp(cq);  // consumer 1
  SimQp* actor = s.Qp(cq);   // consumer 0
  SimQp* holder = s.Qp(cq);  // consumer 1: keeps it busy, so that the second teardown cannot
                             // end (and Wait return its result) before the actor waits
  Recorder first_handler, second_handler;
  Recorder actor_handler;  // acts in its first call (OnFirstCall)
  BlockingHandler holder_handler;
  Registration first_reg = s.rt->RegisterQp(*first, first_handler, 0).value();
  Registration second_reg = s.rt->RegisterQp(*second, second_handler, 1).value();
  Registration actor_reg = s.rt->RegisterQp(*actor, actor_handler, 0).value();
  Registration holder_reg = s.rt->RegisterQp(*holder, holder_handler, 1).value();
  struct Release {  // whatever happens below, before the registrations go
    BlockingHandler& handler;
    ~Release() { handler.release = true; }
  } release_holder{holder_handler};
  ASSERT_TRUE(InjectRecvs(holder, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return holder_handler.inside.load(); }));
  std::promise<Status> waited;
  Teardown second_td;
  actor_handler.before = testing::OnFirstCall([&] {
    auto td = s.rt->TeardownQp(second_reg);
    if (!td.ok()) return waited.set_value(td.status());
    second_td = *td;
    waited.set_value(second_td.Wait());
  });
  ASSERT_TRUE(testing::WaitForPollersAsleep(*s.rt));
  CQD_ASSERT_OK_AND_ASSIGN(first_td, s.rt->TeardownQp(first_reg));
  ASSERT_TRUE(InjectRecvs(actor, 0, 1));  // behind the first QP's marker in the same CQ
  auto result = waited.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), StatusCode::kFailedPrecondition);
  holder_handler.release = true;  // now the second teardown may end
  CQD_ASSERT_OK(first_td.Wait());
  CQD_ASSERT_OK(second_td.Wait());
}

// One stuck teardown does not hold up another's deadline: the first QP's handler is blocked in
// a batch (so its teardown, past its deadline, cannot free the slot yet), and the second QP's
// teardown on another consumer still ends at its own deadline.
TEST(TeardownWaits, AStuckTeardownDoesNotStopAnothersDeadline) {
  Sim s;
  s.Build(OwnedAndEngine());
  CqHandle cq0 = s.Cq(0);
  SimQp* stuck = s.Qp(cq0);
  SimQp* other = s.Qp(cq0);
  BlockingHandler stuck_handler;
  Recorder other_handler;
  Registration stuck_reg = s.rt->RegisterQp(*stuck, stuck_handler, 0).value();
  Registration other_reg = s.rt->RegisterQp(*other, other_handler, 1).value();
  ASSERT_TRUE(InjectRecvs(stuck, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return stuck_handler.inside.load(); }));
  TeardownOptions short_deadline;
  short_deadline.timeout = std::chrono::milliseconds(20);
  CQD_ASSERT_OK_AND_ASSIGN(stuck_td, s.rt->TeardownQp(stuck_reg, short_deadline));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past its deadline: retiring
  CQD_ASSERT_OK_AND_ASSIGN(other_td, s.rt->TeardownQp(other_reg, short_deadline));
  const bool other_ended = WaitFor([&] { return other_td.done(); });
  const bool stuck_ended_early = stuck_td.done();
  stuck_handler.release.store(true);
  EXPECT_TRUE(other_ended) << "the second teardown waited for the first one's consumer";
  EXPECT_FALSE(stuck_ended_early) << "ended while its handler was still running";
  EXPECT_EQ(other_td.Wait().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(stuck_td.Wait().code(), StatusCode::kDeadlineExceeded);
}

// 4. Shutdown ends a pending teardown before it joins the consumers. Here an owned consumer's
// handler waits for an engine thread (the engine's own business), and that thread waits for a
// teardown nobody drains: Shutdown used to join the consumer first and hang; now the teardown
// ends kCancelled, the engine thread lets the handler go, and Shutdown returns.
TEST(TeardownWaits, ShutdownEndsTeardownsBeforeJoiningAnything) {
  Sim s;
  s.Build(OwnedAndEngine());
  CqHandle cq = s.Cq(0);
  SimQp* victim = s.Qp(cq);
  SimQp* actor = s.Qp(cq);
  Recorder victim_handler;
  Recorder actor_handler;  // acts in its first call (OnFirstCall)
  Registration victim_reg = s.rt->RegisterQp(*victim, victim_handler, 1).value();
  Registration actor_reg = s.rt->RegisterQp(*actor, actor_handler, 0).value();
  TeardownOptions forever;
  forever.timeout = std::chrono::hours(1);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(victim_reg, forever));
  std::atomic<bool> engine_done{false};
  std::atomic<bool> handler_blocked{false};
  actor_handler.before = testing::OnFirstCall([&] {
    handler_blocked.store(true);
    while (!engine_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  auto engine = std::async(std::launch::async, [&] {
    Status result = teardown.Wait();
    engine_done.store(true);
    return result;
  });
  ASSERT_TRUE(InjectRecvs(actor, 0, 1));
  ASSERT_TRUE(WaitFor([&] { return handler_blocked.load(); }));
  auto shutdown = std::async(std::launch::async, [&] { return s.rt->Shutdown(); });
  ASSERT_EQ(shutdown.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  CQD_ASSERT_OK(shutdown.get());
  EXPECT_EQ(engine.get().code(), StatusCode::kCancelled);
}

// The thread that drains an engine-driven consumer cannot wait for a teardown of that
// consumer's QP (nothing else delivers the markers): refused. Another thread may. A Drain of
// nothing (max 0) makes its thread the drainer too (before, its Wait ran into the deadline).
TEST(TeardownWaits, TheDrainingThreadIsRefused) {
  for (const int max : {16, 0}) {
    RuntimeOptions options;
    options.consumers[0].kind = ConsumerKind::kEngineDriven;
    Sim s;
    s.Build(options);
    CqHandle cq = s.Cq(0);
    SimQp* qp = s.Qp(cq);
    Recorder handler;
    Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
    EXPECT_EQ(s.rt->Drain(0, max), 0);  // this thread drains consumer 0
    CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg));
    EXPECT_EQ(teardown.Wait().code(), StatusCode::kFailedPrecondition) << "max " << max;
    auto other = std::async(std::launch::async, [&] { return teardown.Wait(); });
    ASSERT_TRUE(testing::DrainUntil(*s.rt, 0, [&] { return teardown.done(); }));
    CQD_ASSERT_OK(other.get());
  }
}

// Every engine thread of the runtime is refused, not only the one draining the QP's consumer:
// here the QP's consumer is an owned thread, but its markers wait behind a full engine-driven
// consumer sharing its CQ, which only the waiting thread would drain (it waited for ever). So is
// the thread driving an engine-driven shard that none of the QP's CQs is on.
TEST(TeardownWaits, EveryEngineThreadOfTheRuntimeIsRefused) {
  {
    RuntimeOptions options = OwnedAndEngine();
    options.consumers[1].queue_capacity = 1;
    options.consumers[1].spill_capacity = 1;
    Sim s;
    s.Build(options);
    CqHandle cq = s.Cq(0, {.depth = 64});
    SimQp* qp = s.Qp(cq);
    SimQp* other = s.Qp(cq);
    Recorder handler;
    Recorder other_handler;
    Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
    Registration other_reg = s.rt->RegisterQp(*other, other_handler, 1).value();
    EXPECT_EQ(s.rt->Drain(1, 16), 0);       // this thread drains consumer 1
    ASSERT_TRUE(InjectRecvs(other, 0, 8));  // more than consumer 1 holds: the CQ is held back
    ASSERT_TRUE(InjectRecvs(qp, 100, 1));   // behind them
    TeardownOptions no_deadline;
    no_deadline.timeout = std::chrono::milliseconds::max();
    CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, no_deadline));
    const Status refused = teardown.Wait();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
    auto waiter = std::async(std::launch::async, [&] { return teardown.Wait(); });
    ASSERT_TRUE(testing::DrainUntil(*s.rt, 1, [&] { return teardown.done(); }));
    CQD_ASSERT_OK(waiter.get());
    EXPECT_EQ(handler.completions(), 1u);
    EXPECT_TRUE(testing::DrainUntil(*s.rt, 1, [&] { return other_handler.completions() == 8; }));
  }
  {
    RuntimeOptions options;
    options.pollers = 2;
    options.engine_shards = {1};
    Sim s;
    s.Build(options);
    CqHandle cq = s.Cq(0);  // on the runtime's own poller
    SimQp* qp = s.Qp(cq);
    BlockingHandler handler;  // holds the teardown back until released
    Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
    ASSERT_TRUE(InjectRecvs(qp, 0, 1));
    ASSERT_TRUE(WaitFor([&] { return handler.inside.load(); }));
    EXPECT_GE(s.rt->PollShard(1, 8), 0);  // this thread drives shard 1
    TeardownOptions no_deadline;
    no_deadline.timeout = std::chrono::milliseconds::max();
    CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, no_deadline));
    const Status refused = teardown.Wait();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
    auto waiter = std::async(std::launch::async, [&] { return teardown.Wait(); });
    handler.release.store(true);
    CQD_ASSERT_OK(waiter.get());
  }
}

// The refusal holds whatever the teardown needs: on a failed device (it ends at once, on the
// teardown thread) the draining thread's Wait is refused too, as runtime.h says.
TEST(TeardownWaits, TheDrainingThreadIsRefusedOnAFailedDeviceToo) {
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* qp = s.Qp(cq);
  Recorder handler;
  Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
  s.sim->RaiseDeviceFatal();
  // This thread drains consumer 0, up to the event (the runtime marked the device failed first).
  ASSERT_TRUE(testing::DrainUntil(*s.rt, 0, [&] { return handler.events() == 1; }));
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kFailedPrecondition);
  auto other = std::async(std::launch::async, [&] { return teardown.Wait(); });
  EXPECT_EQ(other.get().code(), StatusCode::kUnavailable);
}

// Only the thread that drained last is refused: a thread that starts after it exited is not.
TEST(TeardownWaits, ANewThreadIsNotTakenForAnExitedDrainer) {
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* qp = s.Qp(cq);
  Recorder handler;
  Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
  std::thread([&] { s.rt->Drain(0, 16); }).join();
  TeardownOptions short_deadline;
  short_deadline.timeout = std::chrono::milliseconds(50);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, short_deadline));
  Status result;
  std::thread([&] { result = teardown.Wait(); }).join();
  EXPECT_EQ(result.code(), StatusCode::kDeadlineExceeded) << result.ToString();
}

// TeardownOptions::on_done: once per teardown, on the runtime's one teardown thread (never the
// caller's), after the QP was unregistered, with the result Wait returns.
TEST(TeardownWaits, OnDoneRunsOnceOnTheTeardownThreadAfterTheUnregister) {
  Sim s;
  s.Build(RuntimeOptions{});
  CqHandle cq = s.Cq(0);
  SimQp* first = s.Qp(cq);
  SimQp* second = s.Qp(cq);
  Recorder h1, h2;
  Registration r1 = s.rt->RegisterQp(*first, h1, 0).value();
  Registration r2 = s.rt->RegisterQp(*second, h2, 0).value();
  struct Seen {
    std::atomic<int> calls{0};
    std::atomic<bool> recorded{false};  // the fields below are set
    std::thread::id thread;
    uint64_t registrations = 0;
    Status status;
  };
  Seen seen[2];
  for (int i = 0; i < 2; ++i) {
    TeardownOptions options;
    options.on_done = [&s, &seen, i](const Status& status) {
      Seen& mine = seen[i];
      if (mine.calls.fetch_add(1) != 0) return;
      mine.thread = std::this_thread::get_id();
      mine.registrations = s.rt->GetStats().registrations;
      mine.status = status;
      mine.recorded.store(true, std::memory_order_release);
    };
    CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(i == 0 ? r1 : r2, options));
    const Status result = teardown.Wait();
    CQD_ASSERT_OK(result);
    // Wait returns once the result is there; on_done may still be on its way.
    ASSERT_TRUE(testing::WaitFor([&] { return seen[i].recorded.load(std::memory_order_acquire); }));
    EXPECT_EQ(seen[i].status.code(), result.code());
    EXPECT_EQ(seen[i].registrations, 1u - i) << "on_done ran before its QP was unregistered";
    EXPECT_NE(seen[i].thread, std::this_thread::get_id());
  }
  EXPECT_EQ(seen[0].thread, seen[1].thread) << "two teardown threads";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(seen[0].calls.load(), 1);
  EXPECT_EQ(seen[1].calls.load(), 1);
}

// on_done runs on the teardown thread: Shutdown from there is refused with a status (it joined
// that thread from itself), and so is Wait of another teardown.
TEST(TeardownWaits, ShutdownAndWaitFromOnDoneAreRefused) {
  Sim s;
  s.Build(RuntimeOptions{});
  CqHandle cq = s.Cq(0);
  SimQp* first = s.Qp(cq);
  SimQp* second = s.Qp(cq);
  Recorder h1, h2;
  Registration r1 = s.rt->RegisterQp(*first, h1, 0).value();
  Registration r2 = s.rt->RegisterQp(*second, h2, 0).value();
  TeardownOptions slow;
  slow.timeout = std::chrono::hours(1);
  std::promise<std::pair<Status, Status>> from_on_done;
  Teardown pending;
  TeardownOptions options;
  options.on_done = [&](const Status&) {
    from_on_done.set_value({s.rt->Shutdown(), pending.Wait()});
  };
  // The second one may drain first; Wait of a finished teardown is not a wait, so check done().
  CQD_ASSERT_OK_AND_ASSIGN(second_td, s.rt->TeardownQp(r2, slow));
  pending = second_td;
  CQD_ASSERT_OK_AND_ASSIGN(first_td, s.rt->TeardownQp(r1, options));
  auto got = from_on_done.get_future();
  ASSERT_EQ(got.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto [shutdown, wait] = got.get();
  EXPECT_EQ(shutdown.code(), StatusCode::kFailedPrecondition) << shutdown.ToString();
  if (!wait.ok()) {
    EXPECT_EQ(wait.code(), StatusCode::kFailedPrecondition) << wait.ToString();
  }
  CQD_ASSERT_OK(s.rt->Shutdown());
}

// The log sink may run under the runtime mutex (here: AddSimDevice logs the device it added):
// Teardown::Wait, Shutdown and Unregister from it are refused rather than left to hang, and
// GetStats returns.
TEST(TeardownWaits, CallsFromTheLogSinkAreRefused) {
  std::atomic<Runtime*> runtime{nullptr};  // set once `pending` is
  Teardown pending;
  std::atomic<int> sink_checks{0};
  Status wait, shutdown;
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // never drained
  options.log = [&](LogLevel, std::string_view message) {
    Runtime* rt = runtime.load();
    if (rt == nullptr || message.find("added as device") == std::string_view::npos) return;
    wait = pending.Wait();
    shutdown = rt->Shutdown();
    (void)rt->GetStats();
    sink_checks.fetch_add(1);
  };
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* qp = s.Qp(cq);
  Recorder handler;
  Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
  TeardownOptions forever;
  forever.timeout = std::chrono::hours(1);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, forever));
  pending = teardown;
  runtime.store(s.rt.get());
  auto added =
      std::async(std::launch::async, [&] { return s.rt->AddSimDevice(SimDevice::Create()); });
  ASSERT_EQ(added.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(added.get().ok());
  ASSERT_EQ(sink_checks.load(), 1);
  EXPECT_EQ(wait.code(), StatusCode::kFailedPrecondition) << wait.ToString();
  EXPECT_EQ(shutdown.code(), StatusCode::kFailedPrecondition) << shutdown.ToString();
  EXPECT_FALSE(teardown.done());
  runtime.store(nullptr);
  CQD_ASSERT_OK(s.rt->Shutdown());
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kCancelled);
}

// Runtime::InCallback, which layers above the runtime (cqd/tbb.h) use to refuse their own waits,
// is true in each kind of callback, including an OrphanHandler run on the thread that destroys
// the runtime, and false on the engine's threads around them.
class CallbackProbe : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (!Runtime::InCallback()) outside.fetch_add(1);
    seen.fetch_add(wcs.size());
  }
  std::atomic<uint64_t> seen{0};
  std::atomic<int> outside{0};
};
class OrphanProbe : public OrphanHandler {
 public:
  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
    (Runtime::InCallback() ? inside : outside).fetch_add(wcs.size());
  }
  std::atomic<uint64_t> inside{0};
  std::atomic<uint64_t> outside{0};
};

TEST(TeardownWaits, InCallbackIsTrueInEveryCallbackAndOnlyThere) {
  EXPECT_FALSE(Runtime::InCallback());
  OrphanProbe orphans;
  std::atomic<int> sink_outside{0};
  RuntimeOptions options;
  options.consumers.assign(3, ConsumerOptions{});  // owned, engine-driven, run to completion
  options.consumers[1].kind = ConsumerKind::kEngineDriven;
  options.consumers[2].kind = ConsumerKind::kRunToCompletion;
  options.orphan_handler = &orphans;
  options.log = [&](LogLevel, std::string_view) {
    if (!Runtime::InCallback()) sink_outside.fetch_add(1);
  };
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle cq = rt->CreateCq(dev, 0, {}).value();
  CallbackProbe probes[3];
  SimQp* qps[3];
  Registration regs[3];
  for (int c = 0; c < 3; ++c) {
    qps[c] = sim->CreateQp(cq.sim(), cq.sim()).value();
    regs[c] = rt->RegisterQp(*qps[c], probes[c], static_cast<ConsumerId>(c)).value();
    ASSERT_TRUE(InjectRecvs(qps[c], 0, 4));
  }
  ASSERT_TRUE(WaitFor([&] { return probes[0].seen.load() == 4 && probes[2].seen.load() == 4; }));
  ASSERT_TRUE(testing::DrainUntil(*rt, 1, [&] { return probes[1].seen.load() == 4; }));
  EXPECT_FALSE(Runtime::InCallback());  // the engine's thread, after its Drain returned
  std::promise<bool> on_done_inside;
  TeardownOptions teardown_options;
  teardown_options.on_done = [&](const Status&) {
    on_done_inside.set_value(Runtime::InCallback());
  };
  CQD_ASSERT_OK_AND_ASSIGN(teardown, rt->TeardownQp(regs[0], teardown_options));
  auto inside = on_done_inside.get_future();
  ASSERT_EQ(inside.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(inside.get());
  // Completions left in the engine-driven consumer go to the OrphanHandler on this thread, when
  // the QP is unregistered or the runtime destroyed.
  ASSERT_TRUE(InjectRecvs(qps[1], 4, 3));
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().consumers[1].queue_depth == 3; }));
  regs[1].Unregister();
  regs[2].Unregister();
  rt.reset();
  EXPECT_EQ(orphans.inside.load(), 3u);
  EXPECT_EQ(orphans.outside.load(), 0u);
  for (const CallbackProbe& probe : probes) EXPECT_EQ(probe.outside.load(), 0);
  EXPECT_EQ(sink_outside.load(), 0);
  EXPECT_FALSE(Runtime::InCallback());
}

// A CQ held back by a stalled consumer, and a teardown that ends at its deadline while its QP's
// completions and markers are still in it.
struct HeldBack : Bed {
  CqHandle cq;
  SimQp* blocker = nullptr;
  Recorder blocker_handler;
  Registration blocker_reg;

  void Build(int depth) {
    RuntimeOptions options;
    options.consumers.assign(2, ConsumerOptions{});
    options.consumers[0].kind = ConsumerKind::kEngineDriven;  // never drained
    options.consumers[0].queue_capacity = 2;
    options.consumers[0].spill_capacity = 2;
    CQD_ASSERT_OK(Start(options));
    CqOptions cq_options;
    cq_options.depth = depth;
    cq_options.grow = false;
    cq = Cq(0, cq_options);
    blocker = Qp(cq);
    blocker_reg = rt->RegisterQp(*blocker, blocker_handler, 0).value();
    ASSERT_TRUE(InjectRecvs(blocker, 0, 10));  // fills consumer 0's queue and spill
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().consumers[0].spill_depth == 2; }));
  }
};

// 5. The QP's CQ commitment stays while its completions and markers are in the CQ: the guard
// refuses a QP that would overflow the CQ until they have been polled.
TEST(TeardownLeftovers, DeadlineKeepsTheCommitmentUntilTheLeftoversArePolled) {
  HeldBack bed;
  bed.Build(/*depth=*/64);
  SimQpOptions wide;
  wide.max_send_wr = 20;
  wide.max_recv_wr = 20;  // with its two markers, 42 of the 64
  SimQp* old_qp = bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim(), wide).value();
  Recorder old_handler;
  CQD_ASSERT_OK_AND_ASSIGN(old_reg, bed.rt->RegisterQp(*old_qp, old_handler, 0));
  ASSERT_TRUE(InjectRecvs(old_qp, 100, 5));
  TeardownOptions short_deadline;
  short_deadline.timeout = std::chrono::milliseconds(30);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(old_reg, short_deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  // Another number (made while the old QP lives): the guard, not the fence of a reused number,
  // is what refuses it.
  SimQp* new_qp = bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim(), wide).value();
  CQD_ASSERT_OK(bed.sim->DestroyQp(old_qp));
  Recorder new_handler;
  auto refused = bed.rt->RegisterQp(*new_qp, new_handler, 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted)
      << "admitted while the old QP's completions were still in the CQ";
  bed.blocker_reg.Unregister();  // the CQ is polled again: the leftovers come out
  ASSERT_TRUE(WaitFor([&] { return bed.cq.sim()->size() == 0; }));
  Result<Registration> admitted = Status(StatusCode::kInternal, "not tried");
  ASSERT_TRUE(WaitFor([&] {
    admitted = bed.rt->RegisterQp(*new_qp, new_handler, 1);
    return admitted.ok();
  })) << admitted.status().ToString();
  EXPECT_EQ(old_handler.completions(), 0u);
}

// 6. After a teardown ended at its deadline, a new QP that gets the same qp_num on the same CQ
// is refused (UNAVAILABLE) while the old QP's completions are still in the held-back CQ, and,
// once admitted, receives none of them: they go to the orphan handler.
TEST(TeardownLeftovers, ANewQpWithTheNumberGetsNoneOfTheOldCompletions) {
  HeldBack bed;
  bed.Build(/*depth=*/4096);
  SimQp* old_qp = bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()).value();
  Recorder old_handler;
  CQD_ASSERT_OK_AND_ASSIGN(old_reg, bed.rt->RegisterQp(*old_qp, old_handler, 0));
  ASSERT_TRUE(InjectRecvs(old_qp, 100, 3));  // wait in the CQ behind the blocker's
  TeardownOptions short_deadline;
  short_deadline.timeout = std::chrono::milliseconds(30);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(old_reg, short_deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  const uint32_t number = old_qp->qp_num();
  CQD_ASSERT_OK(bed.sim->DestroyQp(old_qp));
  SimQp* new_qp = bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()).value();
  ASSERT_EQ(new_qp->qp_num(), number);
  Recorder new_handler;
  EXPECT_EQ(bed.rt->RegisterQp(*new_qp, new_handler, 1).status().code(), StatusCode::kUnavailable);
  bed.blocker_reg.Unregister();
  ASSERT_TRUE(WaitFor([&] { return bed.cq.sim()->size() == 0; }));
  CQD_ASSERT_OK_AND_ASSIGN(new_reg, bed.rt->RegisterQp(*new_qp, new_handler, 1));
  ASSERT_TRUE(InjectRecvs(new_qp, 0, 2));
  ASSERT_TRUE(WaitFor([&] { return new_handler.completions() == 2; }));
  for (const auto& e : new_handler.log()) {
    EXPECT_LT(e.wr_id, 2u) << "the old QP's completion " << e.wr_id << " reached the new QP";
    EXPECT_EQ(e.status, IBV_WC_SUCCESS) << "a marker reached the new QP";
  }
  std::vector<uint64_t> orphaned = bed.orphans.wr_ids();
  for (uint64_t id : {100u, 101u, 102u}) {
    EXPECT_NE(std::find(orphaned.begin(), orphaned.end(), id), orphaned.end())
        << "old completion " << id << " was not orphaned";
  }
  new_reg.Unregister();
}

// 7. A DEVICE_FATAL ends a teardown that is already waiting: kUnavailable.
TEST(TeardownLeftovers, DeviceFatalEndsAWaitingTeardown) {
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // never drained
  Sim s;
  s.Build(options);
  CqHandle cq = s.Cq(0);
  SimQp* qp = s.Qp(cq);
  Recorder handler;
  Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
  TeardownOptions forever;
  forever.timeout = std::chrono::milliseconds::max();
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, forever));
  s.sim->RaiseDeviceFatal();
  auto result = std::async(std::launch::async, [&] { return teardown.Wait(); });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), StatusCode::kUnavailable);
}

// Overflows `cq` with `n` receive completions of `qp` (more than its depth): the CQ is in error.
void Overflow(CqHandle cq, const SimQp* qp, int n) {
  std::vector<ibv_wc> burst(n);
  for (auto& wc : burst) {
    wc.qp_num = qp->qp_num();
    wc.opcode = IBV_WC_RECV;
  }
  EXPECT_EQ(cq.sim()->Inject(burst, false, /*overflow=*/true), -1);
  ASSERT_TRUE(cq.sim()->failed());
}

// After an overflow (the README says: tear the QPs down), TeardownQp of a QP on the overflowed
// CQ starts (it was always refused: no room for the marker) and ends at its deadline, since
// nothing can come back through a failed CQ.
TEST(TeardownLeftovers, TeardownOnAnOverflowedCqStartsAndEndsAtItsDeadline) {
  Sim s;
  s.Build(RuntimeOptions{});
  CqOptions small;
  small.depth = 8;
  small.grow = false;
  CqHandle cq = s.Cq(0, small);
  SimQp* qp = s.Qp(cq);
  Recorder handler;
  Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
  ASSERT_NO_FATAL_FAILURE(Overflow(cq, qp, 16));
  TeardownOptions short_deadline;
  short_deadline.timeout = std::chrono::milliseconds(50);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, s.rt->TeardownQp(reg, short_deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
}

// A CQ in error (overflowed) is never polled again: a number retired there (a teardown past its
// deadline, or a plain Unregister) registers there again at once, where RegisterQp said
// UNAVAILABLE ("later") for ever, waiting for a catch-up that could not poll.
TEST(TeardownLeftovers, ANumberRetiredOnAnOverflowedCqRegistersThereAgain) {
  for (bool teardown : {true, false}) {
    SCOPED_TRACE(teardown ? "teardown" : "Unregister");
    Sim s;
    s.Build(RuntimeOptions{});
    CqOptions small;
    small.depth = 16;
    small.grow = false;
    CqHandle cq = s.Cq(0, small);
    SimQp* qp = s.Qp(cq, {.max_send_wr = 2, .max_recv_wr = 2});
    Recorder handler;
    Registration reg = s.rt->RegisterQp(*qp, handler, 0).value();
    ASSERT_NO_FATAL_FAILURE(Overflow(cq, qp, 32));
    if (teardown) {
      TeardownOptions short_deadline;
      short_deadline.timeout = std::chrono::milliseconds(50);
      CQD_ASSERT_OK_AND_ASSIGN(td, s.rt->TeardownQp(reg, short_deadline));
      EXPECT_EQ(td.Wait().code(), StatusCode::kDeadlineExceeded);
    } else {
      reg.Unregister();
    }
    const uint32_t number = qp->qp_num();
    CQD_ASSERT_OK(s.sim->DestroyQp(qp));
    SimQp* next = s.Qp(cq, {.max_send_wr = 2, .max_recv_wr = 2});
    ASSERT_EQ(next->qp_num(), number);
    Recorder next_handler;
    Result<Registration> again = s.rt->RegisterQp(*next, next_handler, 0);
    CQD_ASSERT_OK(again.status());
    again->Unregister();
    CQD_ASSERT_OK(s.sim->DestroyQp(next));
    EXPECT_EQ(next_handler.completions(), 0u);
  }
}

}  // namespace
}  // namespace cqd

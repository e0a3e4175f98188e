// SPDX-License-Identifier: BSD-2-Clause
// The oneTBB layer's strands (cqd/tbb.h's StrandConsumer), driven as an engine drives them
// without a watcher thread: its epoll loop reports the consumer's notify fd and calls
// OnReadable. Per QP, completions arrive in order, exactly once, and each async event after the
// completions dispatched before it; one call at a time per QP, each happening-before the next
// (the handlers keep plain, unsynchronized state, which TSan checks); every call on one of the
// arena's threads, never on the engine's. Without a watcher nothing drains until OnReadable, and
// one OnReadable drains everything that was queued.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
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
using testing::WaitFor;

::tbb::global_control& Parallelism() {
  static ::tbb::global_control control(::tbb::global_control::max_allowed_parallelism, 8);
  return control;
}

// What one strand's calls saw, in plain fields: the strand's happens-before order is all that
// keeps two calls on different workers from racing on them.
class StrandLog : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    Enter();
    for (const ibv_wc& wc : wcs) {
      if (wc.qp_num != qp_num || wc.wr_id != next_) ++out_of_order_;
      next_ = wc.wr_id + 1;
    }
    completions_ += wcs.size();
    Leave(wcs.size());
  }
  void OnAsyncEvent(const AsyncEvent&) noexcept override {
    Enter();
    event_after_.push_back(completions_);  // completions delivered before this event
    Leave(0);
  }
  // Call only once `received()` says the calls are over (acquire).
  uint64_t out_of_order() const { return out_of_order_; }
  const std::vector<uint64_t>& event_after() const { return event_after_; }
  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  uint64_t events() const { return events_.load(std::memory_order_acquire); }
  uint64_t overlaps() const { return overlaps_.load(); }
  uint64_t off_arena() const { return off_arena_.load(); }

  uint32_t qp_num = 0;

 private:
  void Enter() {
    if (inside_.exchange(true)) overlaps_.fetch_add(1);
    if (::tbb::this_task_arena::current_thread_index() == ::tbb::task_arena::not_initialized) {
      off_arena_.fetch_add(1);
    }
  }
  void Leave(uint64_t completions) {
    inside_.store(false);
    if (completions == 0) {
      events_.fetch_add(1, std::memory_order_release);
    } else {
      received_.fetch_add(completions, std::memory_order_release);
    }
  }
  uint64_t next_ = 0;
  uint64_t out_of_order_ = 0;
  uint64_t completions_ = 0;
  std::vector<uint64_t> event_after_;
  std::atomic<bool> inside_{false};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> events_{0};
  std::atomic<uint64_t> overlaps_{0};
  std::atomic<uint64_t> off_arena_{0};
};

// The engine's loop: epolls the consumer's notify fd (edge-triggered) and calls OnReadable.
class EngineLoop {
 public:
  EngineLoop(Runtime& rt, StrandConsumer& strands) : strands_(strands) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    added_ = epoll_ctl(ep_, EPOLL_CTL_ADD, rt.NotifyFd(0).value(), &ev) == 0;
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        epoll_event out;
        if (epoll_wait(ep_, &out, 1, 20) == 1) strands_.OnReadable();
      }
    });
  }
  ~EngineLoop() {
    stop_.store(true);
    thread_.join();
    close(ep_);
  }
  bool added() const { return added_; }

 private:
  StrandConsumer& strands_;
  int ep_ = -1;
  bool added_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

RuntimeOptions OneEngineConsumer() {
  RuntimeOptions options;
  options.consumers.assign(1, ConsumerOptions{});
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  options.consumers[0].dispatch_batch = 16;
  return options;
}

TEST(Strands, EachQpInOrderOneCallAtATimeOnArenaThreadsWhenTheEngineReportsTheFd) {
  (void)Parallelism();
  testing::Bed bed;
  CQD_ASSERT_OK(bed.Start(OneEngineConsumer()));
  CqHandle cq = bed.Cq(0, {.depth = 1 << 14});
  ::tbb::task_arena arena(4, 0);
  StrandConsumerOptions options;
  options.consumer = 0;
  options.watcher_thread = false;
  options.drain_budget = 8;   // drain tasks re-enqueue themselves often
  options.strand_budget = 2;  // and so do strand tasks
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, options));
  constexpr int kQps = 12;
  constexpr uint64_t kRounds = 20;
  constexpr uint64_t kPerRound = 25;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<StrandLog>> logs;
  std::vector<StrandRegistration> regs;
  for (int i = 0; i < kQps; ++i) {
    qps.push_back(bed.Qp(cq));
    logs.push_back(std::make_unique<StrandLog>());
    logs.back()->qp_num = qps.back()->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qps.back(), *logs.back()));
    regs.push_back(std::move(reg));
  }
  EngineLoop loop(*bed.rt, *strands);
  ASSERT_TRUE(loop.added());
  // Rounds of completions, each QP's followed by an event once the pollers took them all (so
  // that the event follows every one of them).
  for (uint64_t round = 0; round < kRounds; ++round) {
    for (SimQp* qp : qps) ASSERT_TRUE(InjectRecvs(qp, round * kPerRound, kPerRound));
    const uint64_t polled = (round + 1) * kPerRound * kQps;
    ASSERT_TRUE(WaitFor([&] {
      return testing::SumPollers(bed.rt->GetStats(), &PollerStats::completions) == polled;
    }));
    for (SimQp* qp : qps) CQD_ASSERT_OK(bed.sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  }
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& log : logs) {
      if (log->received() != kRounds * kPerRound || log->events() != kRounds) return false;
    }
    return true;
  }));
  for (const auto& log : logs) {
    SCOPED_TRACE(log->qp_num);
    EXPECT_EQ(log->out_of_order(), 0u);
    EXPECT_EQ(log->overlaps(), 0u);
    EXPECT_EQ(log->off_arena(), 0u) << "a handler ran off the arena (on the engine's thread?)";
    ASSERT_EQ(log->event_after().size(), kRounds);
    for (uint64_t e = 0; e < kRounds; ++e) {
      EXPECT_GE(log->event_after()[e], (e + 1) * kPerRound) << "event " << e;
    }
  }
  CQD_ASSERT_OK(strands->Stop());  // waits for the tasks, which count after their calls
  const StrandStats stats = strands->GetStats();
  EXPECT_EQ(stats.delivered, kQps * kRounds * (kPerRound + 1));  // completions and events
  EXPECT_EQ(stats.orphans, 0u);
  EXPECT_EQ(stats.strands, static_cast<uint64_t>(kQps));
  EXPECT_EQ(bed.orphans.count.load(), 0u);
  regs.clear();
}

TEST(Strands, WithoutAWatcherOneOnReadableDrainsWhatIsQueued) {
  (void)Parallelism();
  testing::Bed bed;
  CQD_ASSERT_OK(bed.Start(OneEngineConsumer()));
  CqHandle cq = bed.Cq(0, {.depth = 1 << 12});
  ::tbb::task_arena arena(2, 0);
  StrandConsumerOptions options;
  options.consumer = 0;
  options.watcher_thread = false;
  options.drain_budget = 4;  // far less than what waits: the drain task must go on by itself
  CQD_ASSERT_OK_AND_ASSIGN(strands, StrandConsumer::Create(*bed.rt, arena, options));
  SimQp* qp = bed.Qp(cq);
  StrandLog log;
  log.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, strands->RegisterQp(*qp, log));
  constexpr uint64_t kTotal = 200;
  ASSERT_TRUE(InjectRecvs(qp, 0, kTotal));
  // Handed to the consumer, and nobody drains it: nobody told the StrandConsumer.
  ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().consumers[0].queue_depth == kTotal; }));
  EXPECT_EQ(log.received(), 0u);
  EXPECT_EQ(strands->GetStats().drain.drain_tasks, 0u);
  EXPECT_TRUE(strands->OnReadable());
  ASSERT_TRUE(WaitFor([&] { return log.received() == kTotal; }))
      << log.received() << " of " << kTotal << " after one OnReadable";
  EXPECT_EQ(log.out_of_order(), 0u);
  EXPECT_EQ(log.off_arena(), 0u);
  EXPECT_EQ(bed.rt->GetStats().consumers[0].queue_depth, 0u);
  CQD_ASSERT_OK(strands->Stop());
  EXPECT_TRUE(strands->OnReadable()) << "after Stop it still says true, and does nothing";
  reg.Unregister();
}

}  // namespace
}  // namespace cqd

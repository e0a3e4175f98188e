// SPDX-License-Identifier: BSD-2-Clause
// The oneTBB consumers (//:cqd_tbb) on real verbs (rxe in the VM): engine-driven consumers
// drained as tasks of an arena (ArenaConsumers), and a strand per QP (StrandConsumer).
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/tbb.h"
#include "tests/fixtures/fixtures.h"
#include "tests/rxe/rxe_fixture.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {
namespace {

using testing::WaitFor;

RuntimeOptions EngineDrivenConsumers(int pollers, int consumers) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.consumers.assign(consumers, ConsumerOptions{});
  for (ConsumerOptions& c : options.consumers) c.kind = ConsumerKind::kEngineDriven;
  return options;
}

// Records what it gets, and whether a call overlapped another on its consumer (`busy`, shared by
// the consumer's QPs) or ran off the arena's threads.
class ArenaRecorder : public WcRecorder {
 public:
  explicit ArenaRecorder(std::atomic<int>* busy = nullptr) : busy_(busy) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (busy_ != nullptr && busy_->fetch_add(1) != 0) overlapped.fetch_add(1);
    if (::tbb::this_task_arena::current_thread_index() < 0) off_arena.fetch_add(1);
    WcRecorder::OnCompletions(wcs);
    if (busy_ != nullptr) busy_->fetch_sub(1);
  }
  std::atomic<int> overlapped{0};
  std::atomic<int> off_arena{0};

 private:
  std::atomic<int>* busy_;
};

// Two engine-driven consumers hosted in a two-thread arena, 8 RC pairs on 2 shards: every
// completion arrives once, in posting order, on an arena thread, one call at a time per
// consumer (at most one drain task each).
TEST_F(Rxe, ArenaConsumersDeliverEveryCompletionInTheArena) {
  ASSERT_NO_FATAL_FAILURE(Start(EngineDrivenConsumers(2, 2)));
  ::tbb::task_arena arena(2);
  ArenaConsumersOptions arena_options;
  arena_options.consumers = {0, 1};
  arena_options.drain_budget = 8;  // drain tasks re-enqueue themselves often
  auto hosted = ArenaConsumers::Create(*rt_, arena, arena_options);
  ASSERT_TRUE(hosted.ok()) << hosted.status().ToString();
  CqHandle cq[2] = {MakeCq(0), MakeCq(1)};
  std::atomic<int> busy[2] = {0, 0};
  constexpr int kPairs = 8, kMsgs = 20;
  std::vector<std::unique_ptr<ArenaRecorder>> handlers;
  std::vector<ibv_qp*> receivers, senders;
  std::vector<Registration> regs;
  for (int i = 0; i < kPairs; ++i) {
    auto a = rxe::CreateRcQp(pd_, cq[i % 2].verbs(), cq[i % 2].verbs(), 128);
    auto b = rxe::CreateRcQp(pd_, cq[(i + 1) % 2].verbs(), cq[(i + 1) % 2].verbs(), 128);
    ASSERT_TRUE(a.ok() && b.ok());
    receivers.push_back(*a);
    senders.push_back(*b);
    CQD_ASSERT_OK(rxe::ConnectLoopback(*a, (*b)->qp_num, gid_index_));
    CQD_ASSERT_OK(rxe::ConnectLoopback(*b, (*a)->qp_num, gid_index_));
    const ConsumerId consumer = i % 2;
    handlers.push_back(std::make_unique<ArenaRecorder>(&busy[consumer]));
    regs.push_back(rt_->RegisterQp(*a, *handlers.back(), consumer).value());
    handlers.push_back(std::make_unique<ArenaRecorder>(&busy[1 - consumer]));
    regs.push_back(rt_->RegisterQp(*b, *handlers.back(), 1 - consumer).value());
  }
  for (int i = 0; i < kPairs; ++i) {
    for (int k = 0; k < kMsgs; ++k) {
      CQD_ASSERT_OK(rxe::PostRecv(receivers[i], k, buffers_, i * 64 + k));
    }
    for (int k = 0; k < kMsgs; ++k) {
      CQD_ASSERT_OK(rxe::PostSend(senders[i], k, buffers_, 600 + k, 64, false));
    }
  }
  ASSERT_TRUE(WaitFor([&] {
    for (auto& h : handlers) {
      if (h->count() < static_cast<size_t>(kMsgs)) return false;
    }
    return true;
  })) << "not every completion arrived";
  for (int i = 0; i < kPairs; ++i) {
    std::vector<ibv_wc> got = handlers[2 * i]->wcs();
    ASSERT_EQ(got.size(), static_cast<size_t>(kMsgs)) << "pair " << i;
    for (int k = 0; k < kMsgs; ++k) {
      EXPECT_EQ(got[k].status, IBV_WC_SUCCESS);
      EXPECT_EQ(got[k].wr_id, static_cast<uint64_t>(k)) << "pair " << i;
      EXPECT_EQ(got[k].qp_num, receivers[i]->qp_num);
    }
    EXPECT_EQ(handlers[2 * i + 1]->count(), static_cast<size_t>(kMsgs));
  }
  for (auto& h : handlers) {
    EXPECT_EQ(h->overlapped.load(), 0);
    EXPECT_EQ(h->off_arena.load(), 0);
  }
  CQD_ASSERT_OK((*hosted)->Stop());
  EXPECT_GT((*hosted)->GetStats().drain_tasks, 0u);
  regs.clear();
  for (ibv_qp* qp : receivers) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_qp* qp : senders) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// A handler that blocks on a latch the test opens.
class BlockingRecorder : public WcRecorder {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    entered.store(true);
    while (!open.load()) std::this_thread::yield();
    WcRecorder::OnCompletions(wcs);
  }
  std::atomic<bool> entered{false};
  std::atomic<bool> open{false};
};

// Strands on rxe: one QP's handler blocks, the other QPs of the same consumer still get all their
// completions; once it opens, it gets its own in order; then a drained teardown through the
// strand consumer returns OK only after its handler saw the flushed receives.
TEST_F(Rxe, StrandsKeepASlowQpToItselfAndDrainTeardowns) {
  static ::tbb::global_control parallelism(::tbb::global_control::max_allowed_parallelism, 4);
  ASSERT_NO_FATAL_FAILURE(Start(EngineDrivenConsumers(1, 1)));
  ::tbb::task_arena arena(3);
  StrandConsumerOptions strand_options;
  strand_options.consumer = 0;
  auto strands = StrandConsumer::Create(*rt_, arena, strand_options);
  ASSERT_TRUE(strands.ok()) << strands.status().ToString();
  CqHandle cq = MakeCq(0);
  constexpr int kFast = 4, kMsgs = 30;
  BlockingRecorder slow;
  std::vector<std::unique_ptr<WcRecorder>> fast;
  std::vector<ibv_qp*> receivers, senders;
  std::vector<StrandRegistration> regs;
  for (int i = 0; i <= kFast; ++i) {
    auto a = rxe::CreateRcQp(pd_, cq.verbs(), cq.verbs(), 128);
    auto b = rxe::CreateRcQp(pd_, cq.verbs(), cq.verbs(), 128);
    ASSERT_TRUE(a.ok() && b.ok());
    receivers.push_back(*a);
    senders.push_back(*b);
    CQD_ASSERT_OK(rxe::ConnectLoopback(*a, (*b)->qp_num, gid_index_));
    CQD_ASSERT_OK(rxe::ConnectLoopback(*b, (*a)->qp_num, gid_index_));
    QpHandler* handler = &slow;
    if (i > 0) {
      fast.push_back(std::make_unique<WcRecorder>());
      handler = fast.back().get();
    }
    auto reg = (*strands)->RegisterQp(*a, *handler);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    regs.push_back(std::move(reg).value());
  }
  // The senders' completions go to a strand of their own each (nobody looks at them).
  std::vector<std::unique_ptr<WcRecorder>> send_handlers;
  for (ibv_qp* b : senders) {
    send_handlers.push_back(std::make_unique<WcRecorder>());
    auto reg = (*strands)->RegisterQp(b, *send_handlers.back());
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    regs.push_back(std::move(reg).value());
  }
  for (int i = 0; i <= kFast; ++i) {
    for (int k = 0; k < kMsgs + 4; ++k) {
      CQD_ASSERT_OK(rxe::PostRecv(receivers[i], k, buffers_, i * 64 + k));
    }
  }
  CQD_ASSERT_OK(rxe::PostSend(senders[0], 0, buffers_, 600, 64, false));
  ASSERT_TRUE(WaitFor([&] { return slow.entered.load(); }));
  for (int i = 0; i <= kFast; ++i) {
    for (int k = (i == 0 ? 1 : 0); k < kMsgs; ++k) {
      CQD_ASSERT_OK(rxe::PostSend(senders[i], k, buffers_, 600 + k, 64, false));
    }
  }
  ASSERT_TRUE(WaitFor([&] {
    for (auto& h : fast) {
      if (h->count() < static_cast<size_t>(kMsgs)) return false;
    }
    return true;
  })) << "a blocked QP held the others back";
  EXPECT_EQ(slow.count(), 0u);  // still blocked in its first call
  slow.open.store(true);
  ASSERT_TRUE(WaitFor([&] { return slow.count() == static_cast<size_t>(kMsgs); }));
  std::vector<ibv_wc> got = slow.wcs();
  for (int k = 0; k < kMsgs; ++k) EXPECT_EQ(got[k].wr_id, static_cast<uint64_t>(k));

  // Four receives are still posted on the slow QP: the teardown flushes them to its handler.
  auto teardown = (*strands)->TeardownQp(regs[0]);
  ASSERT_TRUE(teardown.ok()) << teardown.status().ToString();
  CQD_ASSERT_OK(teardown->Wait());
  got = slow.wcs();
  ASSERT_EQ(got.size(), static_cast<size_t>(kMsgs + 4));
  for (int k = kMsgs; k < kMsgs + 4; ++k) {
    EXPECT_EQ(got[k].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(got[k].wr_id, static_cast<uint64_t>(k));
  }
  regs.clear();
  CQD_ASSERT_OK((*strands)->Stop());
  for (ibv_qp* qp : receivers) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_qp* qp : senders) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

}  // namespace
}  // namespace cqd

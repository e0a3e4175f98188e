// SPDX-License-Identifier: BSD-2-Clause
// Engine-driven shards on real verbs (rxe in the VM): reactor threads drive the shards
// (PollShard, TrySleepShard, epoll on ShardFd) as an SPDK- or Seastar-style engine would, with
// run-to-completion consumers running the handlers inline on them.
#include <thread>

#include "cqd/runtime.h"
#include "tests/fixtures/engine_loop.h"
#include "tests/fixtures/fixtures.h"
#include "tests/rxe/rxe_fixture.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {
namespace {

using testing::EngineLoop;
using testing::WaitFor;

// `shards` engine-driven shards, consumer i running to completion on shard i; with `owned`, one
// more consumer on a thread of the runtime.
RuntimeOptions ReactorOptions(int shards, bool owned = false) {
  RuntimeOptions options;
  options.pollers = shards;
  options.consumers.assign(shards, ConsumerOptions{});
  for (int i = 0; i < shards; ++i) {
    options.engine_shards.push_back(i);
    options.consumers[i].kind = ConsumerKind::kRunToCompletion;
    options.consumers[i].poller = i;
  }
  if (owned) options.consumers.push_back(ConsumerOptions{});
  return options;
}

// SEND/RECV and RDMA WRITE WITH IMM over 6 pairs on 2 reactor shards (and an owned consumer fed
// by them): each handler sees exactly its own completions in posting order, and those on a
// run-to-completion consumer ran on their reactor's thread.
TEST_F(Rxe, ReactorShardsDeliverEveryCompletionOnTheirThread) {
  ASSERT_NO_FATAL_FAILURE(Start(ReactorOptions(2, /*owned=*/true)));
  CqHandle cq[2] = {MakeCq(0), MakeCq(1)};
  EngineLoop loop0(*rt_, 0), loop1(*rt_, 1);
  EngineLoop* loops[2] = {&loop0, &loop1};
  constexpr int kPairs = 6, kMsgs = 20;
  std::vector<Pair*> pairs;
  for (int i = 0; i < kPairs; ++i) {
    const int shard = i % 2;
    const ConsumerId consumer = i < 4 ? shard : 2;
    Pair* p = MakePair(cq[shard], cq[shard], consumer, consumer);
    ASSERT_NE(p, nullptr);
    pairs.push_back(p);
  }
  for (int i = 0; i < kPairs; ++i) {
    const int base = i * 64;
    for (int k = 0; k < 2 * kMsgs; ++k) {
      CQD_ASSERT_OK(rxe::PostRecv(pairs[i]->a, k, buffers_, base + k));
    }
    for (int k = 0; k < kMsgs; ++k) {
      CQD_ASSERT_OK(rxe::PostSend(pairs[i]->b, k, buffers_, 600 + k, 100 + i, false));
      CQD_ASSERT_OK(rxe::PostWriteImm(pairs[i]->b, 1000 + k, buffers_, 600 + k, 200 + i, buffers_,
                                      900 + i, (i << 16) | k));
    }
  }
  ASSERT_TRUE(WaitFor([&] {
    for (Pair* p : pairs) {
      if (p->a_handler.count() < 2 * kMsgs || p->b_handler.count() < 2 * kMsgs) return false;
    }
    return true;
  })) << "not every completion arrived";
  for (int i = 0; i < kPairs; ++i) {
    std::vector<ibv_wc> got = pairs[i]->a_handler.wcs();
    ASSERT_EQ(got.size(), 2u * kMsgs) << "pair " << i;
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].status, IBV_WC_SUCCESS) << ibv_wc_status_str(got[k].status);
      EXPECT_EQ(got[k].qp_num, pairs[i]->a->qp_num);
      EXPECT_EQ(got[k].wr_id, k) << "receives complete in posting order";
    }
    EXPECT_EQ(pairs[i]->b_handler.count(), 2u * kMsgs);
    if (i < 4) {
      EXPECT_EQ(pairs[i]->a_handler.threads(), std::set<std::thread::id>{loops[i % 2]->id()})
          << "pair " << i;
    }
  }
  loop0.Stop();
  loop1.Stop();
  EXPECT_EQ(loop0.errors() + loop1.errors(), 0);
}

// A reactor asleep in epoll (no timeout) wakes for every message: the completion event reaches
// the shard's fd through the event thread. Twenty rounds, each waiting for the sleep first.
TEST_F(Rxe, SleepingReactorWakesForEachMessage) {
  RuntimeOptions options = ReactorOptions(1);
  options.cq_park_after = std::chrono::microseconds(100);  // and a parked CQ wakes it too
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0);
  Pair* p = MakePair(cq, cq, 0, 0);
  ASSERT_NE(p, nullptr);
  EngineLoop loop(*rt_, 0);
  for (int k = 0; k < 20; ++k) {
    ASSERT_TRUE(WaitFor([&] { return loop.asleep(); })) << "round " << k;
    CQD_ASSERT_OK(rxe::PostRecv(p->a, k, buffers_, k));
    CQD_ASSERT_OK(rxe::PostSend(p->b, k, buffers_, 100 + k, 64, false));
    ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == size_t(k) + 1; }))
        << "a sleeping reactor missed message " << k;
  }
  Stats s = rt_->GetStats();
  EXPECT_GE(s.cq_events, 20u);
  EXPECT_GT(s.pollers[0].sleeps, 0u);
  EXPECT_EQ(s.pollers[0].engine_driven, 1);
  loop.Stop();
  EXPECT_EQ(loop.errors(), 0);
}

// A drained teardown on a reactor shard: the flushed receives reach the handler, the async
// event (SQ_DRAINED) arrives after the completions before it, Wait returns OK off the reactor.
TEST_F(Rxe, TeardownAndEventsOnAReactorShard) {
  ASSERT_NO_FATAL_FAILURE(Start(ReactorOptions(1)));
  CqHandle cq = MakeCq(0);
  Pair* p = MakePair(cq, cq, 0, 0);
  ASSERT_NE(p, nullptr);
  EngineLoop loop(*rt_, 0);
  for (int k = 0; k < 4; ++k) CQD_ASSERT_OK(rxe::PostRecv(p->a, k, buffers_, k));
  CQD_ASSERT_OK(rxe::PostSend(p->b, 0, buffers_, 100, 64, false));
  ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == 1; }));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  ASSERT_EQ(ibv_modify_qp(p->b, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  ASSERT_TRUE(WaitFor([&] { return !p->b_handler.events().empty(); }));
  EXPECT_EQ(p->b_handler.events()[0].type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(p->b_handler.count(), 1u) << "the send's completion came before the event";

  Teardown teardown = rt_->TeardownQp(p->a_reg).value();
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_FALSE(p->a_reg.registered());
  std::vector<ibv_wc> got = p->a_handler.wcs();
  ASSERT_EQ(got.size(), 4u);  // one received, three flushed
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  for (int k = 1; k < 4; ++k) {
    EXPECT_EQ(got[k].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(got[k].wr_id, static_cast<uint64_t>(k));
  }
  loop.Stop();
}

}  // namespace
}  // namespace cqd

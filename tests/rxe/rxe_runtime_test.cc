// SPDX-License-Identifier: BSD-2-Clause
// cqd end to end on real verbs (rxe in the VM, or $CQD_RDMA_DEVICE on an RDMA host), through the
// public API only: RC QP pairs connected through the device's own GID.
#include <endian.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cqd/runtime.h"
#include "tests/fixtures/fixtures.h"
#include "tests/rxe/rxe_fixture.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {
namespace {

using testing::WaitFor;

// SEND/RECV and RDMA WRITE WITH IMM over 8 pairs on 2 shards: every handler sees exactly its own
// completions, with the right byte_len and imm_data.
TEST_F(Rxe, SendAndWriteWithImmReachTheirOwnHandlers) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq[2] = {MakeCq(0), MakeCq(1)};
  constexpr int kPairs = 8, kMsgs = 20;
  std::vector<Pair*> pairs;
  for (int i = 0; i < kPairs; ++i) {
    Pair* p = MakePair(cq[i % 2], cq[(i + 1) % 2], i % 2, (i + 1) % 2);
    ASSERT_NE(p, nullptr);
    pairs.push_back(p);
  }
  for (int i = 0; i < kPairs; ++i) {
    const int base = i * 64;  // this pair's receive slots
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
    Pair& p = *pairs[i];
    std::vector<ibv_wc> got = p.a_handler.wcs();
    ASSERT_EQ(got.size(), 2u * kMsgs) << "pair " << i;
    int sends = 0, imms = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      const ibv_wc& wc = got[k];
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
      EXPECT_EQ(wc.qp_num, p.a->qp_num);
      EXPECT_EQ(wc.wr_id, k) << "receives complete in posting order";
      if (wc.opcode == IBV_WC_RECV) {
        EXPECT_EQ(wc.byte_len, 100u + i);
        EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM);
        ++sends;
      } else {
        ASSERT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
        EXPECT_EQ(be32toh(wc.imm_data), static_cast<uint32_t>((i << 16) | imms));
        EXPECT_EQ(wc.byte_len, 200u + i);
        ++imms;
      }
    }
    EXPECT_EQ(sends, kMsgs);
    EXPECT_EQ(imms, kMsgs);
    for (const ibv_wc& wc : p.b_handler.wcs()) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.qp_num, p.b->qp_num);
      EXPECT_TRUE(wc.opcode == IBV_WC_SEND || wc.opcode == IBV_WC_RDMA_WRITE) << wc.opcode;
    }
    EXPECT_EQ(p.b_handler.wcs().size(), 2u * kMsgs);
  }
  EXPECT_EQ(rt_->GetStats().orphans, 0u);
}

// Idle pollers sleep (no polling at all); each message wakes them through a completion event.
TEST_F(Rxe, IdlePollersSleepAndTrafficWakesThem) {
  RuntimeOptions options = testing::OwnedConsumers(2, 1);
  options.idle_budget = std::chrono::microseconds(50);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  Pair* p = MakePair(MakeCq(0), MakeCq(1), 0, 0);
  ASSERT_NE(p, nullptr);
  for (int k = 0; k < 20; ++k) {
    ASSERT_TRUE(WaitForPollersAsleep()) << "round " << k;
    CQD_ASSERT_OK(rxe::PostRecv(p->a, k, buffers_, k));
    CQD_ASSERT_OK(rxe::PostSend(p->b, k, buffers_, 100 + k, 64, false));
    ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == size_t(k) + 1; }))
        << "a sleeping poller missed message " << k;
  }
  Stats s = rt_->GetStats();
  EXPECT_GE(s.cq_events, 20u);
  for (const auto& poller : s.pollers) EXPECT_GT(poller.sleeps, 0u);
}

// S8 through the runtime: a solicited-only CQ's poller sleeps through unsolicited receives and
// wakes for a solicited one and for an error (a flushed receive).
TEST_F(Rxe, SolicitedOnlyCqWakesForSolicitedAndErrors) {
  RuntimeOptions options = testing::OwnedConsumers(2, 1);
  options.idle_budget = std::chrono::microseconds(0);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  Pair* p = MakePair(MakeCq(0, /*solicited_only=*/true), MakeCq(1), 0, 0);
  ASSERT_NE(p, nullptr);
  for (int k = 0; k < 3; ++k) CQD_ASSERT_OK(rxe::PostRecv(p->a, k, buffers_, k));
  ASSERT_TRUE(WaitForPollersAsleep());
  CQD_ASSERT_OK(rxe::PostSend(p->b, 0, buffers_, 100, 64, /*solicited=*/false));
  ASSERT_TRUE(WaitFor([&] { return p->b_handler.count() == 1; }));  // it was received
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(p->a_handler.count(), 0u) << "woke for an unsolicited receive";
  CQD_ASSERT_OK(rxe::PostSend(p->b, 1, buffers_, 101, 64, /*solicited=*/true));
  ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == 2; }));
  ASSERT_TRUE(WaitForPollersAsleep());
  CQD_ASSERT_OK(rxe::MoveToError(p->a));  // receive 2 is flushed: an unsuccessful completion
  ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == 3; }));
  ibv_wc last = p->a_handler.wcs().back();
  EXPECT_EQ(last.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(last.wr_id, 2u);
}

// A QP moved to the error state flushes its receives to its own handler; only the fields valid
// for an error completion (S10) are checked, and no other handler hears of it.
TEST_F(Rxe, FlushErrorsReachTheirOwnHandler) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0);
  Pair* victim = MakePair(cq, cq, 0, 1);
  Pair* bystander = MakePair(cq, cq, 1, 0);
  ASSERT_TRUE(victim && bystander);
  for (int k = 0; k < 5; ++k) CQD_ASSERT_OK(rxe::PostRecv(victim->a, 100 + k, buffers_, k));
  CQD_ASSERT_OK(rxe::MoveToError(victim->a));
  ASSERT_TRUE(WaitFor([&] { return victim->a_handler.count() == 5; }));
  std::vector<ibv_wc> got = victim->a_handler.wcs();
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(got[k].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(got[k].wr_id, 100u + k);
    EXPECT_EQ(got[k].qp_num, victim->a->qp_num);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(bystander->a_handler.count(), 0u);
  EXPECT_EQ(bystander->b_handler.count(), 0u);
  EXPECT_EQ(victim->b_handler.count(), 0u);
}

// An async event from the device reaches its QP's handler, and was acked: destroying the QP
// returns (S13).
TEST_F(Rxe, AsyncEventReachesItsHandler) {
  ASSERT_NO_FATAL_FAILURE(Start(testing::OwnedConsumers(1, 1)));
  CqHandle cq = MakeCq(0);
  Pair* p = MakePair(cq, cq, 0, 0);
  ASSERT_NE(p, nullptr);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  ASSERT_EQ(ibv_modify_qp(p->a, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  ASSERT_TRUE(WaitFor([&] { return !p->a_handler.events().empty(); }));
  AsyncEvent e = p->a_handler.events()[0];
  EXPECT_EQ(e.type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(e.qp_num, p->a->qp_num);
  EXPECT_TRUE(p->b_handler.events().empty());
  p->a_reg.Unregister();
  EXPECT_EQ(ibv_destroy_qp(p->a), 0);  // would wait forever for an unacked event
  p->a = nullptr;
}

// Teardown with unacked completion events returns: DestroyCq and the runtime's destructor flush
// the acks before ibv_destroy_cq (which would otherwise wait forever, S2).
// A QP still in RESET has nothing posted and cannot move to the error state: its teardown ends
// at once, OK, with no deadline to wait for, and the QP stays as it was.
TEST_F(Rxe, TeardownOfAQpInResetEndsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(testing::OwnedConsumers(1, 1)));
  CqHandle cq = MakeCq(0);
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq.verbs();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 16;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd_, &attr);
  ASSERT_NE(qp, nullptr) << strerror(errno);
  WcRecorder handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt_->RegisterQp(qp, handler, 0));
  TeardownOptions never;
  never.timeout = std::chrono::milliseconds::max();  // only ending at once can end it
  CQD_ASSERT_OK_AND_ASSIGN(teardown, rt_->TeardownQp(reg, never));
  EXPECT_FALSE(reg.registered());
  const Status result = teardown.Wait();
  EXPECT_TRUE(result.ok()) << result.ToString();
  EXPECT_TRUE(teardown.done());
  ibv_qp_attr now{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp, &now, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(now.qp_state, IBV_QPS_RESET);
  EXPECT_EQ(handler.count(), 0u);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(Rxe, TeardownWithUnackedEventsReturns) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(0);
  options.ack_threshold = 1000;  // nothing is acked before teardown
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0);
  Pair* p = MakePair(cq, cq, 0, 0);
  ASSERT_NE(p, nullptr);
  for (int k = 0; k < 10; ++k) {
    ASSERT_TRUE(WaitForPollersAsleep());
    CQD_ASSERT_OK(rxe::PostRecv(p->a, k, buffers_, k));
    CQD_ASSERT_OK(rxe::PostSend(p->b, k, buffers_, 100 + k, 64, false));
    ASSERT_TRUE(WaitFor([&] { return p->a_handler.count() == size_t(k) + 1; }));
  }
  Stats before = rt_->GetStats();
  ASSERT_GT(before.cq_events, 0u);
  EXPECT_EQ(before.cq_acked_events, 0u);
  // Leave this CQ to the runtime's destructor (in TearDown), after the QPs are gone.
  p->a_reg.Unregister();
  p->b_reg.Unregister();
  ASSERT_EQ(ibv_destroy_qp(p->a), 0);
  ASSERT_EQ(ibv_destroy_qp(p->b), 0);
  p->a = p->b = nullptr;
  cqs_.clear();
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// RegisterQp's CQ capacity guard: the work requests a CQ's QPs may have outstanding never exceed
// its depth; the CQ grows or the registration is refused.
#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

struct Bed : testing::Bed {
  testing::Recorder handler;

  Bed() { EXPECT_TRUE(Start().ok()); }
  CqHandle Cq(int depth, bool grow) {
    CqOptions options;
    options.depth = depth;
    options.grow = grow;
    return testing::Bed::Cq(0, options);
  }
  SimQp* Qp(CqHandle cq, int send, int recv, bool srq = false) {
    SimQpOptions options;
    options.max_send_wr = send;
    options.max_recv_wr = recv;
    options.srq = srq;
    return testing::Bed::Qp(cq, options);
  }
};

// Each QP commits its caps plus one teardown marker per queue: (40 + 1) + (40 + 1) = 82.
TEST(Capacity, RefusesWhatTheCqCannotHoldWhenItMayNotGrow) {
  Bed bed;
  CqHandle cq = bed.Cq(100, /*grow=*/false);
  CQD_ASSERT_OK_AND_ASSIGN(first, bed.rt->RegisterQp(*bed.Qp(cq, 40, 40), bed.handler, 0));
  auto second = bed.rt->RegisterQp(*bed.Qp(cq, 40, 40), bed.handler, 0);
  ASSERT_EQ(second.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("depth 100"), std::string::npos)
      << second.status().ToString();
  // What an unregistered QP committed is given back.
  first.Unregister();
  CQD_ASSERT_OK_AND_ASSIGN(third, bed.rt->RegisterQp(*bed.Qp(cq, 40, 40), bed.handler, 0));
  // Declared smaller than the QP's caps: the engine promises to post no more than that.
  QpOptions small;
  small.send_wrs = 5;
  small.recv_wrs = 5;
  CQD_ASSERT_OK_AND_ASSIGN(fourth, bed.rt->RegisterQp(*bed.Qp(cq, 40, 40), bed.handler, 0, small));
  EXPECT_EQ(cq.sim()->depth(), 100);
}

TEST(Capacity, GrowsTheCqWhenAllowed) {
  Bed bed;
  CqHandle cq = bed.Cq(100, /*grow=*/true);
  CQD_ASSERT_OK_AND_ASSIGN(first, bed.rt->RegisterQp(*bed.Qp(cq, 40, 40), bed.handler, 0));
  EXPECT_EQ(cq.sim()->depth(), 100);
  CQD_ASSERT_OK_AND_ASSIGN(second, bed.rt->RegisterQp(*bed.Qp(cq, 10, 10), bed.handler, 0));
  EXPECT_GE(cq.sim()->depth(), 104);
  CQD_ASSERT_OK_AND_ASSIGN(third, bed.rt->RegisterQp(*bed.Qp(cq, 1000, 1000), bed.handler, 0));
  EXPECT_GE(cq.sim()->depth(), 82 + 22 + 2002);
  // Beyond what the device allows (the simulated device's limit is 2^22): refused, with the
  // reason.
  auto fourth = bed.rt->RegisterQp(*bed.Qp(cq, 1 << 22, 0), bed.handler, 0);
  ASSERT_EQ(fourth.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("growing it failed"), std::string::npos)
      << fourth.status().ToString();
}

// An SRQ QP's receives are the SRQ's: only its send queue (and marker) counts.
TEST(Capacity, SrqQpCommitsItsSendQueueOnly) {
  Bed bed;
  CqHandle cq = bed.Cq(50, /*grow=*/false);
  CQD_ASSERT_OK_AND_ASSIGN(a, bed.rt->RegisterQp(*bed.Qp(cq, 24, 1000, true), bed.handler, 0));
  CQD_ASSERT_OK_AND_ASSIGN(b, bed.rt->RegisterQp(*bed.Qp(cq, 24, 1000, true), bed.handler, 0));
  auto c = bed.rt->RegisterQp(*bed.Qp(cq, 0, 0, true), bed.handler, 0);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  QpOptions bad;
  bad.send_wrs = -2;
  EXPECT_EQ(bed.rt->RegisterQp(*bed.Qp(cq, 0, 0), bed.handler, 0, bad).status().code(),
            StatusCode::kInvalidArgument);
}

// The guard holds under traffic: a source that keeps each QP's declared window outstanding never
// overflows the CQ (S11), and every completion arrives.
TEST(Capacity, DeclaredWindowsNeverOverflow) {
  Bed bed;
  CqHandle cq = bed.Cq(64, /*grow=*/true);
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<testing::Recorder>> handlers;
  std::vector<Registration> regs;
  for (int i = 0; i < 8; ++i) {
    qps.push_back(bed.Qp(cq, 16, 0));
    handlers.push_back(std::make_unique<testing::Recorder>());
    handlers.back()->qp_num = qps.back()->qp_num();
    regs.push_back(bed.rt->RegisterQp(*qps.back(), *handlers.back(), 0).value());
  }
  EXPECT_GE(cq.sim()->depth(), 8 * (16 + 1 + 1));
  // Post a full window of 16 on every QP at once, then complete them all (as a device would),
  // overflow armed: S11 would fail the CQ.
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 8; ++i) {
      std::vector<ibv_wc> wcs(16);
      for (int k = 0; k < 16; ++k) {
        wcs[k] = {};
        wcs[k].wr_id = static_cast<uint64_t>(round) * 16 + k;
        wcs[k].qp_num = qps[i]->qp_num();
        wcs[k].opcode = IBV_WC_SEND;
      }
      ASSERT_EQ(cq.sim()->Inject(wcs, false, /*overflow=*/true), 16);
    }
    ASSERT_TRUE(testing::WaitFor([&] {
      for (auto& h : handlers) {
        if (h->received() != static_cast<uint64_t>(round + 1) * 16) return false;
      }
      return true;
    }));
  }
  EXPECT_FALSE(cq.sim()->failed());
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// The simulated device's CQ through the backend seam (runtime/backend/sim/sim_device.h): its
// ring (order kept across many wraps, a full CQ taking no more), its arming (S6-S8: one event
// per arm, solicited-only arms waiting for a solicited receive or an error, a repeated arm
// absorbed, next-completion arming winning), the fields of an error completion (S10), and
// overflow (S11: only when asked, then the CQ fails and CQ_ERR and QP_FATAL are raised for it
// and its QPs alone).
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "runtime/backend/sim/sim_device.h"

namespace cqd {
namespace {

using sim_internal::SimBackend;

ibv_wc Recv(uint64_t wr_id, uint32_t qp_num = 7, ibv_wc_status status = IBV_WC_SUCCESS) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.qp_num = qp_num;
  wc.opcode = IBV_WC_RECV;
  wc.status = status;
  return wc;
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

// A CQ of `depth` on its own channel, destroyed (with its events acked) at the end.
class SimCqTest : public ::testing::Test {
 protected:
  void Make(int depth) {
    auto channel = dev_.CreateChannel();
    ASSERT_TRUE(channel.ok()) << channel.status().ToString();
    channel_ = *channel;
    auto cq = dev_.CreateCq(depth, channel_);
    ASSERT_TRUE(cq.ok()) << cq.status().ToString();
    cq_ = *cq;
    sim_cq_ = static_cast<SimCq*>(cq_->native());
  }
  void TearDown() override {
    if (cq_ != nullptr) {
      dev_.AckCqEvents(cq_, events_);
      EXPECT_TRUE(dev_.DestroyCq(cq_).ok());
    }
    if (channel_ != nullptr) EXPECT_TRUE(dev_.DestroyChannel(channel_).ok());
  }
  // Takes one completion event: the CQ's.
  void ExpectOneEvent() {
    ASSERT_TRUE(Readable(channel_->fd())) << "no event";
    void* native = nullptr;
    ASSERT_EQ(channel_->GetEvent(&native), 0);
    EXPECT_EQ(native, cq_->native());
    ++events_;
    EXPECT_FALSE(Readable(channel_->fd())) << "more than one event";
  }
  int Inject(std::vector<ibv_wc> wcs, bool solicited = false) {
    return sim_cq_->Inject(wcs, solicited);
  }
  std::vector<uint64_t> PollAll(int n = 64) {
    std::vector<ibv_wc> wc(n);
    const int got = cq_->Poll(n, wc.data());
    EXPECT_GE(got, 0);
    std::vector<uint64_t> ids;
    for (int i = 0; i < got; ++i) ids.push_back(wc[i].wr_id);
    return ids;
  }

  std::shared_ptr<SimDevice> sim_ = SimDevice::Create();
  SimBackend dev_{sim_};
  backend::Channel* channel_ = nullptr;
  backend::Cq* cq_ = nullptr;
  SimCq* sim_cq_ = nullptr;
  unsigned events_ = 0;
};

TEST_F(SimCqTest, TheRingKeepsOrderAcrossWrapsAndAFullCqTakesNoMore) {
  Make(6);  // a ring of 8 slots, of which the depth lets 6 be used
  std::vector<ibv_wc> ten;
  for (uint64_t i = 0; i < 10; ++i) ten.push_back(Recv(i));
  EXPECT_EQ(Inject(ten), 6) << "a full CQ takes only what fits";
  EXPECT_EQ(sim_cq_->size(), 6);
  std::vector<ibv_wc> wc(4);
  ASSERT_EQ(cq_->Poll(4, wc.data()), 4);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(wc[i].wr_id, i);
  EXPECT_EQ(Inject({Recv(6), Recv(7), Recv(8), Recv(9), Recv(10)}), 4);
  EXPECT_EQ(PollAll(), (std::vector<uint64_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(cq_->Poll(4, wc.data()), 0) << "an empty CQ returns nothing";
  // Around the ring many times: bursts of 1 to 5 (steps that do not divide its 8 slots), each
  // polled out in pieces of 1 to 3.
  uint64_t next_in = 100, next_out = 100;
  for (int round = 0; round < 200; ++round) {
    std::vector<ibv_wc> burst;
    for (int k = 0; k < 1 + round % 5; ++k) burst.push_back(Recv(next_in + k));
    ASSERT_EQ(Inject(burst), static_cast<int>(burst.size())) << round;
    next_in += burst.size();
    while (next_out < next_in) {
      const std::vector<uint64_t> ids = PollAll(1 + round % 3);
      ASSERT_FALSE(ids.empty()) << round;
      for (uint64_t id : ids) ASSERT_EQ(id, next_out++) << round;
    }
  }
  EXPECT_TRUE(PollAll().empty());
  EXPECT_EQ(sim_cq_->size(), 0);
  EXPECT_FALSE(Readable(channel_->fd())) << "nothing was armed: no event";
}

TEST_F(SimCqTest, AnArmFiresOnceForTheNextCompletionAndARepeatIsAbsorbed) {
  Make(16);
  ASSERT_EQ(Inject({Recv(0)}), 1);
  EXPECT_FALSE(Readable(channel_->fd()));
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  ASSERT_EQ(cq_->RequestNotify(false), 0);  // S7: pending already, absorbed
  ASSERT_EQ(Inject({Recv(1)}), 1);
  ExpectOneEvent();
  ASSERT_EQ(Inject({Recv(2)}), 1);  // the arm is spent
  EXPECT_FALSE(Readable(channel_->fd()));
  EXPECT_EQ(PollAll(), (std::vector<uint64_t>{0, 1, 2}));
}

TEST_F(SimCqTest, ASolicitedOnlyArmWaitsForASolicitedReceiveOrAnError) {
  Make(16);
  ASSERT_EQ(cq_->RequestNotify(true), 0);
  ASSERT_EQ(Inject({Recv(0), Recv(1)}), 2);  // unsolicited successes
  EXPECT_FALSE(Readable(channel_->fd())) << "an unsolicited receive fired a solicited-only arm";
  ASSERT_EQ(Inject({Recv(2)}, /*solicited=*/true), 1);
  ExpectOneEvent();
  ASSERT_EQ(cq_->RequestNotify(true), 0);
  ASSERT_EQ(Inject({Recv(3, 7, IBV_WC_WR_FLUSH_ERR)}), 1);  // S8: an error fires it too
  ExpectOneEvent();
  // S8: next-completion arming wins over a solicited-only one.
  ASSERT_EQ(cq_->RequestNotify(true), 0);
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  ASSERT_EQ(Inject({Recv(4)}), 1);
  ExpectOneEvent();
  // S10: of an error completion only wr_id, status, qp_num and vendor_err mean anything; the
  // device fills the rest with garbage so that code reading them is caught.
  std::vector<ibv_wc> wc(8);
  ASSERT_EQ(cq_->Poll(8, wc.data()), 5);
  EXPECT_EQ(wc[3].wr_id, 3u);
  EXPECT_EQ(wc[3].qp_num, 7u);
  EXPECT_EQ(wc[3].status, IBV_WC_WR_FLUSH_ERR);
  // The garbage is no valid ibv_wc_opcode: read it as bytes (loading it as the enum is UB).
  uint32_t opcode_bits = 0;
  static_assert(sizeof(wc[3].opcode) == sizeof(opcode_bits));
  std::memcpy(&opcode_bits, &wc[3].opcode, sizeof(opcode_bits));
  EXPECT_NE(opcode_bits, static_cast<uint32_t>(IBV_WC_RECV));
  EXPECT_EQ(wc[4].opcode, IBV_WC_RECV) << "a success keeps its fields";
}

TEST_F(SimCqTest, AFullCqOverflowsOnlyWhenAskedAndThenFailsItsQpsAlone) {
  Make(4);
  auto other = dev_.CreateCq(4, channel_);
  ASSERT_TRUE(other.ok());
  auto* other_cq = static_cast<SimCq*>((*other)->native());
  auto on_it = sim_->CreateQp(sim_cq_, sim_cq_);
  auto elsewhere = sim_->CreateQp(other_cq, other_cq);
  ASSERT_TRUE(on_it.ok() && elsewhere.ok());
  const uint32_t doomed = (*on_it)->qp_num();
  ASSERT_EQ(Inject({Recv(0, doomed), Recv(1, doomed), Recv(2, doomed), Recv(3, doomed)}), 4);
  EXPECT_EQ(Inject({Recv(4, doomed)}), 0) << "full, no overflow asked: nothing added";
  EXPECT_FALSE(sim_cq_->failed());
  EXPECT_FALSE(Readable(dev_.async_fd()));
  const std::vector<ibv_wc> one = {Recv(5, doomed)};
  EXPECT_EQ(sim_cq_->Inject(one, false, /*overflow=*/true), -1);
  EXPECT_TRUE(sim_cq_->failed());
  ibv_wc wc[4];
  EXPECT_EQ(cq_->Poll(4, wc), -EIO) << "S11: an overflowed CQ is only good for destroying";
  EXPECT_EQ(cq_->RequestNotify(false), EIO);
  EXPECT_EQ(sim_cq_->Inject(one), -1);
  EXPECT_FALSE(other_cq->failed());
  // CQ_ERR for the CQ and QP_FATAL for its QP, and nothing for the other QP.
  std::vector<backend::AsyncEventRecord> records;
  while (Readable(dev_.async_fd())) {
    backend::AsyncEventRecord record;
    ASSERT_EQ(dev_.GetAsyncEvent(&record), 0);
    records.push_back(record);
  }
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(records[0].native_cq, cq_->native());
  EXPECT_EQ(records[1].type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(records[1].qp_num, doomed);
  for (backend::AsyncEventRecord& record : records) dev_.AckAsyncEvent(&record);  // S13
  EXPECT_TRUE(sim_->DestroyQp(*on_it).ok());
  EXPECT_TRUE(sim_->DestroyQp(*elsewhere).ok());
  EXPECT_TRUE(dev_.DestroyCq(*other).ok());
}

}  // namespace
}  // namespace cqd

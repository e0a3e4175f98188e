// SPDX-License-Identifier: BSD-2-Clause
// Real faults on real verbs (rxe in the VM): the link going down and up under traffic, a peer QP
// failing or vanishing mid-traffic, drained teardown of RC and SRQ QPs, the CQ capacity guard
// growing a CQ with ibv_resize_cq, and the device opened by a runtime that is shut down.
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cqd/runtime.h"
#include "tests/fixtures/fixtures.h"
#include "tests/rxe/rxe_fixture.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {
namespace {

using testing::WaitFor;

// Records port and other device-level events.
class DeviceEvents : public DeviceEventHandler {
 public:
  void OnDeviceEvent(const AsyncEvent& event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    types_.push_back(event.type);
  }
  bool Saw(ibv_event_type type) const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(types_.begin(), types_.end(), type) != types_.end();
  }

 private:
  mutable std::mutex mu_;
  std::vector<ibv_event_type> types_;
};

// Checks that `handler` got each wr_id of `posted` exactly once, in posting order, whatever the
// status; returns a description of the first problem, or "".
std::string ExactlyOnceInOrder(const WcRecorder& handler, const std::vector<uint64_t>& posted) {
  std::vector<ibv_wc> got = handler.wcs();
  if (got.size() != posted.size()) {
    return "got " + std::to_string(got.size()) + " completions for " +
           std::to_string(posted.size()) + " posted work requests";
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].wr_id != posted[i]) {
      return "completion " + std::to_string(i) + " has wr_id " + std::to_string(got[i].wr_id) +
             ", expected " + std::to_string(posted[i]);
    }
  }
  return "";
}

class RxeFaults : public Rxe {
 protected:
  // Posts one round: `n` receives on p->a and `n` sends on p->b, recording the wr_ids.
  void PostRound(Pair* p, int n) {
    for (int k = 0; k < n; ++k) {
      uint64_t id = next_id_++;
      ASSERT_TRUE(rxe::PostRecv(p->a, id, buffers_, static_cast<int>(id % 512)).ok());
      recvs_[p].push_back(id);
    }
    for (int k = 0; k < n; ++k) {
      uint64_t id = next_id_++;
      ASSERT_TRUE(rxe::PostSend(p->b, id, buffers_, 600 + k, 64, false).ok());
      sends_[p].push_back(id);
    }
  }
  // Waits until every send posted on `p` has completed (any status). Receives may wait for a
  // send that failed; the teardown flushes them.
  bool SendsCompleted(Pair* p) {
    return WaitFor([&] { return p->b_handler.count() == sends_[p].size(); });
  }
  // Describes how far `p`'s work got, for failure messages.
  std::string Progress(Pair* p) {
    std::string s = "recvs " + std::to_string(p->a_handler.count()) + "/" +
                    std::to_string(recvs_[p].size()) + ", sends " +
                    std::to_string(p->b_handler.count()) + "/" + std::to_string(sends_[p].size()) +
                    "; send statuses:";
    for (const ibv_wc& wc : p->b_handler.wcs())
      s += std::string(" ") + ibv_wc_status_str(wc.status);
    return s;
  }
  // Waits until every posted work request of `p` has completed (any status).
  bool AllCompleted(Pair* p, int timeout_ms = 30000) {
    return WaitFor(
        [&] {
          return p->a_handler.count() == recvs_[p].size() &&
                 p->b_handler.count() == sends_[p].size();
        },
        std::chrono::milliseconds(timeout_ms));
  }
  // Tears both QPs of `p` down (drained) and checks that each work request completed once.
  void TearDownAndCheck(Pair* p) {
    auto ta = rt_->TeardownQp(p->a_reg);
    auto tb = rt_->TeardownQp(p->b_reg);
    ASSERT_TRUE(ta.ok()) << ta.status().ToString();
    ASSERT_TRUE(tb.ok()) << tb.status().ToString();
    Status sa = ta->Wait();
    Status sb = tb->Wait();
    EXPECT_TRUE(sa.ok()) << sa.ToString();
    EXPECT_TRUE(sb.ok()) << sb.ToString();
    EXPECT_EQ(ExactlyOnceInOrder(p->a_handler, recvs_[p]), "");
    EXPECT_EQ(ExactlyOnceInOrder(p->b_handler, sends_[p]), "");
  }

  uint64_t next_id_ = 1;
  std::map<Pair*, std::vector<uint64_t>> recvs_, sends_;
  // Handlers given to the runtime must outlive it (runtime.h): rt_ lives until Rxe::TearDown,
  // after the test body's locals are gone, and its event thread and pollers may call them until
  // then (a late port event on the event thread, an orphan in DestroyCq).
  DeviceEvents events_;
  testing::OrphanLedger orphans_;
};

// The link goes down and comes back while traffic flows: the device handler hears PORT_ERR and
// PORT_ACTIVE, every posted work request completes exactly once (successfully or with an error),
// and the runtime keeps serving: traffic after the link is back succeeds on a fresh pair.
TEST_F(RxeFaults, LinkDownAndUpUnderTraffic) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  ASSERT_NO_FATAL_FAILURE(Start(options, &events_));
  CqHandle cq[2] = {MakeCq(0), MakeCq(1)};
  std::vector<Pair*> pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(MakePair(cq[i % 2], cq[(i + 1) % 2], i % 2, 1));
  // A failed assertion between rounds 4 and 8 must not leave the link down for the tests after.
  struct LinkBackUp {
    ~LinkBackUp() { (void)rxe::SetLinkUp(true); }
  } link_back_up;
  for (int round = 0; round < 12; ++round) {
    if (round == 4) CQD_ASSERT_OK(rxe::SetLinkUp(false));
    if (round == 8) CQD_ASSERT_OK(rxe::SetLinkUp(true));
    for (Pair* p : pairs) ASSERT_NO_FATAL_FAILURE(PostRound(p, 8));
    for (Pair* p : pairs)
      ASSERT_TRUE(SendsCompleted(p)) << "round " << round << ": " << Progress(p);
  }
  EXPECT_TRUE(WaitFor([&] { return events_.Saw(IBV_EVENT_PORT_ERR); }));
  EXPECT_TRUE(WaitFor([&] { return events_.Saw(IBV_EVENT_PORT_ACTIVE); }));
  for (Pair* p : pairs) ASSERT_NO_FATAL_FAILURE(TearDownAndCheck(p));

  Pair* fresh = MakePair(cq[0], cq[1], 0, 1);
  ASSERT_NE(fresh, nullptr);
  ASSERT_NO_FATAL_FAILURE(PostRound(fresh, 16));
  ASSERT_TRUE(AllCompleted(fresh));
  for (const ibv_wc& wc : fresh->a_handler.wcs()) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(TearDownAndCheck(fresh));
}

// The receiving QP of a pair is moved to the error state mid-traffic: its receives flush to its
// handler, the other pair is undisturbed, and the sender's teardown flushes whatever it still
// had outstanding (rxe does not fail those sends by itself: see docs/RXE.md), so each work
// request of both QPs completes exactly once.
TEST_F(RxeFaults, PeerQpFailsMidTraffic) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq[2] = {MakeCq(0), MakeCq(1)};
  Pair* victim = MakePair(cq[0], cq[1], 0, 1);
  Pair* bystander = MakePair(cq[1], cq[0], 1, 0);
  for (int round = 0; round < 3; ++round) {
    ASSERT_NO_FATAL_FAILURE(PostRound(victim, 8));
    ASSERT_NO_FATAL_FAILURE(PostRound(bystander, 8));
    ASSERT_TRUE(AllCompleted(victim));
    ASSERT_TRUE(AllCompleted(bystander));
  }
  // Receives posted but never matched, then the peer fails; then the sender keeps sending.
  for (int k = 0; k < 8; ++k) {
    uint64_t id = next_id_++;
    CQD_ASSERT_OK(rxe::PostRecv(victim->a, id, buffers_, k));
    recvs_[victim].push_back(id);
  }
  CQD_ASSERT_OK(rxe::MoveToError(victim->a));
  for (int k = 0; k < 8; ++k) {
    uint64_t id = next_id_++;
    CQD_ASSERT_OK(rxe::PostSend(victim->b, id, buffers_, 600 + k, 64, false));
    sends_[victim].push_back(id);
  }
  ASSERT_TRUE(WaitFor([&] { return victim->a_handler.count() == recvs_[victim].size(); }))
      << "the failed QP's receives must flush: " << Progress(victim);
  for (int round = 0; round < 3; ++round) {
    ASSERT_NO_FATAL_FAILURE(PostRound(bystander, 8));
    ASSERT_TRUE(AllCompleted(bystander));
  }
  for (const ibv_wc& wc : bystander->a_handler.wcs()) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(TearDownAndCheck(victim));
  int errors = 0;
  for (const ibv_wc& wc : victim->b_handler.wcs()) errors += wc.status != IBV_WC_SUCCESS;
  EXPECT_GT(errors, 0) << "the sends that never reached the peer must complete in error";
  ASSERT_NO_FATAL_FAILURE(TearDownAndCheck(bystander));
}

// The receiving QP is destroyed outright mid-traffic: the other pair keeps running, and the
// survivor's teardown completes, flushing the sends the peer never took.
TEST_F(RxeFaults, PeerQpDestroyedMidTraffic) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0);
  Pair* victim = MakePair(cq, cq, 0, 0);
  Pair* bystander = MakePair(cq, cq, 0, 0);
  ASSERT_NO_FATAL_FAILURE(PostRound(victim, 8));
  ASSERT_TRUE(AllCompleted(victim));
  victim->a_reg.Unregister();
  ASSERT_EQ(ibv_destroy_qp(victim->a), 0);
  victim->a = nullptr;
  for (int k = 0; k < 8; ++k) {
    uint64_t id = next_id_++;
    CQD_ASSERT_OK(rxe::PostSend(victim->b, id, buffers_, 600 + k, 64, false));
    sends_[victim].push_back(id);
  }
  ASSERT_NO_FATAL_FAILURE(PostRound(bystander, 16));
  ASSERT_TRUE(AllCompleted(bystander));
  auto tb = rt_->TeardownQp(victim->b_reg);
  ASSERT_TRUE(tb.ok()) << tb.status().ToString();
  CQD_ASSERT_OK(tb->Wait());
  EXPECT_EQ(ExactlyOnceInOrder(victim->b_handler, sends_[victim]), "");
  EXPECT_NE(victim->b_handler.wcs().back().status, IBV_WC_SUCCESS) << Progress(victim);
  ASSERT_NO_FATAL_FAILURE(TearDownAndCheck(bystander));
}

// Drained teardown of an RC QP with receives outstanding: every one flushes to the handler in
// posting order, the marker never shows, and nothing is left in the CQ for the QP that takes the
// number next.
TEST_F(RxeFaults, TeardownFlushesOutstandingReceives) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0, /*solicited_only=*/true);
  Pair* p = MakePair(cq, cq, 0, 0);
  for (int k = 0; k < 20; ++k) {
    uint64_t id = next_id_++;
    CQD_ASSERT_OK(rxe::PostRecv(p->a, id, buffers_, k));
    recvs_[p].push_back(id);
  }
  auto t = rt_->TeardownQp(p->a_reg);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  CQD_ASSERT_OK(t->Wait());
  EXPECT_EQ(ExactlyOnceInOrder(p->a_handler, recvs_[p]), "");
  for (const ibv_wc& wc : p->a_handler.wcs()) EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_EQ(ibv_destroy_qp(p->a), 0);
  p->a = nullptr;
  EXPECT_EQ(rt_->GetStats().orphans, 0u);
}

// An SRQ-attached QP: rxe never raises LAST_WQE_REACHED, so the grace period ends the teardown.
TEST_F(RxeFaults, SrqQpTeardownEndsWithoutLastWqeReached) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqHandle cq = MakeCq(0);
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = 64;
  srq_attr.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &srq_attr);
  ASSERT_NE(srq, nullptr);
  ibv_qp_init_attr attr{};
  attr.send_cq = cq.verbs();
  attr.recv_cq = cq.verbs();
  attr.srq = srq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 16;
  attr.cap.max_send_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd_, &attr);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(qp, &init,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
            0);
  auto peer = rxe::CreateRcQp(pd_, cq.verbs(), cq.verbs(), 16);
  ASSERT_TRUE(peer.ok());
  CQD_ASSERT_OK(rxe::ConnectLoopback(qp, (*peer)->qp_num, gid_index_));
  CQD_ASSERT_OK(rxe::ConnectLoopback(*peer, qp->qp_num, gid_index_));
  for (int k = 0; k < 8; ++k) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buffers_.slot(k)), 64, buffers_.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 100 + k;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  WcRecorder handler;
  auto reg = rt_->RegisterQp(qp, handler, 0);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  // Four messages arrive on the SRQ first.
  for (int k = 0; k < 4; ++k) CQD_ASSERT_OK(rxe::PostSend(*peer, k, buffers_, 600 + k, 32, false));
  ASSERT_TRUE(WaitFor([&] { return handler.count() == 4; }));
  TeardownOptions teardown_options;
  teardown_options.last_wqe_grace = std::chrono::milliseconds(100);
  auto t = rt_->TeardownQp(*reg, teardown_options);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  CQD_ASSERT_OK(t->Wait());
  EXPECT_EQ(handler.count(), 4u) << "the marker must not reach the handler";
  for (const ibv_wc& wc : handler.wcs()) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_destroy_qp(*peer), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

// The capacity guard reads the QP's caps and grows a CQ too small for them (ibv_resize_cq), or
// refuses when the CQ may not grow.
TEST_F(RxeFaults, RegisterGrowsTheCqOrRefuses) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqOptions small;
  small.depth = 16;
  CQD_ASSERT_OK_AND_ASSIGN(growing, rt_->CreateCq(dev_, 0, small));
  cqs_.push_back(growing);
  small.grow = false;
  CQD_ASSERT_OK_AND_ASSIGN(fixed, rt_->CreateCq(dev_, 0, small));
  cqs_.push_back(fixed);
  auto qp = rxe::CreateRcQp(pd_, growing.verbs(), growing.verbs(), 128);
  ASSERT_TRUE(qp.ok());
  WcRecorder handler;
  auto reg = rt_->RegisterQp(*qp, handler, 0);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_GE(growing.verbs()->cqe, 2 * (128 + 1));
  auto other = rxe::CreateRcQp(pd_, fixed.verbs(), fixed.verbs(), 128);
  ASSERT_TRUE(other.ok());
  auto refused = rt_->RegisterQp(*other, handler, 0);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  reg->Unregister();
  EXPECT_EQ(ibv_destroy_qp(*qp), 0);
  EXPECT_EQ(ibv_destroy_qp(*other), 0);
}

// A teardown that ends at its deadline on a shared CQ leaves both markers in it (rxe flushes the
// receives, then the send marker inside its post, then the receive marker at the next move to
// error). Once the CQ is polled again, both markers end their fences, whichever comes first, and
// the QP's whole commitment is given back: a QP that needs all of the CQ is admitted. Nothing of
// the torn-down QP reaches its handler after the teardown, and no marker reaches the orphan
// handler.
TEST_F(RxeFaults, DeadlineEndedTeardownOnASharedCqGivesItsCommitmentBackOnceBothMarkersArePolled) {
  RuntimeOptions options = testing::OwnedConsumers(1, 2);
  options.orphan_handler = &orphans_;
  options.consumers[1].kind = ConsumerKind::kEngineDriven;  // held back until drained below
  options.consumers[1].queue_capacity = 2;
  options.consumers[1].spill_capacity = 2;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CqOptions fixed;
  fixed.depth = 1024;
  fixed.grow = false;
  CQD_ASSERT_OK_AND_ASSIGN(shared, rt_->CreateCq(dev_, 0, fixed));
  cqs_.push_back(shared);
  CqHandle other = MakeCq(0);
  Pair* p = MakePair(shared, other, 1, 0);
  ASSERT_NE(p, nullptr);
  PostRound(p, 8);  // 8 receives complete: 4 fill consumer 1, 4 stay in the CQ
  ASSERT_TRUE(SendsCompleted(p)) << Progress(p);
  for (int k = 0; k < 16; ++k) CQD_ASSERT_OK(rxe::PostRecv(p->a, next_id_++, buffers_, k));
  TeardownOptions deadline;
  deadline.timeout = std::chrono::milliseconds(100);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, rt_->TeardownQp(p->a_reg, deadline));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  const size_t delivered = p->a_handler.count();
  ASSERT_EQ(ibv_destroy_qp(p->a), 0);  // what it left stays in the CQ on rxe
  p->a = nullptr;
  // Drain consumer 1: the CQ is polled again, the leftovers and both markers come out.
  ASSERT_TRUE(WaitFor([&] {
    while (rt_->Drain(1, 64) > 0) {
    }
    return rt_->GetStats().consumers[1].spill_depth == 0 && orphans_.count.load() >= 4 + 16;
  })) << "orphans "
      << orphans_.count.load();
  EXPECT_EQ(p->a_handler.count(), delivered);  // nothing after the teardown ended
  for (uint64_t id : orphans_.wr_ids()) {
    EXPECT_LT(id, next_id_) << "a teardown marker (wr_id " << id << ") reached the orphan handler";
  }
  // Everything of the old QP is back: a QP that declares all of the CQ fits.
  auto wide = rxe::CreateRcQp(pd_, shared.verbs(), shared.verbs(), 4);
  ASSERT_TRUE(wide.ok());
  QpOptions all;
  all.send_wrs = shared.verbs()->cqe / 2 - 1;
  all.recv_wrs = shared.verbs()->cqe - shared.verbs()->cqe / 2 - 1;
  WcRecorder handler;
  Result<Registration> admitted = Status(StatusCode::kInternal, "not tried");
  EXPECT_TRUE(WaitFor([&] {
    admitted = rt_->RegisterQp(*wide, handler, 0, all);
    return admitted.ok();
  })) << "the torn-down QP's commitment stayed on the CQ: "
      << admitted.status().ToString();
  if (admitted.ok()) admitted->Unregister();
  EXPECT_EQ(ibv_destroy_qp(*wide), 0);
}

// A context belongs to one runtime (each read of an async event takes it from every other
// reader): another runtime may not add the fixture's, and opening the device by name, which
// makes a context of its own, still works there.
TEST_F(RxeFaults, AContextBelongsToOneRuntime) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  ibv_context* context = rt_->VerbsContext(dev_).value();
  auto other = Runtime::Create(options);
  ASSERT_TRUE(other.ok());
  auto refused = (*other)->AddVerbsDevice(context);
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status().ToString();
  EXPECT_EQ(rt_->AddVerbsDevice(context).status().code(), StatusCode::kAlreadyExists);
  auto own = (*other)->OpenVerbsDevice(rxe::DeviceName());
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_NE((*other)->VerbsContext(*own).value(), context);
}

// A runtime that is shut down refuses to add a device it opened, and closes it exactly once.
TEST_F(RxeFaults, OpenVerbsDeviceAfterShutdownClosesTheContextOnce) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  CQD_ASSERT_OK(rt_->Shutdown());
  for (int i = 0; i < 3; ++i) {
    auto again = rt_->OpenVerbsDevice(rxe::DeviceName());
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status().ToString();
  }
  // The device still opens cleanly in a new runtime.
  auto other = Runtime::Create(options);
  ASSERT_TRUE(other.ok());
  auto dev = (*other)->OpenVerbsDevice(rxe::DeviceName());
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
}

}  // namespace
}  // namespace cqd

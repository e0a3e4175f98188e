// The simulated device beyond the S1-S13 suite: what it adds to verbs (fault injection) and the
// verbs misuse it reports instead of hanging.
#include "cqd/sim.h"
#include "runtime/sim_device.h"
#include "tests/test_util.h"

namespace cqd {
namespace {

TEST(SimDevice, OverAckIsReportedAtDestroy) {
  auto sim = SimDevice::Create();
  sim_internal::SimBackend dev(sim);
  CQD_ASSERT_OK_AND_ASSIGN(channel, dev.CreateChannel());
  CQD_ASSERT_OK_AND_ASSIGN(cq, dev.CreateCq(8, channel));
  sim->AddSpuriousEvent(static_cast<SimCq*>(cq->native()));
  void* native = nullptr;
  ASSERT_EQ(channel->GetEvent(&native), 0);
  dev.AckCqEvents(cq, 2);  // one event read, two acked: verbs would hang in destroy
  Status s = dev.DestroyCq(cq);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("more completion events were acked"), std::string::npos);
}

TEST(SimDevice, InjectedErrnoAndSpuriousEvents) {
  auto sim = SimDevice::Create();
  sim_internal::SimBackend dev(sim);
  CQD_ASSERT_OK_AND_ASSIGN(channel, dev.CreateChannel());
  CQD_ASSERT_OK_AND_ASSIGN(cq, dev.CreateCq(8, channel));
  sim->AddSpuriousEvent(static_cast<SimCq*>(cq->native()));
  sim->FailGetEvent(static_cast<SimChannel*>(channel->native()), EINTR, 2);
  void* native = nullptr;
  EXPECT_EQ(channel->GetEvent(&native), -1);
  EXPECT_EQ(errno, EINTR);
  EXPECT_EQ(channel->GetEvent(&native), -1);
  EXPECT_EQ(errno, EINTR);
  ASSERT_EQ(channel->GetEvent(&native), 0);  // the event was not consumed by the failures
  EXPECT_EQ(native, cq->native());
  ibv_wc wc;
  EXPECT_EQ(cq->Poll(1, &wc), 0);  // S5: an event with nothing behind it
  dev.AckCqEvents(cq, 1);
  CQD_ASSERT_OK(dev.DestroyCq(cq));
  CQD_ASSERT_OK(dev.DestroyChannel(channel));
}

// Two threads inject into one CQ while it is polled: nothing is lost, duplicated or reordered.
TEST(SimDevice, ConcurrentInjectorsLoseNothing) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(1024, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(qp_a, sim->CreateQp(cq, cq));
  CQD_ASSERT_OK_AND_ASSIGN(qp_b, sim->CreateQp(cq, cq));
  constexpr uint64_t kEach = 50000;
  auto inject = [&](SimQp* qp) {
    for (uint64_t i = 0; i < kEach;) {
      if (qp->Complete(i) == 1) ++i;
    }
  };
  std::thread a(inject, qp_a), b(inject, qp_b);
  auto* backend_cq = static_cast<sim_internal::SimCqImpl*>(cq);
  uint64_t next_a = 0, next_b = 0, disorder = 0;
  ibv_wc wc[64];
  while (next_a < kEach || next_b < kEach) {
    int n = backend_cq->Poll(64, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      uint64_t& next = wc[i].qp_num == qp_a->qp_num() ? next_a : next_b;
      if (wc[i].wr_id != next) ++disorder;
      next = wc[i].wr_id + 1;
    }
  }
  a.join();
  b.join();
  EXPECT_EQ(disorder, 0u);
  CQD_ASSERT_OK(sim->DestroyQp(qp_a));
  CQD_ASSERT_OK(sim->DestroyQp(qp_b));
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

}  // namespace
}  // namespace cqd

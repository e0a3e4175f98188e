#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/test_util.h"

namespace cqd {
namespace {

using testing::SequenceHandler;
using testing::WaitFor;

TEST(RuntimeSmoke, DeliversToHandler) {
  RuntimeOptions options;
  options.pollers = 1;
  CQD_ASSERT_OK_AND_ASSIGN(rt, Runtime::Create(options));
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(dev, rt->AddSimDevice(sim));
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
  SequenceHandler handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  for (uint64_t i = 0; i < 100; ++i) ASSERT_EQ(qp->Complete(i), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 100; }));
  EXPECT_EQ(handler.out_of_order(), 0u);
  reg.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

}  // namespace
}  // namespace cqd

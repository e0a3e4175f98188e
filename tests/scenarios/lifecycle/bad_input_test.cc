// SPDX-License-Identifier: BSD-2-Clause
// Bad input to the control path gets a status naming the problem: never a crash or a hang.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

void ExpectCreateFails(const RuntimeOptions& options, const std::string& mentions) {
  testing::Bed bed;
  const Status refused = bed.CreateRuntime(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(mentions), std::string::npos) << refused.ToString();
}

// Returns whether a runtime is made with `options` (it is destroyed at once).
bool Creates(const RuntimeOptions& options) {
  testing::Bed bed;
  return bed.CreateRuntime(options).ok();
}

TEST(BadInput, RuntimeOptions) {
  RuntimeOptions o;
  o.pollers = 0;
  ExpectCreateFails(o, "pollers");
  o = {};
  o.pollers = 2;
  o.poller_cpus = {0};
  ExpectCreateFails(o, "poller_cpus");
  o = {};
  o.poller_cpus = {100000};
  ExpectCreateFails(o, "CPU 100000");
  o = {};
  o.poll_batch = 0;
  ExpectCreateFails(o, "poll_batch");
  o = {};
  o.ack_threshold = 0;
  ExpectCreateFails(o, "ack_threshold");
  o = {};
  o.idle_budget = std::chrono::microseconds(-1);
  ExpectCreateFails(o, "idle_budget");
  o = {};
  o.consumers.clear();
  ExpectCreateFails(o, "consumers");
  o = {};
  o.consumers[0].queue_capacity = 0;
  ExpectCreateFails(o, "queue_capacity");
  // Sizes past the bound are named as they were given, not wrapped to a negative number.
  o = {};
  o.consumers[0].queue_capacity = SIZE_MAX;
  ExpectCreateFails(o, "queue_capacity is " + std::to_string(SIZE_MAX) + ", must be in 1..");
  o = {};
  o.consumers[0].spill_capacity = SIZE_MAX;
  ExpectCreateFails(o, "spill_capacity is " + std::to_string(SIZE_MAX) + ", must be in 1..");
  o = {};
  o.consumers[0].dispatch_batch = 5000;
  ExpectCreateFails(o, "dispatch_batch");
  o = {};
  o.consumers[0].cpu = -7;
  ExpectCreateFails(o, "cpu");
  o = {};
  o.max_registrations = 0;
  ExpectCreateFails(o, "max_registrations");
  // Waits past a day (up to microseconds::max(), which would overflow in nanoseconds) are
  // refused, not taken as "now".
  o = {};
  o.idle_budget = std::chrono::microseconds::max();
  ExpectCreateFails(o, "idle_budget");
  o = {};
  o.cq_park_after = std::chrono::hours(25);
  ExpectCreateFails(o, "cq_park_after");
  o = {};
  o.consumers[0].idle_spin = std::chrono::microseconds::max();
  ExpectCreateFails(o, "idle_spin");
  o = {};
  o.idle_budget = std::chrono::hours(24);
  o.cq_park_after = std::chrono::hours(24);
  EXPECT_TRUE(Creates(o));
  // What options.h calls ignored is not checked: an engine-driven consumer's cpu, an
  // engine-driven shard's poller_cpus entry.
  o = {};
  o.consumers[0].kind = ConsumerKind::kEngineDriven;
  o.consumers[0].cpu = 100000;
  EXPECT_TRUE(Creates(o));
  o = {};
  o.pollers = 2;
  o.engine_shards = {1};
  o.poller_cpus = {0, 100000};
  EXPECT_TRUE(Creates(o));
  o.poller_cpus = {100000, 0};  // shard 0 has a thread: its CPU must be one we may use
  ExpectCreateFails(o, "poller_cpus[0]: CPU 100000");
}

class BadCalls : public ::testing::Test {
 protected:
  void SetUp() override {
    RuntimeOptions options = testing::OwnedConsumers(2, 2);
    options.max_registrations = 2;
    CQD_ASSERT_OK(bed_.StartWithoutLedger(options));
  }
  testing::Bed bed_;
  std::unique_ptr<Runtime>& rt_ = bed_.rt;
  std::shared_ptr<SimDevice>& sim_ = bed_.sim;
  const DeviceId& dev_ = bed_.dev;
};

TEST_F(BadCalls, Devices) {
  EXPECT_EQ(rt_->AddSimDevice(nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt_->AddSimDevice(sim_).status().code(), StatusCode::kAlreadyExists);
}

// A device name nobody has fails with the names there are; on a machine with none at all (or no
// RDMA in the kernel) the message says how to get one: rxe, and where the docs are.
TEST_F(BadCalls, AMissingVerbsDeviceSaysWhatToDo) {
  const Result<DeviceId> opened = rt_->OpenVerbsDevice("cqd_no_such_device");
  ASSERT_FALSE(opened.ok());
  const std::string message = opened.status().message();
  EXPECT_TRUE(opened.status().code() == StatusCode::kNotFound ||
              opened.status().code() == StatusCode::kInternal)
      << opened.status().ToString();
  const bool none_here = message.find("(devices: none)") != std::string::npos ||
                         message.find("ibv_get_device_list") != std::string::npos;
  if (none_here) {
    EXPECT_NE(message.find("rdma link add rxe0 type rxe"), std::string::npos) << message;
    EXPECT_NE(message.find("docs/RXE.md"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("no RDMA device \"cqd_no_such_device\" (devices: "), std::string::npos)
        << message;
  }
}

TEST_F(BadCalls, Cqs) {
  EXPECT_EQ(rt_->CreateCq(99, 0).status().code(), StatusCode::kNotFound);
  auto wrong_shard = rt_->CreateCq(dev_, 2);
  EXPECT_EQ(wrong_shard.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shard.status().message().find("shard 2"), std::string::npos);
  CqOptions zero;
  zero.depth = 0;
  EXPECT_EQ(rt_->CreateCq(dev_, 0, zero).status().code(), StatusCode::kInvalidArgument);
  CqHandle empty;
  EXPECT_EQ(rt_->DestroyCq(empty).code(), StatusCode::kInvalidArgument);

  // Adoption: the CQ must use the shard's channel, and be adopted once.
  auto ch0 = rt_->SimChannelFor(dev_, 0);
  ASSERT_TRUE(ch0.ok());
  auto engine_cq = sim_->CreateCq(64, *ch0);
  ASSERT_TRUE(engine_cq.ok());
  auto wrong = rt_->AdoptCq(dev_, 1, *engine_cq);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("wrong shard"), std::string::npos);
  auto adopted = rt_->AdoptCq(dev_, 0, *engine_cq);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_EQ(rt_->AdoptCq(dev_, 0, *engine_cq).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(rt_->AdoptCq(dev_, 0, static_cast<SimCq*>(nullptr)).status().code(),
            StatusCode::kInvalidArgument);
  CQD_ASSERT_OK(rt_->DestroyCq(*adopted));
  CQD_ASSERT_OK(sim_->DestroyCq(*engine_cq));  // the engine destroys what it created
}

TEST_F(BadCalls, Registrations) {
  auto cq = rt_->CreateCq(dev_, 0);
  ASSERT_TRUE(cq.ok());
  testing::Recorder handler;

  // A QP whose CQ the runtime does not poll.
  auto foreign_cq = sim_->CreateCq(16, nullptr);
  ASSERT_TRUE(foreign_cq.ok());
  auto foreign_qp = sim_->CreateQp(*foreign_cq, *foreign_cq);
  ASSERT_TRUE(foreign_qp.ok());
  auto unknown = rt_->RegisterQp(**foreign_qp, handler, 0);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);

  auto qp = sim_->CreateQp(cq->sim(), cq->sim());
  ASSERT_TRUE(qp.ok());
  EXPECT_EQ(rt_->RegisterQp(**qp, handler, 7).status().code(), StatusCode::kInvalidArgument);
  auto reg = rt_->RegisterQp(**qp, handler, 0);
  ASSERT_TRUE(reg.ok());
  auto twice = rt_->RegisterQp(**qp, handler, 1);
  EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(twice.status().message().find("already registered"), std::string::npos);

  // A CQ with registered QPs cannot be destroyed.
  EXPECT_EQ(rt_->DestroyCq(*cq).code(), StatusCode::kFailedPrecondition);

  // max_registrations = 2.
  auto qp2 = sim_->CreateQp(cq->sim(), cq->sim());
  auto qp3 = sim_->CreateQp(cq->sim(), cq->sim());
  ASSERT_TRUE(qp2.ok() && qp3.ok());
  auto reg2 = rt_->RegisterQp(**qp2, handler, 0);
  ASSERT_TRUE(reg2.ok());
  EXPECT_EQ(rt_->RegisterQp(**qp3, handler, 0).status().code(), StatusCode::kResourceExhausted);
  reg2->Unregister();

  // Work request counts at the top of int are refused with the (positive) count they add up to.
  auto huge = rt_->RegisterQp(**qp3, handler, 0, QpOptions{INT32_MAX, INT32_MAX});
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find(" 4294967"), std::string::npos)
      << huge.status().ToString();

  reg->Unregister();
  reg->Unregister();  // idempotent
  reg2->Unregister();
  // No registration left, but the device still has QPs on it: its refusal, named once.
  Status busy = rt_->DestroyCq(*cq);
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(busy.message().rfind("DestroyCq: simulated device: ", 0), 0u) << busy.ToString();
  EXPECT_EQ(busy.message().find("DestroyCq", 1), std::string::npos) << busy.ToString();
  for (SimQp* q : {*qp, *qp2, *qp3, *foreign_qp}) CQD_ASSERT_OK(sim_->DestroyQp(q));
  CQD_ASSERT_OK(rt_->DestroyCq(*cq));
  CQD_ASSERT_OK(sim_->DestroyCq(*foreign_cq));
}

TEST_F(BadCalls, ConnectionManagement) {
  // A stand-in channel: an fd that never becomes readable, so nothing is ever read from it.
  rdma_event_channel channel{eventfd(0, EFD_CLOEXEC)};
  ASSERT_GE(channel.fd, 0);
  class : public CmHandler {
    void OnCmEvent(const CmEvent&) noexcept override {}
  } handler;
  EXPECT_EQ(rt_->WatchCmChannel(nullptr, handler, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt_->WatchCmChannel(&channel, handler, 9).code(), StatusCode::kInvalidArgument);
  CQD_ASSERT_OK(rt_->WatchCmChannel(&channel, handler, 1));
  EXPECT_EQ(rt_->WatchCmChannel(&channel, handler, 0).code(), StatusCode::kAlreadyExists);
  CQD_ASSERT_OK(rt_->UnwatchCmChannel(&channel));
  EXPECT_EQ(rt_->UnwatchCmChannel(&channel).code(), StatusCode::kNotFound);
  CQD_ASSERT_OK(rt_->WatchCmChannel(&channel, handler, 0));  // again, after unwatching

  testing::Recorder qp_handler;
  EXPECT_EQ(rt_->RegisterQp(static_cast<rdma_cm_id*>(nullptr), qp_handler, 0).status().code(),
            StatusCode::kInvalidArgument);
  rdma_cm_id no_qp{};  // an id before rdma_create_qp
  auto registered = rt_->RegisterQp(&no_qp, qp_handler, 0);
  EXPECT_EQ(registered.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(registered.status().message().find("no QP"), std::string::npos);
  EXPECT_EQ(rt_->FindVerbsDevice(nullptr).status().code(), StatusCode::kInvalidArgument);
  ibv_context not_added{};
  EXPECT_EQ(rt_->FindVerbsDevice(&not_added).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(rt_->UnwatchCmChannel(nullptr).code(), StatusCode::kInvalidArgument);

  CQD_ASSERT_OK(rt_->Shutdown());
  EXPECT_EQ(rt_->WatchCmChannel(&channel, handler, 0).code(), StatusCode::kFailedPrecondition);
  rt_.reset();
  close(channel.fd);
}

TEST_F(BadCalls, ConsumersAndShutdown) {
  EXPECT_EQ(rt_->Drain(0, 10), -EINVAL);  // runtime-owned
  EXPECT_EQ(rt_->Drain(9, 10), -EINVAL);  // no such consumer
  EXPECT_EQ(rt_->NotifyFd(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt_->NotifyFd(9).status().code(), StatusCode::kInvalidArgument);
  CQD_ASSERT_OK(rt_->Shutdown());
  CQD_ASSERT_OK(rt_->Shutdown());  // idempotent
  EXPECT_EQ(rt_->CreateCq(dev_, 0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt_->AddSimDevice(SimDevice::Create()).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(BadInputSim, DeviceCallsReturnErrors) {
  auto sim = SimDevice::Create();
  EXPECT_EQ(sim->CreateCq(0, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->DestroyCq(nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(sim->DestroyQp(nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(sim->CreateQp(nullptr, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->RaiseDeviceEvent(IBV_EVENT_PORT_ERR, 9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->RaiseDeviceEvent(IBV_EVENT_QP_FATAL).code(), StatusCode::kInvalidArgument);
  auto ch = sim->CreateChannel();
  ASSERT_TRUE(ch.ok());
  auto cq = sim->CreateCq(8, *ch);
  ASSERT_TRUE(cq.ok());
  EXPECT_EQ(sim->DestroyChannel(*ch).code(), StatusCode::kFailedPrecondition);  // CQ uses it
  CQD_ASSERT_OK(sim->DestroyCq(*cq));
  CQD_ASSERT_OK(sim->DestroyChannel(*ch));
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// Faults below the runtime: arming that fails, a channel that keeps failing, memory that runs
// out. None may lose a wakeup, spin, or throw.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::SumPollers;
using testing::WaitFor;

// If ibv_req_notify_cq fails, the CQ is not armed: the poller must try again rather than sleep
// for good on a CQ that will never raise an event.
TEST(Faults, FailedArmIsRetried) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger({}));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  // An adopted CQ, so that the fault is in place before the runtime ever arms it.
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(engine_cq, sim->CreateCq(256, channel));
  sim->FailRequestNotify(engine_cq, EIO, 1);
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->AdoptCq(dev, 0, engine_cq));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(engine_cq, engine_cq));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));

  ASSERT_TRUE(WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::arm_failures) >= 1; }));
  // A later sleep arms it again, for real; then a completion must wake the poller.
  ASSERT_TRUE(WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::arms) >= 2; }));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*rt));
  ASSERT_TRUE(InjectRecvs(qp, 0, 5));
  EXPECT_TRUE(WaitFor([&] { return handler.received() == 5; }, std::chrono::seconds(10)))
      << "lost wakeup: " << handler.received() << " of 5 delivered";
  reg.Unregister();
  CQD_ASSERT_OK(rt->DestroyCq(cq));
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(engine_cq));
}

// A completion channel whose reads keep failing (a device gone) must not make the event thread
// spin, and the shard's completions must still be delivered.
TEST(Faults, FailingChannelNeitherSpinsNorLosesWakeups) {
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build());
  Runtime* rt = bed.rt.get();
  SimDevice* sim = bed.sim.get();
  SimQp* qp = bed.qp;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(bed.dev, 0));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*rt));

  sim->FailGetEvent(channel, EIO, 1 << 30);
  const uint64_t calls_before = channel->get_event_calls();
  ASSERT_TRUE(InjectRecvs(qp, 0, 1));  // raises the event the poller is armed for
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().failed_fds == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // A level-triggered loop spinning on the readable fd would have called it countless times.
  EXPECT_LE(channel->get_event_calls() - calls_before, 2u);

  // The poller no longer relies on events: completions still arrive.
  ASSERT_TRUE(InjectRecvs(qp, 1, 9));
  EXPECT_TRUE(WaitFor([&] { return handler.received() == 10; }, std::chrono::seconds(10)));
  reg.Unregister();
  sim->FailGetEvent(channel, 0, 0);
}

// DEVICE_FATAL: every handler hears of it after the completions polled before it, the pollers
// stop arming the device's CQs, control calls fail promptly with kUnavailable, a teardown ends
// at once, and Shutdown and the destructor return.
TEST(Faults, DeviceFatal) {
  testing::OrphanLedger orphans;
  RuntimeOptions options = testing::EngineAndOwned(2);
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  std::vector<CqHandle> cqs;
  for (int i = 0; i < 4; ++i) cqs.push_back(rt->CreateCq(dev, i % 2).value());
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<testing::Recorder>> handlers;
  std::vector<Registration> regs;
  for (int i = 0; i < 8; ++i) {
    qps.push_back(sim->CreateQp(cqs[i % 4].sim(), cqs[(i + 1) % 4].sim()).value());
    handlers.push_back(std::make_unique<testing::Recorder>());
    regs.push_back(rt->RegisterQp(*qps.back(), *handlers.back(), i % 2).value());
  }
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(InjectRecvs(qps[i], 0, 10));
  ASSERT_TRUE(WaitFor([&] { return SumPollers(rt->GetStats(), &PollerStats::completions) == 80; }));
  // A CQ the engine made on a shard's channel, to adopt once the device has failed.
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(spare, sim->CreateCq(64, channel));

  sim->RaiseDeviceFatal();
  ASSERT_TRUE(testing::DrainUntil(*rt, 0, [&] {
    for (auto& h : handlers) {
      if (h->events() == 0) return false;
    }
    return true;
  }));
  for (auto& h : handlers) {
    std::vector<testing::Recorder::Entry> log = h->log();
    ASSERT_EQ(log.size(), 11u);
    EXPECT_TRUE(log.back().event);
    EXPECT_EQ(log.back().type, IBV_EVENT_DEVICE_FATAL);
  }
  // The device reports it (cqd_device_failed), with no CQ_ERR.
  const Stats failed = rt->GetStats();
  ASSERT_EQ(failed.devices.size(), 1u);
  EXPECT_EQ(failed.devices[0].failed, 1u);
  EXPECT_EQ(failed.devices[0].cq_errors, 0u);

  EXPECT_EQ(rt->CreateCq(dev, 0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(rt->AdoptCq(dev, 0, spare).status().code(), StatusCode::kUnavailable);
  CQD_ASSERT_OK(sim->DestroyCq(spare));
  CQD_ASSERT_OK_AND_ASSIGN(teardown, rt->TeardownQp(regs[0]));
  // This thread drained consumer 0: its Wait is refused, as on a live device (runtime.h).
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kFailedPrecondition);
  std::thread waiter([&] { EXPECT_EQ(teardown.Wait().code(), StatusCode::kUnavailable); });
  waiter.join();

  // Quiet afterwards: no arming of the dead device's CQs, no reads of its channels.
  ASSERT_TRUE(testing::WaitForPollersAsleep(*rt));
  const uint64_t arms = SumPollers(rt->GetStats(), &PollerStats::arms);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(SumPollers(rt->GetStats(), &PollerStats::arms), arms);

  for (auto& r : regs) r.Unregister();
  CQD_ASSERT_OK(rt->Shutdown());
  rt.reset();
  EXPECT_EQ(orphans.count.load(), 0u);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // their shadow memory cannot live under RLIMIT_AS
#else
constexpr bool kSanitized = false;
#endif

// Returns this process's virtual size in bytes.
uint64_t VirtualSize() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Runs `body` in a child process whose address space is capped at `headroom` bytes above the
// current size; returns its exit code (128 + signal if it died of one).
int RunWithAddressSpaceCap(uint64_t headroom, const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    rlimit limit{VirtualSize() + headroom, VirtualSize() + headroom};
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(100);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The largest accepted max_registrations must not preallocate its slots (a gigabyte), and no
// control call may throw when memory is short: it returns kResourceExhausted.
TEST(Faults, LargeRegistrationLimitNeedsNoMemoryUpFront) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS does not work under ASan/TSan";
  int code = RunWithAddressSpaceCap(uint64_t{384} << 20, [] {
    RuntimeOptions options;
    options.max_registrations = 1u << 24;
    testing::Bed bed;
    const Status created = bed.CreateRuntime(options);
    if (!created.ok()) return created.code() == StatusCode::kResourceExhausted ? 2 : 3;
    if (!bed.AddDevice().ok()) return 5;
    auto cq = bed.rt->CreateCq(bed.dev, 0);
    Recorder handler;
    std::vector<Registration> regs;
    for (int i = 0; i < 100; ++i) {
      auto qp = bed.sim->CreateQp(cq->sim(), cq->sim());
      auto reg = bed.rt->RegisterQp(**qp, handler, 0);
      if (!reg.ok()) return 4;
      regs.push_back(std::move(reg).value());
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: refused, 3: wrong status, 4: register failed, 5: no device, 134: threw";
}

TEST(Faults, CreateUnderMemoryPressureReturnsAStatus) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS does not work under ASan/TSan";
  int code = RunWithAddressSpaceCap(uint64_t{48} << 20, [] {
    RuntimeOptions options;
    options.pollers = 4;
    options.consumers.assign(64, ConsumerOptions{});
    for (auto& c : options.consumers) c.queue_capacity = 1u << 22;
    testing::Bed bed;
    const Status created = bed.CreateRuntime(options);
    if (created.ok()) return 0;
    return created.code() == StatusCode::kResourceExhausted ? 0 : 3;
  });
  EXPECT_EQ(code, 0) << "3: wrong status, 134: threw";
}

}  // namespace
}  // namespace cqd

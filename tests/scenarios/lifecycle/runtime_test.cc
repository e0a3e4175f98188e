// SPDX-License-Identifier: BSD-2-Clause
// The runtime's behaviour on the simulated device: engine-driven consumers, adopted CQs, orphans,
// async event routing (S14), unregistering from a handler, and injected faults.
#include "cqd/runtime.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "cqd/sim.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/base/thread_role.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::DeviceEventLog;
using testing::Recorder;
using testing::Topology;
using testing::WaitFor;

// The engine waits on the notify fd in its own epoll set, level- or edge-triggered, and drains in
// small steps: the fd must report every time work remains.
void DriveWithEpoll(uint32_t epoll_events) {
  RuntimeOptions options;
  options.consumers = {ConsumerOptions{}};
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 4));
  CQD_ASSERT_OK_AND_ASSIGN(fd, topo.rt->NotifyFd(0));
  int ep = epoll_create1(0);
  epoll_event ev{};
  ev.events = epoll_events;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);

  EXPECT_EQ(epoll_wait(ep, &ev, 1, 0), 0) << "readable with nothing queued";
  for (SimQp* qp : topo.qps) {
    for (uint64_t i = 0; i < 50; ++i) ASSERT_EQ(qp->Complete(i), 1);
  }
  uint64_t drained = 0;
  while (drained < 200) {
    int n = epoll_wait(ep, &ev, 1, 10000);
    ASSERT_EQ(n, 1) << "notify fd never became readable; drained " << drained;
    int got = topo.rt->Drain(0, 7);  // small max: the fd must stay readable while work remains
    ASSERT_GE(got, 0);
    drained += got;
  }
  EXPECT_EQ(topo.received(), 200u);
  EXPECT_EQ(topo.rt->Drain(0, 64), 0);
  EXPECT_EQ(epoll_wait(ep, &ev, 1, 0), 0) << "fd readable with nothing queued";
  for (const auto& h : topo.handlers) EXPECT_EQ(h->out_of_order(), 0u);
  close(ep);
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(Runtime, EngineDrivenConsumerLevelTriggered) { DriveWithEpoll(EPOLLIN); }
TEST(Runtime, EngineDrivenConsumerEdgeTriggered) { DriveWithEpoll(EPOLLIN | EPOLLET); }

TEST(Runtime, AdoptedCqIsPolledAndReleased) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(testing::OwnedConsumers(2, 1)));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 1));
  CQD_ASSERT_OK_AND_ASSIGN(engine_cq, sim->CreateCq(256, channel));
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->AdoptCq(dev, 1, engine_cq));
  EXPECT_EQ(cq.sim(), engine_cq);
  EXPECT_EQ(cq.shard(), 1);
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(engine_cq, engine_cq));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  {
    CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
    for (int round = 0; round < 20; ++round) {  // idle between rounds: events get read and acked
      ASSERT_EQ(qp->Complete(round), 1);
      ASSERT_TRUE(WaitFor([&] { return handler.received() == uint64_t(round) + 1; }));
    }
  }
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));          // releases: acks what the runtime read
  CQD_ASSERT_OK(sim->DestroyCq(engine_cq));  // would hang on an unacked event (S2)
}

TEST(Runtime, UnknownQpsGoToOrphanHandler) {
  testing::OrphanLedger orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 1));
  ibv_wc wc{};
  wc.qp_num = 0xabcde;  // no such registration
  ASSERT_EQ(topo.cqs[0].sim()->Inject({&wc, 1}), 1);
  ASSERT_TRUE(WaitFor([&] { return orphans.count.load() == 1; }));
  EXPECT_EQ(topo.rt->GetStats().orphans, 1u);
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(Runtime, UnregisterFromOwnHandler) {
  class SelfUnregistering : public QpHandler {
   public:
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      calls.fetch_add(1);
      if (registration.registered()) {
        registration.Unregister();  // must not deadlock on its own consumer
        after_unregister_calls.store(0);
        unregistered.store(true, std::memory_order_release);  // publishes `registration`
      } else {
        after_unregister_calls.fetch_add(1);
      }
      (void)wcs;
    }
    Registration registration;
    std::atomic<int> calls{0};
    std::atomic<int> after_unregister_calls{0};
    std::atomic<bool> unregistered{false};
  };
  testing::OrphanLedger orphans;
  RuntimeOptions options;
  options.orphan_handler = &orphans;
  options.consumers[0].dispatch_batch = 1;  // one completion per call
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, topo.sim->CreateQp(topo.cqs[0].sim(), topo.cqs[0].sim()));
  SelfUnregistering handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, topo.rt->RegisterQp(*qp, handler, 0));
  handler.registration = std::move(reg);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_EQ(qp->Complete(i), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.calls.load() + orphans.count.load() == 10; }));
  // The handler's write of its Registration must happen-before this thread destroys it.
  ASSERT_TRUE(WaitFor([&] { return handler.unregistered.load(std::memory_order_acquire); }));
  EXPECT_EQ(handler.calls.load(), 1);
  EXPECT_EQ(handler.after_unregister_calls.load(), 0);
  CQD_ASSERT_OK(topo.sim->DestroyQp(qp));
  CQD_ASSERT_OK(topo.TearDown());
}

TEST(Runtime, ShutdownFromHandlerIsRefused) {
  class ShutdownCaller : public QpHandler {
   public:
    void OnCompletions(std::span<const ibv_wc>) noexcept override {
      code.store(static_cast<int>(rt->Shutdown().code()));
    }
    Runtime* rt = nullptr;
    std::atomic<int> code{-1};
  };
  Topology topo;
  CQD_ASSERT_OK(topo.Build(RuntimeOptions{}, 1, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, topo.sim->CreateQp(topo.cqs[0].sim(), topo.cqs[0].sim()));
  ShutdownCaller handler;
  handler.rt = topo.rt.get();
  CQD_ASSERT_OK_AND_ASSIGN(reg, topo.rt->RegisterQp(*qp, handler, 0));
  ASSERT_EQ(qp->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.code.load() != -1; }));
  EXPECT_EQ(handler.code.load(), static_cast<int>(StatusCode::kFailedPrecondition));
  reg.Unregister();
  CQD_ASSERT_OK(topo.sim->DestroyQp(qp));
  CQD_ASSERT_OK(topo.TearDown());
}

// A CmHandler can also run outside every batch, on the owned consumer or run-to-completion
// poller that dispatches its last items while a Shutdown joins it (CM events handed on to a
// closed consumer run on the thread that handed them on, in a callback scope; on a poller, with
// its wait duty). A Shutdown from there waited for the first one, which waited to join it. The
// scopes are what those threads hold at that point; any cqd callback is refused.
TEST(Runtime, ShutdownFromACallbackOutsideABatchIsRefused) {
  Topology topo;
  CQD_ASSERT_OK(topo.Build(RuntimeOptions{}, 1, 0));
  {
    const internal::CallbackScope cm_handler;
    const Status refused = topo.rt->Shutdown();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
    EXPECT_TRUE(Runtime::InCallback());
  }
  {
    const internal::HostedDispatchScope on_a_poller([](void*) {}, nullptr);
    const Status refused = topo.rt->Shutdown();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  }
  // Refused, not done: the runtime still runs and shuts down from the engine's thread.
  ASSERT_FALSE(Runtime::InCallback());
  CQD_ASSERT_OK_AND_ASSIGN(qp, topo.sim->CreateQp(topo.cqs[0].sim(), topo.cqs[0].sim()));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, topo.rt->RegisterQp(*qp, handler, 0));
  ASSERT_EQ(qp->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 1; }));
  reg.Unregister();
  CQD_ASSERT_OK(topo.sim->DestroyQp(qp));
  CQD_ASSERT_OK(topo.TearDown());
}

// OrphanHandler and DeviceEventHandler run on runtime threads: calls into the runtime from them are
// refused with a status instead of deadlocking against a control call waiting for that thread.
TEST(Runtime, CallsFromRuntimeThreadsAreRefused) {
  class Reentrant : public DeviceEventHandler {
   public:
    void OnDeviceEvent(const AsyncEvent&) noexcept override {
      create = static_cast<int>(rt->CreateCq(dev, 0).status().code());
      shutdown = static_cast<int>(rt->Shutdown().code());
      // Refused before the arguments are looked at.
      add_null = static_cast<int>(rt->AddSimDevice(nullptr).status().code());
      find_null = static_cast<int>(rt->FindVerbsDevice(nullptr).status().code());
      reg->Unregister();
      still_registered = reg->registered();
      const Stats stats = rt->GetStats();  // all but the CQs (they need the control mutex)
      stats_orphans = stats.orphans;
      stats_cqs = stats.cqs.size();
      done.store(true);
    }
    Runtime* rt = nullptr;
    DeviceId dev = 0;
    Registration* reg = nullptr;
    int create = -1, shutdown = -1, add_null = -1, find_null = -1;
    uint64_t stats_orphans = 0;
    size_t stats_cqs = 99;
    bool still_registered = false;
    std::atomic<bool> done{false};
  };
  Reentrant handler;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(RuntimeOptions{}, {}, &handler));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
  Recorder qp_handler;
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, qp_handler, 0));
  CQD_ASSERT_OK_AND_ASSIGN(stranger, sim->CreateQp(cq.sim(), cq.sim()));  // never registered
  ASSERT_EQ(stranger->Complete(1), 1);
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().orphans == 1; }));
  handler.rt = rt.get();
  handler.dev = dev;
  handler.reg = &reg;
  CQD_ASSERT_OK(sim->RaiseDeviceEvent(IBV_EVENT_PORT_ACTIVE, 1));
  ASSERT_TRUE(WaitFor([&] { return handler.done.load(); }));
  EXPECT_EQ(handler.create, static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(handler.shutdown, static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(handler.add_null, static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(handler.find_null, static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(handler.still_registered);
  EXPECT_EQ(handler.stats_orphans, 1u);
  EXPECT_EQ(handler.stats_cqs, 0u);
  reg.Unregister();  // from an ordinary thread it works
  EXPECT_FALSE(reg.registered());
  CQD_ASSERT_OK(sim->DestroyQp(stranger));
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// An event for a CQ the engine put on a runtime channel without adopting it is acked at once, so
// the engine's destroy of that CQ returns (S2).
TEST(Runtime, StrayEventsAreAcked) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(RuntimeOptions{}));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(channel, rt->SimChannelFor(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(engine_cq, sim->CreateCq(16, channel));
  for (int i = 0; i < 3; ++i) sim->AddSpuriousEvent(engine_cq);
  ASSERT_TRUE(WaitFor([&] {
    pollfd p{engine_cq->channel()->fd(), POLLIN, 0};
    return poll(&p, 1, 0) == 0;  // all three read by the event thread
  }));
  CQD_ASSERT_OK(sim->DestroyCq(engine_cq));  // would wait forever on an unacked event
}

// A CQ whose destroy fails (a QP still uses it) goes back to its poller and keeps working in
// event mode, also when an event raced the failed destroy.
TEST(Runtime, FailedDestroyLeavesCqWorking) {
  RuntimeOptions options;
  options.idle_budget = std::chrono::microseconds(0);
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_EQ(qp->Complete(i), 1);  // may raise an event while the destroy below is retiring
    Status s = rt->DestroyCq(cq);   // the QP is not registered, but it exists: EBUSY
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    ASSERT_TRUE(WaitFor([&] { return cq.sim()->size() == 0; }))  // polled (as an orphan)
        << "round " << i << ": the CQ was not polled after a failed destroy";
  }
  CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*qp, handler, 0));
  ASSERT_EQ(qp->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 1; }));
  reg.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// S14: every QP event reaches its QP's handler; port and SRQ events reach the device handler.
TEST(Runtime, AsyncEventsAreRouted) {
  DeviceEventLog device_events;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(testing::OwnedConsumers(1, 2), {}, &device_events));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp_a, sim->CreateQp(cq.sim(), cq.sim()));
  CQD_ASSERT_OK_AND_ASSIGN(qp_b, sim->CreateQp(cq.sim(), cq.sim()));
  Recorder a, b;
  a.qp_num = qp_a->qp_num();
  b.qp_num = qp_b->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg_a, rt->RegisterQp(*qp_a, a, 0));
  CQD_ASSERT_OK_AND_ASSIGN(reg_b, rt->RegisterQp(*qp_b, b, 1));

  const ibv_event_type qp_events[] = {IBV_EVENT_QP_FATAL,      IBV_EVENT_QP_REQ_ERR,
                                      IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_COMM_EST,
                                      IBV_EVENT_SQ_DRAINED,    IBV_EVENT_PATH_MIG,
                                      IBV_EVENT_PATH_MIG_ERR,  IBV_EVENT_QP_LAST_WQE_REACHED};
  for (ibv_event_type type : qp_events) CQD_ASSERT_OK(sim->RaiseQpEvent(qp_a, type));
  ASSERT_TRUE(WaitFor([&] { return a.async_events().size() == std::size(qp_events); }));
  for (ibv_event_type type : qp_events) EXPECT_TRUE(a.Saw(type)) << type;
  EXPECT_TRUE(b.async_events().empty()) << "another QP's event reached b";

  const ibv_event_type device_types[] = {
      IBV_EVENT_PORT_ACTIVE,       IBV_EVENT_PORT_ERR,   IBV_EVENT_LID_CHANGE,
      IBV_EVENT_PKEY_CHANGE,       IBV_EVENT_GID_CHANGE, IBV_EVENT_SM_CHANGE,
      IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_SRQ_ERR,    IBV_EVENT_SRQ_LIMIT_REACHED};
  for (ibv_event_type type : device_types) CQD_ASSERT_OK(sim->RaiseDeviceEvent(type, 1));
  ASSERT_TRUE(WaitFor([&] {
    for (ibv_event_type type : device_types) {
      if (!device_events.Saw(type)) return false;
    }
    return true;
  }));

  // DEVICE_FATAL: the device handler and every QP on the device hear of it; new CQs fail;
  // destroying what exists still returns.
  sim->RaiseDeviceFatal();
  ASSERT_TRUE(WaitFor([&] {
    return device_events.Saw(IBV_EVENT_DEVICE_FATAL) && a.Saw(IBV_EVENT_DEVICE_FATAL) &&
           b.Saw(IBV_EVENT_DEVICE_FATAL);
  }));
  EXPECT_EQ(rt->CreateCq(dev, 0).status().code(), StatusCode::kUnavailable);
  reg_a.Unregister();
  reg_b.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp_a));
  CQD_ASSERT_OK(sim->DestroyQp(qp_b));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// S13: once a QP's async event is acked, ibv_destroy_qp may return and a new QP may get its number
// and register. The event thread looks the number up before it acks, while the number can name no
// other QP, so an event raised after the QP's registration ended reaches the device handler and
// never the QP that took the number. The sim's after-ack hook has this thread reuse the number
// between the ack and whatever the event thread does next.
TEST(Runtime, AnOldQpsEventNeverReachesTheQpThatTookItsNumber) {
  struct AfterAck {
    std::mutex mu;
    std::condition_variable cv;
    bool reused = false;
  };
  static AfterAck gate;  // static: the hook may outlive a failed assertion's early return
  {
    const std::lock_guard<std::mutex> lock(gate.mu);
    gate.reused = false;
  }
  DeviceEventLog device_events;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(testing::OwnedConsumers(1, 1), {}, &device_events));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(old_qp, sim->CreateQp(cq.sim(), cq.sim()));
  const uint32_t number = old_qp->qp_num();
  Recorder old_handler, new_handler;
  {
    CQD_ASSERT_OK_AND_ASSIGN(reg, rt->RegisterQp(*old_qp, old_handler, 0));
    reg.Unregister();
  }
  auto* impl = static_cast<sim_internal::SimDeviceImpl*>(sim.get());
  impl->SetAfterAsyncAckForTest(
      [](void* arg) {
        auto* g = static_cast<AfterAck*>(arg);
        std::unique_lock<std::mutex> lock(g->mu);
        // Bounded, so that a RegisterQp that needed this thread would show as a failure below.
        g->cv.wait_for(lock, std::chrono::seconds(10), [g] { return g->reused; });
      },
      &gate);
  CQD_ASSERT_OK(sim->RaiseQpEvent(old_qp, IBV_EVENT_QP_FATAL));
  // Read (not yet acked) before the destroy, which would otherwise drop it unread.
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().async_events >= 1; }));
  CQD_ASSERT_OK(sim->DestroyQp(old_qp));  // returns once the event is acked
  CQD_ASSERT_OK_AND_ASSIGN(new_qp, sim->CreateQp(cq.sim(), cq.sim()));
  ASSERT_EQ(new_qp->qp_num(), number);  // the sim hands out the last freed number first
  new_handler.qp_num = number;
  Result<Registration> new_reg = rt->RegisterQp(*new_qp, new_handler, 0);
  {
    const std::lock_guard<std::mutex> lock(gate.mu);
    gate.reused = true;
  }
  gate.cv.notify_all();
  CQD_ASSERT_OK(new_reg.status());
  ASSERT_TRUE(WaitFor([&] {
    return device_events.Saw(IBV_EVENT_QP_FATAL) || !new_handler.async_events().empty();
  }));
  EXPECT_TRUE(device_events.Saw(IBV_EVENT_QP_FATAL));
  EXPECT_TRUE(new_handler.async_events().empty())
      << "the destroyed QP's QP_FATAL reached the new QP";
  EXPECT_TRUE(old_handler.async_events().empty());
  impl->SetAfterAsyncAckForTest(nullptr, nullptr);
  new_reg->Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(new_qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// A device belongs to one runtime: each read of an async event takes it from every other reader,
// so a second runtime's add is refused (it would otherwise take a share of the first's events),
// until the first is destroyed. Every event then reaches the QP's handler in the runtime that
// has the device.
TEST(Runtime, ADeviceBelongsToOneRuntimeAtATime) {
  DeviceEventLog first_events, second_events;  // outlive the runtimes
  testing::Bed first_bed, second_bed;          // the first's device is the one both try to add
  CQD_ASSERT_OK(first_bed.CreateRuntime(testing::OwnedConsumers(1, 1)));
  CQD_ASSERT_OK(second_bed.CreateRuntime(testing::OwnedConsumers(1, 1)));
  CQD_ASSERT_OK(first_bed.AddDevice({}, &first_events));
  auto& sim = first_bed.sim;
  auto& first = first_bed.rt;
  auto& second = second_bed.rt;
  const DeviceId dev = first_bed.dev;
  Result<DeviceId> refused = second->AddSimDevice(sim, &second_events);
  ASSERT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("another runtime"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(first->AddSimDevice(sim).status().code(), StatusCode::kAlreadyExists);

  CQD_ASSERT_OK_AND_ASSIGN(cq, first->CreateCq(dev, 0));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq.sim(), cq.sim()));
  Recorder handler;
  handler.qp_num = qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, first->RegisterQp(*qp, handler, 0));
  constexpr size_t kEvents = 20;
  for (size_t i = 0; i < kEvents; ++i) CQD_ASSERT_OK(sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  ASSERT_TRUE(WaitFor([&] { return handler.async_events().size() == kEvents; }))
      << handler.async_events().size() << " of " << kEvents << " events reached the handler";
  EXPECT_FALSE(second_events.Saw(IBV_EVENT_COMM_EST));
  reg.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(first->DestroyCq(cq));

  // Shut down is not enough (the runtime still holds the device's records); destroyed is.
  CQD_ASSERT_OK(first->Shutdown());
  EXPECT_EQ(second->AddSimDevice(sim).status().code(), StatusCode::kAlreadyExists);
  first.reset();
  CQD_ASSERT_OK_AND_ASSIGN(again, second->AddSimDevice(sim, &second_events));
  sim->RaiseDeviceFatal();
  EXPECT_TRUE(WaitFor([&] { return second_events.Saw(IBV_EVENT_DEVICE_FATAL); }));
  (void)again;
}

// S11 through the runtime: an overflowed CQ faults every QP on it, and only those.
TEST(Runtime, CqOverflowFaultsItsQps) {
  DeviceEventLog device_events;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(testing::OwnedConsumers(1, 1), {}, &device_events));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqOptions small;
  small.depth = 8;
  CQD_ASSERT_OK_AND_ASSIGN(doomed, rt->CreateCq(dev, 0, small));
  CQD_ASSERT_OK_AND_ASSIGN(healthy, rt->CreateCq(dev, 0, small));
  CQD_ASSERT_OK_AND_ASSIGN(qp_a, sim->CreateQp(doomed.sim(), doomed.sim()));
  CQD_ASSERT_OK_AND_ASSIGN(qp_b, sim->CreateQp(healthy.sim(), healthy.sim()));
  Recorder a, b;
  a.qp_num = qp_a->qp_num();
  b.qp_num = qp_b->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg_a, rt->RegisterQp(*qp_a, a, 0));
  CQD_ASSERT_OK_AND_ASSIGN(reg_b, rt->RegisterQp(*qp_b, b, 0));
  std::vector<ibv_wc> burst(9);
  for (auto& wc : burst) wc.qp_num = qp_a->qp_num();
  EXPECT_EQ(doomed.sim()->Inject(burst, false, /*overflow=*/true), -1);
  ASSERT_TRUE(WaitFor([&] {
    return a.Saw(IBV_EVENT_CQ_ERR) && a.Saw(IBV_EVENT_QP_FATAL) &&
           device_events.Saw(IBV_EVENT_CQ_ERR);
  }));
  for (const auto& e : a.async_events()) {
    if (e.type == IBV_EVENT_CQ_ERR) {
      EXPECT_EQ(e.cq_id, doomed.id());
    }
  }
  EXPECT_TRUE(b.async_events().empty());
  // Counted for the device (cqd_device_cq_errors_total), which has not failed.
  const Stats after_error = rt->GetStats();
  ASSERT_EQ(after_error.devices.size(), 1u);
  EXPECT_EQ(after_error.devices[0].cq_errors, 1u);
  EXPECT_EQ(after_error.devices[0].failed, 0u);
  // The healthy CQ keeps working.
  ASSERT_EQ(qp_b->Complete(0), 1);
  ASSERT_TRUE(WaitFor([&] { return b.received() == 1; }));
  // The failed poll is counted (CqStats::poll_errors), and the CQ is left alone from then on:
  // passes that poll the healthy one never poll it again.
  auto poll_errors = [&](uint32_t id) {
    for (const CqStats& c : rt->GetStats().cqs) {
      if (c.id == id) return c.poll_errors;
    }
    return UINT64_MAX;
  };
  ASSERT_TRUE(WaitFor([&] { return poll_errors(doomed.id()) == 1; }));
  for (uint64_t i = 1; i < 20; ++i) {
    ASSERT_EQ(qp_b->Complete(i), 1);
    ASSERT_TRUE(WaitFor([&] { return b.received() == i + 1; }));
  }
  EXPECT_EQ(poll_errors(doomed.id()), 1u);
  EXPECT_EQ(poll_errors(healthy.id()), 0u);
  reg_a.Unregister();
  reg_b.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp_a));
  CQD_ASSERT_OK(sim->DestroyQp(qp_b));
  CQD_ASSERT_OK(rt->DestroyCq(doomed));
  CQD_ASSERT_OK(rt->DestroyCq(healthy));
}

// Injected EINTR/EAGAIN on the channel and async fds, and events with an empty CQ (S5), do not
// lose or duplicate anything.
TEST(Runtime, SurvivesInjectedFaults) {
  RuntimeOptions options = testing::OwnedConsumers(1, 1);
  options.idle_budget = std::chrono::microseconds(0);  // arm and sleep at once: events matter
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 1));
  SimQp* qp = topo.qps[0];
  CQD_ASSERT_OK_AND_ASSIGN(channel, topo.rt->SimChannelFor(topo.dev, 0));
  for (uint64_t i = 0; i < 200; ++i) {
    switch (i % 4) {
      case 0:
        topo.sim->FailGetEvent(channel, EINTR, 2);
        break;
      case 1:
        topo.sim->FailGetEvent(channel, EAGAIN, 1);
        break;
      case 2:
        topo.sim->AddSpuriousEvent(topo.cqs[0].sim());
        break;
      case 3:
        topo.sim->FailGetAsyncEvent(EINTR, 1);
        break;
    }
    ASSERT_EQ(qp->Complete(i), 1);
    ASSERT_TRUE(WaitFor([&] { return topo.handlers[0]->received() == i + 1; }))
        << "completion " << i << " was not delivered";
  }
  CQD_ASSERT_OK(topo.sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  ASSERT_TRUE(WaitFor([&] { return topo.handlers[0]->Saw(IBV_EVENT_COMM_EST); }));
  EXPECT_EQ(topo.handlers[0]->out_of_order(), 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// Run-to-completion consumers (ConsumerKind::kRunToCompletion): handlers on the poller's thread,
// with the guarantees of the other kinds: order and exactly-once, events behind completions,
// Unregister (from any thread, and from the handler), TeardownQp, control calls from handlers on
// two pollers at once, sleeping pollers, Shutdown, and bad input.
#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::InjectRecvs;
using testing::OneQp;
using testing::OrphanLedger;
using testing::Recorder;
using testing::Topology;
using testing::WaitFor;
using testing::WaitForPollersAsleep;

constexpr uint64_t kOld = 100;  // wr_ids of a QP retired in the middle of a poll

// `pollers` shards, consumer i running to completion on poller i.
RuntimeOptions RtcOptions(int pollers, bool busy = false) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.busy_poll = busy;
  options.consumers.assign(pollers, ConsumerOptions{});
  for (int i = 0; i < pollers; ++i) {
    options.consumers[i].kind = ConsumerKind::kRunToCompletion;
    options.consumers[i].poller = i;
  }
  return options;
}

// With the default spill the poller dispatches straight from it (nothing is ever queued); with a
// spill of 2 most items go through the queue and the two ways alternate.
TEST(RunToCompletion, HandlersRunOnTheirPollerInOrderExactlyOnce) {
  for (int variant = 0; variant < 4; ++variant) {
    const bool busy = variant & 1;
    const size_t spill = (variant & 2) ? 2 : ConsumerOptions{}.spill_capacity;
    RuntimeOptions options = RtcOptions(2, busy);
    for (ConsumerOptions& c : options.consumers) c.spill_capacity = spill;
    testing::Bed bed;
    CQD_ASSERT_OK(bed.StartWithoutLedger(options));
    auto& rt = bed.rt;
    auto& sim = bed.sim;
    const DeviceId dev = bed.dev;
    std::vector<CqHandle> cqs = {rt->CreateCq(dev, 0).value(), rt->CreateCq(dev, 1).value()};
    std::vector<SimQp*> qps;
    std::vector<std::unique_ptr<Recorder>> handlers;
    std::vector<Registration> regs;
    for (int i = 0; i < 4; ++i) {
      SimCq* cq = cqs[i % 2].sim();
      qps.push_back(sim->CreateQp(cq, cq).value());
      handlers.push_back(std::make_unique<Recorder>());
      handlers.back()->qp_num = qps.back()->qp_num();
      regs.push_back(rt->RegisterQp(*qps.back(), *handlers.back(), i % 2).value());
    }
    constexpr int kPerQp = 3000;
    std::vector<std::thread> injectors;
    for (int i = 0; i < 4; ++i) {
      injectors.emplace_back([&, i] {
        for (int k = 0; k < kPerQp; ++k) {
          while (qps[i]->Complete(k) != 1) std::this_thread::yield();  // CQ full: retry
        }
      });
    }
    for (auto& t : injectors) t.join();
    ASSERT_TRUE(WaitFor([&] {
      uint64_t sum = 0;
      for (auto& h : handlers) sum += h->received();
      return sum == 4u * kPerQp;
    }));
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(handlers[i]->received(), static_cast<uint64_t>(kPerQp));
      EXPECT_EQ(handlers[i]->out_of_order(), 0u);
      EXPECT_EQ(handlers[i]->concurrent_calls(), 0u);
      EXPECT_EQ(handlers[i]->thread_names(),
                std::set<std::string>{"cqd-poll" + std::to_string(i % 2)})
          << "busy " << busy << ", spill " << spill;
    }
    Stats stats = rt->GetStats();
    EXPECT_EQ(stats.consumers[0].delivered + stats.consumers[1].delivered, 4u * kPerQp);
    if (spill > 2) {  // a pass polls at most poll_batch per CQ: the spill never fills
      for (const ConsumerStats& c : stats.consumers) EXPECT_EQ(c.high_water, 0u) << c.name;
    }
    regs.clear();
    for (SimQp* qp : qps) CQD_ASSERT_OK(sim->DestroyQp(qp));
    for (CqHandle cq : cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
    CQD_ASSERT_OK(rt->Shutdown());
  }
}

// A sleeping poller wakes for completions and for async events, and an event follows every
// completion that was in the QP's CQ when it was read.
TEST(RunToCompletion, EventsFollowCompletionsAndWakeASleepingPoller) {
  CqOptions cq_options;
  cq_options.solicited_only = true;  // unsolicited completions wait in the CQ, unseen
  OneQp one;
  CQD_ASSERT_OK(one.Build(RtcOptions(1), cq_options));
  auto& rt = one.rt;
  auto& sim = one.sim;
  SimQp* qp = one.qp;
  CqHandle cq = one.cq;
  Recorder handler;
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();
  ASSERT_TRUE(WaitForPollersAsleep(*rt));
  ASSERT_TRUE(InjectRecvs(qp, 0, 40));
  CQD_ASSERT_OK(sim->RaiseQpEvent(qp, IBV_EVENT_COMM_EST));
  ASSERT_TRUE(WaitFor([&] { return handler.events() == 1; }));
  std::vector<Recorder::Entry> log = handler.log();
  ASSERT_EQ(log.size(), 41u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_FALSE(log[i].event);
    EXPECT_EQ(log[i].wr_id, static_cast<uint64_t>(i));
  }
  EXPECT_TRUE(log[40].event);
  EXPECT_EQ(log[40].type, IBV_EVENT_COMM_EST);

  ASSERT_TRUE(WaitForPollersAsleep(*rt));
  ASSERT_TRUE(InjectRecvs(qp, 40, 1, /*solicited=*/true));
  ASSERT_TRUE(WaitFor([&] { return handler.completions() == 41; }));
  reg.Unregister();
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// Unregister from another thread while completions flow: once it returns, the handler is never
// called again; what was left goes to the orphan handler; nothing is lost or doubled.
TEST(RunToCompletion, UnregisterFromAnotherThreadEndsCalls) {
  OrphanLedger orphans;
  RuntimeOptions options = RtcOptions(1);
  options.orphan_handler = &orphans;
  OneQp one;
  CQD_ASSERT_OK(one.Build(options));
  auto& rt = one.rt;
  auto& sim = one.sim;
  SimQp* qp = one.qp;
  CqHandle cq = one.cq;
  std::atomic<bool> unregistered{false};
  std::atomic<uint64_t> late{0}, delivered{0};
  struct Handler : QpHandler {
    std::atomic<bool>* unregistered;
    std::atomic<uint64_t>* late;
    std::atomic<uint64_t>* delivered;
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      if (unregistered->load(std::memory_order_acquire)) late->fetch_add(1);
      delivered->fetch_add(wcs.size());
    }
  } handler;
  handler.unregistered = &unregistered;
  handler.late = &late;
  handler.delivered = &delivered;
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> injected{0};
  std::thread injector([&] {
    for (uint64_t i = 0; !stop.load(); ++i) {
      if (qp->Complete(i) == 1) injected.fetch_add(1);
    }
  });
  ASSERT_TRUE(WaitFor([&] { return delivered.load() > 1000; }));
  reg.Unregister();
  unregistered.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.store(true);
  injector.join();
  ASSERT_TRUE(WaitFor([&] { return delivered.load() + orphans.count.load() == injected.load(); }))
      << delivered.load() << " + " << orphans.count.load() << " of " << injected.load();
  EXPECT_EQ(late.load(), 0u);
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// Handlers on two pollers make control calls at the same time, each of which waits for both
// pollers (register, unregister, tear down, stats): none may deadlock, and each call works.
TEST(RunToCompletion, HandlersOnTwoPollersMakeControlCallsAtOnce) {
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(RtcOptions(2)));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  std::vector<CqHandle> cqs = {rt->CreateCq(dev, 0).value(), rt->CreateCq(dev, 1).value()};
  struct Churner : QpHandler {
    Runtime* rt;
    SimDevice* sim;
    SimCq* cq;
    ConsumerId consumer;
    std::atomic<int> rounds{0};
    std::atomic<int> failures{0};
    std::vector<std::pair<SimQp*, Teardown>> torn_down;  // this handler's only
    Recorder other;
    void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
      for (size_t i = 0; i < wcs.size(); ++i) {
        // Two fresh QPs, registered from this handler: one unregistered and destroyed at once,
        // one torn down (it finishes once this handler returns: its markers come this way).
        for (int k = 0; k < 2; ++k) {
          auto qp = sim->CreateQp(cq, cq);
          if (!qp.ok()) {
            failures.fetch_add(1);
            continue;
          }
          auto reg = rt->RegisterQp(**qp, other, consumer);
          if (!reg.ok()) {
            failures.fetch_add(1);
            continue;
          }
          if (k == 0) {
            reg->Unregister();
            if (!sim->DestroyQp(*qp).ok()) failures.fetch_add(1);
            continue;
          }
          auto teardown = rt->TeardownQp(*reg);
          if (!teardown.ok()) {
            failures.fetch_add(1);
            continue;
          }
          torn_down.emplace_back(*qp, *teardown);
        }
        std::erase_if(torn_down, [&](auto& entry) {
          if (!entry.second.done()) return false;
          if (!entry.second.Wait().ok() || !sim->DestroyQp(entry.first).ok()) {
            failures.fetch_add(1);
          }
          return true;
        });
        (void)rt->GetStats();
        rounds.fetch_add(1);
      }
    }
  };
  Churner churners[2];
  std::vector<SimQp*> qps;
  std::vector<Registration> regs;
  for (int i = 0; i < 2; ++i) {
    churners[i].rt = rt.get();
    churners[i].sim = sim.get();
    churners[i].cq = cqs[i].sim();
    churners[i].consumer = static_cast<ConsumerId>(i);
    qps.push_back(sim->CreateQp(cqs[i].sim(), cqs[i].sim()).value());
    regs.push_back(rt->RegisterQp(*qps[i], churners[i], i).value());
  }
  constexpr int kRounds = 50;
  for (int k = 0; k < kRounds; ++k) {
    // A handler's round takes many control calls: wait for room in the CQ, as a sender waits
    // for credits, rather than assume the pollers keep up.
    for (SimQp* qp : qps) ASSERT_TRUE(WaitFor([&] { return qp->Complete(k) == 1; }));
  }
  ASSERT_TRUE(WaitFor([&] { return churners[0].rounds + churners[1].rounds == 2 * kRounds; }))
      << churners[0].rounds << " " << churners[1].rounds;
  regs.clear();
  for (Churner& churner : churners) {
    EXPECT_EQ(churner.failures.load(), 0);
    for (auto& [qp, teardown] : churner.torn_down) {
      EXPECT_TRUE(teardown.Wait().ok());
      EXPECT_TRUE(sim->DestroyQp(qp).ok());
    }
  }
  for (SimQp* qp : qps) CQD_ASSERT_OK(sim->DestroyQp(qp));
  for (CqHandle cq : cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
  CQD_ASSERT_OK(rt->Shutdown());
}

// A handler unregisters its own QP: it is never called again, and the rest become orphans.
TEST(RunToCompletion, HandlerUnregistersItself) {
  OrphanLedger orphans;
  RuntimeOptions options = RtcOptions(1);
  options.orphan_handler = &orphans;
  CqOptions cq_options;
  cq_options.solicited_only = true;
  OneQp one;
  CQD_ASSERT_OK(one.Build(options, cq_options));
  auto& rt = one.rt;
  auto& sim = one.sim;
  SimQp* qp = one.qp;
  CqHandle cq = one.cq;
  struct Handler : QpHandler {
    Registration* reg = nullptr;
    std::atomic<int> calls{0};
    void OnCompletions(std::span<const ibv_wc>) noexcept override {
      calls.fetch_add(1);
      reg->Unregister();
    }
  } handler;
  Registration reg = rt->RegisterQp(*qp, handler, 0).value();
  handler.reg = &reg;
  ASSERT_TRUE(WaitForPollersAsleep(*rt));
  ASSERT_TRUE(InjectRecvs(qp, 0, 10));
  ASSERT_TRUE(InjectRecvs(qp, 10, 1, /*solicited=*/true));
  ASSERT_TRUE(WaitFor([&] { return handler.calls.load() >= 1; }));
  ASSERT_TRUE(
      WaitFor([&] { return rt->GetStats().consumers[0].delivered + orphans.count.load() == 11; }));
  EXPECT_EQ(handler.calls.load(), 1);
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// Orphans that come up while run-to-completion handlers are dispatched on the poller (here: QP
// B's completions, queued behind QP A's, after A's handler unregistered B) reach the
// OrphanHandler on the poller, where control calls stay refused (handler.h).
TEST(RunToCompletion, OrphanHandlerOnThePollerMayNotCallTheRuntime) {
  struct CallingOrphans : OrphanHandler {
    Runtime* rt = nullptr;
    SimQp* spare = nullptr;
    Recorder spare_handler;
    std::atomic<int> calls{0};
    std::atomic<int> refused{0};
    void OnOrphans(std::span<const ibv_wc>) noexcept override {
      auto reg = rt->RegisterQp(*spare, spare_handler, 0);
      if (!reg.ok() && reg.status().code() == StatusCode::kFailedPrecondition) refused.fetch_add(1);
      calls.fetch_add(1);
    }
  } orphans;
  RuntimeOptions options = RtcOptions(1);
  options.orphan_handler = &orphans;
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  orphans.rt = rt.get();
  CQD_ASSERT_OK(bed.AddDevice());
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqOptions cq_options;
  cq_options.solicited_only = true;  // the completions wait in the CQ until the solicited one
  CqHandle cq = rt->CreateCq(dev, 0, cq_options).value();
  SimQp* a = sim->CreateQp(cq.sim(), cq.sim()).value();
  SimQp* b = sim->CreateQp(cq.sim(), cq.sim()).value();
  orphans.spare = sim->CreateQp(cq.sim(), cq.sim()).value();
  Recorder b_handler;
  Registration b_reg = rt->RegisterQp(*b, b_handler, 0).value();
  struct Unregistering : QpHandler {
    Registration* victim = nullptr;
    void OnCompletions(std::span<const ibv_wc>) noexcept override { victim->Unregister(); }
  } a_handler;
  a_handler.victim = &b_reg;
  Registration a_reg = rt->RegisterQp(*a, a_handler, 0).value();
  ASSERT_TRUE(WaitForPollersAsleep(*rt));
  ASSERT_EQ(a->Complete(0), 1);
  ASSERT_EQ(b->Complete(0), 1);
  ASSERT_EQ(b->Complete(1, IBV_WC_RECV, IBV_WC_SUCCESS, /*solicited=*/true), 1);
  ASSERT_TRUE(WaitFor([&] { return orphans.calls.load() >= 1; }));
  EXPECT_EQ(orphans.refused.load(), orphans.calls.load());
  EXPECT_EQ(b_handler.received(), 0u);
  a_reg.Unregister();
  for (SimQp* qp : {a, b, orphans.spare}) CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(rt->DestroyCq(cq));
}

// A lane of six entries (queue 4, spill 2) that the poller starts over after each dispatch from
// its spill, and that fills up now and then (the queue takes over): across thousands of laps each
// completion arrives once and in order, and each event after every completion made before it
// (and perhaps some made after: the catch-up takes all the CQ holds).
TEST(RunToCompletion, OrderHoldsAcrossManyLapsOfASmallLane) {
  for (const bool busy : {false, true}) {
    RuntimeOptions options = RtcOptions(1, busy);
    options.consumers[0].queue_capacity = 4;
    options.consumers[0].spill_capacity = 2;
    OneQp one;
    CQD_ASSERT_OK(one.Build(options));
    Recorder handler;
    Registration reg = one.rt->RegisterQp(*one.qp, handler, 0).value();
    constexpr int kEvents = 100;
    constexpr uint64_t kPerEvent = 60;
    for (uint64_t next = 0; next < kEvents * kPerEvent; ++next) {
      while (one.qp->Complete(next) != 1) std::this_thread::yield();  // CQ full: retry
      if (next % kPerEvent == kPerEvent - 1) {
        CQD_ASSERT_OK(one.sim->RaiseQpEvent(one.qp, IBV_EVENT_COMM_EST));
      }
    }
    ASSERT_TRUE(WaitFor([&] {
      return handler.events() == kEvents && handler.completions() == kEvents * kPerEvent;
    }));
    const std::vector<Recorder::Entry> log = handler.log();
    uint64_t completions = 0;
    uint64_t events = 0;
    for (const Recorder::Entry& entry : log) {
      if (entry.event) {
        ++events;
        EXPECT_GE(completions, events * kPerEvent) << "event " << events << ", busy " << busy;
        continue;
      }
      EXPECT_EQ(entry.wr_id, completions) << "busy " << busy;
      ++completions;
    }
    EXPECT_EQ(events, static_cast<uint64_t>(kEvents));
    EXPECT_EQ(completions, kEvents * kPerEvent);
    reg.Unregister();
    CQD_ASSERT_OK(one.sim->DestroyQp(one.qp));
    CQD_ASSERT_OK(one.rt->DestroyCq(one.cq));
  }
}

// Completions polled before Shutdown reach their handlers; nothing is lost.
TEST(RunToCompletion, ShutdownDeliversWhatWasPolled) {
  RuntimeOptions options = RtcOptions(1, /*busy=*/true);
  options.consumers[0].queue_capacity = 64;  // much waits in the poller's spill and the CQ
  Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 1, 1));
  SimQp* qp = topo.qps[0];
  constexpr int kCount = 3000;
  for (int i = 0; i < kCount; ++i) {
    while (qp->Complete(i) != 1) std::this_thread::yield();
  }
  ASSERT_TRUE(WaitFor([&] { return topo.received() == kCount; }));
  CQD_ASSERT_OK(topo.rt->Shutdown());
  EXPECT_EQ(topo.handlers[0]->out_of_order(), 0u);
  CQD_ASSERT_OK(topo.TearDown());
}

// The fused pass (a poll of a CQ whose QPs all run to completion on its poller calls each run's
// handler as soon as it is routed): a handler's control calls meet the rest of its poll. The
// completions below are all in the CQ before its one poll: on an engine-driven shard the test's
// PollShard makes that poll; on a poller thread, a solicited-only CQ stays quiet until the last.
struct FusedBed : testing::Bed {
  explicit FusedBed(bool engine, int cqs = 1, uint32_t max_registrations = 1 << 16)
      : engine(engine) {
    RuntimeOptions options = RtcOptions(1);
    if (engine) options.engine_shards = {0};
    options.max_registrations = max_registrations;
    const Status started = Start(options);  // `orphans` takes the orphans
    EXPECT_TRUE(started.ok()) << started.ToString();
    CqOptions cq_options;
    cq_options.solicited_only = !engine;
    for (int i = 0; i < cqs; ++i) this->cqs.push_back(rt->CreateCq(dev, 0, cq_options).value());
  }
  SimQp* Qp(int cq = 0) { return sim->CreateQp(cqs[cq].sim(), cqs[cq].sim()).value(); }
  // Before the completions go in: on a poller thread, wait until it sleeps.
  bool Quiet() { return engine || WaitForPollersAsleep(*rt); }
  // After they went in: the poll (with `last`, solicited, on a poller thread).
  bool Poll(SimQp* last, uint64_t wr_id) {
    if (!InjectRecvs(last, wr_id, 1, /*solicited=*/!engine)) return false;
    if (engine) return rt->PollShard(0, 64) > 0;
    return true;
  }
  // Returns once `done` holds (driving the shard meanwhile when it is the engine's).
  bool Until(const std::function<bool()>& done) {
    return WaitFor([&] {
      if (engine) (void)rt->PollShard(0, 64);
      return done();
    });
  }

  const bool engine;
  std::vector<CqHandle> cqs;
};

// A handler unregisters and destroys a QP whose completions come after its own in the same poll,
// and registers a new QP that takes the old one's number, on the same CQ, and (two registrations
// at most) its registration slot: the old completions still in the poll reach the OrphanHandler,
// never the new QP's handler (nor the old one's).
TEST(RunToCompletion, AHandlerRetiringAQpMidPollKeepsTheRestFromItsNumbersNextQp) {
  for (bool engine : {false, true}) {
    SCOPED_TRACE(engine ? "engine-driven shard" : "poller thread");
    FusedBed bed(engine, /*cqs=*/1, /*max_registrations=*/2);
    SimQp* old_qp = bed.Qp();
    SimQp* probe = bed.Qp();
    Recorder old_handler;
    Recorder next_handler;
    struct Probe : QpHandler {
      FusedBed* bed = nullptr;
      SimQp* old_qp = nullptr;
      Registration* old_reg = nullptr;
      QpHandler* next_handler = nullptr;
      Registration next_reg;
      SimQp* next = nullptr;
      uint32_t old_number = 0;
      uint32_t next_number = 0;
      Status registered = Internal("not yet");
      std::atomic<int> completions{0};
      void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
        if (completions.fetch_add(static_cast<int>(wcs.size())) != 0) return;
        old_reg->Unregister();
        old_number = old_qp->qp_num();
        if (!bed->sim->DestroyQp(old_qp).ok()) return;
        next = bed->Qp();
        next_number = next->qp_num();
        auto reg = bed->rt->RegisterQp(*next, *next_handler, 0);
        registered = reg.status();
        if (reg.ok()) next_reg = std::move(reg).value();
      }
    } handler;
    handler.bed = &bed;
    handler.old_qp = old_qp;
    handler.next_handler = &next_handler;
    Registration old_reg = bed.rt->RegisterQp(*old_qp, old_handler, 0).value();
    Registration probe_reg = bed.rt->RegisterQp(*probe, handler, 0).value();
    handler.old_reg = &old_reg;
    ASSERT_TRUE(bed.Quiet());
    ASSERT_TRUE(InjectRecvs(probe, 0, 1));
    ASSERT_TRUE(InjectRecvs(old_qp, kOld, 5));
    ASSERT_TRUE(bed.Poll(probe, 1));
    ASSERT_TRUE(bed.Until([&] { return handler.completions.load() == 2; }));
    // The old QP's five went somewhere: the OrphanHandler, and nowhere else.
    ASSERT_TRUE(bed.Until([&] {
      return bed.orphans.count.load() + old_handler.completions() + next_handler.completions() == 5;
    }));
    CQD_ASSERT_OK(handler.registered);
    EXPECT_EQ(handler.next_number, handler.old_number) << "the sim reuses the number";
    EXPECT_EQ(old_handler.completions(), 0u);
    EXPECT_EQ(next_handler.completions(), 0u);
    // The new QP's own completions reach it.
    ASSERT_NE(handler.next, nullptr);
    ASSERT_TRUE(InjectRecvs(handler.next, 7, 1, /*solicited=*/!engine));
    ASSERT_TRUE(bed.Until([&] { return next_handler.completions() == 1; }));
    EXPECT_EQ(next_handler.wr_ids(), std::vector<uint64_t>{7});
    EXPECT_EQ(bed.orphans.count.load(), 5u);
    handler.next_reg.Unregister();
    probe_reg.Unregister();
  }
}

// A handler ends its CQ (its QPs unregistered and destroyed, the CQ destroyed) in the middle of
// that CQ's poll: the rest of the poll reaches the OrphanHandler, the CQ polled after it in the
// same pass is still served, and nothing touches the CQ once it is gone (ASan).
TEST(RunToCompletion, AHandlerDestroyingItsCqMidPollLeavesTheOtherCqsServed) {
  for (bool engine : {false, true}) {
    SCOPED_TRACE(engine ? "engine-driven shard" : "poller thread");
    FusedBed bed(engine, /*cqs=*/2);
    SimQp* doomed = bed.Qp(0);
    SimQp* killer = bed.Qp(0);
    SimQp* other = bed.Qp(1);
    Recorder doomed_handler;
    Recorder other_handler;
    struct Killer : QpHandler {
      FusedBed* bed = nullptr;
      SimQp* qps[2] = {};
      Registration* regs[2] = {};
      Status destroyed = Internal("not yet");
      std::atomic<int> calls{0};
      std::atomic<bool> done{false};
      void OnCompletions(std::span<const ibv_wc>) noexcept override {
        if (calls.fetch_add(1) != 0) return;
        for (Registration* reg : regs) reg->Unregister();
        for (SimQp* qp : qps) (void)bed->sim->DestroyQp(qp);
        destroyed = bed->rt->DestroyCq(bed->cqs[0]);
        done.store(true, std::memory_order_release);
      }
    } killer_handler;
    Registration doomed_reg = bed.rt->RegisterQp(*doomed, doomed_handler, 0).value();
    Registration killer_reg = bed.rt->RegisterQp(*killer, killer_handler, 0).value();
    Registration other_reg = bed.rt->RegisterQp(*other, other_handler, 0).value();
    killer_handler.bed = &bed;
    killer_handler.qps[0] = doomed;
    killer_handler.qps[1] = killer;
    killer_handler.regs[0] = &doomed_reg;
    killer_handler.regs[1] = &killer_reg;
    ASSERT_TRUE(bed.Quiet());
    ASSERT_TRUE(InjectRecvs(other, 0, 3));
    ASSERT_TRUE(InjectRecvs(killer, 0, 1));
    ASSERT_TRUE(InjectRecvs(doomed, kOld, 5));
    // The wake goes to the other CQ: the test is done with the doomed CQ's QPs before any handler
    // runs (no QP is destroyed under a call posting to it).
    ASSERT_TRUE(bed.Poll(other, 3));
    ASSERT_TRUE(bed.Until([&] { return killer_handler.done.load(std::memory_order_acquire); }));
    CQD_ASSERT_OK(killer_handler.destroyed);
    ASSERT_TRUE(bed.Until([&] { return bed.orphans.count.load() == 5; }));
    EXPECT_EQ(doomed_handler.completions(), 0u);
    EXPECT_EQ(killer_handler.calls.load(), 1);
    ASSERT_TRUE(bed.Until([&] { return other_handler.completions() == 4; }));
    EXPECT_EQ(other_handler.wr_ids(), (std::vector<uint64_t>{0, 1, 2, 3}));
    ASSERT_TRUE(InjectRecvs(other, 4, 1, /*solicited=*/!engine));
    ASSERT_TRUE(bed.Until([&] { return other_handler.completions() == 5; }));
    EXPECT_EQ(bed.orphans.count.load(), 5u);
    other_reg.Unregister();
  }
}

// A fused batch holds up only the Unregister of a QP it may call. Here X's handler (consumer 0,
// run to completion, X alone on its CQ) waits in Unregister(Z) for consumer 1's batch, whose
// handler is held; meanwhile another thread unregisters Y, a QP of consumer 0 in no batch, on
// another device, with X's number. Y's Unregister returns (it waited for X's batch when the batch
// was listed by number alone: with Z's handler doing it, the two waited for each other).
TEST(RunToCompletion, AFusedBatchHoldsUpOnlyTheUnregisterOfAQpItMayCall) {
  for (bool engine : {false, true}) {
    SCOPED_TRACE(engine ? "engine-driven shard" : "poller thread");
    RuntimeOptions options = RtcOptions(1);
    options.consumers.push_back(ConsumerOptions{});  // consumer 1: an owned thread
    if (engine) options.engine_shards = {0};
    testing::Bed bed;
    CQD_ASSERT_OK(bed.StartWithoutLedger(options));
    auto& rt = bed.rt;
    auto& sim1 = bed.sim;
    SimDeviceOptions second;
    second.name = "sim-second";
    auto sim2 = SimDevice::Create(second);
    const DeviceId d1 = bed.dev;
    DeviceId d2 = rt->AddSimDevice(sim2).value();
    CqHandle x_cq = rt->CreateCq(d1, 0).value();
    CqHandle z_cq = rt->CreateCq(d1, 0).value();
    CqHandle y_cq = rt->CreateCq(d2, 0).value();
    SimQp* x = sim1->CreateQp(x_cq.sim(), x_cq.sim()).value();
    SimQp* z = sim1->CreateQp(z_cq.sim(), z_cq.sim()).value();
    SimQp* y = sim2->CreateQp(y_cq.sim(), y_cq.sim()).value();
    ASSERT_EQ(x->qp_num(), y->qp_num()) << "each device numbers its QPs on its own";
    std::atomic<bool> release{false};
    struct Held : QpHandler {
      std::atomic<bool>* release = nullptr;
      std::atomic<bool> inside{false};
      void OnCompletions(std::span<const ibv_wc>) noexcept override {
        inside.store(true);
        while (!release->load()) std::this_thread::yield();
      }
    } z_handler;
    z_handler.release = &release;
    struct Unregistering : QpHandler {
      Registration* z = nullptr;
      std::atomic<bool> inside{false};
      std::atomic<bool> done{false};
      void OnCompletions(std::span<const ibv_wc>) noexcept override {
        if (inside.exchange(true)) return;
        z->Unregister();  // waits for consumer 1's batch, which holds Z's handler
        done.store(true);
      }
    } x_handler;
    Recorder y_handler;
    Registration z_reg = rt->RegisterQp(*z, z_handler, 1).value();
    Registration x_reg = rt->RegisterQp(*x, x_handler, 0).value();
    Registration y_reg = rt->RegisterQp(*y, y_handler, 0).value();
    x_handler.z = &z_reg;
    std::atomic<bool> stop{false};
    std::thread driver([&] {
      while (engine && !stop.load()) (void)rt->PollShard(0, 64);
    });
    ASSERT_TRUE(InjectRecvs(z, 0, 1));
    ASSERT_TRUE(WaitFor([&] { return z_handler.inside.load(); }));
    ASSERT_TRUE(InjectRecvs(x, 0, 1));
    ASSERT_TRUE(WaitFor([&] { return x_handler.inside.load(); }));
    std::atomic<bool> y_done{false};
    std::thread unregister([&] {
      y_reg.Unregister();
      y_done.store(true);
    });
    EXPECT_TRUE(WaitFor([&] { return y_done.load(); }))
        << "Y's Unregister waited for a batch that may not call Y";
    EXPECT_FALSE(x_handler.done.load());  // X's batch was open all along
    release.store(true);
    unregister.join();
    ASSERT_TRUE(WaitFor([&] { return x_handler.done.load(); }));
    stop.store(true);
    driver.join();
    x_reg.Unregister();
  }
}

// The sleep's re-check polls once more and routes what it finds without running a handler
// (TrySleepShard's contract): the fused pass is a pass's, never the sleep's. The next PollShard
// delivers them, in order.
TEST(RunToCompletion, TrySleepShardRunsNoHandler) {
  FusedBed bed(/*engine=*/true);
  SimQp* qp = bed.Qp();
  Recorder handler;
  Registration reg = bed.rt->RegisterQp(*qp, handler, 0).value();
  while (bed.rt->PollShard(0, 64) > 0) {
  }
  ASSERT_TRUE(InjectRecvs(qp, 0, 5));
  EXPECT_EQ(bed.rt->TrySleepShard(0), 0);  // it found work
  EXPECT_EQ(handler.received(), 0u);       // and ran none of it
  ASSERT_TRUE(bed.Until([&] { return handler.received() == 5; }));
  EXPECT_EQ(handler.out_of_order(), 0u);
  reg.Unregister();
}

TEST(RunToCompletion, BadInputIsRefused) {
  RuntimeOptions options = RtcOptions(2);
  options.consumers[1].poller = 2;
  testing::Bed refused;
  Status bad = refused.CreateRuntime(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("poller"), std::string::npos) << bad.message();

  options = RtcOptions(1);
  options.consumers[0].cpu = 0;
  bad = refused.CreateRuntime(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);

  // A QP whose CQ is on another poller's shard cannot be on consumer 0 (poller 0).
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(RtcOptions(2)));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  CqHandle cq1 = rt->CreateCq(dev, 1).value();
  SimQp* qp = sim->CreateQp(cq1.sim(), cq1.sim()).value();
  Recorder handler;
  auto reg = rt->RegisterQp(*qp, handler, 0);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reg.status().message().find("shard 1"), std::string::npos) << reg.status().message();
  CQD_ASSERT_OK(rt->RegisterQp(*qp, handler, 1).status());  // its own poller's consumer

  // Engine-driven calls do not apply.
  EXPECT_LT(rt->Drain(0, 16), 0);
  EXPECT_FALSE(rt->NotifyFd(0).ok());
}

}  // namespace
}  // namespace cqd

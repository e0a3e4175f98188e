// The CM hand-on rule (runtime/cm_router.h) under races, without rdma_cm: made-up events of two
// bound ids are routed through real pollers and consumers, as the event thread routes what it
// reads, while engine threads drain the QPs' consumers (one item at a time, so that parts wait
// in queues and spills) and other threads end the registrations the way Unregister does (dead
// state, purge of the spills, Ended, wait for the batch, then the held events). Half the rounds
// route each event in two parts (send and receive CQs on two shards); half stop the pollers and
// close the CmHandler's consumer first, as Shutdown does, so that what is handed on is held and
// run by the engine threads.
//
// Each round checks, for each id: every event reaches exactly one handler; the QP's handler gets
// a prefix of the events in read order and the CmHandler the rest, in read order; the CmHandler
// gets its first only after the QP's handler returned from its last; the CmHandler never runs on
// two threads at once; and the channel's read-ahead count comes back to zero.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cqd/options.h"
#include "gtest/gtest.h"
#include "runtime/cm_router.h"
#include "runtime/consumer.h"
#include "runtime/orphans.h"
#include "runtime/poller.h"
#include "runtime/registry.h"
#include "tests/test_util.h"

namespace cqd::internal {
namespace {

using cqd::testing::WaitFor;

constexpr int kIds = 2;
constexpr int kEvents = 40;  // per id and round
constexpr uint32_t kListener = 0;

struct Seen {
  int seq;
  uint64_t ticket;
};

std::atomic<uint64_t> tickets{0};

class QpSide : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc>) noexcept override {}
  void OnCmEvent(const CmEvent& event) noexcept override {
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // a window for a wrong hand-on
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back({event.status, tickets.fetch_add(1)});  // taken as it returns
  }
  std::mutex mu;
  std::vector<Seen> seen;
};

class CmSide : public CmHandler {
 public:
  explicit CmSide(rdma_cm_id* const* ids) : ids_(ids) {}
  void OnCmEvent(const CmEvent& event) noexcept override {
    if (inside.fetch_add(1) != 0) overlapped = true;
    const uint64_t ticket = tickets.fetch_add(1);  // taken as it starts
    for (int k = 0; k < kIds; ++k) {
      if (event.id != ids_[k]) continue;
      std::lock_guard<std::mutex> lock(mu);
      seen[k].push_back({event.status, ticket});
    }
    std::this_thread::yield();
    inside.fetch_sub(1);
  }
  std::mutex mu;
  std::vector<Seen> seen[kIds];
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};

 private:
  rdma_cm_id* const* ids_;
};

void RunRound(uint32_t seed, bool two_shards, bool shut_down) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed << (two_shards ? ", two shards" : "")
                                    << (shut_down ? ", after Shutdown" : ""));
  std::mt19937 rng(seed);
  RuntimeOptions options;
  options.pollers = 2;
  options.consumers.resize(1 + kIds);
  options.consumers[kListener].name = "listen";
  for (int k = 0; k < kIds; ++k) {
    options.consumers[1 + k].kind = ConsumerKind::kEngineDriven;
    options.consumers[1 + k].queue_capacity = 1;  // the rest waits in the pollers' spills
    options.consumers[1 + k].name = "qp" + std::to_string(k);
  }
  SlotPool slots(64);
  OrphanSink orphans(nullptr);
  std::vector<std::unique_ptr<Consumer>> consumers;
  std::vector<Consumer*> consumer_ptrs;
  for (uint32_t c = 0; c < options.consumers.size(); ++c) {
    consumers.push_back(
        std::make_unique<Consumer>(c, options.consumers[c], slots, orphans, options.pollers));
    consumer_ptrs.push_back(consumers.back().get());
  }
  std::vector<std::unique_ptr<Poller>> pollers;
  std::vector<Poller*> poller_ptrs;
  for (int p = 0; p < options.pollers; ++p) {
    pollers.push_back(std::make_unique<Poller>(p, options, consumer_ptrs, slots, orphans));
    poller_ptrs.push_back(pollers.back().get());
  }
  auto router = std::make_unique<CmRouter>(slots, poller_ptrs);
  // However the round ends: the pollers hand over and stop, the consumers stop, what is queued
  // is dropped, and only then do the router's watches go.
  struct Cleanup {
    std::vector<std::unique_ptr<Poller>>& pollers;
    std::vector<std::unique_ptr<Consumer>>& consumers;
    std::unique_ptr<CmRouter>& router;
    ~Cleanup() {
      for (auto& p : pollers) p->Stop();
      for (auto& c : consumers) c->Stop();
      for (auto& c : consumers) c->OrphanRemaining();
      pollers.clear();
      consumers.clear();
      router.reset();
    }
  } cleanup{pollers, consumers, router};
  for (auto& c : consumers) ASSERT_TRUE(c->Start().ok());
  for (auto& p : pollers) p->Start();

  int id_storage[kIds];
  rdma_cm_id* ids[kIds];
  for (int k = 0; k < kIds; ++k) ids[k] = reinterpret_cast<rdma_cm_id*>(&id_storage[k]);
  CmSide listener(ids);
  CmWatch* watch = router->AddWatch(nullptr, &listener, kListener, int64_t{1} << 40);
  QpSide qp[kIds];
  uint32_t slot_of[kIds];
  for (int k = 0; k < kIds; ++k) {
    const int64_t index = slots.Allocate();
    ASSERT_GE(index, 0);
    slot_of[k] = static_cast<uint32_t>(index);
    Slot& slot = slots.slot(slot_of[k]);
    slot.handler.store(&qp[k]);
    slot.qp_num.store(100 + k);
    slot.send_shard.store(0);
    slot.recv_shard.store(two_shards ? 1 : 0);
    slot.state.store(MakeState(0, 1 + k, true), std::memory_order_release);
    ASSERT_TRUE(router->Bind(ids[k], slot_of[k], 0));
  }

  if (shut_down) {  // as Shutdown does: pollers hand over and stop, the owned consumer closes
    for (auto& p : pollers) p->Stop();
    consumers[kListener]->Stop();
  }
  std::atomic<bool> routed{false};
  std::vector<std::thread> threads;
  // The engine threads: drain one item at a time, now and then pausing.
  for (int k = 0; k < kIds; ++k) {
    const uint32_t pause_every = 1 + rng() % 8;
    threads.emplace_back([&, k, pause_every] {
      uint32_t n = 0;
      while (!routed.load() || consumers[1 + k]->Pending()) {
        consumers[1 + k]->Drain(1);
        if (++n % pause_every == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  // The ends: Retire (dead state, purge, Ended), then Unregister's wait and held events.
  for (int k = 0; k < kIds; ++k) {
    const uint32_t delay_us = rng() % 3000;
    threads.emplace_back([&, k, delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      Slot& slot = slots.slot(slot_of[k]);
      slot.state.store(MakeState(1, 1 + k, false), std::memory_order_seq_cst);
      for (Poller* p : poller_ptrs) p->PurgeDead(1 + k);
      router->Ended(slot_of[k], 0);
      consumers[1 + k]->WaitForBatchInProgress(slot_of[k]);
      router->held().DeliverAll();
    });
  }
  // The event thread.
  for (int seq = 1; seq <= kEvents; ++seq) {
    for (int k = 0; k < kIds; ++k) {
      auto* join = new EventJoin;
      join->cm.type = RDMA_CM_EVENT_ESTABLISHED;
      join->cm.status = seq;
      join->cm.id = ids[k];
      join->watch = watch;
      watch->unfinished.fetch_add(1);
      router->Route(join);
    }
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
  }
  routed = true;
  for (std::thread& t : threads) t.join();
  // What is still on its way reaches a handler: drain until every event is accounted for.
  auto delivered = [&](int k) {
    std::lock_guard<std::mutex> a(qp[k].mu);
    std::lock_guard<std::mutex> b(listener.mu);
    return qp[k].seen.size() + listener.seen[k].size();
  };
  EXPECT_TRUE(WaitFor([&] {
    for (int k = 0; k < kIds; ++k) consumers[1 + k]->Drain(64);
    router->held().DeliverAll();
    return delivered(0) >= kEvents && delivered(1) >= kEvents;
  })) << delivered(0) << " and " << delivered(1) << " of " << kEvents << " delivered";
  EXPECT_TRUE(WaitFor([&] { return watch->unfinished.load() == 0; }))
      << watch->unfinished.load() << " still counted against the channel";
  EXPECT_FALSE(listener.overlapped.load()) << "the CmHandler ran on two threads at once";

  for (int k = 0; k < kIds; ++k) {
    SCOPED_TRACE(::testing::Message() << "id " << k);
    const std::vector<Seen>& to_qp = qp[k].seen;
    const std::vector<Seen>& to_cm = listener.seen[k];
    std::string got = "QP handler:";
    for (const Seen& seen : to_qp) got += " " + std::to_string(seen.seq);
    got += "; CmHandler:";
    for (const Seen& seen : to_cm) got += " " + std::to_string(seen.seq);
    SCOPED_TRACE(got);
    ASSERT_EQ(to_qp.size() + to_cm.size(), static_cast<size_t>(kEvents)) << "lost or doubled";
    for (size_t i = 0; i < to_qp.size(); ++i) {
      EXPECT_EQ(to_qp[i].seq, static_cast<int>(i + 1)) << "the QP handler's events";
    }
    for (size_t i = 0; i < to_cm.size(); ++i) {
      EXPECT_EQ(to_cm[i].seq, static_cast<int>(to_qp.size() + i + 1)) << "the CmHandler's events";
    }
    if (!to_qp.empty() && !to_cm.empty()) {
      EXPECT_LT(to_qp.back().ticket, to_cm.front().ticket)
          << "handed on before the QP handler returned from the id's earlier event";
    }
  }

}

TEST(CmHandOn, EventsLeaveInReadOrderWhateverEndsTheRegistration) {
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    RunRound(seed, /*two_shards=*/seed % 2 == 0, /*shut_down=*/false);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(CmHandOn, AfterShutdownHeldEventsRunOneThreadAtATimeInOrder) {
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    RunRound(seed, /*two_shards=*/seed % 2 == 0, /*shut_down=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace cqd::internal

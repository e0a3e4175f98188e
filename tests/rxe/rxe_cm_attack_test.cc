// SPDX-License-Identifier: BSD-2-Clause
// Adversarial tests of connection management (rdma_cm) on rxe: sequences, through the public API
// only, that a review found breaking what handler.h, runtime.h and README "Connection
// management" promised; each FINDING below failed before the fix and guards it now.
//
// Layout: consumer 0 is runtime-owned and runs both channels' CmHandlers and the client's QP;
// consumer 1 is engine-driven (the test thread drains it) and holds the server's QP, so that the
// test decides exactly when the server's queued CM events are dispatched.
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"
#include "tests/rxe/cm_bed.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {
namespace {

using ::cqd::testing::WaitFor;
using std::chrono::milliseconds;

constexpr int kQueueDepth = 64;
constexpr ConsumerId kOwned = 0;
constexpr ConsumerId kEngine = 1;
constexpr ConsumerId kEngine2 = 2;
constexpr int kPairs = 4;

std::string Str(rdma_cm_event_type type) { return rdma_event_str(type); }

using Conn = rxe::CmConn;
using Channel = rxe::RecordingCmHandler;

// One connection, its QPs on `client_consumer` and `server_consumer`; the server tells pairs
// apart by the pair's index in the connect private data.
struct Pair {
  rdma_cm_id* client = nullptr;
  std::atomic<rdma_cm_id*> server{nullptr};
  Conn client_conn, server_conn;
  ConsumerId client_consumer = kOwned;
  ConsumerId server_consumer = kEngine;
};

class RxeCmAttack : public ::testing::Test, protected rxe::CmBed {
 protected:
  // `engine` configures consumers 1 and 2 (engine-driven), `owned` consumer 0.
  void Start(ConsumerOptions engine = {}, ConsumerOptions owned = {}) {
    RuntimeOptions options;
    options.pollers = 2;
    options.consumers.resize(3);
    engine.kind = ConsumerKind::kEngineDriven;
    options.consumers[kOwned] = owned;
    options.consumers[kEngine] = engine;
    options.consumers[kEngine2] = engine;
    ASSERT_NO_FATAL_FAILURE(StartBed(options, kQueueDepth));
  }

  void TearDown() override {
    for (Pair& pair : pairs_) {
      for (Conn* conn : {&pair.server_conn, &pair.client_conn}) conn->registration.Unregister();
      for (rdma_cm_id* id : {pair.server.load(), pair.client}) {
        if (id == nullptr) continue;
        if (id->qp != nullptr) rdma_destroy_qp(id);
        rdma_destroy_id(id);
      }
    }
    for (rdma_cm_id* id : extra_ids_) rdma_destroy_id(id);
    StopBed(/*expect_cqs_destroyed=*/false);
  }

  // An RC QP on shard 0's CQ alone (so each of its events travels as one part), registered with
  // its id on `consumer`.
  bool MakeQp(rdma_cm_id* id, Conn& conn, ConsumerId consumer, int recvs,
              ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr attr{};
    attr.send_cq = attr.recv_cq = cqs_[0].verbs();
    attr.qp_type = type;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = kQueueDepth;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    return MakeCmQp(id, attr, recvs, conn, consumer, &conn.registration);
  }

  // Watches both channels (their CmHandlers on `cm_consumer`) and listens; connections then
  // made with ConnectPair are accepted by the server's CmHandler.
  void Listen(ConsumerId cm_consumer = kOwned) {
    CQD_ASSERT_OK(rt_->WatchCmChannel(server_channel_, server_cm_, cm_consumer));
    CQD_ASSERT_OK(rt_->WatchCmChannel(client_channel_, client_cm_, cm_consumer));
    ASSERT_EQ(rdma_listen(listen_id_, 8), 0) << strerror(errno);
    server_cm_.react = [this](const CmEvent& event) {
      if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST || event.private_data_len < 1 ||
          event.private_data[0] >= kPairs) {
        return;
      }
      Pair& pair = pairs_[event.private_data[0]];
      pair.server = event.id;
      if (!MakeQp(event.id, pair.server_conn, pair.server_consumer, 8)) return;
      rdma_conn_param param{};
      param.responder_resources = param.initiator_depth = 1;
      EXPECT_EQ(rdma_accept(event.id, &param), 0) << strerror(errno);
    };
    client_cm_.react = [this](const CmEvent& event) {
      auto* pair = static_cast<Pair*>(event.context);
      if (pair == nullptr) return;
      if (event.type == RDMA_CM_EVENT_ADDR_RESOLVED) {
        EXPECT_EQ(rdma_resolve_route(event.id, 5000), 0) << strerror(errno);
      } else if (event.type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
        if (!MakeQp(event.id, pair->client_conn, pair->client_consumer, 0)) return;
        const uint8_t tag = static_cast<uint8_t>(pair - pairs_);
        rdma_conn_param param{};
        param.responder_resources = param.initiator_depth = 1;
        param.retry_count = 6;
        param.rnr_retry_count = 7;
        param.private_data = &tag;
        param.private_data_len = 1;
        EXPECT_EQ(rdma_connect(event.id, &param), 0) << strerror(errno);
      }
    };
  }

  // Connects pairs_[index], its QPs on the consumers given; returns once the side on kOwned saw
  // ESTABLISHED (the client, if both are).
  void ConnectPair(int index, ConsumerId server_consumer, ConsumerId client_consumer = kOwned) {
    Pair& pair = pairs_[index];
    pair.server_consumer = server_consumer;
    pair.client_consumer = client_consumer;
    ASSERT_EQ(rdma_create_id(client_channel_, &pair.client, &pair, RDMA_PS_TCP), 0);
    ASSERT_EQ(
        rdma_resolve_addr(pair.client, nullptr, reinterpret_cast<sockaddr*>(&server_addr_), 5000),
        0)
        << strerror(errno);
    Conn& watched = client_consumer == kOwned ? pair.client_conn : pair.server_conn;
    ASSERT_TRUE(WaitFor([&] { return watched.Saw(RDMA_CM_EVENT_ESTABLISHED); }))
        << "no connection; client channel saw " << client_cm_.Names();
  }

  // Pair 0: server QP on the engine-driven consumer 1, client QP on the owned one; both
  // CmHandlers on the owned one. Returns once the client saw ESTABLISHED.
  void Connect() {
    ASSERT_NO_FATAL_FAILURE(Listen());
    ASSERT_NO_FATAL_FAILURE(ConnectPair(0, kEngine));
  }

  uint64_t EngineDepth() const { return rt_->GetStats().consumers[kEngine].queue_depth; }
  // The position of `id`'s first `type` event in what `channel` saw from position `from` on, or
  // -1.
  static int IndexOf(const Channel& channel, rdma_cm_id* id, rdma_cm_event_type type,
                     size_t from = 0) {
    const std::vector<Channel::Seen> seen = channel.seen();
    for (size_t i = from; i < seen.size(); ++i) {
      if (seen[i].id == id && seen[i].type == type) return static_cast<int>(i);
    }
    return -1;
  }

  Pair pairs_[kPairs];
  // Pair 0, under the names the single-connection tests use.
  std::atomic<rdma_cm_id*>& server_id_ = pairs_[0].server;
  rdma_cm_id*& client_id_ = pairs_[0].client;
  std::vector<rdma_cm_id*> extra_ids_;
  Channel server_cm_, client_cm_;
  Conn& server_conn_ = pairs_[0].server_conn;
  Conn& client_conn_ = pairs_[0].client_conn;
};

// Control: the server's ESTABLISHED waits on the engine-driven consumer; the QP is unregistered
// before it is drained; draining hands it on to the server channel's CmHandler. This holds.
TEST_F(RxeCmAttack, HandOnBeforeShutdownReachesCmHandler) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "server ESTABLISHED not queued";
  server_conn_.registration.Unregister();
  rt_->Drain(kEngine, 64);
  EXPECT_TRUE(
      WaitFor([&] { return server_cm_.Saw(RDMA_CM_EVENT_ESTABLISHED); }, milliseconds(5000)))
      << "server channel saw " << server_cm_.Names();
  EXPECT_FALSE(server_conn_.Saw(RDMA_CM_EVENT_ESTABLISHED));
}

// FINDING: a CM event read while its QP was registered, found unregistered when the engine
// drained it after Shutdown (which runtime.h allows), was pushed into the queue of the
// CmHandler's owned consumer, which Shutdown had stopped: nobody dispatched it, and the
// destructor deleted it. (Since issue 15 the Unregister before Shutdown hands it on at once;
// CmHandlerNeverRunsOnTwoThreadsAfterShutdown covers hand-ons after Shutdown.)
TEST_F(RxeCmAttack, EventHandedOnAfterShutdownStillReachesTheCmHandler) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "server ESTABLISHED not queued";
  server_conn_.registration.Unregister();  // the consumer is not dispatching: no wait
  CQD_ASSERT_OK(rt_->Shutdown());
  int drained = 0;
  ASSERT_TRUE(WaitFor([&] {
    int n = rt_->Drain(kEngine, 64);
    if (n > 0) drained += n;
    return drained >= 1;
  }));
  EXPECT_TRUE(
      WaitFor([&] { return server_cm_.Saw(RDMA_CM_EVENT_ESTABLISHED); }, milliseconds(3000)))
      << "the server's ESTABLISHED (read while registered, found unregistered) never reached "
         "the CmHandler; server channel saw: "
      << server_cm_.Names()
      << "; consumer 0 queue_depth=" << rt_->GetStats().consumers[kOwned].queue_depth;
  client_conn_.registration.Unregister();  // registrations must not outlive the runtime
  for (CqHandle cq : cqs_) (void)rt_->DestroyCq(cq);
  cqs_.clear();
  rt_.reset();  // the destructor drops it for good
  EXPECT_TRUE(server_cm_.Saw(RDMA_CM_EVENT_ESTABLISHED)) << "lost for good";
}

// FINDING: one id's events reached the CmHandler out of read order when its QP was unregistered
// while an event of it was queued: the queued DISCONNECTED was handed on only when the consumer
// reached it, while the id's later TIMEWAIT_EXIT went straight to the CmHandler. Now the end of
// the registration hands on what is queued at once, and later events follow it.
TEST_F(RxeCmAttack, CmHandlerSeesOneIdsEventsInReadOrder) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(WaitFor([&] {
    rt_->Drain(kEngine, 64);
    return server_conn_.Saw(RDMA_CM_EVENT_ESTABLISHED);
  }));
  ASSERT_EQ(EngineDepth(), 0u);
  ASSERT_EQ(rdma_disconnect(client_id_), 0) << strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "server DISCONNECTED not queued";
  server_conn_.registration.Unregister();  // e.g. the engine's timer thread gives up on it
  const uint64_t read_before = rt_->GetStats().cm_events;
  ASSERT_EQ(rdma_disconnect(server_id_.load()), 0) << strerror(errno);  // answer: DREP
  // The server id's TIMEWAIT_EXIT (and the client's DISCONNECTED) are read while the server's
  // DISCONNECTED still waits on the undrained consumer 1.
  ASSERT_TRUE(
      WaitFor([&] { return rt_->GetStats().cm_events >= read_before + 2; }, milliseconds(60000)))
      << "no TIMEWAIT_EXIT read; server channel saw " << server_cm_.Names();
  std::this_thread::sleep_for(milliseconds(200));  // room for a wrong route to show itself
  if (server_cm_.Saw(RDMA_CM_EVENT_TIMEWAIT_EXIT)) {
    EXPECT_TRUE(server_cm_.Saw(RDMA_CM_EVENT_DISCONNECTED))
        << "TIMEWAIT_EXIT overtook the id's DISCONNECTED: " << server_cm_.Names();
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        rt_->Drain(kEngine, 64);
        return server_cm_.Saw(RDMA_CM_EVENT_DISCONNECTED) &&
               server_cm_.Saw(RDMA_CM_EVENT_TIMEWAIT_EXIT);
      },
      milliseconds(60000)))
      << "saw " << server_cm_.Names();
  int disconnected = -1, timewait = -1, i = 0;
  for (const Channel::Seen& s : server_cm_.seen()) {
    if (s.id == server_id_.load()) {
      if (s.type == RDMA_CM_EVENT_DISCONNECTED) disconnected = i;
      if (s.type == RDMA_CM_EVENT_TIMEWAIT_EXIT) timewait = i;
    }
    ++i;
  }
  EXPECT_LT(disconnected, timewait)
      << "the CmHandler got the id's events out of read order: " << server_cm_.Names();
}

// FINDING: listener events for a CmHandler on a stalled consumer were read, acked and held
// without bound in poller 0's inbox (which Stats do not show): 64 where queue_capacity and
// spill_capacity were 1. Now the channel's read-ahead is bounded by those two.
TEST_F(RxeCmAttack, StalledCmHandlerBoundsTheChannelReadAhead) {
  ConsumerOptions engine;
  engine.queue_capacity = 1;
  engine.spill_capacity = 1;
  ASSERT_NO_FATAL_FAILURE(Start(engine));
  CQD_ASSERT_OK(rt_->WatchCmChannel(client_channel_, client_cm_, kEngine));
  constexpr int kIds = 64;
  for (int i = 0; i < kIds; ++i) {
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(client_channel_, &id, nullptr, RDMA_PS_TCP), 0);
    extra_ids_.push_back(id);
    ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&server_addr_), 5000), 0)
        << strerror(errno);
  }
  // The channel's read-ahead is queue_capacity + spill_capacity of the CmHandler's consumer:
  // while nobody drains it, no more than that is read (and acked); the rest waits in the kernel.
  const uint64_t bound = engine.queue_capacity + engine.spill_capacity;
  ASSERT_TRUE(WaitFor([&] { return rt_->GetStats().cm_events >= bound; }));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(rt_->GetStats().cm_events, bound)
      << "events read ahead of a stalled CmHandler beyond the channel's limit";
  // Draining lets the rest through; none is lost.
  int delivered = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        int n = rt_->Drain(kEngine, 64);
        if (n > 0) delivered += n;
        return delivered >= kIds;
      },
      milliseconds(30000)))
      << delivered << " of " << kIds << " delivered";
  EXPECT_EQ(rt_->GetStats().cm_events, static_cast<uint64_t>(kIds));
}

// FINDING (issue 15.1): Unregister's purge of a poller's spill handed the id's DISCONNECTED,
// waiting there behind a full consumer, to the CmHandler at once, while the id's earlier
// ESTABLISHED still waited in the consumer's queue and was handed on only when it was drained.
TEST_F(RxeCmAttack, PurgedEventFollowsTheIdsEarlierQueuedOne) {
  ConsumerOptions engine;
  engine.queue_capacity = 1;  // ESTABLISHED fills the queue; DISCONNECTED waits in the spill
  ASSERT_NO_FATAL_FAILURE(Start(engine));
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "server ESTABLISHED not queued";
  ASSERT_EQ(rdma_disconnect(client_id_), 0) << strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return rt_->GetStats().consumers[kEngine].spill_depth >= 1; }))
      << "server DISCONNECTED not held in a spill";
  server_conn_.registration.Unregister();
  rdma_cm_id* server = server_id_.load();
  // Wrongly handed on, DISCONNECTED shows up now; give it the time to.
  WaitFor([&] { return IndexOf(server_cm_, server, RDMA_CM_EVENT_DISCONNECTED) >= 0; },
          milliseconds(1000));
  ASSERT_TRUE(WaitFor([&] {
    rt_->Drain(kEngine, 64);
    return IndexOf(server_cm_, server, RDMA_CM_EVENT_DISCONNECTED) >= 0 &&
           IndexOf(server_cm_, server, RDMA_CM_EVENT_ESTABLISHED) >= 0;
  })) << "server channel saw "
      << server_cm_.Names();
  EXPECT_LT(IndexOf(server_cm_, server, RDMA_CM_EVENT_ESTABLISHED),
            IndexOf(server_cm_, server, RDMA_CM_EVENT_DISCONNECTED))
      << "the CmHandler got the id's events out of read order: " << server_cm_.Names();
  EXPECT_FALSE(server_conn_.Saw(RDMA_CM_EVENT_ESTABLISHED));
}

// FINDING (issue 15.2): the server channel's read-ahead count still held the CM events queued for
// a consumer that stopped draining after their QP was unregistered, so the channel was no longer
// read and a new client's CONNECT_REQUEST never reached the listener's healthy consumer.
TEST_F(RxeCmAttack, StuckConsumerOfUnregisteredQpsDoesNotHoldTheListener) {
  ConsumerOptions owned;  // runs the CmHandlers: the channels' read-ahead is 1 + 1
  owned.queue_capacity = 1;
  owned.spill_capacity = 1;
  ASSERT_NO_FATAL_FAILURE(Start({}, owned));
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "server ESTABLISHED not queued";
  ASSERT_EQ(rdma_disconnect(client_id_), 0) << strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 2; })) << "server DISCONNECTED not queued";
  // Consumer 1 never drains again; the engine gives up on its QP.
  server_conn_.registration.Unregister();
  // A new client is accepted by the listener (consumer 0) while consumer 1 still holds them.
  ASSERT_NO_FATAL_FAILURE(ConnectPair(1, kOwned));
  // What consumer 1 held was handed on, in order, without it draining.
  rdma_cm_id* server = server_id_.load();
  ASSERT_TRUE(WaitFor([&] {
    return IndexOf(server_cm_, server, RDMA_CM_EVENT_ESTABLISHED) >= 0 &&
           IndexOf(server_cm_, server, RDMA_CM_EVENT_DISCONNECTED) >= 0;
  })) << server_cm_.Names();
  EXPECT_LT(IndexOf(server_cm_, server, RDMA_CM_EVENT_ESTABLISHED),
            IndexOf(server_cm_, server, RDMA_CM_EVENT_DISCONNECTED));
}

// FINDING (issue 15.3): a binding that ended with events still in flight kept its id's address,
// so a new id that got the destroyed id's address had its ADDR_RESOLVED routed behind the dead
// connection, into the stuck consumer's queue.
TEST_F(RxeCmAttack, NewIdAtAnEndedIdsAddressIsNotRoutedBehindIt) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Listen());
  // The client's id (made on this thread, so that this thread's next ids can get its memory) has
  // its QP on consumer 1, which never drains.
  ASSERT_NO_FATAL_FAILURE(ConnectPair(0, kOwned, kEngine));
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 1; })) << "client ESTABLISHED not queued";
  client_conn_.registration.Unregister();
  rdma_cm_id* old = client_id_;
  client_id_ = nullptr;
  rdma_destroy_qp(old);
  // Nothing but the ids may allocate on this thread from here on. Once in CI no new id got the
  // address; the likely cause was extra_ids_ growing inside the loop below, since glibc may split
  // the freed id's chunk for a vector's new buffer.
  constexpr int kTries = 1024;
  extra_ids_.reserve(extra_ids_.size() + kTries);
  // Fill the allocator's per-thread cache for this size first, so that the destroyed id's memory
  // goes back to the arena, where a new id's calloc (which skips that cache) finds it.
  std::vector<rdma_cm_id*> spare(7);
  for (rdma_cm_id*& id : spare) {
    ASSERT_EQ(rdma_create_id(client_channel_, &id, nullptr, RDMA_PS_TCP), 0);
  }
  for (rdma_cm_id* id : spare) rdma_destroy_id(id);
  ASSERT_EQ(rdma_destroy_id(old), 0) << strerror(errno);
  rdma_cm_id* reused = nullptr;
  for (int i = 0; i < kTries && reused == nullptr; ++i) {
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(client_channel_, &id, nullptr, RDMA_PS_TCP), 0);
    extra_ids_.push_back(id);
    if (id == old) reused = id;
  }
  ASSERT_NE(reused, nullptr) << "no new id got the destroyed id's address";
  const size_t seen_before = client_cm_.seen().size();  // the old id's, at the same address
  ASSERT_EQ(rdma_resolve_addr(reused, nullptr, reinterpret_cast<sockaddr*>(&server_addr_), 5000), 0)
      << strerror(errno);
  EXPECT_TRUE(WaitFor(
      [&] { return IndexOf(client_cm_, reused, RDMA_CM_EVENT_ADDR_RESOLVED, seen_before) >= 0; },
      milliseconds(10000)))
      << "the new id's ADDR_RESOLVED never reached the CmHandler (consumer 1 queue_depth="
      << EngineDepth() << "); client channel saw " << client_cm_.Names();
}

// FINDING (issue 15.5): after Shutdown, two engine threads draining two consumers that each
// handed on an event to the same CmHandler (whose owned consumer had stopped) ran it on both
// threads at once.
TEST_F(RxeCmAttack, CmHandlerNeverRunsOnTwoThreadsAfterShutdown) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Listen());
  ASSERT_NO_FATAL_FAILURE(ConnectPair(0, kEngine));
  ASSERT_NO_FATAL_FAILURE(ConnectPair(1, kEngine2));
  ASSERT_TRUE(WaitFor([&] {
    const Stats stats = rt_->GetStats();
    return stats.consumers[kEngine].queue_depth >= 1 && stats.consumers[kEngine2].queue_depth >= 1;
  })) << "the servers' ESTABLISHED not queued";
  static std::atomic<int> inside;  // static: a late callback must not dangle
  static std::atomic<bool> overlapped;
  static std::atomic<int> handed_on;
  inside = 0;
  overlapped = false;
  handed_on = 0;
  server_cm_.react = [](const CmEvent& event) {
    if (event.type != RDMA_CM_EVENT_ESTABLISHED) return;
    if (inside.fetch_add(1) != 0) overlapped = true;
    std::this_thread::sleep_for(milliseconds(300));
    inside.fetch_sub(1);
    handed_on.fetch_add(1);
  };
  CQD_ASSERT_OK(rt_->Shutdown());
  std::atomic<int> ready{0};
  auto engine_thread = [&](Pair& pair, ConsumerId consumer) {
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    pair.server_conn.registration.Unregister();
    for (int i = 0; i < 100; ++i) {
      rt_->Drain(consumer, 64);
      std::this_thread::sleep_for(milliseconds(5));
    }
  };
  std::thread a(engine_thread, std::ref(pairs_[0]), kEngine);
  std::thread b(engine_thread, std::ref(pairs_[1]), kEngine2);
  a.join();
  b.join();
  EXPECT_EQ(handed_on.load(), 2) << "server channel saw " << server_cm_.Names();
  EXPECT_FALSE(overlapped.load()) << "the CmHandler ran on two threads at once";
}

// FINDING (review of the SPSC hand-over): after Shutdown, an event handed on during a batch to
// a CmHandler whose consumer had closed ran on the draining thread once the batch was over but
// before the batch's entries were released, so a CmHandler that called Drain there was handed
// the batch's completions a second time (and the queue depth was lowered twice).
TEST_F(RxeCmAttack, CmHandlerThatDrainsAfterShutdownGetsNoCompletionTwice) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Listen());
  ASSERT_NO_FATAL_FAILURE(ConnectPair(0, kEngine));
  ASSERT_NO_FATAL_FAILURE(ConnectPair(1, kEngine));
  constexpr int kSends = 8;  // pair 1's server posted 8 receives, wr_id 0..7
  for (int i = 0; i < kSends; ++i) {
    CQD_ASSERT_OK(PostSend(pairs_[1].client->qp, 100 + i, buffers_, 20, 8, false));
  }
  ASSERT_EQ(rdma_disconnect(pairs_[0].client), 0) << strerror(errno);
  // Queued on consumer 1 and not dispatched: both servers' ESTABLISHED, pair 1's receives and
  // pair 0's DISCONNECTED.
  ASSERT_TRUE(WaitFor([&] { return EngineDepth() >= 2 + kSends + 1; }))
      << "queued on consumer 1: " << EngineDepth();
  CQD_ASSERT_OK(rt_->Shutdown());
  // Pair 0's server unregisters itself on its ESTABLISHED, inside the batch: its DISCONNECTED is
  // handed on to the server channel's CmHandler, whose consumer has closed, so it runs on this
  // thread after the batch.
  Conn& server0 = pairs_[0].server_conn;
  server0.on_event = [&server0](const CmEvent& event) {  // only this thread drains consumer 1
    if (event.type == RDMA_CM_EVENT_ESTABLISHED) server0.registration.Unregister();
  };
  static std::atomic<int> reacted;         // static: a late callback must not dangle
  static std::atomic<int> drained_inside;  // what the CmHandler's own Drain returned
  reacted = 0;
  drained_inside = 0;
  Runtime* rt = rt_.get();
  server_cm_.react = [rt](const CmEvent& event) {  // after Shutdown: only drainers call it
    if (event.type != RDMA_CM_EVENT_DISCONNECTED) return;
    reacted.fetch_add(1);
    const int n = rt->Drain(kEngine, 64);
    if (n > 0) drained_inside.fetch_add(n);
  };
  const Conn& server1 = pairs_[1].server_conn;
  ASSERT_TRUE(WaitFor([&] {
    rt_->Drain(kEngine, 64);
    return reacted.load() >= 1 && server1.wr_ids().size() >= kSends;
  })) << "reacted "
      << reacted.load() << ", pair 1's server got " << server1.wr_ids().size()
      << ", server channel saw " << server_cm_.Names();
  for (int i = 0; i < 20; ++i) rt_->Drain(kEngine, 64);  // anything still to come, would come
  std::vector<uint64_t> got = server1.wr_ids();
  std::sort(got.begin(), got.end());
  const std::vector<uint64_t> want = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(got, want) << "a receive reached its handler twice or never (the CmHandler's own "
                          "Drain returned "
                       << drained_inside.load() << ")";
  EXPECT_EQ(EngineDepth(), 0u) << "consumer 1's depth after everything was drained";
}

// FINDING (API gap): for RDMA_PS_UDP ids the event's rdma_ud_param (the remote QP number, qkey
// and address of a SIDR ESTABLISHED) had no place in CmEvent. Now it is CmEvent::ud.
TEST_F(RxeCmAttack, UdEstablishedCarriesTheRemoteQp) {
  ASSERT_NO_FATAL_FAILURE(Start());
  rdma_cm_id* udp_listen = nullptr;
  ASSERT_EQ(rdma_create_id(server_channel_, &udp_listen, nullptr, RDMA_PS_UDP), 0);
  extra_ids_.push_back(udp_listen);
  sockaddr_in addr = server_addr_;
  addr.sin_port = 0;
  ASSERT_EQ(rdma_bind_addr(udp_listen, reinterpret_cast<sockaddr*>(&addr)), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(udp_listen, 8), 0) << strerror(errno);
  addr.sin_port = rdma_get_src_port(udp_listen);
  CQD_ASSERT_OK(rt_->WatchCmChannel(server_channel_, server_cm_, kOwned));
  CQD_ASSERT_OK(rt_->WatchCmChannel(client_channel_, client_cm_, kOwned));
  static std::atomic<uint32_t> server_qpn;  // static: a late callback must not dangle
  server_qpn = 0;
  server_cm_.react = [&](const CmEvent& event) {
    if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;
    server_id_ = event.id;
    if (!MakeQp(event.id, server_conn_, kOwned, 0, IBV_QPT_UD)) return;
    server_qpn = event.id->qp->qp_num;
    rdma_conn_param param{};
    EXPECT_EQ(rdma_accept(event.id, &param), 0) << strerror(errno);
  };
  client_cm_.react = [&](const CmEvent& event) {
    if (event.type == RDMA_CM_EVENT_ADDR_RESOLVED) {
      EXPECT_EQ(rdma_resolve_route(event.id, 5000), 0) << strerror(errno);
    } else if (event.type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      if (!MakeQp(event.id, client_conn_, kOwned, 0, IBV_QPT_UD)) return;
      rdma_conn_param param{};
      EXPECT_EQ(rdma_connect(event.id, &param), 0) << strerror(errno);
    }
  };
  ASSERT_EQ(rdma_create_id(client_channel_, &client_id_, nullptr, RDMA_PS_UDP), 0);
  ASSERT_EQ(rdma_resolve_addr(client_id_, nullptr, reinterpret_cast<sockaddr*>(&addr), 5000), 0)
      << strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return !client_conn_.events().empty(); }, milliseconds(20000)))
      << "client channel saw " << client_cm_.Names() << "; server channel saw "
      << server_cm_.Names();
  const CmEvent event = client_conn_.events().front();
  ASSERT_EQ(event.type, RDMA_CM_EVENT_ESTABLISHED) << Str(event.type) << " " << event.status;
  EXPECT_EQ(event.ud.qp_num, server_qpn.load()) << "a UD ESTABLISHED's remote QP number";
  EXPECT_NE(event.ud.qkey, 0u);

  // TeardownQp refuses a UD QP with a status (runtime.h), and leaves it registered.
  ASSERT_TRUE(client_conn_.registration.registered());
  Result<Teardown> refused = rt_->TeardownQp(client_conn_.registration);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_TRUE(client_conn_.registration.registered());
}

}  // namespace
}  // namespace cqd

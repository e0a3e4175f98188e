// SPDX-License-Identifier: BSD-2-Clause
// Connection management through librdmacm on rxe: CM events reach the QP handler of a QP
// registered with its rdma_cm_id, ordered with its completions; the rest reach the channel's
// CmHandler. Server and client share the one device (cm_bed.h).
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
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

constexpr int kMessages = 256;
constexpr int kQueueDepth = kMessages + 16;
void* const kClientContext = reinterpret_cast<void*>(uintptr_t{0xc11e47});

using Conn = rxe::CmConn;
using Channel = rxe::RecordingCmHandler;

std::string Names(const std::vector<Conn::Seen>& seen) {
  std::string out;
  for (const Conn::Seen& s : seen) {
    out += std::string(rdma_event_str(s.type)) + "(" + std::to_string(s.status) + ") ";
  }
  return out;
}

class RxeCm : public ::testing::Test, protected rxe::CmBed {
 protected:
  void SetUp() override {
    RuntimeOptions options;
    options.pollers = 2;
    options.consumers.resize(2);  // 0: server, 1: client
    // The server's consumer holds little and is slow, so that most receive completions are
    // still in the CQ when DISCONNECTED is read.
    options.consumers[0].queue_capacity = 16;
    options.consumers[0].spill_capacity = 16;
    ASSERT_NO_FATAL_FAILURE(StartBed(options, kQueueDepth));
    CQD_ASSERT_OK(rt_->WatchCmChannel(server_channel_, server_cm_, 0));
    CQD_ASSERT_OK(rt_->WatchCmChannel(client_channel_, client_cm_, 1));
  }

  void TearDown() override {
    for (Conn* conn : {&server_conn_, &client_conn_}) conn->registration.Unregister();
    for (rdma_cm_id* id : {server_id_.load(), client_id_}) {
      if (id == nullptr) continue;
      if (id->qp != nullptr) rdma_destroy_qp(id);
      rdma_destroy_id(id);
    }
    StopBed(/*expect_cqs_destroyed=*/true);
  }

  // Gives `id` an RC QP whose sends go to shard 0's CQ and receives to shard 1's (so its events
  // travel as two parts), posts `recvs` receives, and registers it with `conn`.
  bool MakeQp(rdma_cm_id* id, Conn& conn, ConsumerId consumer, int recvs) {
    ibv_qp_init_attr attr{};
    attr.send_cq = cqs_[0].verbs();
    attr.recv_cq = cqs_[1].verbs();
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = kQueueDepth;
    attr.cap.max_recv_wr = kQueueDepth;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = 64;
    return MakeCmQp(id, attr, recvs, conn, consumer, &conn.registration);
  }

  // The server accepts one connection; the client resolves and connects to `port`.
  void Connect(in_port_t port) {
    server_cm_.react = [this](const CmEvent& event) {
      if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;
      EXPECT_EQ(event.listen_id, listen_id_);
      server_id_ = event.id;
      if (!MakeQp(event.id, server_conn_, 0, kMessages + 8)) return;
      rdma_conn_param param{};
      param.responder_resources = param.initiator_depth = 1;
      EXPECT_EQ(rdma_accept(event.id, &param), 0) << strerror(errno);
    };
    client_cm_.react = [this](const CmEvent& event) {
      if (event.type == RDMA_CM_EVENT_ADDR_RESOLVED) {
        EXPECT_EQ(rdma_resolve_route(event.id, 5000), 0) << strerror(errno);
      } else if (event.type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
        if (!MakeQp(event.id, client_conn_, 1, 0)) return;
        rdma_conn_param param{};
        param.responder_resources = param.initiator_depth = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        const char hello[] = "cqd-hello";
        param.private_data = hello;
        param.private_data_len = sizeof(hello);
        EXPECT_EQ(rdma_connect(event.id, &param), 0) << strerror(errno);
      }
    };
    ASSERT_EQ(rdma_create_id(client_channel_, &client_id_, kClientContext, RDMA_PS_TCP), 0);
    sockaddr_in to = server_addr_;
    to.sin_port = port;
    ASSERT_EQ(rdma_resolve_addr(client_id_, nullptr, reinterpret_cast<sockaddr*>(&to), 5000), 0)
        << strerror(errno);
  }

  std::atomic<rdma_cm_id*> server_id_{nullptr};
  rdma_cm_id* client_id_ = nullptr;
  Channel server_cm_, client_cm_;
  Conn server_conn_{std::chrono::microseconds(200)};  // slow: completions queue up behind it
  Conn client_conn_;
};

TEST_F(RxeCm, DisconnectedFollowsEveryCompletionPolledBeforeIt) {
  ASSERT_EQ(rdma_listen(listen_id_, 8), 0) << strerror(errno);
  // Both ends tear down on DISCONNECTED, from their handler (the server answers it first).
  for (Conn* conn : {&server_conn_, &client_conn_}) {
    conn->on_event = [this, conn](const CmEvent& event) {
      if (event.type != RDMA_CM_EVENT_DISCONNECTED) return;
      // Answers the peer's disconnect request (the passive side's DREP); a no-op on the side
      // that asked.
      if (conn == &server_conn_) {
        EXPECT_EQ(rdma_disconnect(event.id), 0) << strerror(errno);
      }
      auto teardown = rt_->TeardownQp(conn->registration);
      EXPECT_TRUE(teardown.ok()) << teardown.status().ToString();
      if (teardown.ok()) conn->teardown = *teardown;
    };
  }
  Connect(server_addr_.sin_port);
  ASSERT_TRUE(WaitFor([&] {
    return server_conn_.Saw(RDMA_CM_EVENT_ESTABLISHED) &&
           client_conn_.Saw(RDMA_CM_EVENT_ESTABLISHED);
  })) << "no connection";
  // The listener saw the request with the client's private data; resolution events went to the
  // client's channel handler, connection events to the QP handlers.
  EXPECT_EQ(server_cm_.types(), std::vector<rdma_cm_event_type>{RDMA_CM_EVENT_CONNECT_REQUEST});
  EXPECT_EQ(client_cm_.types(), (std::vector<rdma_cm_event_type>{RDMA_CM_EVENT_ADDR_RESOLVED,
                                                                 RDMA_CM_EVENT_ROUTE_RESOLVED}));
  EXPECT_EQ(server_conn_.seen().front().qp_num, server_id_.load()->qp->qp_num);
  // Each event carries its id's context as it was when read.
  EXPECT_EQ(client_cm_.contexts(), (std::vector<void*>{kClientContext, kClientContext}));

  for (int i = 0; i < kMessages; ++i) {
    Status posted = rxe::PostSend(client_id_->qp, i, buffers_, i, 64, false);
    ASSERT_TRUE(posted.ok()) << "send " << i << ": " << posted.ToString();
  }
  ASSERT_TRUE(WaitFor([&] { return client_conn_.successes() == kMessages; }))
      << client_conn_.successes() << " of " << kMessages << " sends completed";
  // Every receive completion is in the server's CQ (or further on) before the disconnect
  // request can arrive behind the messages.
  ASSERT_EQ(rdma_disconnect(client_id_), 0) << strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return server_conn_.Saw(RDMA_CM_EVENT_DISCONNECTED); }));
  for (const Conn::Seen& seen : server_conn_.seen()) {
    if (seen.type == RDMA_CM_EVENT_DISCONNECTED) {
      EXPECT_EQ(seen.successes_before, kMessages) << "DISCONNECTED overtook receive completions";
    }
  }
  EXPECT_EQ(server_conn_.successes(), kMessages);
  // Both teardowns drain; afterwards the ids' late events (TIMEWAIT_EXIT) find no registration
  // and go to the channel handlers.
  ASSERT_TRUE(WaitFor([&] { return server_conn_.teardown.done() && client_conn_.teardown.done(); }))
      << "server saw " << Names(server_conn_.seen()) << "; client saw "
      << Names(client_conn_.seen());
  EXPECT_TRUE(server_conn_.teardown.Wait().ok());
  EXPECT_TRUE(client_conn_.teardown.Wait().ok());
  EXPECT_TRUE(WaitFor(
      [&] {
        return server_cm_.Saw(RDMA_CM_EVENT_TIMEWAIT_EXIT) &&
               client_cm_.Saw(RDMA_CM_EVENT_TIMEWAIT_EXIT);
      },
      milliseconds(60000)))
      << "no TIMEWAIT_EXIT at the channel handlers";
  Stats stats = rt_->GetStats();
  EXPECT_GE(stats.cm_events, 8u);
}

TEST_F(RxeCm, ErrorsOfARegisteredIdReachItsHandler) {
  // Nobody listens on the port the client connects to.
  sockaddr_in addr = server_addr_;
  rdma_cm_id* unused = nullptr;
  ASSERT_EQ(rdma_create_id(server_channel_, &unused, nullptr, RDMA_PS_TCP), 0);
  addr.sin_port = 0;
  ASSERT_EQ(rdma_bind_addr(unused, reinterpret_cast<sockaddr*>(&addr)), 0);
  const in_port_t port = rdma_get_src_port(unused);
  rdma_destroy_id(unused);  // the port is free again, and nobody listens on it
  Connect(port);
  ASSERT_TRUE(WaitFor(
      [&] {
        return client_conn_.Saw(RDMA_CM_EVENT_REJECTED) ||
               client_conn_.Saw(RDMA_CM_EVENT_UNREACHABLE) ||
               client_conn_.Saw(RDMA_CM_EVENT_CONNECT_ERROR);
      },
      milliseconds(60000)))
      << "the failed connect reached no QP handler";
  std::vector<Conn::Seen> seen = client_conn_.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].qp_num, client_id_->qp->qp_num);
  EXPECT_NE(seen[0].status, 0);
  EXPECT_EQ(client_cm_.types(), (std::vector<rdma_cm_event_type>{RDMA_CM_EVENT_ADDR_RESOLVED,
                                                                 RDMA_CM_EVENT_ROUTE_RESOLVED}));
  EXPECT_TRUE(server_cm_.types().empty());
}

TEST_F(RxeCm, UnwatchedChannelIsNotRead) {
  CQD_ASSERT_OK(rt_->UnwatchCmChannel(client_channel_));
  EXPECT_EQ(rt_->UnwatchCmChannel(client_channel_).code(), StatusCode::kNotFound);
  EXPECT_EQ(rt_->WatchCmChannel(server_channel_, server_cm_, 0).code(), StatusCode::kAlreadyExists);
  // The client's channel is the engine's again: it reads ADDR_RESOLVED itself.
  ASSERT_EQ(rdma_create_id(client_channel_, &client_id_, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(
      rdma_resolve_addr(client_id_, nullptr, reinterpret_cast<sockaddr*>(&server_addr_), 5000), 0);
  rdma_cm_event* event = nullptr;
  ASSERT_TRUE(WaitFor([&] { return rdma_get_cm_event(client_channel_, &event) == 0; }));
  EXPECT_EQ(event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ack_cm_event(event);
  EXPECT_TRUE(client_cm_.types().empty());
  // Watching it again works, and its events flow to the handler once more.
  CQD_ASSERT_OK(rt_->WatchCmChannel(client_channel_, client_cm_, 1));
  ASSERT_EQ(rdma_resolve_route(client_id_, 5000), 0);
  EXPECT_TRUE(WaitFor([&] { return client_cm_.Saw(RDMA_CM_EVENT_ROUTE_RESOLVED); }));
}

}  // namespace
}  // namespace cqd

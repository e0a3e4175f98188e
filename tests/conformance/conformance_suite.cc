// SPDX-License-Identifier: BSD-2-Clause
// The verbs rules S1-S14 of docs/DESIGN.md, as tests against the backend seam. Instantiated once
// per backend (sim_conformance_test.cc here; the rxe instantiation runs the same tests on verbs).
//
// "It happens" is waited for with a generous timeout; "it does not happen" is checked over a
// short quiet period, which can only let a bug through, never fail a correct backend.
#include <fcntl.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/conformance/bed.h"
#include "tests/fixtures/wait.h"

namespace cqd::conformance {
namespace {

// S1: ibv_get_cq_event blocks until the next event and returns the CQ it is for.
TEST_P(Conformance, S1_GetEventBlocksUntilNotification) {
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  std::atomic<bool> returned{false};
  void* native = nullptr;
  int rc = -1;
  std::thread waiter([&] {
    rc = channel_->GetEvent(&native);
    returned.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(kQuietMs));
  EXPECT_FALSE(returned.load()) << "GetEvent returned with no completion";
  CQD_ASSERT_OK(bed_->Receive(1, false));
  waiter.join();
  ASSERT_EQ(rc, 0);
  ++unacked_;
  EXPECT_EQ(native, cq_->native());
  EXPECT_EQ(PollFor(1).size(), 1u);
}

// S2: destroying a CQ waits until every event read for it was acked.
TEST_P(Conformance, S2_DestroyWaitsForAck) {
  SetNonBlocking(channel_->fd());
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_EQ(NextEvent(), cq_->native());
  ASSERT_EQ(PollFor(1).size(), 1u);
  CQD_ASSERT_OK(bed_->Detach());
  attached_ = false;
  std::atomic<bool> destroyed{false};
  backend::Cq* cq = std::exchange(cq_, nullptr);
  std::thread destroyer([&] {
    EXPECT_TRUE(dev().DestroyCq(cq).ok());
    destroyed.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(kQuietMs));
  EXPECT_FALSE(destroyed.load()) << "DestroyCq returned with an unacked event";
  dev().AckCqEvents(cq, 1);
  unacked_ = 0;
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

// S3: one ack call acknowledges many events.
TEST_P(Conformance, S3_OneAckCoversManyEvents) {
  SetNonBlocking(channel_->fd());
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(cq_->RequestNotify(false), 0);
    CQD_ASSERT_OK(bed_->Receive(1, false));
    ASSERT_EQ(NextEvent(), cq_->native()) << "event " << i;
    ASSERT_EQ(PollFor(1).size(), 1u);
  }
  EXPECT_EQ(unacked_, 5u);
  AckAll();  // one call for all five; TearDown's destroy would hang otherwise
}

// S4: a non-blocking channel returns EAGAIN when empty and is pollable.
TEST_P(Conformance, S4_NonBlockingChannel) {
  SetNonBlocking(channel_->fd());
  void* native = nullptr;
  errno = 0;
  EXPECT_EQ(channel_->GetEvent(&native), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_FALSE(Readable(channel_->fd(), 0));
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_TRUE(Readable(channel_->fd(), kEventuallyMs));
  ASSERT_EQ(channel_->GetEvent(&native), 0);
  ++unacked_;
  EXPECT_EQ(native, cq_->native());
  errno = 0;
  EXPECT_EQ(channel_->GetEvent(&native), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(PollFor(1).size(), 1u);
}

// S5: a completion added between re-arming and emptying the CQ yields a later event for which the
// CQ may already be empty.
TEST_P(Conformance, S5_EventForAlreadyEmptiedCq) {
  SetNonBlocking(channel_->fd());
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_EQ(NextEvent(), cq_->native());
  AckAll();
  ASSERT_EQ(cq_->RequestNotify(false), 0);  // re-arm, then (before emptying) one more arrives
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_EQ(PollFor(2).size(), 2u);       // empty the CQ: both are taken
  ASSERT_EQ(NextEvent(), cq_->native());  // the second one's event still comes
  ibv_wc wc;
  EXPECT_EQ(cq_->Poll(1, &wc), 0);  // ... for an empty CQ
}

// S6: completions already in the CQ when it is armed raise no event; the next one does.
TEST_P(Conformance, S6_ArmDoesNotCoverOlderCompletions) {
  SetNonBlocking(channel_->fd());
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_EQ(NextEvent(), cq_->native());  // the completion is now in the CQ, unpolled
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  EXPECT_FALSE(Readable(channel_->fd(), kQuietMs)) << "arming notified an older completion";
  EXPECT_EQ(PollFor(1).size(), 1u);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  EXPECT_EQ(NextEvent(), cq_->native());
  EXPECT_EQ(PollFor(1).size(), 1u);
}

// S7: while a request is pending, another one has no effect: one event.
TEST_P(Conformance, S7_RepeatedArmGivesOneEvent) {
  SetNonBlocking(channel_->fd());
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(2, false));
  ASSERT_EQ(PollFor(2).size(), 2u);
  ASSERT_EQ(NextEvent(), cq_->native());
  EXPECT_FALSE(Readable(channel_->fd(), kQuietMs)) << "a second event for one request";
}

// S8: solicited-only arming fires for solicited receives and for errors, not for others; when
// both kinds were requested, next-completion wins.
TEST_P(Conformance, S8_SolicitedOnly) {
  SetNonBlocking(channel_->fd());
  ASSERT_EQ(cq_->RequestNotify(true), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  ASSERT_EQ(PollFor(1).size(), 1u);
  EXPECT_FALSE(Readable(channel_->fd(), kQuietMs)) << "unsolicited receive fired solicited arm";
  CQD_ASSERT_OK(bed_->Receive(1, true));
  EXPECT_EQ(NextEvent(), cq_->native()) << "solicited receive did not fire";
  EXPECT_EQ(PollFor(1).size(), 1u);

  ASSERT_EQ(cq_->RequestNotify(true), 0);
  ASSERT_EQ(cq_->RequestNotify(false), 0);
  CQD_ASSERT_OK(bed_->Receive(1, false));
  EXPECT_EQ(NextEvent(), cq_->native()) << "next-completion did not win over solicited-only";
  EXPECT_EQ(PollFor(1).size(), 1u);

  ASSERT_EQ(cq_->RequestNotify(true), 0);
  CQD_ASSERT_OK(bed_->FailOne(7));
  EXPECT_EQ(NextEvent(), cq_->native()) << "an error completion did not fire solicited arm";
  EXPECT_GE(PollFor(1).size(), 1u);
}

// S9: poll never blocks, returns at most n, and takes completions for good.
TEST_P(Conformance, S9_PollTakesAtMostNForGood) {
  ibv_wc wc[4];
  EXPECT_EQ(cq_->Poll(4, wc), 0);
  CQD_ASSERT_OK(bed_->Receive(5, false));
  std::vector<ibv_wc> got = PollFor(5, 2);
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(got[i - 1].wr_id, got[i].wr_id) << "order";
  EXPECT_EQ(cq_->Poll(4, wc), 0) << "a polled completion came back";
}

// S10: an error completion carries wr_id, status and qp_num.
TEST_P(Conformance, S10_ErrorCompletionValidFields) {
  CQD_ASSERT_OK(bed_->FailOne(0xabcdef));
  std::vector<ibv_wc> got = PollFor(1);
  ASSERT_GE(got.size(), 1u);
  EXPECT_NE(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 0xabcdefu);
  EXPECT_EQ(got[0].qp_num, bed_->qp_num());
}

// Reads async events until `want` arrived or the timeout; acks each one.
std::vector<backend::AsyncEventRecord> ReadAsync(backend::Device& dev, size_t want) {
  std::vector<backend::AsyncEventRecord> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventuallyMs);
  while (out.size() < want && std::chrono::steady_clock::now() < deadline) {
    pollfd p{dev.async_fd(), POLLIN, 0};
    if (poll(&p, 1, 50) != 1) continue;
    backend::AsyncEventRecord record;
    if (dev.GetAsyncEvent(&record) != 0) continue;
    out.push_back(record);
    dev.AckAsyncEvent(&record);
  }
  return out;
}

// S11: overflowing a CQ raises CQ_ERR for it. (The man page also has the CQ's QPs fail with a
// QP event and the CQ stop returning completions; rxe does neither, so the suite checks only what
// both verbs and the simulated device do. See docs/RXE.md.)
TEST_P(Conformance, S11_OverflowRaisesCqErr) {
  SetNonBlocking(dev().async_fd());
  CQD_ASSERT_OK(bed_->Overflow());
  bool cq_err = false;
  std::string seen;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventuallyMs);
  while (!cq_err && std::chrono::steady_clock::now() < deadline) {
    for (const auto& e : ReadAsync(dev(), 1)) {
      seen += std::string(ibv_event_type_str(e.type)) + "; ";
      cq_err |= e.type == IBV_EVENT_CQ_ERR && e.native_cq == cq_->native();
    }
  }
  EXPECT_TRUE(cq_err) << "events seen: " << seen;
}

// S12: the async fd is pollable, returns EAGAIN when non-blocking, and of several waiters each
// event reaches exactly one.
TEST_P(Conformance, S12_AsyncEventsReachOneWaiter) {
  constexpr int kEvents = 3;
  std::atomic<int> got{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kEvents; ++i) {
    waiters.emplace_back([&] {
      backend::AsyncEventRecord record;
      int rc;
      do {
        rc = dev().GetAsyncEvent(&record);
      } while (rc != 0 && errno == EINTR);
      if (rc == 0) {
        if (record.type == IBV_EVENT_SQ_DRAINED && record.qp_num == bed_->qp_num()) {
          got.fetch_add(1);
        }
        dev().AckAsyncEvent(&record);
      }
    });
  }
  for (int i = 0; i < kEvents; ++i) CQD_ASSERT_OK(bed_->RaiseQpEvent(IBV_EVENT_SQ_DRAINED));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(got.load(), kEvents);
  SetNonBlocking(dev().async_fd());
  backend::AsyncEventRecord record;
  errno = 0;
  EXPECT_EQ(dev().GetAsyncEvent(&record), -1) << "an event was delivered twice";
  EXPECT_EQ(errno, EAGAIN);
}

// S13: destroying the QP an async event refers to waits for that event's ack.
TEST_P(Conformance, S13_DestroyWaitsForAsyncAck) {
  SetNonBlocking(dev().async_fd());
  CQD_ASSERT_OK(bed_->RaiseQpEvent(IBV_EVENT_SQ_DRAINED));
  backend::AsyncEventRecord record;
  ASSERT_TRUE(Readable(dev().async_fd(), kEventuallyMs));
  ASSERT_EQ(dev().GetAsyncEvent(&record), 0);
  EXPECT_EQ(record.qp_num, bed_->qp_num());
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    EXPECT_TRUE(bed_->Detach().ok());
    destroyed.store(true);
  });
  attached_ = false;
  std::this_thread::sleep_for(std::chrono::milliseconds(kQuietMs));
  EXPECT_FALSE(destroyed.load()) << "QP destroy returned with an unacked async event";
  dev().AckAsyncEvent(&record);
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

// S14: every async event names what it is about, so it can be routed: a QP event its QP (and no
// CQ), a port event its port, CQ_ERR its CQ (S11 above).
TEST_P(Conformance, S14_AsyncEventsNameTheirObject) {
  SetNonBlocking(dev().async_fd());
  CQD_ASSERT_OK(bed_->RaiseQpEvent(IBV_EVENT_SQ_DRAINED));
  std::vector<backend::AsyncEventRecord> qp_events = ReadAsync(dev(), 1);
  ASSERT_EQ(qp_events.size(), 1u);
  EXPECT_EQ(qp_events[0].type, IBV_EVENT_SQ_DRAINED);
  EXPECT_TRUE(backend::IsQpEvent(qp_events[0].type));
  EXPECT_EQ(qp_events[0].qp_num, bed_->qp_num());
  EXPECT_EQ(qp_events[0].native_cq, nullptr);

  Status down = bed_->SetPortUp(false);
  if (down.code() == StatusCode::kUnavailable) GTEST_SKIP() << down.message();
  CQD_ASSERT_OK(down);
  // Wait for the port event; a device may raise others with it (rxe: GID_CHANGE).
  auto await_port_event = [&](ibv_event_type want) {
    std::string seen;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventuallyMs);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& e : ReadAsync(dev(), 1)) {
        seen += std::string(ibv_event_type_str(e.type)) + "; ";
        if (e.type == want) {
          EXPECT_TRUE(backend::IsPortEvent(e.type));
          EXPECT_EQ(e.port_num, 1);
          return;
        }
      }
    }
    ADD_FAILURE() << ibv_event_type_str(want) << " never came; seen: " << seen;
  };
  await_port_event(IBV_EVENT_PORT_ERR);
  CQD_ASSERT_OK(bed_->SetPortUp(true));
  await_port_event(IBV_EVENT_PORT_ACTIVE);
}

}  // namespace
}  // namespace cqd::conformance

// SPDX-License-Identifier: BSD-2-Clause
// The simulated device beyond the S1-S13 suite: what it adds to verbs (fault injection) and the
// verbs misuse it reports instead of hanging.
#include "runtime/backend/sim/sim_device.h"

#include <poll.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

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

// The fault hooks that return nothing ignore a null pointer and another device's CQ or channel
// (they crashed on null): the other device's objects are left as they were.
TEST(SimDevice, FaultHooksIgnoreNullAndForeignObjects) {
  auto sim = SimDevice::Create();
  auto other = SimDevice::Create();
  sim_internal::SimBackend dev(other);
  CQD_ASSERT_OK_AND_ASSIGN(channel, dev.CreateChannel());
  CQD_ASSERT_OK_AND_ASSIGN(cq, dev.CreateCq(8, channel));
  auto* foreign_cq = static_cast<SimCq*>(cq->native());
  auto* foreign_channel = static_cast<SimChannel*>(channel->native());
  sim->AddSpuriousEvent(nullptr);
  sim->FailGetEvent(nullptr, EINTR, 3);
  sim->FailRequestNotify(nullptr, EINTR, 3);
  sim->AddSpuriousEvent(foreign_cq);
  sim->FailGetEvent(foreign_channel, EINTR, 3);
  sim->FailRequestNotify(foreign_cq, EINTR, 3);
  EXPECT_EQ(cq->RequestNotify(false), 0);  // not failed by `sim`
  pollfd readable{channel->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&readable, 1, 0), 0);  // no spurious event was queued
  other->AddSpuriousEvent(foreign_cq);  // its own device's hook does queue one
  void* native = nullptr;
  EXPECT_EQ(channel->GetEvent(&native), 0);  // and no EINTR was set
  EXPECT_EQ(native, cq->native());
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

// Replay (benchmarks): an endless source cycling through a pattern, for exactly `total`
// completions, and stoppable at any time.
TEST(SimDevice, ReplayCyclesThroughThePatternAndStops) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(8, nullptr));
  auto* polled = static_cast<sim_internal::SimCqImpl*>(cq);
  std::vector<ibv_wc> pattern(3);
  for (int i = 0; i < 3; ++i) pattern[i].wr_id = 10 + i;
  cq->Replay(pattern, 7);
  ibv_wc wc[16];
  ASSERT_EQ(polled->Poll(5, wc), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(wc[i].wr_id, 10u + i % 3);
  ASSERT_EQ(polled->Poll(16, wc), 2);  // 7 in all
  EXPECT_EQ(wc[0].wr_id, 12u);
  EXPECT_EQ(polled->Poll(16, wc), 0);
  cq->Replay(pattern, 1000);
  EXPECT_EQ(polled->Poll(4, wc), 4);
  cq->Replay({}, 0);
  EXPECT_EQ(cq->replay_left(), 0u);
  EXPECT_EQ(polled->Poll(4, wc), 0);
  // Injected completions are back once the replay ended.
  ibv_wc one{};
  one.wr_id = 99;
  ASSERT_EQ(cq->Inject({&one, 1}), 1);
  ASSERT_EQ(polled->Poll(4, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 99u);
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

// A paced replay (open-loop benchmarks): completion k is pollable from start + k / rate on, and
// carries that time in wr_id; none is returned before its time, none is lost or repeated.
TEST(SimDevice, PacedReplayReleasesCompletionsOnTheirSchedule) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(8, nullptr));
  auto* polled = static_cast<sim_internal::SimCqImpl*>(cq);
  std::vector<ibv_wc> pattern(3);
  for (int i = 0; i < 3; ++i) pattern[i].qp_num = 100 + i;
  constexpr double kRate = 20000;  // one every 50 us
  constexpr uint64_t kTotal = 200;
  cq->Replay(pattern, kTotal, kRate);
  std::vector<ibv_wc> got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (got.size() < kTotal && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[16];
    int n = polled->Poll(16, wc);
    ASSERT_GE(n, 0);
    const auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now().time_since_epoch())
                                               .count());
    for (int i = 0; i < n; ++i) {
      EXPECT_LE(wc[i].wr_id, now) << "returned before its arrival time";
      got.push_back(wc[i]);
    }
  }
  ASSERT_EQ(got.size(), kTotal);
  for (size_t k = 1; k < got.size(); ++k) {
    EXPECT_EQ(got[k].qp_num, 100u + k % 3);
    const uint64_t gap = got[k].wr_id - got[k - 1].wr_id;
    EXPECT_GE(gap, 49999u);
    EXPECT_LE(gap, 50001u);
  }
  ibv_wc wc[4];
  EXPECT_EQ(polled->Poll(4, wc), 0);
  EXPECT_EQ(cq->replay_left(), 0u);
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

// Rates out of range are clamped (0.001..1e12 per second): an enormous rate releases everything
// at once, an infinite one too and still stamps, a vanishing one releases completion 0 (stamped
// with the start) and nothing for the next 1000 s; NaN and negative rates replay unpaced.
TEST(SimDevice, PacedReplayClampsTheRate) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(8, nullptr));
  auto* polled = static_cast<sim_internal::SimCqImpl*>(cq);
  std::vector<ibv_wc> pattern(1);
  pattern[0].wr_id = 7;
  auto now_ns = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  };
  ibv_wc wc[8];
  for (double rate : {1e300, std::numeric_limits<double>::infinity()}) {
    const uint64_t before = now_ns();
    cq->Replay(pattern, 5, rate);
    int got = 0;
    for (int tries = 0; got < 5 && tries < 1000000; ++tries) {
      const int n = polled->Poll(8, wc);
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i) {
        EXPECT_GE(wc[i].wr_id, before) << rate;  // stamped with its time
        EXPECT_LE(wc[i].wr_id, now_ns()) << rate;
      }
      got += n;
    }
    EXPECT_EQ(got, 5) << rate;
  }
  const uint64_t before = now_ns();
  cq->Replay(pattern, 5, 1e-300);
  ASSERT_EQ(polled->Poll(8, wc), 1);
  EXPECT_GE(wc[0].wr_id, before);
  EXPECT_LE(wc[0].wr_id, now_ns());
  EXPECT_EQ(polled->Poll(8, wc), 0);
  EXPECT_EQ(cq->replay_left(), 4u);
  for (double rate : {std::nan(""), -1.0}) {
    cq->Replay(pattern, 3, rate);
    ASSERT_EQ(polled->Poll(8, wc), 3) << rate;
    EXPECT_EQ(wc[0].wr_id, 7u);  // unpaced: the pattern as it is
  }
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

TEST(SimDevice, StampPollTimeWritesTheClockIntoSrcQp) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(8, nullptr));
  auto* polled = static_cast<sim_internal::SimCqImpl*>(cq);
  cq->StampPollTime(true);
  ibv_wc in{};
  ASSERT_EQ(cq->Inject({&in, 1}), 1);
  auto before = static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  ibv_wc out;
  ASSERT_EQ(polled->Poll(1, &out), 1);
  EXPECT_LT(out.src_qp - before, 1'000'000'000u) << "stamped at poll time (mod 2^32 ns)";
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

// Posted work requests flush on the move to the error state, as on rxe: receives before sends
// (or sends first), the send marker inside its post, the receive marker at the next move.
std::vector<uint64_t> PollAll(sim_internal::SimCqImpl* cq) {
  std::vector<uint64_t> ids;
  ibv_wc wc[16];
  for (int n; (n = cq->Poll(16, wc)) > 0;) {
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
      ids.push_back(wc[i].wr_id);
    }
  }
  return ids;
}

constexpr uint64_t kSendMarker = 1000;
constexpr uint64_t kRecvMarker = 1001;

// Posts three receives and two sends, starts a drain, and polls the CQ into `ids`.
void FlushOrder(const SimDeviceOptions& options, std::vector<uint64_t>* ids) {
  auto sim = SimDevice::Create(options);
  sim_internal::SimBackend dev(sim);
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(16, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq, cq, {.max_send_wr = 4, .max_recv_wr = 4}));
  for (uint64_t id : {0, 1, 2}) CQD_ASSERT_OK(qp->PostRecv(id));
  for (uint64_t id : {10, 11}) CQD_ASSERT_OK(qp->PostSend(id));
  EXPECT_EQ(qp->outstanding(true), 3);
  EXPECT_EQ(cq->size(), 0) << "posted work completes only when flushed";
  CQD_ASSERT_OK_AND_ASSIGN(posted, dev.StartQpFlush(qp, kSendMarker, kRecvMarker));
  EXPECT_EQ(posted, backend::FlushStart::kAllMarkers);
  EXPECT_EQ(qp->outstanding(true), 0);
  *ids = PollAll(static_cast<sim_internal::SimCqImpl*>(cq));
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

TEST(SimDevice, ReceivesFlushBeforeSendsAsOnRxe) {
  std::vector<uint64_t> ids;
  FlushOrder({}, &ids);
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 1, 2, 10, 11, kSendMarker, kRecvMarker}));
}

TEST(SimDevice, FlushOrderCanPutSendsFirst) {
  SimDeviceOptions options;
  options.flush_receives_first = false;
  std::vector<uint64_t> ids;
  FlushOrder(options, &ids);
  EXPECT_EQ(ids, (std::vector<uint64_t>{10, 11, 0, 1, 2, kSendMarker, kRecvMarker}));
}

TEST(SimDevice, TheReceiveMarkerCanArriveFirst) {
  SimDeviceOptions options;
  options.flush_sends_at_post = false;  // a send posted in error waits for the next move too
  std::vector<uint64_t> ids;
  FlushOrder(options, &ids);
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 1, 2, 10, 11, kRecvMarker, kSendMarker}));
}

TEST(SimDevice, InErrorASendFlushesAtOnceAndAReceiveAtTheNextMove) {
  auto sim = SimDevice::Create();
  sim_internal::SimBackend dev(sim);
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(16, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq, cq, {.max_send_wr = 4, .max_recv_wr = 4}));
  CQD_ASSERT_OK(dev.StartQpFlush(qp, kSendMarker, kRecvMarker).status());
  auto* polled = static_cast<sim_internal::SimCqImpl*>(cq);
  EXPECT_EQ(PollAll(polled), (std::vector<uint64_t>{kSendMarker, kRecvMarker}));
  CQD_ASSERT_OK(qp->PostRecv(50));
  CQD_ASSERT_OK(qp->PostSend(60));
  EXPECT_EQ(PollAll(polled), (std::vector<uint64_t>{60}));
  EXPECT_EQ(qp->outstanding(true), 1);
  CQD_ASSERT_OK(dev.RedriveFlush(qp, 70));  // moves it to error again
  EXPECT_EQ(PollAll(polled), (std::vector<uint64_t>{50, 70}));
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

TEST(SimDevice, AFullReceiveQueueRefusesTheMarkerUntilItsFlushesFit) {
  auto sim = SimDevice::Create();
  sim_internal::SimBackend dev(sim);
  CQD_ASSERT_OK_AND_ASSIGN(send_cq, sim->CreateCq(8, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(recv_cq, sim->CreateCq(4, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(send_cq, recv_cq, {.max_recv_wr = 2}));
  for (uint64_t id : {0, 1, 2}) CQD_ASSERT_OK(qp->PostRecv(id));  // max_recv_wr + 1: full
  EXPECT_EQ(qp->PostRecv(3).code(), StatusCode::kResourceExhausted);
  std::vector<ibv_wc> other(4);
  ASSERT_EQ(recv_cq->Inject(other), 4);  // the receive CQ is full: nothing can flush into it
  CQD_ASSERT_OK_AND_ASSIGN(posted, dev.StartQpFlush(qp, kSendMarker, kRecvMarker));
  EXPECT_EQ(posted, backend::FlushStart::kSendMarkerOnly);
  EXPECT_EQ(dev.RedriveFlush(qp, kRecvMarker).code(), StatusCode::kResourceExhausted);
  auto* polled = static_cast<sim_internal::SimCqImpl*>(recv_cq);
  ibv_wc wc[4];
  ASSERT_EQ(polled->Poll(4, wc), 4);  // room: the flushes fit at the next move to error
  CQD_ASSERT_OK(dev.RedriveFlush(qp, kRecvMarker));
  EXPECT_EQ(PollAll(polled), (std::vector<uint64_t>{0, 1, 2, kRecvMarker}));
  EXPECT_EQ(PollAll(static_cast<sim_internal::SimCqImpl*>(send_cq)),
            (std::vector<uint64_t>{kSendMarker}));
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(send_cq));
  CQD_ASSERT_OK(sim->DestroyCq(recv_cq));
}

TEST(SimDevice, PostRecvOnAnSrqQpIsRefused) {
  auto sim = SimDevice::Create();
  CQD_ASSERT_OK_AND_ASSIGN(cq, sim->CreateCq(8, nullptr));
  CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cq, cq, {.srq = true}));
  EXPECT_EQ(qp->PostRecv(1).code(), StatusCode::kInvalidArgument);
  CQD_ASSERT_OK(sim->DestroyQp(qp));
  CQD_ASSERT_OK(sim->DestroyCq(cq));
}

}  // namespace
}  // namespace cqd

// SPDX-License-Identifier: BSD-2-Clause
// tests/conformance/bed.h: what the S1-S14 conformance suite needs from a backend.
//
// The suite (conformance_suite.cc) drives the seam (runtime/backend/device.h) directly. A Bed
// supplies the device and the one thing the seam cannot do by itself: make completions and events
// happen on the CQ under test (on the simulated device by injection; on verbs by real traffic).
#ifndef CQD_TESTS_CONFORMANCE_BED_H_
#define CQD_TESTS_CONFORMANCE_BED_H_

#include <fcntl.h>
#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cqd/status.h"
#include "gtest/gtest.h"
#include "runtime/backend/device.h"
#include "tests/fixtures/wait.h"

namespace cqd::conformance {

class Bed {
 public:
  virtual ~Bed() = default;
  virtual backend::Device& device() = 0;
  // Creates the QP under test with `cq` as both its send and receive CQ.
  virtual Status Attach(backend::Cq* cq) = 0;
  // Destroys that QP (S13: may block until its async events are acked).
  virtual Status Detach() = 0;
  virtual uint32_t qp_num() const = 0;
  // Makes `n` successful receive completions arrive on the CQ (sent with IBV_SEND_SOLICITED when
  // `solicited`). They may arrive after this returns (real devices are asynchronous).
  virtual Status Receive(int n, bool solicited) = 0;
  // Makes one unsuccessful receive completion with `wr_id` arrive on the CQ (on verbs: a posted
  // receive flushed by moving the QP to the error state; the QP stays in error).
  virtual Status FailOne(uint64_t wr_id) = 0;
  // Posts more completions than the CQ holds (S11).
  virtual Status Overflow() = 0;
  // Makes the device raise a QP async event for the QP under test. Every bed supports
  // IBV_EVENT_SQ_DRAINED (on verbs: move the QP to SQD and back to RTS).
  virtual Status RaiseQpEvent(ibv_event_type type) = 0;
  // Takes port 1 down (PORT_ERR) or brings it up (PORT_ACTIVE) as a link change does (on verbs
  // in the VM: `ip link set eth0 down|up`). kUnavailable where that would cut a real host off.
  virtual Status SetPortUp(bool up) = 0;
};

struct BedFactory {
  std::string name;
  std::function<std::unique_ptr<Bed>()> make;
};

// The suite's fixture: a channel and a CQ of depth kDepth on the bed's device, with the bed's
// QP attached.
inline constexpr int kQuietMs = 150;
inline constexpr int kEventuallyMs = 10000;

class Conformance : public ::testing::TestWithParam<BedFactory> {
 protected:
  void SetUp() override {
    bed_ = GetParam().make();
    ASSERT_NE(bed_, nullptr);
    auto channel = dev().CreateChannel();
    ASSERT_TRUE(channel.ok()) << channel.status().ToString();
    channel_ = *channel;
    auto cq = dev().CreateCq(kDepth, channel_);
    ASSERT_TRUE(cq.ok()) << cq.status().ToString();
    cq_ = *cq;
    CQD_ASSERT_OK(bed_->Attach(cq_));
    attached_ = true;
  }

  void TearDown() override {
    if (bed_ == nullptr) return;
    if (attached_) {
      EXPECT_TRUE(bed_->Detach().ok());
    }
    if (cq_ != nullptr) {
      // Ack whatever the test read but left unacked, then destroy (S2).
      if (unacked_ > 0) dev().AckCqEvents(cq_, unacked_);
      EXPECT_TRUE(dev().DestroyCq(cq_).ok());
    }
    if (channel_ != nullptr) {
      EXPECT_TRUE(dev().DestroyChannel(channel_).ok());
    }
  }

  backend::Device& dev() { return bed_->device(); }

  void SetNonBlocking(int fd) { ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0); }

  // Returns true if `fd` becomes readable within `ms`.
  static bool Readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    int rc;
    do {
      rc = poll(&p, 1, ms);
    } while (rc < 0 && errno == EINTR);
    return rc == 1;
  }

  // Waits for one completion event (non-blocking channel) and returns its CQ; counts it unacked.
  void* NextEvent() {
    if (!Readable(channel_->fd(), kEventuallyMs)) return nullptr;
    void* native = nullptr;
    int rc;
    do {
      rc = channel_->GetEvent(&native);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return nullptr;
    ++unacked_;
    return native;
  }
  void AckAll() {
    dev().AckCqEvents(cq_, unacked_);
    unacked_ = 0;
  }

  // Polls until `want` completions were taken (or the timeout); returns them.
  std::vector<ibv_wc> PollFor(int want, int batch = 16) {
    std::vector<ibv_wc> out;
    std::vector<ibv_wc> wc(batch);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventuallyMs);
    while (static_cast<int>(out.size()) < want && std::chrono::steady_clock::now() < deadline) {
      int n = cq_->Poll(batch, wc.data());
      EXPECT_GE(n, 0);
      EXPECT_LE(n, batch);
      if (n <= 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      out.insert(out.end(), wc.begin(), wc.begin() + n);
    }
    return out;
  }

  static constexpr int kDepth = 64;
  std::unique_ptr<Bed> bed_;
  backend::Channel* channel_ = nullptr;
  backend::Cq* cq_ = nullptr;
  bool attached_ = false;
  unsigned unacked_ = 0;
};

}  // namespace cqd::conformance

#endif  // CQD_TESTS_CONFORMANCE_BED_H_

// SPDX-License-Identifier: BSD-2-Clause
// tests/rxe/rxe_fixture.h: the fixture of the tests that run cqd on real verbs (rxe in the VM, or
// $CQD_RDMA_DEVICE on an RDMA host): a runtime on the device, a PD, registered buffers, CQs, and
// connected RC QP pairs whose handlers keep everything they are given.
#ifndef CQD_TESTS_RXE_RXE_FIXTURE_H_
#define CQD_TESTS_RXE_RXE_FIXTURE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"
#include "tools/rdma/verbs_util.h"

namespace cqd {

// Keeps copies of everything it is given.
class WcRecorder : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    wcs_.insert(wcs_.end(), wcs.begin(), wcs.end());
    threads_.insert(std::this_thread::get_id());
    count_.fetch_add(wcs.size(), std::memory_order_release);
  }
  void OnAsyncEvent(const AsyncEvent& event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }
  size_t count() const { return count_.load(std::memory_order_acquire); }
  std::vector<ibv_wc> wcs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return wcs_;
  }
  std::vector<AsyncEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // The threads OnCompletions ran on.
  std::set<std::thread::id> threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<ibv_wc> wcs_;
  std::vector<AsyncEvent> events_;
  std::set<std::thread::id> threads_;
  std::atomic<size_t> count_{0};
};

struct Pair {
  ibv_qp* a = nullptr;  // receives
  ibv_qp* b = nullptr;  // sends
  WcRecorder a_handler, b_handler;
  Registration a_reg, b_reg;
};

class Rxe : public ::testing::Test {
 protected:
  void Start(const RuntimeOptions& options, DeviceEventHandler* events = nullptr) {
    auto rt = Runtime::Create(options);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    rt_ = std::move(rt).value();
    auto dev = rt_->OpenVerbsDevice(rxe::DeviceName(), events);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    dev_ = *dev;
    ibv_context* context = rt_->VerbsContext(dev_).value();
    gid_index_ = rxe::FindGidIndex(context);
    pd_ = ibv_alloc_pd(context);
    ASSERT_NE(pd_, nullptr);
    CQD_ASSERT_OK(buffers_.Register(pd_, 1024, 4096));
  }

  void TearDown() override {
    for (auto& p : pairs_) {
      p->a_reg.Unregister();
      p->b_reg.Unregister();
      if (p->a) {
        EXPECT_EQ(ibv_destroy_qp(p->a), 0);
      }
      if (p->b) {
        EXPECT_EQ(ibv_destroy_qp(p->b), 0);
      }
    }
    pairs_.clear();
    for (CqHandle cq : cqs_) {
      Status s = rt_->DestroyCq(cq);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    if (buffers_.mr != nullptr) {
      ibv_dereg_mr(buffers_.mr);
      buffers_.mr = nullptr;
    }
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    rt_.reset();  // closes the device it opened
  }

  CqHandle MakeCq(int shard, bool solicited_only = false) {
    CqOptions options;
    options.depth = 1024;
    options.solicited_only = solicited_only;
    auto cq = rt_->CreateCq(dev_, shard, options);
    EXPECT_TRUE(cq.ok()) << cq.status().ToString();
    cqs_.push_back(*cq);
    return *cq;
  }

  // A (on a_cq, consumer a_consumer) and B (on b_cq, consumer b_consumer), connected.
  Pair* MakePair(CqHandle a_cq, CqHandle b_cq, ConsumerId a_consumer, ConsumerId b_consumer) {
    auto pair = std::make_unique<Pair>();
    auto a = rxe::CreateRcQp(pd_, a_cq.verbs(), a_cq.verbs(), 128);
    auto b = rxe::CreateRcQp(pd_, b_cq.verbs(), b_cq.verbs(), 128);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    pair->a = *a;
    pair->b = *b;
    EXPECT_TRUE(rxe::ConnectLoopback(pair->a, pair->b->qp_num, gid_index_).ok());
    EXPECT_TRUE(rxe::ConnectLoopback(pair->b, pair->a->qp_num, gid_index_).ok());
    auto ra = rt_->RegisterQp(pair->a, pair->a_handler, a_consumer);
    auto rb = rt_->RegisterQp(pair->b, pair->b_handler, b_consumer);
    EXPECT_TRUE(ra.ok() && rb.ok());
    if (!ra.ok() || !rb.ok()) return nullptr;
    pair->a_reg = std::move(ra).value();
    pair->b_reg = std::move(rb).value();
    pairs_.push_back(std::move(pair));
    return pairs_.back().get();
  }

  bool WaitForPollersAsleep() { return testing::WaitForPollersAsleep(*rt_); }

  std::unique_ptr<Runtime> rt_;
  DeviceId dev_ = 0;
  int gid_index_ = 0;
  ibv_pd* pd_ = nullptr;
  rxe::Buffers buffers_;
  std::vector<CqHandle> cqs_;
  std::vector<std::unique_ptr<Pair>> pairs_;
};

}  // namespace cqd

#endif  // CQD_TESTS_RXE_RXE_FIXTURE_H_

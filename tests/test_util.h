// tests/test_util.h: helpers shared by cqd's tests.
#ifndef CQD_TESTS_TEST_UTIL_H_
#define CQD_TESTS_TEST_UTIL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "gtest/gtest.h"

namespace cqd::testing {

// Returns true once `done()` holds, false if `timeout` passes first. For waiting on other
// threads only; never used to assert speed.
inline bool WaitFor(const std::function<bool()>& done,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

#define CQD_ASSERT_OK(expr)                                 \
  do {                                                      \
    ::cqd::Status _s = (expr);                              \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)

#define CQD_ASSERT_OK_AND_ASSIGN(lhs, expr)                                     \
  auto lhs##_result = (expr);                                                   \
  ASSERT_TRUE(lhs##_result.ok()) << #expr << ": " << lhs##_result.status().ToString(); \
  auto lhs = std::move(lhs##_result).value()

// A handler that checks that wr_ids of its QP arrive as 0, 1, 2, ... exactly once, on one thread
// at a time, and counts them.
class SequenceHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (inside_.exchange(true, std::memory_order_acq_rel)) concurrent_calls_.fetch_add(1);
    for (const ibv_wc& wc : wcs) {
      if (wc.qp_num != qp_num) wrong_qp_.fetch_add(1, std::memory_order_relaxed);
      if (wc.wr_id != next_) out_of_order_.fetch_add(1, std::memory_order_relaxed);
      next_ = wc.wr_id + 1;
    }
    thread_ = std::this_thread::get_id();
    received_.fetch_add(wcs.size(), std::memory_order_release);
    inside_.store(false, std::memory_order_release);
  }
  void OnAsyncEvent(const AsyncEvent& event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }

  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  uint64_t out_of_order() const { return out_of_order_.load(); }
  uint64_t wrong_qp() const { return wrong_qp_.load(); }
  uint64_t concurrent_calls() const { return concurrent_calls_.load(); }
  std::vector<AsyncEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  uint32_t qp_num = 0;

 private:
  std::atomic<bool> inside_{false};
  uint64_t next_ = 0;
  std::thread::id thread_;
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> out_of_order_{0};
  std::atomic<uint64_t> wrong_qp_{0};
  std::atomic<uint64_t> concurrent_calls_{0};
  mutable std::mutex mu_;
  std::vector<AsyncEvent> events_;
};

// Counts orphans and keeps their wr_ids.
class CountingOrphans : public OrphanHandler {
 public:
  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
    count.fetch_add(wcs.size(), std::memory_order_relaxed);
  }
  std::atomic<uint64_t> count{0};
};

}  // namespace cqd::testing

#endif  // CQD_TESTS_TEST_UTIL_H_

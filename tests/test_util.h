// SPDX-License-Identifier: BSD-2-Clause
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
#include "cqd/sim.h"
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

#define CQD_ASSERT_OK_AND_ASSIGN(lhs, expr)                                            \
  auto lhs##_result = (expr);                                                          \
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
    std::lock_guard<std::mutex> lock(mu_);
    for (const ibv_wc& wc : wcs) wr_ids_.push_back(wc.wr_id);
    count.fetch_add(wcs.size(), std::memory_order_release);
  }
  std::vector<uint64_t> wr_ids() const {
    std::lock_guard<std::mutex> lock(mu_);
    return wr_ids_;
  }
  std::atomic<uint64_t> count{0};

 private:
  mutable std::mutex mu_;
  std::vector<uint64_t> wr_ids_;
};

// Logs what a QP's handler receives, in order: completions by wr_id, events by type.
class RecordingHandler : public QpHandler {
 public:
  struct Entry {
    bool event;
    uint64_t wr_id;        // completions
    ibv_wc_status status;  // completions
    ibv_event_type type;   // events
  };
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ibv_wc& wc : wcs) log_.push_back({false, wc.wr_id, wc.status, {}});
    calls_.fetch_add(1, std::memory_order_relaxed);
    completions_.fetch_add(wcs.size(), std::memory_order_release);
  }
  void OnAsyncEvent(const AsyncEvent& event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back({true, 0, IBV_WC_SUCCESS, event.type});
    events_.fetch_add(1, std::memory_order_release);
  }
  std::vector<Entry> log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  // The completions' wr_ids, in delivery order.
  std::vector<uint64_t> wr_ids() const {
    std::vector<uint64_t> ids;
    for (const Entry& e : log()) {
      if (!e.event) ids.push_back(e.wr_id);
    }
    return ids;
  }
  uint64_t completions() const { return completions_.load(std::memory_order_acquire); }
  uint64_t events() const { return events_.load(std::memory_order_acquire); }
  // OnCompletions calls so far: one per run of the QP's completions a consumer delivered.
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mu_;
  std::vector<Entry> log_;
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> completions_{0};
  std::atomic<uint64_t> events_{0};
};

// Injects `n` receive completions with wr_ids first, first+1, ... for `qp`; returns false if the
// CQ had no room.
inline bool InjectRecvs(SimQp* qp, uint64_t first, int n, bool solicited = false) {
  for (int i = 0; i < n; ++i) {
    if (qp->Complete(first + i, IBV_WC_RECV, IBV_WC_SUCCESS, solicited) != 1) return false;
  }
  return true;
}

// Drains engine-driven `consumer` until `done()` holds; false after 30 s.
inline bool DrainUntil(Runtime& rt, ConsumerId consumer, const std::function<bool()>& done) {
  return WaitFor([&] {
    rt.Drain(consumer, 1024);
    return done();
  });
}

// A runtime on one simulated device, with a counting orphan handler: the bed the scenario tests
// build theirs on (a test's bed derives from it and adds its CQs, QPs and helpers). Declare
// registrations after it: they must go first.
struct SimBed {
  CountingOrphans orphans;
  std::unique_ptr<Runtime> rt;
  std::shared_ptr<SimDevice> sim;
  DeviceId dev = 0;

  // Creates the runtime (its orphan handler `orphans` unless `options` names one) and adds a
  // simulated device made with `device`. Returns the first failure.
  Status Start(RuntimeOptions options = {}, const SimDeviceOptions& device = {}) {
    if (options.orphan_handler == nullptr) options.orphan_handler = &orphans;
    auto runtime = Runtime::Create(options);
    if (!runtime.ok()) return runtime.status();
    rt = std::move(runtime).value();
    sim = SimDevice::Create(device);
    auto d = rt->AddSimDevice(sim);
    if (!d.ok()) return d.status();
    dev = *d;
    return Status::Ok();
  }
  // A CQ on `shard` (the bed's requests are valid: a failure ends the test binary).
  CqHandle Cq(int shard = 0, const CqOptions& options = {}) {
    return rt->CreateCq(dev, shard, options).value();
  }
  // A QP whose queues both use `cq`, or `send` and `recv`.
  SimQp* Qp(CqHandle cq, const SimQpOptions& options = {}) { return Qp(cq, cq, options); }
  SimQp* Qp(CqHandle send, CqHandle recv, const SimQpOptions& options = {}) {
    return sim->CreateQp(send.sim(), recv.sim(), options).value();
  }
};

// A runtime on a simulated device with `cqs` CQs (round robin over the shards) and `qps` QPs
// (round robin over the CQs and the consumers), each registered with a SequenceHandler.
struct SimTopology {
  std::unique_ptr<Runtime> rt;
  std::shared_ptr<SimDevice> sim;
  DeviceId device = 0;
  std::vector<CqHandle> cqs;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<SequenceHandler>> handlers;
  std::vector<Registration> registrations;

  // Returns the first failure.
  Status Build(const RuntimeOptions& options, int num_cqs, int num_qps, int depth = 4096) {
    auto runtime = Runtime::Create(options);
    if (!runtime.ok()) return runtime.status();
    rt = std::move(runtime).value();
    sim = SimDevice::Create();
    auto dev = rt->AddSimDevice(sim);
    if (!dev.ok()) return dev.status();
    device = *dev;
    for (int i = 0; i < num_cqs; ++i) {
      CqOptions cq_options;
      cq_options.depth = depth;
      auto cq = rt->CreateCq(device, i % options.pollers, cq_options);
      if (!cq.ok()) return cq.status();
      cqs.push_back(*cq);
    }
    for (int i = 0; i < num_qps; ++i) {
      SimCq* cq = cqs[i % num_cqs].sim();
      auto qp = sim->CreateQp(cq, cq);
      if (!qp.ok()) return qp.status();
      qps.push_back(*qp);
      handlers.push_back(std::make_unique<SequenceHandler>());
      handlers.back()->qp_num = (*qp)->qp_num();
      auto reg = rt->RegisterQp(**qp, *handlers.back(),
                                static_cast<ConsumerId>(i % options.consumers.size()));
      if (!reg.ok()) return reg.status();
      registrations.push_back(std::move(reg).value());
    }
    return Status::Ok();
  }

  uint64_t received() const {
    uint64_t sum = 0;
    for (const auto& h : handlers) sum += h->received();
    return sum;
  }

  // Unregisters, destroys QPs and CQs; returns the first failure.
  Status TearDown() {
    for (auto& r : registrations) r.Unregister();
    for (SimQp* qp : qps) {
      if (Status s = sim->DestroyQp(qp); !s.ok()) return s;
    }
    for (CqHandle cq : cqs) {
      if (Status s = rt->DestroyCq(cq); !s.ok()) return s;
    }
    qps.clear();
    cqs.clear();
    return Status::Ok();
  }
};

// A runtime on a simulated device with one CQ on shard 0 and one QP using it for both queues;
// the test registers the QP itself. Declare registrations after it: they must go first.
struct OneQp {
  std::unique_ptr<Runtime> rt;
  std::shared_ptr<SimDevice> sim = SimDevice::Create();
  DeviceId dev = 0;
  CqHandle cq;
  SimQp* qp = nullptr;

  // Returns the first failure.
  Status Build(const RuntimeOptions& options = {}, const CqOptions& cq_options = {}) {
    auto runtime = Runtime::Create(options);
    if (!runtime.ok()) return runtime.status();
    rt = std::move(runtime).value();
    auto d = rt->AddSimDevice(sim);
    if (!d.ok()) return d.status();
    dev = *d;
    auto c = rt->CreateCq(dev, 0, cq_options);
    if (!c.ok()) return c.status();
    cq = *c;
    auto q = sim->CreateQp(cq.sim(), cq.sim());
    if (!q.ok()) return q.status();
    qp = *q;
    return Status::Ok();
  }
};

// Returns the sum of one counter over all pollers, e.g. SumPollers(s, &PollerStats::sleeps).
inline uint64_t SumPollers(const Stats& s, uint64_t PollerStats::*counter) {
  uint64_t n = 0;
  for (const auto& p : s.pollers) n += p.*counter;
  return n;
}

// Waits until every runtime-driven poller of `rt` sleeps (PollerStats::asleep): armed, found
// nothing after arming, and waiting for an event or a wake. Engine-driven shards are the test's.
inline bool WaitForPollersAsleep(const Runtime& rt) {
  // All of them at once: two snapshots in a row that find each asleep, none having polled or
  // slept again in between (pollers may wake each other).
  auto asleep = [](const Stats& s) {
    for (const PollerStats& p : s.pollers) {
      if (p.engine_driven == 0 && p.asleep == 0) return false;
    }
    return true;
  };
  return WaitFor([&] {
    const Stats first = rt.GetStats();
    if (!asleep(first)) return false;
    const Stats second = rt.GetStats();
    if (!asleep(second)) return false;
    for (size_t i = 0; i < first.pollers.size(); ++i) {
      if (first.pollers[i].polls != second.pollers[i].polls ||
          first.pollers[i].sleeps != second.pollers[i].sleeps) {
        return false;
      }
    }
    return true;
  });
}

// Options with one engine-driven consumer (0) and one runtime-owned consumer (1).
inline RuntimeOptions EngineAndOwned(int pollers) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.consumers.assign(2, ConsumerOptions{});
  options.consumers[0].kind = ConsumerKind::kEngineDriven;
  return options;
}

// Options with `consumers` runtime-owned consumers.
inline RuntimeOptions OwnedConsumers(int pollers, int consumers) {
  RuntimeOptions options;
  options.pollers = pollers;
  options.consumers.assign(consumers, ConsumerOptions{});
  return options;
}

}  // namespace cqd::testing

#endif  // CQD_TESTS_TEST_UTIL_H_

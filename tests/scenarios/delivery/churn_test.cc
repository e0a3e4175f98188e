// SPDX-License-Identifier: BSD-2-Clause
// Registration churn under traffic: QPs are unregistered and re-registered with new handlers while
// completions flow. After Unregister returns the old handler is never called (half of them are
// deleted at once, so ASan catches a late call; the other half record one), and every completion
// reaches exactly one place: a handler or the orphan handler.
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

constexpr int kQps = 16;
constexpr uint64_t kPerQp = 20000;

// Marks each (QP, wr_id) as seen; counts the marks that were already set.
class Ledger {
 public:
  explicit Ledger(const std::vector<SimQp*>& qps) : seen_(qps.size() * kPerQp) {
    for (size_t i = 0; i < qps.size(); ++i) index_[qps[i]->qp_num()] = i;
  }
  void Mark(const ibv_wc& wc) {
    auto it = index_.find(wc.qp_num);
    if (it == index_.end() || wc.wr_id >= kPerQp) {
      bogus_.fetch_add(1);
      return;
    }
    if (seen_[it->second * kPerQp + wc.wr_id].exchange(1)) duplicates_.fetch_add(1);
    total_.fetch_add(1);
  }
  uint64_t total() const { return total_.load(); }
  uint64_t duplicates() const { return duplicates_.load(); }
  uint64_t bogus() const { return bogus_.load(); }

 private:
  std::unordered_map<uint32_t, size_t> index_;  // read-only after construction
  std::vector<std::atomic<uint8_t>> seen_;
  std::atomic<uint64_t> total_{0}, duplicates_{0}, bogus_{0};
};

std::atomic<uint64_t> g_late_calls{0};

class ChurnHandler : public QpHandler {
 public:
  explicit ChurnHandler(Ledger& ledger) : ledger_(ledger) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    if (unregistered_.load()) g_late_calls.fetch_add(1);
    for (const ibv_wc& wc : wcs) {
      if (seen_any_ && wc.wr_id <= last_) out_of_order_.fetch_add(1);
      last_ = wc.wr_id;
      seen_any_ = true;
      ledger_.Mark(wc);
    }
  }
  void MarkUnregistered() { unregistered_.store(true); }
  uint64_t out_of_order() const { return out_of_order_.load(); }

 private:
  Ledger& ledger_;
  std::atomic<bool> unregistered_{false};
  bool seen_any_ = false;
  uint64_t last_ = 0;
  std::atomic<uint64_t> out_of_order_{0};
};

class LedgerOrphans : public OrphanHandler {
 public:
  explicit LedgerOrphans(Ledger*& ledger) : ledger_(ledger) {}
  void OnOrphans(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) ledger_->Mark(wc);
  }

 private:
  Ledger*& ledger_;
};

TEST(Churn, UnregisterUnderTrafficIsExactlyOnce) {
  Ledger* ledger = nullptr;
  LedgerOrphans orphans(ledger);
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.orphan_handler = &orphans;
  options.idle_budget = std::chrono::microseconds(10);
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  auto& sim = bed.sim;
  const DeviceId dev = bed.dev;
  std::vector<CqHandle> cqs;
  for (int i = 0; i < 2; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(cq, rt->CreateCq(dev, i, CqOptions{.depth = 512}));
    cqs.push_back(cq);
  }
  std::vector<SimQp*> qps;
  for (int i = 0; i < kQps; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, sim->CreateQp(cqs[i % 2].sim(), cqs[i % 2].sim()));
    qps.push_back(qp);
  }
  Ledger book(qps);
  ledger = &book;

  struct Live {
    std::unique_ptr<ChurnHandler> handler;
    Registration registration;
  };
  std::vector<Live> live(kQps);
  std::vector<std::unique_ptr<ChurnHandler>> graveyard;
  // The QP registers again right after its Unregister, while its completions still flow:
  // RegisterQp polls its CQ out first (what the QP completed meanwhile is the orphan handler's),
  // and says UNAVAILABLE while a consumer the CQ serves is too full for that; the engine then
  // registers again, as runtime.h says.
  uint64_t refused = 0;
  auto register_qp = [&](int i) {
    live[i].handler = std::make_unique<ChurnHandler>(book);
    Result<Registration> reg = Status(StatusCode::kInternal, "not tried");
    ASSERT_TRUE(testing::WaitFor([&] {
      reg = rt->RegisterQp(*qps[i], *live[i].handler, static_cast<ConsumerId>(i % 2));
      if (reg.status().code() != StatusCode::kUnavailable) return true;
      ++refused;
      return false;
    }));
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    live[i].registration = std::move(reg).value();
  };
  for (int i = 0; i < kQps; ++i) register_qp(i);

  SimTrafficOptions traffic;
  traffic.qps = qps;
  traffic.completions_per_qp = kPerQp;
  traffic.burst = 8;
  SimTrafficSource source(traffic);
  source.Start();

  // A fixed number of churns, and as many more as the traffic lasts: what is checked is the
  // outcome, never how many churns fit into the traffic.
  constexpr uint64_t kMinChurns = 200;
  std::mt19937 rng(7);
  uint64_t churns = 0;
  while (churns < kMinChurns || source.injected() < source.total()) {
    int i = static_cast<int>(rng() % kQps);
    live[i].registration.Unregister();
    live[i].handler->MarkUnregistered();
    EXPECT_EQ(live[i].handler->out_of_order(), 0u);
    if (churns % 2 == 0) {
      live[i].handler.reset();  // freed at once: a late call is a use-after-free
    } else {
      graveyard.push_back(std::move(live[i].handler));
    }
    register_qp(i);
    ++churns;
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
  }
  source.Join();
  ASSERT_TRUE(testing::WaitFor([&] { return book.total() == kQps * kPerQp; }))
      << "accounted for " << book.total() << " of " << kQps * kPerQp;
  EXPECT_EQ(book.duplicates(), 0u);
  EXPECT_EQ(book.bogus(), 0u);
  EXPECT_EQ(g_late_calls.load(), 0u);
  for (auto& l : live) EXPECT_EQ(l.handler->out_of_order(), 0u);
  RecordProperty("register_refused", static_cast<int>(refused));

  for (auto& l : live) l.registration.Unregister();
  for (SimQp* qp : qps) CQD_ASSERT_OK(sim->DestroyQp(qp));
  for (CqHandle cq : cqs) CQD_ASSERT_OK(rt->DestroyCq(cq));
}

}  // namespace
}  // namespace cqd

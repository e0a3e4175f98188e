// SPDX-License-Identifier: BSD-2-Clause
// A rig for the CM hand-on rule (runtime/core/cm_router.h) without rdma_cm: the runtime's own
// pollers and consumers, a CmRouter, one watched (made-up) channel whose CmHandler runs on an owned
// consumer, and made-up ids, each with an engine-driven consumer for its QP. The caller plays
// the event thread (Route), the engine threads (Drain), the control path (Register, End, as
// RegisterQp(rdma_cm_id*) and Unregister do it) and Shutdown (StopLikeShutdown); Check says
// whether the rule held.
//
// Threading: Route from one thread (the event thread's role); End and StopLikeShutdown from one
// thread at a time (the control path's), which may run beside Route as Unregister runs beside
// the event thread; Register only while nothing else runs (Bind is the event thread's);
// Drain(k) from one thread per id at a time; Check once everything is settled (Settle).
#ifndef CQD_TESTS_CM_HANDON_RIG_H_
#define CQD_TESTS_CM_HANDON_RIG_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cqd/options.h"
#include "runtime/core/cm_router.h"
#include "runtime/core/consumer.h"
#include "runtime/core/orphans.h"
#include "runtime/core/registry.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal::testing {

class HandOnRig {
 public:
  static constexpr uint32_t kListener = 0;  // the CmHandler's consumer; id k's QPs use 1 + k

  struct Options {
    int ids = 2;
    bool two_shards = false;         // events travel as two parts (send and recv CQs on two shards)
    uint32_t qp_queue_capacity = 1;  // small: parts wait in the pollers' spills
    std::chrono::microseconds qp_handler_time{0};  // a window for a wrong hand-on
    // The CmHandler's consumer engine-driven with a queue of one (the caller drains it with
    // DrainListener; Settle does too), so that its events wait in the pollers' spills.
    bool listener_engine_driven = false;
  };

  // A delivery: the event's sequence number (per id, in read order) and a global ticket, taken as
  // a QP handler returns and as the CmHandler starts.
  struct Seen {
    int seq;
    uint64_t ticket;
  };

  explicit HandOnRig(const Options& options);
  ~HandOnRig();
  HandOnRig(const HandOnRig&) = delete;
  HandOnRig& operator=(const HandOnRig&) = delete;

  int ids() const { return options_.ids; }
  bool registered(int k) const { return ids_[k].registered; }
  // A fresh registration of id k (a new slot, bound to the id, its own QP handler).
  void Register(int k);
  // Unregister's steps for id k's registration: dead state, purge of the spills, Ended, the wait
  // for the batch in progress, then the held events.
  void End(int k);
  // The next event of id k, read and routed; nothing after StopLikeShutdown (Shutdown stops the
  // event thread first).
  void Route(int k);
  int Drain(int k, int max) { return consumers_[1 + k]->Drain(max); }
  int DrainListener(int max) { return consumers_[kListener]->Drain(max); }
  // What the pollers' spills hold for the CmHandler's consumer now.
  uint64_t ListenerSpilled() const;
  // Unregister's purge of the spills (Shard::PurgeDead) for the CmHandler's consumer, as when a
  // QP that consumer also serves is unregistered.
  void PurgeListener() {
    for (Shard* p : poller_ptrs_) p->PurgeDead(kListener);
  }
  bool Pending(int k) const { return consumers_[1 + k]->Pending(); }
  // Shutdown's order: the event thread stops (Route does nothing from here), the pollers hand
  // over and stop, the owned listener consumer closes.
  void StopLikeShutdown();
  // Drains until every event routed is delivered; returns false if some never is.
  bool Settle();
  // Returns "" if, for every id: each event reached exactly one handler; each handler got its
  // events in read order; the CmHandler started none before the QP handler returned from every
  // earlier event of the id it got; the CmHandler never ran on two threads at once; and nothing
  // still counts against the channel. Otherwise what broke.
  std::string Check();

 private:
  class QpSide : public QpHandler {
   public:
    explicit QpSide(const HandOnRig& rig) : rig_(rig) {}
    void OnCompletions(std::span<const ibv_wc>) noexcept override {}
    void OnCmEvent(const CmEvent& event) noexcept override;
    std::vector<Seen> seen;  // guarded by the rig's mu_

   private:
    const HandOnRig& rig_;
  };
  class CmSide : public CmHandler {
   public:
    explicit CmSide(HandOnRig& rig) : rig_(rig) {}
    void OnCmEvent(const CmEvent& event) noexcept override;

   private:
    HandOnRig& rig_;
  };
  struct Id {
    int storage = 0;  // its address is the made-up rdma_cm_id*
    rdma_cm_id* id() { return reinterpret_cast<rdma_cm_id*>(&storage); }
    bool registered = false;
    uint32_t slot = 0;
    uint32_t generation = 0;
    int routed = 0;
    std::deque<QpSide> qp;    // one per registration, the last one current
    std::vector<Seen> to_cm;  // guarded by the rig's mu_
  };

  const Options options_;
  RuntimeOptions runtime_options_;
  SlotPool slots_{256};
  OrphanSink orphans_{nullptr};
  std::vector<std::unique_ptr<Consumer>> consumers_;
  std::vector<std::unique_ptr<Shard>> pollers_;
  std::vector<Shard*> poller_ptrs_;
  std::unique_ptr<CmRouter> router_;
  CmWatch* watch_ = nullptr;
  CmSide listener_{*this};
  std::deque<Id> ids_;
  mutable std::mutex mu_;
  std::atomic<uint64_t> tickets_{0};
  std::atomic<int> listener_inside_{0};
  std::atomic<bool> listener_overlapped_{false};
  bool stopped_ = false;
};

}  // namespace cqd::internal::testing

#endif  // CQD_TESTS_CM_HANDON_RIG_H_

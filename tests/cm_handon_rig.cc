// SPDX-License-Identifier: BSD-2-Clause
#include "tests/cm_handon_rig.h"

#include <algorithm>

namespace cqd::internal::testing {

void HandOnRig::QpSide::OnCmEvent(const CmEvent& event) noexcept {
  if (rig_.options_.qp_handler_time.count() > 0) {
    std::this_thread::sleep_for(rig_.options_.qp_handler_time);
  }
  std::lock_guard<std::mutex> lock(rig_.mu_);
  seen.push_back({event.status, const_cast<HandOnRig&>(rig_).tickets_.fetch_add(1)});
}

void HandOnRig::CmSide::OnCmEvent(const CmEvent& event) noexcept {
  if (rig_.listener_inside_.fetch_add(1) != 0) rig_.listener_overlapped_ = true;
  const uint64_t ticket = rig_.tickets_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(rig_.mu_);
    for (Id& id : rig_.ids_) {
      if (event.id == id.id()) id.to_cm.push_back({event.status, ticket});
    }
  }
  std::this_thread::yield();
  rig_.listener_inside_.fetch_sub(1);
}

HandOnRig::HandOnRig(const Options& options) : options_(options) {
  runtime_options_.pollers = 2;
  runtime_options_.consumers.resize(1 + options_.ids);
  runtime_options_.consumers[kListener].name = "listen";
  if (options_.listener_engine_driven) {
    runtime_options_.consumers[kListener].kind = ConsumerKind::kEngineDriven;
    runtime_options_.consumers[kListener].queue_capacity = 1;
  }
  for (int k = 0; k < options_.ids; ++k) {
    ConsumerOptions& c = runtime_options_.consumers[1 + k];
    c.kind = ConsumerKind::kEngineDriven;
    c.queue_capacity = options_.qp_queue_capacity;
    c.name = "qp" + std::to_string(k);
  }
  std::vector<Consumer*> consumer_ptrs;
  for (uint32_t c = 0; c < runtime_options_.consumers.size(); ++c) {
    consumers_.push_back(std::make_unique<Consumer>(c, runtime_options_.consumers[c], slots_,
                                                    orphans_, runtime_options_.pollers));
    consumer_ptrs.push_back(consumers_.back().get());
  }
  for (int p = 0; p < runtime_options_.pollers; ++p) {
    pollers_.push_back(
        std::make_unique<Shard>(p, runtime_options_, consumer_ptrs, slots_, orphans_));
    poller_ptrs_.push_back(pollers_.back().get());
  }
  router_ = std::make_unique<CmRouter>(slots_, poller_ptrs_);
  for (auto& c : consumers_) (void)c->Start();
  for (auto& p : pollers_) (void)p->Start();
  watch_ = router_->AddWatch(nullptr, &listener_, kListener, int64_t{1} << 40);
  ids_.resize(options_.ids);
}

HandOnRig::~HandOnRig() {
  // As the runtime's destructor: the threads stop (everything polled handed over), what is still
  // queued is dropped, and only then do the router's watches go.
  for (auto& p : pollers_) p->Stop();
  for (auto& c : consumers_) c->Stop();
  for (auto& c : consumers_) c->OrphanRemaining();
  pollers_.clear();
  consumers_.clear();
  router_.reset();
}

void HandOnRig::Register(int k) {
  Id& id = ids_[k];
  if (id.registered) return;
  const int64_t index = slots_.Allocate();
  if (index < 0) return;
  id.slot = static_cast<uint32_t>(index);
  id.qp.emplace_back(*this);
  Slot& slot = slots_.slot(id.slot);
  id.generation = StateGeneration(slot.state.load(std::memory_order_relaxed));
  slot.handler.store(&id.qp.back(), std::memory_order_relaxed);
  slot.qp_num.store(100 + k, std::memory_order_relaxed);
  slot.send_shard.store(0, std::memory_order_relaxed);
  slot.recv_shard.store(options_.two_shards ? 1 : 0, std::memory_order_relaxed);
  slot.state.store(MakeState(id.generation, 1 + k, true), std::memory_order_release);
  id.registered = router_->Bind(id.id(), id.slot, id.generation);
}

void HandOnRig::End(int k) {
  Id& id = ids_[k];
  if (!id.registered) return;
  id.registered = false;
  slots_.slot(id.slot).state.store(MakeState(id.generation + 1, 1 + k, false),
                                   std::memory_order_seq_cst);
  for (Shard* p : poller_ptrs_) p->PurgeDead(1 + k);
  router_->Ended(id.slot, id.generation);
  consumers_[1 + k]->WaitForCallInProgress(id.slot);
  slots_.Free(id.slot);
  router_->held().DeliverAll();
}

uint64_t HandOnRig::ListenerSpilled() const {
  ConsumerStats stats;
  for (const auto& p : pollers_) p->AddSpillStats(kListener, stats);
  return stats.spill_depth;
}

void HandOnRig::Route(int k) {
  if (stopped_) return;  // Shutdown stops the event thread before the pollers
  Id& id = ids_[k];
  auto* join = new EventJoin;
  join->cm.type = RDMA_CM_EVENT_ESTABLISHED;
  join->cm.status = ++id.routed;
  join->cm.id = id.id();
  join->watch = watch_;
  watch_->unfinished.fetch_add(1, std::memory_order_relaxed);
  router_->RouteEvent(join);
}

void HandOnRig::StopLikeShutdown() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& p : pollers_) p->Stop();
  consumers_[kListener]->Stop();
}

bool HandOnRig::Settle() {
  auto delivered = [&](Id& id) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = id.to_cm.size();
    for (const QpSide& qp : id.qp) n += qp.seen.size();
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    bool all = true;
    if (options_.listener_engine_driven) DrainListener(64);
    for (int k = 0; k < options_.ids; ++k) {
      Drain(k, 64);
      if (delivered(ids_[k]) < static_cast<size_t>(ids_[k].routed)) all = false;
    }
    // No DeliverAll here: held events run on the threads that handed them on, or not at all.
    if (all && watch_->unfinished.load(std::memory_order_acquire) == 0) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string HandOnRig::Check() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string broken;
  if (listener_overlapped_) broken += "the CmHandler ran on two threads at once; ";
  const int64_t counted = watch_->unfinished.load(std::memory_order_acquire);
  if (counted != 0) broken += std::to_string(counted) + " still counted against the channel; ";
  for (int k = 0; k < options_.ids; ++k) {
    const Id& id = ids_[k];
    const std::string who = "id " + std::to_string(k) + ": ";
    std::vector<int> times(id.routed + 1, 0);
    auto in_order = [&](const std::vector<Seen>& seen, const std::string& handler) {
      for (size_t i = 0; i < seen.size(); ++i) {
        if (seen[i].seq >= 1 && seen[i].seq <= id.routed) ++times[seen[i].seq];
        if (i > 0 && seen[i].seq <= seen[i - 1].seq) {
          broken += who + handler + " got " + std::to_string(seen[i].seq) + " after " +
                    std::to_string(seen[i - 1].seq) + "; ";
        }
      }
    };
    in_order(id.to_cm, "the CmHandler");
    for (const QpSide& qp : id.qp) {
      in_order(qp.seen, "a QP handler");
      for (const Seen& q : qp.seen) {
        for (const Seen& c : id.to_cm) {
          if (q.seq < c.seq && q.ticket > c.ticket) {
            broken += who + "the CmHandler got " + std::to_string(c.seq) +
                      " before the QP handler returned from " + std::to_string(q.seq) + "; ";
          }
        }
      }
    }
    for (int seq = 1; seq <= id.routed; ++seq) {
      if (times[seq] != 1) {
        broken += who + "event " + std::to_string(seq) + " delivered " +
                  std::to_string(times[seq]) + " times; ";
      }
    }
  }
  return broken;
}

}  // namespace cqd::internal::testing

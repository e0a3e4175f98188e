// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/cm_router.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "runtime/core/route.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {
namespace {

void CopyEvent(const rdma_cm_event& raw, CmEvent* out) {
  out->type = raw.event;
  out->status = raw.status;
  out->id = raw.id;
  out->listen_id = raw.listen_id;
  out->context = raw.id != nullptr ? raw.id->context : nullptr;  // the id lives until the ack
  // The union's private data fields sit alike in its conn and ud members; the rest means
  // something only for the port space it belongs to.
  const void* data = raw.param.conn.private_data;
  const uint8_t len = data == nullptr ? 0 : raw.param.conn.private_data_len;
  if (raw.id != nullptr && (raw.id->ps == RDMA_PS_TCP || raw.id->ps == RDMA_PS_IB)) {
    out->conn = raw.param.conn;
    out->conn.private_data = nullptr;
    out->conn.private_data_len = len;
  } else if (raw.id != nullptr && (raw.id->ps == RDMA_PS_UDP || raw.id->ps == RDMA_PS_IPOIB)) {
    out->ud = raw.param.ud;
    out->ud.private_data = nullptr;
    out->ud.private_data_len = len;
  }
  out->private_data_len = len;
  if (len > 0) std::memcpy(out->private_data, data, len);
}

}  // namespace

// ---- CmBinding ----

bool CmBinding::LiveIn(const Slot& slot) const noexcept {
  return RouteAtConsumer(EntryKind::kEventPart, slot, route_.generation) == Disposal::kDeliver;
}

void CmBinding::Unlink(EventJoin* join) noexcept {
  EventJoin* before = nullptr;
  for (EventJoin* j = first_; j != nullptr; before = j, j = j->next) {
    if (j != join) continue;
    (before != nullptr ? before->next : first_) = j->next;
    if (last_ == j) last_ = before;
    j->next = nullptr;
    j->left = true;
    EventJoin::DropHold(j);  // the list's (the caller still holds the route's)
    return;
  }
}

void CmBinding::EndLocked() noexcept {
  ended_ = true;
  if (delivering_) {
    end_pending_ = true;  // Delivered() hands on the rest once the QP's handler returned
    return;
  }
  end_pending_ = false;
  while (first_ != nullptr) {  // in read order, under the lock: nothing can slip in between
    EventJoin* join = first_;
    first_ = join->next;
    join->next = nullptr;
    join->left = true;
    PostToListener(join);
    // The list's hold. The last one may free the join here: its binding outlives this call
    // (every caller holds it).
    EventJoin::DropHold(join);
  }
  last_ = nullptr;
}

CmBinding::Admission CmBinding::Admit(EventJoin* join, const std::shared_ptr<CmBinding>& self,
                                      const SlotPool& slots) {
  MutexLock lock(mu_);
  const bool live = !ended_ && LiveIn(slots.slot(route_.slot));
  if (!live && !ended_) EndLocked();
  // Behind a delivery under way the event waits even when nothing else does: the CmHandler must
  // not get it while the QP's handler still has the id's earlier one.
  if (!live && first_ == nullptr && !delivering_) return Admission::kEnded;
  join->kind = EventJoin::Kind::kCm;
  join->cm.qp_num = qp_num_;
  join->gate = self;
  join->holds.store(live ? 2 : 1, std::memory_order_relaxed);  // the list's, and the route's
  join->next = nullptr;
  (last_ != nullptr ? last_->next : first_) = join;
  last_ = join;
  return live ? Admission::kRouted : Admission::kWaiting;
}

CmEventGate::Arrival CmBinding::Arrived(EventJoin* join, const Slot* slot) noexcept {
  MutexLock lock(mu_);
  if (join->left) return Arrival::kDone;  // handed on already: this was a stale part
  const bool live = !ended_ && slot != nullptr && LiveIn(*slot);
  if (Route(RouteStage::kConsumer, {.kind = EntryKind::kEventPart, .live = live}) ==
      Disposal::kDeliver) {
    // Every event listed before it arrived before it (same route, FIFO per poller) and left.
    Unlink(join);
    delivering_ = true;
    return Arrival::kDeliver;
  }
  EndLocked();  // the registration is gone (or nobody can deliver): hand on what is listed
  return Arrival::kDone;
}

void CmBinding::Delivered() noexcept {
  MutexLock lock(mu_);
  delivering_ = false;
  if (end_pending_) EndLocked();
}

void CmBinding::Drop(EventJoin* join) noexcept {
  MutexLock lock(mu_);
  if (!join->left) Unlink(join);  // the caller still holds the route's hold
}

bool CmBinding::End() noexcept {
  MutexLock lock(mu_);
  EndLocked();
  return first_ == nullptr && !delivering_;
}

// ---- CmRouter ----

CmWatch* CmRouter::AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer,
                            int64_t limit) {
  auto watch = std::make_unique<CmWatch>();
  watch->channel = channel;
  watch->handler = handler;
  watch->consumer = consumer;
  watch->poller = pollers_[0];
  watch->held = &held_;
  watch->limit = std::max<int64_t>(1, limit);
  watches_.push_back(std::move(watch));
  return watches_.back().get();
}

bool CmRouter::Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation) noexcept {
  try {
    if (bindings_.size() >= sweep_at_) {
      std::erase_if(bindings_, [&](const auto& entry) {
        CmBinding& binding = *entry.second;
        const Slot& bound = slots_.slot(binding.route().slot);
        if (RouteAtConsumer(EntryKind::kEventPart, bound, binding.route().generation) ==
            Disposal::kDeliver) {
          return false;
        }
        return binding.End();  // kept while events wait for a delivery under way
      });
      sweep_at_ = std::max<size_t>(64, 2 * bindings_.size());
    }
    const Slot& s = slots_.slot(slot);
    const uint32_t qp_num = s.qp_num.load(std::memory_order_relaxed);
    const QpEventTarget target =
        RouteQpEvent(s, slot, s.device.load(std::memory_order_relaxed), qp_num, &generation);
    if (target.disposal != Disposal::kDeliver) return true;  // gone already
    auto binding = std::make_shared<CmBinding>(target.route, qp_num);
    {
      MutexLock lock(by_slot_mu_);
      by_slot_[slot] = binding;
    }
    auto [it, added] = bindings_.try_emplace(id, binding);
    if (!added) {
      it->second->End();  // an id registered again: its old registration's events go on (above)
      it->second = std::move(binding);
    }
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

void CmRouter::Ended(uint32_t slot, uint32_t generation) noexcept {
  std::shared_ptr<CmBinding> binding;
  {
    MutexLock lock(by_slot_mu_);
    auto it = by_slot_.find(slot);
    if (it == by_slot_.end() || it->second->route().generation != generation) return;
    binding = std::move(it->second);
    by_slot_.erase(it);
  }
  binding->End();
}

CmRouter::ReadResult CmRouter::Read(CmWatch& watch) {
  for (;;) {
    if (watch.unfinished.load(std::memory_order_acquire) >= watch.limit) {
      return ReadResult::kFull;
    }
    // Made before the read, so that running out of memory leaves the event in the channel.
    auto* join = new (std::nothrow) EventJoin;
    if (join == nullptr) return ReadResult::kFull;
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(watch.channel, &raw) != 0) {
      const int error = errno;
      delete join;
      if (error == EINTR) continue;
      errno = error;  // for the caller's log
      return error == EAGAIN || error == EWOULDBLOCK ? ReadResult::kEmpty : ReadResult::kBroken;
    }
    CopyEvent(*raw, &join->cm);
    rdma_ack_cm_event(raw);  // everything needed is copied
    events_.fetch_add(1, std::memory_order_relaxed);
    watch.unfinished.fetch_add(1, std::memory_order_relaxed);
    join->watch = &watch;
    RouteEvent(join);
  }
}

namespace {

// Events that only an id not yet registered gets (a new id, perhaps at a destroyed id's address:
// a binding never holds them back). A listener's CONNECT_REQUEST names the new id; address and
// route resolution come before the QP an engine registers (it registers before connecting).
bool BeforeRegistration(rdma_cm_event_type type) {
  switch (type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
    case RDMA_CM_EVENT_ADDR_RESOLVED:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return true;
    default:
      return false;
  }
}

}  // namespace

void CmRouter::RouteEvent(EventJoin* join) {
  auto it = bindings_.find(join->cm.id);
  if (it != bindings_.end() && !BeforeRegistration(join->cm.type)) {
    const std::shared_ptr<CmBinding> binding = it->second;
    switch (binding->Admit(join, binding, slots_)) {
      case CmBinding::Admission::kRouted:
        PostAlong(binding->route(), join, pollers_);
        return;
      case CmBinding::Admission::kWaiting:
        return;  // handed on behind the id's earlier events
      case CmBinding::Admission::kEnded:
        bindings_.erase(it);  // the id (or a new one at its address) is nobody's from here
        break;
    }
  }
  join->kind = EventJoin::Kind::kListener;
  PostToListener(join);
}

}  // namespace cqd::internal

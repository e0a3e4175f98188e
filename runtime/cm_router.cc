#include "runtime/cm_router.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "runtime/poller.h"

namespace cqd::internal {
namespace {

// Delivers a listener join on this thread: its consumer has closed (Shutdown), so no other
// thread can be running that consumer's handlers.
void DeliverHere(EventJoin* join) noexcept {
  join->watch->handler->OnCmEvent(join->cm);
  delete join;
}

// Sends a join through its channel's poller to the CmHandler's consumer.
void PostToListener(EventJoin* join) noexcept {
  join->kind = EventJoin::Kind::kListener;
  join->cm.qp_num = 0;
  join->binding.reset();
  join->parts.store(1, std::memory_order_relaxed);
  Item item;
  item.join = join;
  item.slot = kNoSlot;
  item.kind = ItemKind::kListenerEvent;
  if (!join->watch->poller->PostEvent(join->watch->consumer, item, 0, 0)) DeliverHere(join);
}

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

EventJoin::~EventJoin() {
  if (watch != nullptr) watch->unfinished.fetch_sub(1, std::memory_order_release);
}

void HandOnOrDelete(EventJoin* join) noexcept {
  if (join->kind != EventJoin::Kind::kCm || join->watch == nullptr) {
    delete join;
    return;
  }
  std::shared_ptr<CmBinding> binding = std::move(join->binding);
  PostToListener(join);
  // Only now: the event thread sends the id's next events straight to the CmHandler once
  // nothing is in flight, and they must come after this one.
  if (binding != nullptr) binding->in_flight.fetch_sub(1, std::memory_order_release);
}

CmWatch* CmRouter::AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer,
                            int64_t limit) {
  auto watch = std::make_unique<CmWatch>();
  watch->channel = channel;
  watch->handler = handler;
  watch->consumer = consumer;
  watch->poller = pollers_[0];
  watch->limit = std::max<int64_t>(1, limit);
  watches_.push_back(std::move(watch));
  return watches_.back().get();
}

bool CmRouter::Live(const CmBinding& binding) const {
  const uint64_t state = slots_.slot(binding.route.slot).state.load(std::memory_order_acquire);
  return StateLive(state) && StateGeneration(state) == binding.route.generation;
}

bool CmRouter::Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation) noexcept {
  try {
    if (bindings_.size() >= sweep_at_) {
      std::erase_if(bindings_, [&](const auto& entry) {
        return !Live(*entry.second) && entry.second->in_flight.load(std::memory_order_acquire) == 0;
      });
      sweep_at_ = std::max<size_t>(64, 2 * bindings_.size());
    }
    const Slot& s = slots_.slot(slot);
    const uint64_t state = s.state.load(std::memory_order_acquire);
    if (!StateLive(state) || StateGeneration(state) != generation) return true;  // gone already
    auto binding = std::make_shared<CmBinding>();
    binding->route = RouteOf(s, slot, state);
    binding->qp_num = s.qp_num.load(std::memory_order_relaxed);
    bindings_[id] = std::move(binding);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

CmRouter::DrainResult CmRouter::Drain(CmWatch& watch) {
  for (;;) {
    if (watch.unfinished.load(std::memory_order_acquire) >= watch.limit) {
      return DrainResult::kFull;
    }
    // Made before the read, so that running out of memory leaves the event in the channel.
    auto* join = new (std::nothrow) EventJoin;
    if (join == nullptr) return DrainResult::kFull;
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(watch.channel, &raw) != 0) {
      const int error = errno;
      delete join;
      if (error == EINTR) continue;
      return error == EAGAIN || error == EWOULDBLOCK ? DrainResult::kEmpty : DrainResult::kBroken;
    }
    CopyEvent(*raw, &join->cm);
    rdma_ack_cm_event(raw);  // everything needed is copied
    events_.fetch_add(1, std::memory_order_relaxed);
    watch.unfinished.fetch_add(1, std::memory_order_relaxed);
    join->watch = &watch;
    Route(join);
  }
}

void CmRouter::Route(EventJoin* join) {
  auto it = bindings_.find(join->cm.id);
  if (it != bindings_.end() && join->cm.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    const std::shared_ptr<CmBinding>& binding = it->second;
    // While an earlier event of the id is on its way to the QP's consumer, this one follows it
    // there (it is handed on behind it if the registration ended), to keep the id's order.
    if (Live(*binding) || binding->in_flight.load(std::memory_order_acquire) > 0) {
      join->kind = EventJoin::Kind::kCm;
      join->cm.qp_num = binding->qp_num;
      join->binding = binding;
      binding->in_flight.fetch_add(1, std::memory_order_relaxed);
      PostAlong(binding->route, join, pollers_);
      return;
    }
    bindings_.erase(it);  // the registration ended and nothing of it is in flight
  }
  PostToListener(join);
}

}  // namespace cqd::internal

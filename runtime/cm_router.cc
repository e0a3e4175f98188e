#include "runtime/cm_router.h"

#include <cerrno>
#include <cstring>
#include <new>

#include "runtime/event_loop.h"
#include "runtime/poller.h"

namespace cqd::internal {
namespace {

// Sends a listener join through its channel's poller to the CmHandler's consumer.
void PostToListener(EventJoin* join) noexcept {
  join->kind = EventJoin::Kind::kListener;
  join->cm.qp_num = 0;
  join->parts.store(1, std::memory_order_relaxed);
  Item item;
  item.join = join;
  item.slot = kNoSlot;
  item.kind = ItemKind::kListenerEvent;
  join->watch->poller->PostEvent(join->watch->consumer, item, 0, 0);
}

void CopyEvent(const rdma_cm_event& raw, CmEvent* out) {
  out->type = raw.event;
  out->status = raw.status;
  out->id = raw.id;
  out->listen_id = raw.listen_id;
  out->context = raw.id != nullptr ? raw.id->context : nullptr;  // the id lives until the ack
  // The union's private data fields sit alike in its conn and ud members; the rest of `conn`
  // means something only on connected port spaces.
  const void* data = raw.param.conn.private_data;
  const uint8_t len = data == nullptr ? 0 : raw.param.conn.private_data_len;
  if (raw.id != nullptr && (raw.id->ps == RDMA_PS_TCP || raw.id->ps == RDMA_PS_IB)) {
    out->conn = raw.param.conn;
  }
  out->conn.private_data = nullptr;
  out->conn.private_data_len = len;
  out->private_data_len = len;
  if (len > 0) std::memcpy(out->private_data, data, len);
}

}  // namespace

void HandOnOrDelete(EventJoin* join) noexcept {
  if (join->kind == EventJoin::Kind::kCm && join->watch != nullptr) {
    PostToListener(join);
  } else {
    delete join;
  }
}

CmWatch* CmRouter::AddWatch(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer) {
  auto watch = std::make_unique<CmWatch>();
  watch->channel = channel;
  watch->handler = handler;
  watch->consumer = consumer;
  watch->poller = pollers_[0];
  watches_.push_back(std::move(watch));
  return watches_.back().get();
}

bool CmRouter::Live(const Binding& binding) const {
  const uint64_t state = slots_.slot(binding.slot).state.load(std::memory_order_acquire);
  return StateLive(state) && StateGeneration(state) == binding.generation;
}

void CmRouter::Bind(rdma_cm_id* id, uint32_t slot, uint32_t generation, uint32_t qp_num,
                    DeviceId device) {
  if (bindings_.size() >= sweep_at_) {
    std::erase_if(bindings_, [&](const auto& entry) { return !Live(entry.second); });
    sweep_at_ = std::max<size_t>(64, 2 * bindings_.size());
  }
  bindings_[id] = Binding{slot, generation, qp_num, device};
}

bool CmRouter::Drain(const CmWatch& watch) {
  for (;;) {
    // Made before the read, so that running out of memory leaves the event in the channel.
    auto* join = new (std::nothrow) EventJoin;
    if (join == nullptr) return true;
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(watch.channel, &raw) != 0) {
      const int error = errno;
      delete join;
      if (error == EINTR) continue;
      return error == EAGAIN || error == EWOULDBLOCK;
    }
    CopyEvent(*raw, &join->cm);
    rdma_ack_cm_event(raw);  // everything needed is copied
    events_.fetch_add(1, std::memory_order_relaxed);
    join->watch = &watch;
    Route(join);
  }
}

void CmRouter::Route(EventJoin* join) {
  auto it = bindings_.find(join->cm.id);
  if (it != bindings_.end() && join->cm.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    const Binding binding = it->second;
    if (Live(binding)) {
      join->kind = EventJoin::Kind::kCm;
      join->cm.qp_num = binding.qp_num;
      if (PostJoin(slots_, pollers_, binding.slot, binding.generation, join, binding.qp_num,
                   binding.device)) {
        return;
      }
    }
    bindings_.erase(it);  // the registration ended
  }
  PostToListener(join);
}

}  // namespace cqd::internal

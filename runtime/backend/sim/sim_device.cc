// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/backend/sim/sim_device.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "runtime/base/mutex.h"

namespace cqd {

int SimQp::Complete(uint64_t wr_id, ibv_wc_opcode opcode, ibv_wc_status status,
                    bool solicited) noexcept {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = qp_num();
  wc.byte_len = (opcode & IBV_WC_RECV) ? 64 : 0;
  SimCq* cq = (opcode & IBV_WC_RECV) ? recv_cq() : send_cq();
  return cq->Inject({&wc, 1}, solicited, /*overflow=*/false);
}

std::shared_ptr<SimDevice> SimDevice::Create(const SimDeviceOptions& options) {
  return std::make_shared<sim_internal::SimDeviceImpl>(options);
}

namespace sim_internal {

SimDeviceImpl::SimDeviceImpl(const SimDeviceOptions& options) : options_(options) {}

SimDeviceImpl::~SimDeviceImpl() = default;

Result<SimChannel*> SimDeviceImpl::CreateChannel() {
  auto channel = std::make_unique<SimChannelImpl>(this);
  SimChannelImpl* raw = channel.get();
  internal::MutexLock lock(mu_);
  channels_.emplace(raw, std::move(channel));
  return static_cast<SimChannel*>(raw);
}

Status SimDeviceImpl::DestroyChannel(SimChannel* channel) {
  internal::MutexLock lock(mu_);
  auto it = channels_.find(static_cast<SimChannelImpl*>(channel));
  if (channel == nullptr || it == channels_.end()) {
    return NotFound("DestroyChannel: not a channel of sim device " + options_.name);
  }
  if (it->second->cq_count > 0) {
    return FailedPrecondition("DestroyChannel: " + std::to_string(it->second->cq_count) +
                              " CQs still use the channel (EBUSY)");
  }
  channels_.erase(it);
  return Status::Ok();
}

Result<SimCq*> SimDeviceImpl::CreateCq(int depth, SimChannel* channel) {
  if (depth < 1 || depth > (1 << 22)) {
    return InvalidArgument("CreateCq: depth " + std::to_string(depth) + " is not in 1..4194304");
  }
  internal::MutexLock lock(mu_);
  SimChannelImpl* ch = static_cast<SimChannelImpl*>(channel);
  if (channel != nullptr && !channels_.contains(ch)) {
    return NotFound("CreateCq: not a channel of sim device " + options_.name);
  }
  if (fatal()) return Unavailable("CreateCq: sim device " + options_.name + " has failed");
  auto cq = std::make_unique<SimCqImpl>(this, depth, ch);
  SimCqImpl* raw = cq.get();
  cqs_.emplace(raw, std::move(cq));
  if (ch != nullptr) ++ch->cq_count;
  return static_cast<SimCq*>(raw);
}

SimCqImpl* SimDeviceImpl::FindCq(void* native) {
  internal::MutexLock lock(mu_);
  auto* cq = static_cast<SimCqImpl*>(static_cast<SimCq*>(native));
  return cqs_.contains(cq) ? cq : nullptr;
}

Status SimDeviceImpl::DestroyCq(SimCq* public_cq) { return DestroyCqAs(public_cq, "DestroyCq: "); }

Status SimDeviceImpl::DestroyCqAs(SimCq* public_cq, const std::string& who) {
  auto* cq = static_cast<SimCqImpl*>(public_cq);
  {
    internal::MutexLock lock(mu_);
    if (public_cq == nullptr || !cqs_.contains(cq)) {
      return NotFound(who + "not a CQ of sim device " + options_.name);
    }
    if (cq->qp_refs > 0) {
      return FailedPrecondition(who + std::to_string(cq->qp_refs) +
                                " QP queues (send or receive) still use the CQ (EBUSY)");
    }
    if (cq->destroying.load(std::memory_order_relaxed)) {
      return FailedPrecondition(who + "already being destroyed");
    }
    if (cq->sim_channel() != nullptr) {
      cq->sim_channel()->Retire(cq);  // unread events vanish, as in the kernel
    } else {
      cq->destroying.store(true, std::memory_order_relaxed);
    }
    PurgeAsyncLocked(cq);
  }
  // S2: wait for every completion event that was read to be acked; S13: same for async events.
  if (!cq->WaitAllAcked()) {
    return Internal(who +
                    "more completion events were acked than were read "
                    "(verbs would hang here)");
  }
  internal::MutexLock lock(mu_);
  while (cq->async_unacked != 0) async_acked_cv_.WaitForRecheck(mu_);
  if (cq->sim_channel() != nullptr) --cq->sim_channel()->cq_count;
  cqs_.erase(cq);
  return Status::Ok();
}

Result<SimQp*> SimDeviceImpl::CreateQp(SimCq* send_cq, SimCq* recv_cq,
                                       const SimQpOptions& options) {
  internal::MutexLock lock(mu_);
  auto* send = static_cast<SimCqImpl*>(send_cq);
  auto* recv = static_cast<SimCqImpl*>(recv_cq);
  if (send_cq == nullptr || recv_cq == nullptr || !cqs_.contains(send) || !cqs_.contains(recv) ||
      send->destroying.load(std::memory_order_relaxed) ||
      recv->destroying.load(std::memory_order_relaxed)) {
    return InvalidArgument("CreateQp: send and recv CQs must be live CQs of sim device " +
                           options_.name);
  }
  if (fatal()) return Unavailable("CreateQp: sim device " + options_.name + " has failed");
  if (qps_.size() >= (1u << 24) - 2) return ResourceExhausted("CreateQp: out of QP numbers");
  if (options.max_send_wr < 0 || options.max_recv_wr < 0) {
    return InvalidArgument("CreateQp: max_send_wr and max_recv_wr must not be negative");
  }
  uint32_t qp_num;
  if (!free_qp_nums_.empty()) {
    qp_num = free_qp_nums_.back();
    free_qp_nums_.pop_back();
  } else {
    do {
      qp_num = next_qp_num_;
      next_qp_num_ = (next_qp_num_ + 1) & 0xffffff;
      if (next_qp_num_ == 0) next_qp_num_ = 1;
    } while (qps_.contains(qp_num));
  }
  auto qp = std::make_unique<SimQpImpl>(qp_num, send, recv, options, options_);
  SimQpImpl* raw = qp.get();
  qps_.emplace(qp_num, std::move(qp));
  ++send->qp_refs;
  ++recv->qp_refs;
  return static_cast<SimQp*>(raw);
}

Status SimDeviceImpl::DestroyQp(SimQp* public_qp) {
  internal::MutexLock lock(mu_);
  auto it = public_qp ? qps_.find(public_qp->qp_num()) : qps_.end();
  if (it == qps_.end() || it->second.get() != public_qp) {
    return NotFound("DestroyQp: not a QP of sim device " + options_.name);
  }
  SimQpImpl* qp = it->second.get();
  PurgeAsyncLocked(qp);
  while (qp->async_unacked != 0) async_acked_cv_.WaitForRecheck(mu_);  // S13
  --qp->send()->qp_refs;
  --qp->recv()->qp_refs;
  free_qp_nums_.push_back(qp->qp_num());
  qps_.erase(qp->qp_num());
  return Status::Ok();
}

SimQpImpl* SimDeviceImpl::FindQp(void* native) {
  internal::MutexLock lock(mu_);
  auto* qp = static_cast<SimQpImpl*>(static_cast<SimQp*>(native));
  auto it = qps_.find(qp->qp_num());
  return it != qps_.end() && it->second.get() == qp ? qp : nullptr;
}

Status SimQpImpl::PostSend(uint64_t wr_id) {
  internal::MutexLock lock(mu_);
  if (sends_.size() > static_cast<size_t>(options_.max_send_wr)) {
    return ResourceExhausted("PostSend: the send queue of qp_num " + std::to_string(qp_num_) +
                             " is full");
  }
  // Flushed inside the post, as on rxe, unless earlier sends are still waiting for room in the CQ
  // (then it waits behind them: a queue flushes in order).
  if (in_error() && sends_at_post_ && sends_.empty()) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_SEND;
    wc.qp_num = qp_num_;
    if (send_->failed()) return Status::Ok();  // lost with the failed CQ, as on verbs
    if (send_->Inject({&wc, 1}, false, false) != 1) {
      return ResourceExhausted("PostSend: the send CQ has no room for the flush");
    }
    return Status::Ok();
  }
  sends_.push_back(wr_id);
  return Status::Ok();
}

Status SimQpImpl::PostRecv(uint64_t wr_id) {
  if (options_.srq) {
    return InvalidArgument("PostRecv: qp_num " + std::to_string(qp_num_) + " receives from an SRQ");
  }
  internal::MutexLock lock(mu_);
  if (recvs_.size() > static_cast<size_t>(options_.max_recv_wr)) {
    return ResourceExhausted("PostRecv: the receive queue of qp_num " + std::to_string(qp_num_) +
                             " is full");
  }
  recvs_.push_back(wr_id);  // in the error state too: it flushes at the next move to it
  return Status::Ok();
}

int SimQpImpl::outstanding(bool recv) const {
  internal::MutexLock lock(mu_);
  return static_cast<int>(recv ? recvs_.size() : sends_.size());
}

void SimQpImpl::ModifyToError() {
  internal::MutexLock lock(mu_);
  error_.store(true, std::memory_order_release);
  if (receives_first_) {
    FlushLocked(recvs_, recv_, IBV_WC_RECV);
    FlushLocked(sends_, send_, IBV_WC_SEND);
  } else {
    FlushLocked(sends_, send_, IBV_WC_SEND);
    FlushLocked(recvs_, recv_, IBV_WC_RECV);
  }
}

void SimQpImpl::FlushLocked(std::deque<uint64_t>& queue, SimCqImpl* cq, ibv_wc_opcode opcode) {
  while (!queue.empty()) {
    if (cq->failed()) {  // lost with the failed CQ, as on verbs
      queue.clear();
      return;
    }
    ibv_wc wc{};
    wc.wr_id = queue.front();
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = opcode;
    wc.qp_num = qp_num_;
    if (cq->Inject({&wc, 1}, false, false) != 1) return;  // no room: at the next move to error
    queue.pop_front();
  }
}

Result<backend::DrainStart> SimDeviceImpl::StartQpDrain(SimQpImpl* qp, uint64_t send_marker,
                                                        uint64_t recv_marker) {
  // As the verbs backend does: error state (what is outstanding flushes), the send marker, the
  // receive marker, and the error state once more (a receive posted in error flushes only then).
  qp->ModifyToError();  // already in error (an earlier teardown): ERR -> ERR, as on verbs
  if (Status s = qp->PostSend(send_marker); !s.ok()) {
    return ResourceExhausted("StartQpDrain: no room for the send marker (" + s.message() + ")");
  }
  backend::DrainStart posted = backend::DrainStart::kAllMarkers;
  if (!qp->options().srq && !qp->PostRecv(recv_marker).ok()) {
    posted = backend::DrainStart::kSendMarkerOnly;
  }
  qp->ModifyToError();
  if (qp->options().srq && options_.last_wqe_reached) {
    internal::MutexLock lock(mu_);
    PushAsyncLocked({IBV_EVENT_QP_LAST_WQE_REACHED, qp, nullptr, 0});
  }
  return posted;
}

Status SimDeviceImpl::RedriveDrain(SimQpImpl* qp, uint64_t recv_marker) {
  qp->ModifyToError();  // flushes that found no room in the CQ before go out now if they fit
  if (recv_marker == 0) return Status::Ok();
  if (Status s = qp->PostRecv(recv_marker); !s.ok()) return s;
  qp->ModifyToError();
  return Status::Ok();
}

Status SimDeviceImpl::RaiseQpEvent(SimQp* public_qp, ibv_event_type type) {
  if (!backend::IsQpEvent(type)) return InvalidArgument("RaiseQpEvent: not a QP event type");
  internal::MutexLock lock(mu_);
  auto it = public_qp ? qps_.find(public_qp->qp_num()) : qps_.end();
  if (it == qps_.end() || it->second.get() != public_qp) {
    return NotFound("RaiseQpEvent: not a QP of sim device " + options_.name);
  }
  PushAsyncLocked({type, it->second.get(), nullptr, 0});
  return Status::Ok();
}

Status SimDeviceImpl::RaiseDeviceEvent(ibv_event_type type, int port_num) {
  if (backend::IsPortEvent(type)) {
    if (port_num < 1 || port_num > options_.ports) {
      return InvalidArgument("RaiseDeviceEvent: no port " + std::to_string(port_num));
    }
  } else if (type != IBV_EVENT_SRQ_ERR && type != IBV_EVENT_SRQ_LIMIT_REACHED) {
    return InvalidArgument("RaiseDeviceEvent: use RaiseQpEvent, RaiseDeviceFatal or overflow");
  }
  internal::MutexLock lock(mu_);
  PushAsyncLocked({type, nullptr, nullptr, port_num});
  return Status::Ok();
}

void SimDeviceImpl::RaiseDeviceFatal() {
  internal::MutexLock lock(mu_);
  if (fatal_.exchange(true, std::memory_order_acq_rel)) return;
  PushAsyncLocked({IBV_EVENT_DEVICE_FATAL, nullptr, nullptr, 0});
}

void SimDeviceImpl::RaiseOverflow(SimCqImpl* cq) {
  internal::MutexLock lock(mu_);
  PushAsyncLocked({IBV_EVENT_CQ_ERR, nullptr, cq, 0});
  for (auto& [num, qp] : qps_) {
    if (qp->send() == cq || qp->recv() == cq) {
      PushAsyncLocked({IBV_EVENT_QP_FATAL, qp.get(), nullptr, 0});
    }
  }
}

// The fault hooks ignore a null pointer or another device's object (sim.h): nothing to fail.
void SimDeviceImpl::AddSpuriousEvent(SimCq* cq) {
  SimCqImpl* impl = cq != nullptr ? FindCq(cq) : nullptr;
  if (impl != nullptr && impl->sim_channel() != nullptr) impl->sim_channel()->Push(impl);
}

void SimDeviceImpl::FailGetEvent(SimChannel* channel, int err, int times) {
  auto* impl = static_cast<SimChannelImpl*>(channel);
  {
    internal::MutexLock lock(mu_);
    if (channel == nullptr || !channels_.contains(impl)) return;
  }
  impl->injected_errno().Set(err, times);
}

void SimDeviceImpl::FailGetAsyncEvent(int err, int times) { async_errno_.Set(err, times); }

void SimDeviceImpl::FailRequestNotify(SimCq* cq, int err, int times) {
  SimCqImpl* impl = cq != nullptr ? FindCq(cq) : nullptr;
  if (impl != nullptr) impl->notify_errno().Set(err, times);
}

void SimDeviceImpl::PushAsyncLocked(const PendingAsync& event) {
  async_events_.push_back(event);
  async_pending_.Add();
}

void SimDeviceImpl::PurgeAsyncLocked(const void* object) {
  auto it = std::remove_if(async_events_.begin(), async_events_.end(),
                           [&](const PendingAsync& e) { return e.qp == object || e.cq == object; });
  int removed = static_cast<int>(async_events_.end() - it);
  async_events_.erase(it, async_events_.end());
  async_pending_.Take(removed);
}

int SimDeviceImpl::GetAsyncEvent(backend::AsyncEventRecord* out) noexcept {
  if (async_errno_.Fire()) return -1;
  for (;;) {
    {
      internal::MutexLock lock(mu_);
      if (!async_events_.empty()) {
        PendingAsync event = async_events_.front();
        async_events_.pop_front();
        async_pending_.Take();
        *out = backend::AsyncEventRecord{};
        out->type = event.type;
        out->port_num = event.port;
        // The object the event holds until its ack: a SimQpImpl for QP events, else a SimCqImpl.
        void* held = nullptr;
        if (event.qp != nullptr) {
          out->qp_num = event.qp->qp_num();
          held = event.qp;
          ++event.qp->async_unacked;
        } else if (event.cq != nullptr) {
          out->native_cq = event.cq->native();
          held = event.cq;
          ++event.cq->async_unacked;
        }
        out->Keep(held);
        return 0;
      }
    }
    if (async_pending_.nonblocking()) {
      errno = EAGAIN;
      return -1;
    }
    if (!async_pending_.WaitReadable()) return -1;
  }
}

void SimDeviceImpl::AckAsyncEvent(backend::AsyncEventRecord* record) noexcept {
  void* held = record->Kept<void*>();
  if (held == nullptr) return;
  {
    internal::MutexLock lock(mu_);
    if (backend::IsQpEvent(record->type)) {
      --static_cast<SimQpImpl*>(held)->async_unacked;
    } else {
      --static_cast<SimCqImpl*>(held)->async_unacked;
    }
    record->Keep<void*>(nullptr);
    async_acked_cv_.NotifyAll();
  }
  if (void (*hook)(void*) = after_ack_hook_.load(std::memory_order_acquire); hook != nullptr) {
    hook(after_ack_arg_.load(std::memory_order_relaxed));
  }
}

// ---- seam ----

Result<std::unique_ptr<SimBackend>> SimBackend::Over(std::shared_ptr<SimDevice> device) {
  if (device == nullptr) return InvalidArgument("device is null");
  if (dynamic_cast<SimDeviceImpl*>(device.get()) == nullptr) {
    return InvalidArgument("not a device made by SimDevice::Create");
  }
  return std::make_unique<SimBackend>(std::move(device));
}

Result<backend::Channel*> SimBackend::CreateChannel() {
  Result<SimChannel*> channel = device_->CreateChannel();
  if (!channel.ok()) return channel.status();
  return static_cast<backend::Channel*>(static_cast<SimChannelImpl*>(*channel));
}

Status SimBackend::DestroyChannel(backend::Channel* channel) {
  return device_->DestroyChannel(static_cast<SimChannelImpl*>(channel));
}

Result<backend::Cq*> SimBackend::CreateCq(int depth, backend::Channel* channel,
                                          int /*comp_vector*/) {
  Result<SimCq*> cq = device_->CreateCq(depth, static_cast<SimChannelImpl*>(channel));
  if (!cq.ok()) return cq.status();
  return static_cast<backend::Cq*>(static_cast<SimCqImpl*>(*cq));
}

Result<backend::Cq*> SimBackend::AdoptCq(void* native_cq, backend::Channel* channel) {
  SimCqImpl* cq = native_cq ? device_->FindCq(native_cq) : nullptr;
  if (cq == nullptr) return InvalidArgument("AdoptCq: not a CQ of sim device " + name());
  if (cq->sim_channel() != static_cast<SimChannelImpl*>(channel)) {
    return InvalidArgument("AdoptCq: the CQ uses another completion channel (wrong shard)");
  }
  return static_cast<backend::Cq*>(cq);
}

Status SimBackend::DestroyCq(backend::Cq* cq) {
  // The runtime names the call itself ("DestroyCq: ..."), as it does for ibv_destroy_cq's errors.
  return device_->DestroyCqAs(static_cast<SimCqImpl*>(cq), "simulated device: ");
}

Result<backend::QpCaps> SimBackend::QueryQp(void* native_qp) {
  SimQpImpl* qp = native_qp ? device_->FindQp(native_qp) : nullptr;
  if (qp == nullptr) return NotFound("QueryQp: not a QP of sim device " + name());
  return backend::QpCaps{qp->options().max_send_wr, qp->options().max_recv_wr, qp->options().srq,
                         qp->in_error()};
}

Result<backend::DrainStart> SimBackend::StartQpDrain(void* native_qp, uint64_t send_marker,
                                                     uint64_t recv_marker) {
  SimQpImpl* qp = native_qp ? device_->FindQp(native_qp) : nullptr;
  if (qp == nullptr) return NotFound("StartQpDrain: not a QP of sim device " + name());
  return device_->StartQpDrain(qp, send_marker, recv_marker);
}

Status SimBackend::RedriveDrain(void* native_qp, uint64_t recv_marker) {
  SimQpImpl* qp = native_qp ? device_->FindQp(native_qp) : nullptr;
  if (qp == nullptr) return NotFound("RedriveDrain: not a QP of sim device " + name());
  return device_->RedriveDrain(qp, recv_marker);
}

void SimBackend::AckCqEvents(backend::Cq* cq, unsigned n) noexcept {
  static_cast<SimCqImpl*>(cq)->Ack(n);
}

}  // namespace sim_internal
}  // namespace cqd

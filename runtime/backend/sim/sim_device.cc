// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_device.cc: the simulated device's objects (sim_device.h): SimDevice's
// Create, and making, finding and destroying its channels, CQs and QPs (a CQ's destroy waits for
// its events' acks, S2 and S13; QP numbers are reused last-freed first).
#include "runtime/backend/sim/sim_device.h"

#include <memory>
#include <string>

#include "runtime/base/mutex.h"

namespace cqd {

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

}  // namespace sim_internal
}  // namespace cqd

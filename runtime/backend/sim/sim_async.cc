// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_async.cc: the simulated device's async events (sim_device.h): raising
// QP, port, SRQ, fatal and overflow events, the fault hooks (spurious events, injected errnos),
// the pending queue and its purge, and GetAsyncEvent and its ack (S13).
#include <algorithm>
#include <cerrno>
#include <string>

#include "runtime/backend/sim/sim_device.h"
#include "runtime/base/mutex.h"

namespace cqd::sim_internal {

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

}  // namespace cqd::sim_internal

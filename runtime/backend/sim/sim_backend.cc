// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_backend.cc: the seam over a simulated device (SimBackend in
// sim_device.h): the backend::Device calls the runtime and the conformance suite make, passed on
// to the device, its channels and its CQs.
#include <memory>
#include <string>
#include <utility>

#include "runtime/backend/sim/sim_device.h"

namespace cqd::sim_internal {

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

Result<backend::FlushStart> SimBackend::StartQpFlush(void* native_qp, uint64_t send_marker,
                                                     uint64_t recv_marker) {
  SimQpImpl* qp = native_qp ? device_->FindQp(native_qp) : nullptr;
  if (qp == nullptr) return NotFound("StartQpFlush: not a QP of sim device " + name());
  return device_->StartQpFlush(qp, send_marker, recv_marker);
}

Status SimBackend::RedriveFlush(void* native_qp, uint64_t recv_marker) {
  SimQpImpl* qp = native_qp ? device_->FindQp(native_qp) : nullptr;
  if (qp == nullptr) return NotFound("RedriveFlush: not a QP of sim device " + name());
  return device_->RedriveFlush(qp, recv_marker);
}

void SimBackend::AckCqEvents(backend::Cq* cq, unsigned n) noexcept {
  static_cast<SimCqImpl*>(cq)->Ack(n);
}

}  // namespace cqd::sim_internal

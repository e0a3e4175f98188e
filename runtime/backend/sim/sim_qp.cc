// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_qp.cc: the simulated device's QPs (sim_device.h): completing a work
// request (SimQp::Complete), posting sends and receives, the move to the error state and its
// flushes, and the device's QP flush for a teardown (StartQpFlush, RedriveFlush) as the verbs
// backend does it.
#include <deque>
#include <string>

#include "runtime/backend/sim/sim_device.h"
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

namespace sim_internal {

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

Result<backend::FlushStart> SimDeviceImpl::StartQpFlush(SimQpImpl* qp, uint64_t send_marker,
                                                        uint64_t recv_marker) {
  // As the verbs backend does: error state (what is outstanding flushes), the send marker, the
  // receive marker, and the error state once more (a receive posted in error flushes only then).
  qp->ModifyToError();  // already in error (an earlier teardown): ERR -> ERR, as on verbs
  if (Status s = qp->PostSend(send_marker); !s.ok()) {
    return ResourceExhausted("StartQpFlush: no room for the send marker (" + s.message() + ")");
  }
  backend::FlushStart posted = backend::FlushStart::kAllMarkers;
  if (!qp->options().srq && !qp->PostRecv(recv_marker).ok()) {
    posted = backend::FlushStart::kSendMarkerOnly;
  }
  qp->ModifyToError();
  if (qp->options().srq && options_.last_wqe_reached) {
    internal::MutexLock lock(mu_);
    PushAsyncLocked({IBV_EVENT_QP_LAST_WQE_REACHED, qp, nullptr, 0});
  }
  return posted;
}

Status SimDeviceImpl::RedriveFlush(SimQpImpl* qp, uint64_t recv_marker) {
  qp->ModifyToError();  // flushes that found no room in the CQ before go out now if they fit
  if (recv_marker == 0) return Status::Ok();
  if (Status s = qp->PostRecv(recv_marker); !s.ok()) return s;
  qp->ModifyToError();
  return Status::Ok();
}

}  // namespace sim_internal
}  // namespace cqd

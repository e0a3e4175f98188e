// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/backend/verbs/verbs_device.h"

#include <cerrno>
#include <cstring>

#include "runtime/base/mutex.h"

namespace cqd::verbs_internal {

int VerbsChannel::GetEvent(void** native_cq) noexcept {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(channel_, &cq, &context) != 0) return -1;  // errno from read(2)
  *native_cq = cq;
  return 0;
}

Status VerbsCq::Resize(int depth) {
  if (int rc = ibv_resize_cq(cq_, depth); rc != 0) {
    return ErrnoStatus("ibv_resize_cq(" + std::to_string(depth) + ")", rc);
  }
  return Status::Ok();
}

VerbsBackend::VerbsBackend(ibv_context* context, bool close_on_destroy)
    : context_(context),
      close_on_destroy_(close_on_destroy),
      name_(ibv_get_device_name(context->device)) {}

VerbsBackend::~VerbsBackend() {
  if (close_on_destroy_) ibv_close_device(context_);
}

Result<backend::Channel*> VerbsBackend::CreateChannel() {
  ibv_comp_channel* channel = ibv_create_comp_channel(context_);
  if (channel == nullptr) return ErrnoStatus("ibv_create_comp_channel(" + name_ + ")", errno);
  return static_cast<backend::Channel*>(new VerbsChannel(channel));
}

Status VerbsBackend::DestroyChannel(backend::Channel* channel) {
  auto* wrapper = static_cast<VerbsChannel*>(channel);
  if (int rc = ibv_destroy_comp_channel(wrapper->channel()); rc != 0) {
    return ErrnoStatus("ibv_destroy_comp_channel", rc);  // EBUSY: CQs still use it
  }
  delete wrapper;
  return Status::Ok();
}

Result<backend::Cq*> VerbsBackend::CreateCq(int depth, backend::Channel* channel, int comp_vector) {
  ibv_comp_channel* ch = channel ? static_cast<VerbsChannel*>(channel)->channel() : nullptr;
  ibv_cq* cq = ibv_create_cq(context_, depth, nullptr, ch, comp_vector);
  if (cq == nullptr) {
    return ErrnoStatus("ibv_create_cq(" + name_ + ", depth " + std::to_string(depth) + ")", errno);
  }
  return static_cast<backend::Cq*>(new VerbsCq(cq));
}

Result<backend::Cq*> VerbsBackend::AdoptCq(void* native_cq, backend::Channel* channel) {
  auto* cq = static_cast<ibv_cq*>(native_cq);
  if (cq == nullptr || cq->context != context_) {
    return InvalidArgument("AdoptCq: the CQ does not belong to device " + name_);
  }
  if (cq->channel != static_cast<VerbsChannel*>(channel)->channel()) {
    return InvalidArgument("AdoptCq: the CQ uses another completion channel (wrong shard)");
  }
  return static_cast<backend::Cq*>(new VerbsCq(cq));
}

void VerbsBackend::ReleaseCq(backend::Cq* cq) {
  internal::MutexLock lock(mu_);
  released_.emplace_back(static_cast<VerbsCq*>(cq));
}

Status VerbsBackend::DestroyCq(backend::Cq* cq) {
  auto* wrapper = static_cast<VerbsCq*>(cq);
  if (int rc = ibv_destroy_cq(wrapper->cq()); rc != 0) {
    return ErrnoStatus("ibv_destroy_cq", rc);  // EBUSY: QPs still use it
  }
  delete wrapper;
  return Status::Ok();
}

int VerbsBackend::GetAsyncEvent(backend::AsyncEventRecord* out) noexcept {
  *out = backend::AsyncEventRecord{};
  ibv_async_event event;
  if (ibv_get_async_event(context_, &event) != 0) return -1;
  out->type = event.event_type;
  if (backend::IsQpEvent(out->type)) {
    out->qp_num = event.element.qp->qp_num;  // valid until the ack (S13)
  } else if (out->type == IBV_EVENT_CQ_ERR) {
    out->native_cq = event.element.cq;
  } else if (backend::IsPortEvent(out->type)) {
    out->port_num = event.element.port_num;
  }
  out->Keep(event);  // for the ack
  return 0;
}

Result<backend::QpCaps> VerbsBackend::QueryQp(void* native_qp) {
  auto* qp = static_cast<ibv_qp*>(native_qp);
  if (qp->context != context_) return InvalidArgument("the QP does not belong to " + name_);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (int rc = ibv_query_qp(qp, &attr, IBV_QP_CAP | IBV_QP_STATE, &init); rc != 0) {
    return ErrnoStatus("ibv_query_qp(qp_num " + std::to_string(qp->qp_num) + ")", rc);
  }
  return backend::QpCaps{static_cast<int>(attr.cap.max_send_wr),
                         static_cast<int>(attr.cap.max_recv_wr), qp->srq != nullptr,
                         attr.qp_state == IBV_QPS_ERR};
}

Result<backend::FlushStart> VerbsBackend::StartQpFlush(void* native_qp, uint64_t send_marker,
                                                       uint64_t recv_marker) {
  auto* qp = static_cast<ibv_qp*>(native_qp);
  const std::string which = "qp_num " + std::to_string(qp->qp_num);
  if (qp->qp_type != IBV_QPT_RC && qp->qp_type != IBV_QPT_UC) {
    // A UD marker SEND would need an address handle; unregister UD QPs instead.
    return InvalidArgument("only RC and UC QPs can be drained (" + which + ")");
  }
  ibv_qp_attr current{};
  ibv_qp_init_attr init{};
  if (int rc = ibv_query_qp(qp, &current, IBV_QP_STATE, &init); rc != 0) {
    return ErrnoStatus("ibv_query_qp(" + which + ")", rc);
  }
  // RESET cannot go to ERR, and nothing can have been posted in it.
  if (current.qp_state == IBV_QPS_RESET) return backend::FlushStart::kNothingOutstanding;
  ibv_qp_attr error{};
  error.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp, &error, IBV_QP_STATE); rc != 0) {
    return ErrnoStatus("ibv_modify_qp(" + which + ", IBV_QPS_ERR)", rc);
  }
  // Zero-length, signaled: in the error state it completes with IBV_WC_WR_FLUSH_ERR after
  // everything posted before it (S10).
  ibv_send_wr send{};
  send.wr_id = send_marker;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_send = nullptr;
  if (int rc = ibv_post_send(qp, &send, &bad_send); rc != 0) {
    return ErrnoStatus("ibv_post_send(teardown marker of " + which + "; is a slot free?)", rc);
  }
  backend::FlushStart posted = backend::FlushStart::kAllMarkers;
  if (qp->srq == nullptr) {
    ibv_recv_wr recv{};
    recv.wr_id = recv_marker;
    ibv_recv_wr* bad_recv = nullptr;
    if (ibv_post_recv(qp, &recv, &bad_recv) != 0) posted = backend::FlushStart::kSendMarkerOnly;
  }
  // Move to ERR once more: a provider whose queues live in user memory (rxe) flushes work
  // posted after the first transition only when the kernel is told again (ERR -> ERR is valid).
  (void)ibv_modify_qp(qp, &error, IBV_QP_STATE);
  return posted;
}

Status VerbsBackend::RedriveFlush(void* native_qp, uint64_t recv_marker) {
  auto* qp = static_cast<ibv_qp*>(native_qp);
  ibv_qp_attr error{};
  error.qp_state = IBV_QPS_ERR;
  if (recv_marker == 0) {
    (void)ibv_modify_qp(qp, &error, IBV_QP_STATE);
    return Status::Ok();
  }
  ibv_recv_wr recv{};
  recv.wr_id = recv_marker;
  ibv_recv_wr* bad_recv = nullptr;
  int rc = ibv_post_recv(qp, &recv, &bad_recv);
  if (rc != 0) {
    // Room comes back as the queue's receives are flushed: on rxe when the kernel is told of the
    // error state (ERR -> ERR), elsewhere as their completions are polled.
    (void)ibv_modify_qp(qp, &error, IBV_QP_STATE);
    rc = ibv_post_recv(qp, &recv, &bad_recv);
  }
  if (rc != 0) {
    return Status(StatusCode::kResourceExhausted, "ibv_post_recv(teardown marker of qp_num " +
                                                      std::to_string(qp->qp_num) +
                                                      "): " + std::strerror(rc));
  }
  // A receive posted in the error state flushes on rxe only when the kernel is told again.
  (void)ibv_modify_qp(qp, &error, IBV_QP_STATE);
  return Status::Ok();
}

// What to do on a machine with no RDMA device, appended to the error.
constexpr char kNoDeviceHint[] =
    "this machine has no RDMA device: load rdma_rxe and add a soft-RoCE one over an Ethernet "
    "interface (`rdma link add rxe0 type rxe netdev eth0`), or run the rxe tests in their VM; "
    "see docs/RXE.md";

Result<ibv_context*> OpenDevice(const std::string& name) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {  // ENOSYS: the kernel has no RDMA support (no ib_uverbs)
    const Status failed = ErrnoStatus("ibv_get_device_list", errno);
    return Status(failed.code(), failed.message() + "; " + kNoDeviceHint);
  }
  ibv_context* context = nullptr;
  bool found = false;
  std::string names;
  for (int i = 0; i < count; ++i) {
    const char* n = ibv_get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + std::string(n);
    if (name == n) {
      found = true;
      context = ibv_open_device(list[i]);
    }
  }
  int err = errno;
  ibv_free_device_list(list);
  if (context != nullptr) return context;
  if (found) return ErrnoStatus("ibv_open_device(" + name + ")", err);
  if (names.empty())
    return NotFound("no RDMA device \"" + name + "\" (devices: none); " + kNoDeviceHint);
  return NotFound("no RDMA device \"" + name + "\" (devices: " + names + ")");
}

}  // namespace cqd::verbs_internal

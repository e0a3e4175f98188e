// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/verbs/verbs_device.h: the seam over libibverbs (rxe, mlx5, any rdma-core
// provider).
//
// Each call is the verbs call of the same name; the wrappers add no state on the poll path
// (Poll is ibv_poll_cq on the wrapped CQ). CQs are keyed by their ibv_cq*, channels by their
// ibv_comp_channel*.
#ifndef CQD_RUNTIME_BACKEND_VERBS_VERBS_DEVICE_H_
#define CQD_RUNTIME_BACKEND_VERBS_VERBS_DEVICE_H_

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/device.h"
#include "runtime/base/mutex.h"

namespace cqd::verbs_internal {

class VerbsCq final : public backend::Cq {
 public:
  explicit VerbsCq(ibv_cq* cq) : cq_(cq) {}
  void* native() const noexcept override { return cq_; }
  int Poll(int n, ibv_wc* wc) noexcept override { return ibv_poll_cq(cq_, n, wc); }
  int RequestNotify(bool solicited_only) noexcept override {
    return ibv_req_notify_cq(cq_, solicited_only ? 1 : 0);
  }
  int depth() const noexcept override { return cq_->cqe; }
  Status Resize(int depth) override;
  ibv_cq* cq() const { return cq_; }

 private:
  ibv_cq* const cq_;
};

class VerbsChannel final : public backend::Channel {
 public:
  explicit VerbsChannel(ibv_comp_channel* channel) : channel_(channel) {}
  void* native() const noexcept override { return channel_; }
  int fd() const noexcept override { return channel_->fd; }
  int GetEvent(void** native_cq) noexcept override;
  ibv_comp_channel* channel() const { return channel_; }

 private:
  ibv_comp_channel* const channel_;
};

class VerbsBackend final : public backend::Device {
 public:
  // `close_on_destroy`: close the context when the backend is destroyed.
  VerbsBackend(ibv_context* context, bool close_on_destroy);
  ~VerbsBackend() override;

  const std::string& name() const override { return name_; }
  backend::Kind kind() const noexcept override { return backend::Kind::kVerbs; }
  void* native() const noexcept override { return context_; }
  int comp_vectors() const noexcept override { return context_->num_comp_vectors; }
  bool in_sysfs() const noexcept override { return true; }
  Result<backend::Channel*> CreateChannel() override;
  Status DestroyChannel(backend::Channel* channel) override;
  using backend::Device::CreateCq;
  Result<backend::Cq*> CreateCq(int depth, backend::Channel* channel, int comp_vector) override;
  Result<backend::Cq*> AdoptCq(void* native_cq, backend::Channel* channel) override;
  void ReleaseCq(backend::Cq* cq) override;
  Status DestroyCq(backend::Cq* cq) override;
  void AckCqEvents(backend::Cq* cq, unsigned n) noexcept override {
    ibv_ack_cq_events(static_cast<VerbsCq*>(cq)->cq(), n);
  }
  void AckNativeCqEvent(void* native_cq) noexcept override {
    ibv_ack_cq_events(static_cast<ibv_cq*>(native_cq), 1);
  }
  Result<backend::QpCaps> QueryQp(void* native_qp) override;
  Result<backend::FlushStart> StartQpFlush(void* native_qp, uint64_t send_marker,
                                           uint64_t recv_marker) override;
  Status RedriveFlush(void* native_qp, uint64_t recv_marker) override;
  int async_fd() const noexcept override { return context_->async_fd; }
  int GetAsyncEvent(backend::AsyncEventRecord* out) noexcept override;
  void AckAsyncEvent(backend::AsyncEventRecord* record) noexcept override {
    ibv_async_event event = record->Kept<ibv_async_event>();
    ibv_ack_async_event(&event);
  }
  ibv_context* context() const { return context_; }

 private:
  ibv_context* const context_;
  const bool close_on_destroy_;
  const std::string name_;
  internal::Mutex mu_;
  // Wrappers of released (adopted) CQs: the runtime may still ack a late event through one.
  std::vector<std::unique_ptr<VerbsCq>> released_ CQD_GUARDED_BY(mu_);
};

// Opens the device called `name` ("rxe0", "mlx5_0"); kNotFound lists the devices there are.
Result<ibv_context*> OpenDevice(const std::string& name);

}  // namespace cqd::verbs_internal

#endif  // CQD_RUNTIME_BACKEND_VERBS_VERBS_DEVICE_H_

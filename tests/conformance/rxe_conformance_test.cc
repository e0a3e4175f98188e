// SPDX-License-Identifier: BSD-2-Clause
// Runs the S1-S14 conformance suite on real verbs: rxe in the VM (tools/vm), or the device named
// by $CQD_RDMA_DEVICE on an RDMA host. Completions are made by real traffic: a second RC QP,
// connected to the QP under test through the device's own GID, sends to it.
#include <chrono>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/backend/verbs/verbs_device.h"
#include "tests/conformance/bed.h"
#include "tools/rdma/verbs_util.h"

namespace cqd::conformance {
namespace {

constexpr int kQpDepth = 256;
constexpr int kSlots = 256;

class VerbsBed : public Bed {
 public:
  // Returns nullptr (and records a test failure) if the device cannot be set up.
  static std::unique_ptr<Bed> Make() {
    auto bed = std::make_unique<VerbsBed>();
    Status s = bed->Open();
    if (!s.ok()) {
      ADD_FAILURE() << "cannot set up " << rxe::DeviceName() << ": " << s.ToString();
      return nullptr;
    }
    return bed;
  }

  ~VerbsBed() override {
    if (peer_cq_ != nullptr) ibv_destroy_cq(peer_cq_);
    buffers_.reset();
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  }

  backend::Device& device() override { return *backend_; }

  Status Attach(backend::Cq* cq) override {
    cq_ = static_cast<ibv_cq*>(cq->native());
    Result<ibv_qp*> a = rxe::CreateRcQp(pd_, cq_, cq_, kQpDepth);
    if (!a.ok()) return a.status();
    a_ = *a;
    Result<ibv_qp*> b = rxe::CreateRcQp(pd_, peer_cq_, peer_cq_, kQpDepth);
    if (!b.ok()) return b.status();
    b_ = *b;
    if (Status s = rxe::ConnectLoopback(a_, b_->qp_num, gid_index_); !s.ok()) return s;
    return rxe::ConnectLoopback(b_, a_->qp_num, gid_index_);
  }

  Status Detach() override {
    int rc_b = b_ ? ibv_destroy_qp(b_) : 0;
    int rc_a = a_ ? ibv_destroy_qp(a_) : 0;  // S13: waits for its async events' acks
    a_ = b_ = nullptr;
    if (rc_a != 0) return ErrnoStatus("ibv_destroy_qp", rc_a);
    if (rc_b != 0) return ErrnoStatus("ibv_destroy_qp(peer)", rc_b);
    return Status::Ok();
  }

  uint32_t qp_num() const override { return a_->qp_num; }

  Status Receive(int n, bool solicited) override {
    for (int i = 0; i < n; ++i) {
      if (Status s = rxe::PostRecv(a_, next_wr_id_++, *buffers_, i % kSlots); !s.ok()) return s;
    }
    for (int i = 0; i < n; ++i) {
      if (Status s = rxe::PostSend(b_, i, *buffers_, i % kSlots, 64, solicited); !s.ok()) {
        return s;
      }
    }
    std::vector<ibv_wc> sent = rxe::PollN(peer_cq_, n);  // the peer's own send completions
    if (static_cast<int>(sent.size()) != n) return Internal("peer send completions missing");
    for (const ibv_wc& wc : sent) {
      if (wc.status != IBV_WC_SUCCESS) {
        return Internal(std::string("peer send failed: ") + ibv_wc_status_str(wc.status));
      }
    }
    return Status::Ok();
  }

  Status FailOne(uint64_t wr_id) override {
    if (Status s = rxe::PostRecv(a_, wr_id, *buffers_, 0); !s.ok()) return s;
    return rxe::MoveToError(a_);
  }

  // The device may round the CQ up: overflow what it really holds (cqe).
  Status Overflow() override {
    const int depth = cq_->cqe;
    if (depth + 1 > kQpDepth) return Internal("the CQ holds more than the QP can post");
    for (int i = 0; i <= depth; ++i) {
      if (Status s = rxe::PostRecv(a_, next_wr_id_++, *buffers_, i % kSlots); !s.ok()) return s;
    }
    for (int i = 0; i <= depth; ++i) {
      if (Status s = rxe::PostSend(b_, i, *buffers_, i % kSlots, 64, false); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status RaiseQpEvent(ibv_event_type type) override {
    if (type != IBV_EVENT_SQ_DRAINED) {
      return InvalidArgument("the verbs bed raises only IBV_EVENT_SQ_DRAINED");
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.en_sqd_async_notify = 1;
    if (int rc = ibv_modify_qp(a_, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY)) {
      return ErrnoStatus("ibv_modify_qp(SQD)", rc);
    }
    // SQD -> RTS is refused (EINVAL) while rxe is still draining the send queue: retry briefly.
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    int rc = 0;
    for (int attempt = 0; attempt < 200; ++attempt) {
      rc = ibv_modify_qp(a_, &rts, IBV_QP_STATE);
      if (rc != EINVAL) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (rc != 0) return ErrnoStatus("modify(RTS)", rc);
    return Status::Ok();
  }

  Status SetPortUp(bool up) override { return rxe::SetLinkUp(up); }

 private:
  Status Open() {
    Result<ibv_context*> context = verbs_internal::OpenDevice(rxe::DeviceName());
    if (!context.ok()) return context.status();
    backend_ = std::make_unique<verbs_internal::VerbsBackend>(*context, /*owned=*/true);
    gid_index_ = rxe::FindGidIndex(*context);
    pd_ = ibv_alloc_pd(*context);
    if (pd_ == nullptr) return ErrnoStatus("ibv_alloc_pd", errno);
    buffers_ = std::make_unique<rxe::Buffers>();
    if (Status s = buffers_->Register(pd_, kSlots, 4096); !s.ok()) return s;
    peer_cq_ = ibv_create_cq(*context, 2 * kQpDepth, nullptr, nullptr, 0);
    if (peer_cq_ == nullptr) return ErrnoStatus("ibv_create_cq(peer)", errno);
    return Status::Ok();
  }

  std::unique_ptr<verbs_internal::VerbsBackend> backend_;
  int gid_index_ = 0;
  ibv_pd* pd_ = nullptr;
  std::unique_ptr<rxe::Buffers> buffers_;
  ibv_cq* peer_cq_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
  uint64_t next_wr_id_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Verbs, Conformance,
                         ::testing::Values(BedFactory{"verbs", &VerbsBed::Make}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cqd::conformance

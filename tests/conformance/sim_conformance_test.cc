// SPDX-License-Identifier: BSD-2-Clause
// Runs the S1-S14 conformance suite on the simulated device.
#include "cqd/sim.h"
#include "gtest/gtest.h"
#include "runtime/backend/sim/sim_device.h"
#include "tests/conformance/bed.h"

namespace cqd::conformance {
namespace {

class SimBed : public Bed {
 public:
  SimBed() : sim_(SimDevice::Create()), backend_(sim_) {}
  backend::Device& device() override { return backend_; }

  Status Attach(backend::Cq* cq) override {
    cq_ = static_cast<SimCq*>(cq->native());
    Result<SimQp*> qp = sim_->CreateQp(cq_, cq_);
    if (!qp.ok()) return qp.status();
    qp_ = *qp;
    return Status::Ok();
  }
  Status Detach() override { return sim_->DestroyQp(qp_); }
  uint32_t qp_num() const override { return qp_->qp_num(); }
  Status Receive(int n, bool solicited) override {
    for (int i = 0; i < n; ++i) {
      if (qp_->Complete(next_wr_id_++, IBV_WC_RECV, IBV_WC_SUCCESS, solicited) != 1) {
        return Internal("Receive: CQ full");
      }
    }
    return Status::Ok();
  }
  Status FailOne(uint64_t wr_id) override {
    return qp_->Complete(wr_id, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR) == 1 ? Status::Ok()
                                                                       : Internal("CQ full");
  }
  Status Overflow() override {
    std::vector<ibv_wc> wcs(cq_->depth() + 1);
    for (auto& wc : wcs) wc.qp_num = qp_->qp_num();
    return cq_->Inject(wcs, false, /*overflow=*/true) < 0 ? Status::Ok()
                                                          : Internal("Overflow: CQ did not fail");
  }
  Status RaiseQpEvent(ibv_event_type type) override { return sim_->RaiseQpEvent(qp_, type); }
  Status SetPortUp(bool up) override {
    return sim_->RaiseDeviceEvent(up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, 1);
  }

 private:
  std::shared_ptr<SimDevice> sim_;
  sim_internal::SimBackend backend_;
  SimCq* cq_ = nullptr;
  SimQp* qp_ = nullptr;
  uint64_t next_wr_id_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Sim, Conformance,
                         ::testing::Values(BedFactory{
                             "sim", [] { return std::unique_ptr<Bed>(new SimBed()); }}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cqd::conformance

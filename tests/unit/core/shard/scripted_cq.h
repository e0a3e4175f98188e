// SPDX-License-Identifier: BSD-2-Clause
// tests/unit/core/shard/scripted_cq.h: a backend::Cq whose completions the test puts in, for the
// shard's stage tests: it counts its polls and arms and can be told to fail an arm.
#ifndef CQD_TESTS_UNIT_CORE_SHARD_SCRIPTED_CQ_H_
#define CQD_TESTS_UNIT_CORE_SHARD_SCRIPTED_CQ_H_

#include <deque>

#include "runtime/backend/device.h"

namespace cqd::internal {

class ScriptedCq : public backend::Cq {
 public:
  explicit ScriptedCq(int depth = 256) : depth_(depth) {}
  // Queues a successful completion of `qp_num` with `wr_id`.
  void Push(uint32_t qp_num, uint64_t wr_id) {
    ibv_wc wc{};
    wc.qp_num = qp_num;
    wc.wr_id = wr_id;
    wc.status = IBV_WC_SUCCESS;
    held_.push_back(wc);
  }
  size_t held() const { return held_.size(); }
  int polls = 0;
  int arms = 0;
  bool fail_arm = false;

  void* native() const noexcept override { return nullptr; }
  int Poll(int n, ibv_wc* wc) noexcept override {
    ++polls;
    int k = 0;
    for (; k < n && !held_.empty(); ++k) {
      wc[k] = held_.front();
      held_.pop_front();
    }
    return k;
  }
  int RequestNotify(bool) noexcept override {
    ++arms;
    return fail_arm ? 5 /* EIO */ : 0;
  }
  int depth() const noexcept override { return depth_; }
  Status Resize(int depth) override {
    depth_ = depth;
    return Status::Ok();
  }

 private:
  int depth_;
  std::deque<ibv_wc> held_;
};

}  // namespace cqd::internal

#endif  // CQD_TESTS_UNIT_CORE_SHARD_SCRIPTED_CQ_H_

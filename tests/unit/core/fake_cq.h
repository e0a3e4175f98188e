// SPDX-License-Identifier: BSD-2-Clause
// tests/unit/core/fake_cq.h: a backend::Cq that holds nothing, for unit tests of the pieces that
// only read a CQ's depth (fences, routing).
#ifndef CQD_TESTS_UNIT_CORE_FAKE_CQ_H_
#define CQD_TESTS_UNIT_CORE_FAKE_CQ_H_

#include "runtime/backend/device.h"

namespace cqd::internal {

class FakeCq : public backend::Cq {
 public:
  explicit FakeCq(int depth) : depth_(depth) {}
  void* native() const noexcept override { return nullptr; }
  int Poll(int, ibv_wc*) noexcept override { return 0; }
  int RequestNotify(bool) noexcept override { return 0; }
  int depth() const noexcept override { return depth_; }
  Status Resize(int) override { return Status::Ok(); }

 private:
  int depth_;
};

}  // namespace cqd::internal

#endif  // CQD_TESTS_UNIT_CORE_FAKE_CQ_H_

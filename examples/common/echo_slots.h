// SPDX-License-Identifier: BSD-2-Clause
// examples/common/echo_slots.h: the server side of the echo protocol for one connection, shared
// by echo_server and reactor_server: kSlots receive slots of kSlotBytes, each request echoed back
// from a send slot of its own, the receive posted again once the echo completed, and an idle
// connection's keepalive. Not thread-safe: one thread at a time (the connection's handler, or a
// thread holding what serializes it with the handler).
#ifndef CQD_EXAMPLES_COMMON_ECHO_SLOTS_H_
#define CQD_EXAMPLES_COMMON_ECHO_SLOTS_H_

#include <infiniband/verbs.h>

#include <cstdint>

#include "examples/common/cm_util.h"

namespace cqd::examples {

class EchoSlots {
 public:
  static constexpr int kSlots = 32;  // receives posted per connection
  static constexpr uint32_t kSlotBytes = 64;

  // The QP shape the protocol needs (a keepalive and a spare beside the echoes).
  static QpShape Shape();
  // Registers the slots on `pd` and posts every receive on `qp`; false if either failed.
  bool Setup(ibv_pd* pd, ibv_qp* qp);

  enum class Outcome { kEchoed, kReposted, kKeepaliveDone, kIgnored };
  // Handles one successful completion of the connection. Returns nullptr and sets `*outcome`, or
  // the name of the verb that failed (the connection should end).
  const char* OnSuccess(ibv_qp* qp, const ibv_wc& wc, Outcome* outcome);
  // Posts a keepalive (a zero-length RDMA WRITE); false if the post failed.
  static bool PostKeepalive(ibv_qp* qp);

 private:
  bool PostRecv(ibv_qp* qp, int slot);
  Region buffers_;  // kSlots receive slots, then kSlots send slots
};

}  // namespace cqd::examples

#endif  // CQD_EXAMPLES_COMMON_ECHO_SLOTS_H_

// SPDX-License-Identifier: BSD-2-Clause
#include "examples/common/echo_slots.h"

#include <cstring>

namespace cqd::examples {
namespace {

constexpr uint64_t kSendBit = 1ull << 32;
constexpr uint64_t kKeepalive = 1ull << 33;

}  // namespace

QpShape EchoSlots::Shape() {
  QpShape shape;
  shape.send_wrs = kSlots + 2;
  shape.recv_wrs = kSlots;
  return shape;
}

bool EchoSlots::Setup(ibv_pd* pd, ibv_qp* qp) {
  if (!buffers_.Register(pd, 2 * kSlots * kSlotBytes, IBV_ACCESS_LOCAL_WRITE)) return false;
  for (int i = 0; i < kSlots; ++i) {
    if (!PostRecv(qp, i)) return false;
  }
  return true;
}

bool EchoSlots::PostRecv(ibv_qp* qp, int slot) {
  return examples::PostRecv(qp, buffers_, buffers_.data + slot * kSlotBytes, kSlotBytes,
                            static_cast<uint64_t>(slot));
}

bool EchoSlots::PostKeepalive(ibv_qp* qp) { return examples::PostKeepalive(qp, kKeepalive); }

const char* EchoSlots::OnSuccess(ibv_qp* qp, const ibv_wc& wc, Outcome* outcome) {
  if (wc.wr_id & kKeepalive) {
    *outcome = Outcome::kKeepaliveDone;
    return nullptr;
  }
  if (wc.wr_id & kSendBit) {  // an echo went out: its request's slot takes the next one
    *outcome = Outcome::kReposted;
    return PostRecv(qp, static_cast<int>(wc.wr_id & 0xffff)) ? nullptr : "ibv_post_recv failed";
  }
  if (wc.opcode != IBV_WC_RECV) {
    *outcome = Outcome::kIgnored;
    return nullptr;
  }
  const int slot = static_cast<int>(wc.wr_id);
  char* reply = buffers_.data + (kSlots + slot) * kSlotBytes;
  memcpy(reply, buffers_.data + slot * kSlotBytes, wc.byte_len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(reply), wc.byte_len, buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kSendBit | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp, &wr, &bad) != 0) return "ibv_post_send failed";
  *outcome = Outcome::kEchoed;
  return nullptr;
}

}  // namespace cqd::examples

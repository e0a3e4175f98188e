// SPDX-License-Identifier: BSD-2-Clause
#include "tools/rdma/verbs_util.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace cqd::rxe {

int FindGidIndex(ibv_context* context) {
  ibv_port_attr port{};
  if (ibv_query_port(context, 1, &port) != 0) return 0;
  for (int i = 0; i < port.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(context, 1, i, &gid) != 0) continue;
    const uint8_t* r = gid.raw;
    bool v4_mapped = true;
    for (int k = 0; k < 10; ++k) v4_mapped &= r[k] == 0;
    if (v4_mapped && r[10] == 0xff && r[11] == 0xff) return i;
  }
  return 0;
}

Buffers::~Buffers() {
  if (mr != nullptr) ibv_dereg_mr(mr);
  free(memory);
}

Status Buffers::Register(ibv_pd* pd, int slots, uint32_t size) {
  slot_size = size;
  size_t bytes = static_cast<size_t>(slots) * size;
  memory = static_cast<char*>(aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (memory == nullptr) return ResourceExhausted("Buffers: out of memory");
  memset(memory, 0, bytes);
  mr = ibv_reg_mr(pd, memory, bytes,
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) return ErrnoStatus("ibv_reg_mr", errno);
  return Status::Ok();
}

Result<ibv_qp*> CreateRcQp(ibv_pd* pd, ibv_cq* send_cq, ibv_cq* recv_cq, int depth) {
  ibv_qp_init_attr attr{};
  attr.send_cq = send_cq;
  attr.recv_cq = recv_cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = depth;
  attr.cap.max_recv_wr = depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 64;  // PostSend inlines messages up to 64 bytes, as perftest does
  ibv_qp* qp = ibv_create_qp(pd, &attr);
  if (qp == nullptr) return ErrnoStatus("ibv_create_qp", errno);
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.pkey_index = 0;
  init.port_num = 1;
  init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (int rc = ibv_modify_qp(
          qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return ErrnoStatus("ibv_modify_qp(INIT)", rc);
  }
  return qp;
}

Status ConnectLoopback(ibv_qp* qp, uint32_t remote_qpn, int gid_index) {
  ibv_gid gid{};
  if (int rc = ibv_query_gid(qp->context, 1, gid_index, &gid)) {
    return ErrnoStatus("ibv_query_gid", rc);
  }
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = IBV_MTU_1024;
  rtr.dest_qp_num = remote_qpn;
  rtr.rq_psn = 0;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 1;
  rtr.ah_attr.is_global = 1;
  rtr.ah_attr.grh.dgid = gid;
  rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
  rtr.ah_attr.grh.hop_limit = 1;
  rtr.ah_attr.port_num = 1;
  if (int rc =
          ibv_modify_qp(qp, &rtr,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return ErrnoStatus("ibv_modify_qp(RTR)", rc);
  }
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.sq_psn = 0;
  rts.max_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp, &rts,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    return ErrnoStatus("ibv_modify_qp(RTS)", rc);
  }
  return Status::Ok();
}

Status MoveToError(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE)) return ErrnoStatus("modify(ERR)", rc);
  return Status::Ok();
}

Status PostRecv(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers, int slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffers.slot(slot)), buffers.slot_size, buffers.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp, &wr, &bad)) return ErrnoStatus("ibv_post_recv", rc);
  return Status::Ok();
}

namespace {
Status Post(ibv_qp* qp, ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, &wr, &bad)) return ErrnoStatus("ibv_post_send", rc);
  return Status::Ok();
}
}  // namespace

Status PostSend(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers, int slot, uint32_t length,
                bool solicited, bool signaled) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffers.slot(slot)), length, buffers.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (solicited ? IBV_SEND_SOLICITED : 0);
  if (length <= 64) wr.send_flags |= IBV_SEND_INLINE;
  return Post(qp, wr);
}

Status PostWriteImm(ibv_qp* qp, uint64_t wr_id, const Buffers& local, int slot, uint32_t length,
                    const Buffers& remote, int remote_slot, uint32_t imm_host_order) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local.slot(slot)), length, local.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(imm_host_order);
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote.slot(remote_slot));
  wr.wr.rdma.rkey = remote.mr->rkey;
  return Post(qp, wr);
}

Status PostBadSend(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffers.slot(0)), 16, buffers.mr->lkey ^ 0x5a5a00};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return Post(qp, wr);
}

std::vector<ibv_wc> PollN(ibv_cq* cq, int n, int timeout_ms) {
  std::vector<ibv_wc> out;
  ibv_wc wc[16];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (static_cast<int>(out.size()) < n && std::chrono::steady_clock::now() < deadline) {
    int got = ibv_poll_cq(cq, 16, wc);
    if (got < 0) break;
    if (got == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    out.insert(out.end(), wc, wc + got);
  }
  return out;
}

Status SetLinkUp(bool up) {
  const char* host = getenv("CQD_RDMA_HOST");
  if (host != nullptr && std::string(host) == "1") {
    return Unavailable("link changes run only in the VM, never on an RDMA host");
  }
  const char* netdev = getenv("CQD_RDMA_NETDEV");
  std::string command = std::string("ip link set ") +
                        (netdev != nullptr && *netdev != '\0' ? netdev : "eth0") +
                        (up ? " up" : " down");
  int rc = system(command.c_str());
  if (rc != 0) return Internal(command + ": exit status " + std::to_string(rc));
  return Status::Ok();
}

}  // namespace cqd::rxe

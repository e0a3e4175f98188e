// SPDX-License-Identifier: BSD-2-Clause
// tools/rdma/verbs_util.h: plain verbs plumbing for the tests and benchmarks that run on rxe (or
// a real device): open the device, register memory, create RC QPs and connect two of them to each
// other on the same port (loopback through the device's own GID).
#ifndef CQD_TOOLS_RDMA_VERBS_UTIL_H_
#define CQD_TOOLS_RDMA_VERBS_UTIL_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cqd/status.h"

namespace cqd::rxe {

// The device under test: $CQD_RDMA_DEVICE, or "rxe0".
inline std::string DeviceName() {
  const char* name = getenv("CQD_RDMA_DEVICE");
  return name != nullptr && *name != '\0' ? name : "rxe0";
}

// Returns the index of the first IPv4-mapped GID of port 1 (RoCE v2 over IPv4), or 0.
int FindGidIndex(ibv_context* context);

// Memory for sends and receives: `slots` buffers of `slot_size` bytes, registered for local and
// remote write.
struct Buffers {
  ~Buffers();
  Status Register(ibv_pd* pd, int slots, uint32_t slot_size);
  char* slot(int i) const { return memory + static_cast<size_t>(i) * slot_size; }
  char* memory = nullptr;
  uint32_t slot_size = 0;
  ibv_mr* mr = nullptr;
};

// Creates an RC QP with the given CQs, `depth` send and receive WRs.
Result<ibv_qp*> CreateRcQp(ibv_pd* pd, ibv_cq* send_cq, ibv_cq* recv_cq, int depth);
// Moves `qp` to RTS connected to `remote_qpn` on the same device and port.
Status ConnectLoopback(ibv_qp* qp, uint32_t remote_qpn, int gid_index);
// Moves `qp` to the error state (its outstanding WRs complete with IBV_WC_WR_FLUSH_ERR).
Status MoveToError(ibv_qp* qp);

Status PostRecv(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers, int slot);
// Posts a SEND of `length` bytes from `slot`, optionally solicited; signaled unless `signaled`
// is false (then it completes silently, as part of a later signaled one).
Status PostSend(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers, int slot, uint32_t length,
                bool solicited, bool signaled = true);
// Posts a signaled RDMA WRITE WITH IMM of `length` bytes into the peer's `remote_slot`.
Status PostWriteImm(ibv_qp* qp, uint64_t wr_id, const Buffers& local, int slot, uint32_t length,
                    const Buffers& remote, int remote_slot, uint32_t imm_host_order);
// Posts a SEND whose buffer has a bad lkey: it completes with an error (and the QP fails).
Status PostBadSend(ibv_qp* qp, uint64_t wr_id, const Buffers& buffers);

// Takes the VM's eth0 (rxe0's netdev; $CQD_RDMA_NETDEV overrides) down or up, as a cable pull
// would: rxe raises PORT_ERR / PORT_ACTIVE. kUnavailable on an RDMA host (CQD_RDMA_HOST=1),
// where that would cut the host off.
Status SetLinkUp(bool up);

// Polls `cq` until `n` completions were taken or `timeout_ms` passed; returns them.
std::vector<ibv_wc> PollN(ibv_cq* cq, int n, int timeout_ms = 10000);

}  // namespace cqd::rxe

#endif  // CQD_TOOLS_RDMA_VERBS_UTIL_H_

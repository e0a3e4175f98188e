// SPDX-License-Identifier: BSD-2-Clause
// blockd_client: writes blocks to blockd_server and reads every one back, verifying it.
//
//   blockd_client --server=ADDR [--port=7472] [--device=NAME] [--connections=4]
//                 [--blocks-per-connection=64] [--first-block=0] [--rounds=2] [--window=4]
//                 [--pollers=2] [--consumers=2]
//
// Connection i owns blocks [first + i*B, first + (i+1)*B). Each round writes every block with a
// pattern naming the block and the round (one block per request), then reads them back in
// requests of 1 to 4 blocks and compares each block with what was written; `window` requests
// are outstanding at a time. Each request is a SEND; the server moves the data by RDMA READ /
// WRITE from / into this connection's registered buffer and answers with an RDMA WRITE WITH
// IMMEDIATE carrying the request's tag. The geometry comes in the server's accept (private
// data). Connections end with a drained TeardownQp. Exit code 0 when every block read back
// matched and every teardown drained, 1 otherwise.
#include <endian.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "examples/blockd/protocol.h"
#include "examples/common/client.h"
#include "examples/common/cm_util.h"
#include "examples/common/stats_out.h"

namespace cqd::examples::blockd {
namespace {

constexpr uint32_t kMaxRead = 4;  // blocks per read request
constexpr uint64_t kSendBit = 1ull << 32;

void Pattern(char* out, uint32_t block_size, uint64_t block, uint32_t round) {
  for (uint32_t k = 0; k < block_size; k += 8) {
    const uint64_t word = (block << 32) ^ (static_cast<uint64_t>(round) << 16) ^ k;
    memcpy(out + k, &word, std::min<uint32_t>(8, block_size - k));
  }
}

class Conn : public ClientConn {
 public:
  Conn(ClientEngine& client, uint32_t index, uint64_t first, uint64_t count, int window, int rounds)
      : ClientConn(client, index), first_(first), count_(count), window_(window), rounds_(rounds) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;

 private:
  struct Slot {
    bool busy = false;
    uint8_t op = 0;
    uint64_t block = 0;
    uint32_t blocks = 0;
  };
  void Establish() noexcept override;
  void Pump() noexcept;  // issues requests while the window has room
  bool Issue(int slot, uint8_t op, uint64_t block, uint32_t blocks) noexcept;
  void OnReply(uint32_t imm) noexcept;
  char* Data(int slot) { return buffers_.data + static_cast<size_t>(slot) * slot_bytes_; }

  const uint64_t first_, count_;
  const int window_, rounds_;
  Region buffers_;  // window data slots of kMaxRead blocks, then window request slots
  uint32_t block_size_ = 0;
  size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  int round_ = 1;
  bool reading_ = false;  // the round's phase
  uint64_t next_ = 0;     // the phase's next block (relative)
  int outstanding_ = 0;
  uint32_t seq_ = 0;
};

void Conn::Establish() noexcept {
  Engine& e = client_.engine;
  QpShape shape;
  shape.send_wrs = 2 * window_ + 1;  // a request's SEND may complete after its reply
  shape.recv_wrs = window_ + 1;
  if (!CreateQp(id(), e.pd, e.CqFor(index_), shape)) return Fail("rdma_create_qp");
  // Replies are WRITE WITH IMMEDIATE: each consumes a receive, with no buffer.
  for (int i = 0; i < window_ + 1; ++i) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(id()->qp, &wr, &bad) != 0) return Fail("ibv_post_recv");
  }
  if (!Register()) return;
  rdma_conn_param param{};
  param.responder_resources = static_cast<uint8_t>(window_);  // the server's RDMA READs
  param.initiator_depth = 1;
  param.retry_count = 6;  // both ends' transport retries; rxe takes 7 as "for ever"
  param.rnr_retry_count = 7;
  param.private_data = kHello;
  param.private_data_len = sizeof(kHello);
  if (rdma_connect(id(), &param) != 0) Fail("rdma_connect");
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  if (event.type != RDMA_CM_EVENT_ESTABLISHED) {
    FailOnCmEvent(event);
    return;
  }
  Geometry geometry;
  if (event.private_data_len < sizeof(geometry)) return Fail("no geometry in the accept");
  memcpy(&geometry, event.private_data, sizeof(geometry));
  if (geometry.magic != kMagic || first_ + count_ > geometry.blocks) {
    return Fail("the server's geometry does not hold our blocks");
  }
  block_size_ = geometry.block_size;
  slot_bytes_ = static_cast<size_t>(block_size_) * kMaxRead;
  const size_t data = slot_bytes_ * window_;
  if (!buffers_.Register(
          client_.engine.pd, data + window_ * sizeof(Request),
          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) {
    return Fail("ibv_reg_mr");
  }
  slots_.assign(window_, Slot{});
  Running();
  Pump();
}

void Conn::Pump() noexcept {
  for (int slot = 0; slot < window_ && state() == ConnState::kRunning; ++slot) {
    if (slots_[slot].busy) continue;
    if (next_ == count_) {
      if (outstanding_ > 0) return;  // the phase ends when all its requests are answered
      if (reading_) {
        if (round_ == rounds_) {
          Done();
          return;
        }
        ++round_;
      }
      reading_ = !reading_;
      next_ = 0;
    }
    const uint32_t blocks =
        reading_ ? static_cast<uint32_t>(std::min<uint64_t>(1 + seq_ % kMaxRead, count_ - next_))
                 : 1;
    if (!reading_) Pattern(Data(slot), block_size_, first_ + next_, round_);
    if (!Issue(slot, reading_ ? kRead : kWrite, first_ + next_, blocks)) {
      return Fail("ibv_post_send");
    }
    next_ += blocks;
  }
}

bool Conn::Issue(int slot, uint8_t op, uint64_t block, uint32_t blocks) noexcept {
  Request* request = reinterpret_cast<Request*>(buffers_.data + slot_bytes_ * window_) + slot;
  *request = Request{};
  request->magic = kMagic;
  request->op = op;
  request->tag = ((seq_++ & 0xffffff) << 4) | static_cast<uint32_t>(slot);
  request->count = blocks;
  request->block = block;
  request->addr = reinterpret_cast<uintptr_t>(Data(slot));
  request->rkey = buffers_.mr->rkey;
  ibv_sge sge{reinterpret_cast<uintptr_t>(request), sizeof(Request), buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kSendBit | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(id()->qp, &wr, &bad) != 0) return false;
  slots_[slot] = Slot{true, op, block, blocks};
  ++outstanding_;
  return true;
}

void Conn::OnReply(uint32_t imm) noexcept {
  if (imm & kRefused) {
    return Fail("the server refused a request (its log says why: a block range past its blocks?)");
  }
  const int slot = static_cast<int>(imm & 0xf);
  if (slot >= window_ || !slots_[slot].busy) return Fail("a reply for no request");
  Slot& s = slots_[slot];
  if (s.op == kRead) {
    std::vector<char> expected(block_size_);
    for (uint32_t b = 0; b < s.blocks; ++b) {
      Pattern(expected.data(), block_size_, s.block + b, round_);
      if (memcmp(Data(slot) + static_cast<size_t>(b) * block_size_, expected.data(), block_size_) !=
          0) {
        fprintf(stderr, "blockd_client: block %" PRIu64 " read back wrong\n", s.block + b);
        return Fail("verification");
      }
      Verified(1);
    }
  }
  s.busy = false;
  --outstanding_;
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(id()->qp, &wr, &bad) != 0) return Fail("ibv_post_recv");
  Pump();
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  for (const ibv_wc& wc : wcs) {
    const ConnState state = this->state();
    if (state == ConnState::kDone || state == ConnState::kFailed) continue;
    if (FlushedWhileConnecting(wc)) continue;
    if (wc.status != IBV_WC_SUCCESS) return Fail(ibv_wc_status_str(wc.status));
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) OnReply(be32toh(wc.imm_data));
  }
}

int Run(const Flags& flags) {
  ClientEngine client;
  if (!client.Start("blockd_client", flags, 7472)) return 1;
  const int connections = static_cast<int>(flags.Int("connections", 4));
  const uint64_t per = static_cast<uint64_t>(flags.Int("blocks-per-connection", 64));
  const uint64_t first = static_cast<uint64_t>(flags.Int("first-block", 0));
  const int rounds = static_cast<int>(flags.Int("rounds", 2));
  const int window = static_cast<int>(flags.Int("window", 4));
  // One life per connection: its rounds run inside it, on one QP.
  LoopTotals totals;
  const bool started = RunConnections(
      client, connections, /*rounds=*/1,
      [&](int i) {
        return std::make_unique<Conn>(client, i, first + i * per, per, window, rounds);
      },
      &totals);
  if (!started) return 1;
  const uint64_t expected = static_cast<uint64_t>(connections) * per * rounds;
  printf("blockd_client: connections=%d verified_blocks=%" PRIu64 " of %" PRIu64 " clean=%" PRIu64
         "\n",
         connections, totals.verified, expected, totals.teardowns_ok);
  client.Stop(flags);
  return totals.verified == expected && totals.teardowns_ok == static_cast<uint64_t>(connections)
             ? 0
             : 1;
}

}  // namespace
}  // namespace cqd::examples::blockd

int main(int argc, char** argv) {
  cqd::examples::Flags flags(
      argc, argv,
      "blockd_client: writes blocks to blockd_server and reads every one back, verifying it\n"
      "(examples/blockd/README.md).\n\n"
      "usage: blockd_client --server=HOST [flags]",
      {
          {"server", "HOST", "the server: a name, an IPv4 or an IPv6 address (required)"},
          {"port", "PORT", "the server's port, 1-65535 (default 7472)", 1, 65535},
          {"device", "NAME", "RDMA device (default: librdmacm's first)"},
          {"connections", "N", "connections at once (default 4)", 1, 4096},
          {"blocks-per-connection", "N", "blocks each connection owns (default 64)", 1, 16777216},
          {"first-block", "N", "the first block of connection 0 (default 0)", 0, 16777216},
          {"rounds", "N", "write-then-read rounds per connection (default 2)", 1, 1048576},
          {"window", "N", "requests outstanding per connection, 1-15 (default 4)", 1, 15},
          {"pollers", "N", "poller threads (default 2)", 1, 256},
          {"consumers", "N", "consumer threads (default 2)", 1, 256},
          {"stats-json", "FILE|-", "write the runtime's stats as JSON there at exit"},
      });
  return cqd::examples::blockd::Run(flags);
}

// SPDX-License-Identifier: BSD-2-Clause
// blockd_server: a block server on cqd. Blocks live in one registered region; clients ask by
// SEND and the data moves by RDMA READ / WRITE, each request answered by an RDMA WRITE WITH
// IMMEDIATE (protocol.h). The same port also serves unmodified rping clients (rdmacm-utils),
// told apart by the private data of their connect request.
//
//   blockd_server [--addr=0.0.0.0] [--port=7472] [--device=NAME] [--blocks=4096]
//                 [--block-size=4096] [--pollers=2] [--consumers=2] [--exit-after=N]
//                 [--stats-json=FILE|-] [--stats-socket=PATH] [--stats-tcp=ADDR:PORT]
//
// Handlers run on runtime-owned consumer threads (connection n on consumer n % consumers); the
// CM channel's CmHandler (connect requests) runs on consumer 0. A connection ends on
// DISCONNECTED or its first error with a drained TeardownQp; the main thread destroys it once
// the teardown is done. Prints "cqd-ready" once listening; with --exit-after=N it exits after N
// connections were established and none is left, printing a summary line. Exit code 0 unless
// setup failed or a connection failed.
#include <endian.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "cqd/runtime.h"
#include "examples/blockd/protocol.h"
#include "examples/common/cm_util.h"
#include "examples/common/keepalive.h"
#include "examples/common/stats_out.h"

namespace cqd::examples::blockd {
namespace {

constexpr int kSlots = 16;  // receives per connection
constexpr uint32_t kRpingBuffer = 64 * 1024;
// wr_id: what a send-queue completion was, and the receive slot it serves.
constexpr uint64_t kRdmaRead = 1ull << 32;
constexpr uint64_t kReply = 2ull << 32;      // WRITE WITH IMM, or rping's go-ahead SEND
constexpr uint64_t kKindMask = 3ull << 32;   // rping's sink write is kRdmaRead | kReply
constexpr uint64_t kKeepalive = 4ull << 32;  // a zero-length RDMA WRITE to an idle peer

struct Totals {
  std::atomic<uint64_t> established{0};
  std::atomic<uint64_t> blockd_connections{0};
  std::atomic<uint64_t> rping_connections{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> rping_pings{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<uint64_t> teardowns_ok{0};
};

class Server;

// One connection. Its handler calls run on one consumer thread; the main thread only asks
// whether it may be reaped (under mu_).
class Conn : public QpHandler {
 public:
  Conn(Server& server, rdma_cm_id* id, bool rping, int read_depth)
      : server_(server), id_(id), rping_(rping), read_depth_(read_depth) {}
  bool Setup(uint64_t n);
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;
  // Ends the connection; `failure` (logged once) names why, nullptr for a clean end.
  void End(const char* failure) noexcept;
  bool Reapable();
  void Destroy();
  // Main thread: an established connection idle for `keepalive` gets a probe, and ends if the
  // probe stays unanswered (keepalive.h): a peer whose host died without a word is let go
  // within a few periods, whatever its QP's retry count.
  // `stats`: the runtime's, read once for this round of ticks (a keepalive judges only once the
  // connection's consumer has caught up: keepalive.h).
  void Tick(std::chrono::steady_clock::time_point now, std::chrono::milliseconds keepalive,
            const Stats& stats);

 private:
  void OnRequest(int slot) noexcept;  // blockd
  void OnRpingInfo(int slot, uint32_t bytes) noexcept;
  void OnSendDone(uint64_t wr_id) noexcept;
  bool PostRecv(int slot);
  bool PostRead(int slot, uint64_t remote, uint32_t rkey, char* local, uint32_t bytes);
  bool PostReply(int slot, const Request& request, uint32_t imm, char* data, uint32_t bytes);
  bool PostGoAhead(int slot);
  char* RecvSlot(int slot) { return buffers_.data + slot * kSlotBytes; }

  static constexpr uint32_t kSlotBytes = sizeof(Request);
  Server& server_;
  rdma_cm_id* id_;
  const bool rping_;
  const int read_depth_;  // RDMA READs the peer lets us have outstanding
  Region buffers_;        // receive slots; for rping also the go-ahead and the data buffer
  Registration registration_;
  int reads_out_ = 0;
  std::deque<int> waiting_;  // blockd write requests waiting for a read credit
  bool rping_sink_next_ = false;
  uint32_t rping_read_ = 0;  // bytes of the last rping source read
  // Set by the consumer thread, read by the main thread's Tick.
  std::atomic<bool> established_{false};
  Keepalive keepalive_;
  ConsumerId consumer_ = 0;  // the consumer its handlers run on (Setup)
  std::mutex mu_;            // guards the fields below (main thread vs. consumer)
  bool ending_ = false;
  bool unregistered_ = false;
  Teardown teardown_;
};

class Server : public CmHandler {
 public:
  explicit Server(const Flags& flags) : flags_(flags) {}
  int Run();
  void OnCmEvent(const CmEvent& event) noexcept override;

  Engine engine;
  Totals totals;
  Region store;
  uint32_t block_size = 4096;
  uint64_t blocks = 4096;
  int consumers = 2;
  std::atomic<bool> stopping{false};  // SIGINT/SIGTERM came: refuse new connections

 private:
  const Flags& flags_;
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  uint64_t accepted_ = 0;                   // consumer 0 only
};

bool Conn::Setup(uint64_t n) {
  Engine& e = server_.engine;
  QpShape shape;
  shape.send_wrs = kSlots + 2;
  shape.recv_wrs = kSlots;
  shape.inline_bytes = 16;
  if (!CreateQp(id_, e.pd, e.CqFor(n), shape)) return false;
  const size_t bytes = kSlots * kSlotBytes + (rping_ ? 16 + kRpingBuffer : 0);
  if (!buffers_.Register(e.pd, bytes, IBV_ACCESS_LOCAL_WRITE)) return false;
  for (int i = 0; i < kSlots; ++i) {
    if (!PostRecv(i)) return false;
  }
  consumer_ = static_cast<ConsumerId>(n % server_.consumers);
  auto registration = e.runtime->RegisterQp(id_, *this, consumer_);
  if (!registration.ok()) {
    fprintf(stderr, "blockd_server: %s\n", registration.status().ToString().c_str());
    return false;
  }
  registration_ = std::move(registration).value();
  return true;
}

bool Conn::PostRecv(int slot) {
  return examples::PostRecv(id_->qp, buffers_, RecvSlot(slot), kSlotBytes,
                            static_cast<uint64_t>(slot));
}

bool Conn::PostRead(int slot, uint64_t remote, uint32_t rkey, char* local, uint32_t bytes) {
  ibv_mr* mr = local >= buffers_.data && local < buffers_.data + buffers_.size ? buffers_.mr
                                                                               : server_.store.mr;
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), bytes, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kRdmaRead | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(id_->qp, &wr, &bad) == 0;
}

bool Conn::PostReply(int slot, const Request& request, uint32_t imm, char* data, uint32_t bytes) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(data), bytes, server_.store.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kReply | static_cast<uint64_t>(slot);
  wr.sg_list = bytes > 0 ? &sge : nullptr;
  wr.num_sge = bytes > 0 ? 1 : 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(imm);
  wr.wr.rdma.remote_addr = request.addr;
  wr.wr.rdma.rkey = request.rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(id_->qp, &wr, &bad) == 0;
}

bool Conn::PostGoAhead(int slot) {
  char* message = buffers_.data + kSlots * kSlotBytes;  // 16 bytes; rping checks only the size
  ibv_sge sge{reinterpret_cast<uintptr_t>(message), 16, buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kReply | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(id_->qp, &wr, &bad) == 0;
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  const Keepalive::Clock::time_point now = Keepalive::Clock::now();
  for (const ibv_wc& wc : wcs) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ending_) continue;  // flushed by the teardown
    }
    if (wc.status != IBV_WC_SUCCESS) {
      End(wc.status == IBV_WC_WR_FLUSH_ERR ? nullptr : ibv_wc_status_str(wc.status));
      continue;
    }
    keepalive_.Heard(now, (wc.wr_id & kKeepalive) != 0);
    if ((wc.wr_id & kKeepalive) != 0) {
      continue;  // the probe answered
    } else if ((wc.wr_id & kKindMask) != 0) {
      OnSendDone(wc.wr_id);
    } else if (rping_) {
      OnRpingInfo(static_cast<int>(wc.wr_id), wc.byte_len);
    } else if (wc.byte_len == sizeof(Request)) {
      OnRequest(static_cast<int>(wc.wr_id));
    } else {
      End("a request of the wrong size");
    }
  }
}

void Conn::OnRequest(int slot) noexcept {
  Request request;
  memcpy(&request, RecvSlot(slot), sizeof(request));
  const bool valid = request.magic == kMagic && request.tag < kRefused && request.count >= 1 &&
                     request.count <= kMaxBlocksPerRequest && request.block < server_.blocks &&
                     request.count <= server_.blocks - request.block &&
                     (request.op == kRead || request.op == kWrite);
  if (!valid) {
    server_.totals.refused.fetch_add(1, std::memory_order_relaxed);
    // Said on both sides: here, and by the client, which gets the tag with kRefused set.
    printf("blockd_server: refused a request on qp %u: op %u, blocks %" PRIu64 "+%u of %" PRIu64
           "%s\n",
           id_->qp->qp_num, static_cast<unsigned>(request.op), static_cast<uint64_t>(request.block),
           static_cast<unsigned>(request.count), server_.blocks,
           request.magic != kMagic ? " (not blockd's magic)" : "");
    fflush(stdout);
    if (!PostReply(slot, request, request.tag | kRefused, nullptr, 0)) End("a post failed");
    return;
  }
  char* data = server_.store.data + request.block * server_.block_size;
  const uint32_t bytes = request.count * server_.block_size;
  if (request.op == kRead) {
    server_.totals.reads.fetch_add(1, std::memory_order_relaxed);
    if (!PostReply(slot, request, request.tag, data, bytes)) End("a post failed");
    return;
  }
  if (reads_out_ >= read_depth_) {
    waiting_.push_back(slot);
    return;
  }
  ++reads_out_;
  if (!PostRead(slot, request.addr, request.rkey, data, bytes)) End("a post failed");
}

void Conn::OnRpingInfo(int slot, uint32_t bytes) noexcept {
  RpingInfo info;
  if (bytes != sizeof(info)) return End("an rping info of the wrong size");
  memcpy(&info, RecvSlot(slot), sizeof(info));
  if (!PostRecv(slot))
    return End("a post failed");  // at once: the next info may follow our go-ahead fast
  const uint64_t remote = be64toh(info.buf);
  const uint32_t rkey = be32toh(info.rkey);
  const uint32_t size = be32toh(info.size);
  char* data = buffers_.data + kSlots * kSlotBytes + 16;
  if (size == 0 || size >= kRpingBuffer) return End("an rping buffer too large");
  if (!rping_sink_next_) {  // the source: read it
    rping_read_ = size;
    if (!PostRead(slot, remote, rkey, data, size)) End("a post failed");
    return;
  }
  // The sink: write back what we read, up to and including its first NUL.
  const void* nul = memchr(data, 0, rping_read_);
  uint32_t length = nul == nullptr ? rping_read_ : static_cast<const char*>(nul) - data + 1;
  if (length > size) length = size;
  ibv_sge sge{reinterpret_cast<uintptr_t>(data), length, buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kRdmaRead | kReply | static_cast<uint64_t>(slot);  // "write done": go ahead next
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) End("a post failed");
}

void Conn::OnSendDone(uint64_t wr_id) noexcept {
  const int slot = static_cast<int>(wr_id & 0xffff);
  const uint64_t kind = wr_id & kKindMask;
  if (rping_) {
    if (kind == kReply) return;  // a go-ahead was delivered
    // The source read, or the sink write, is done: tell the client to go ahead.
    if (kind == kRdmaRead) {
      rping_sink_next_ = true;
    } else {
      rping_sink_next_ = false;
      server_.totals.rping_pings.fetch_add(1, std::memory_order_relaxed);
    }
    if (!PostGoAhead(slot)) End("a post failed");
    return;
  }
  if (kind == kRdmaRead) {  // a write request's data is in: acknowledge it
    --reads_out_;
    server_.totals.writes.fetch_add(1, std::memory_order_relaxed);
    Request request;
    memcpy(&request, RecvSlot(slot), sizeof(request));
    if (!PostReply(slot, request, request.tag, nullptr, 0)) return End("a post failed");
    while (!waiting_.empty() && reads_out_ < read_depth_) {
      const int next = waiting_.front();
      waiting_.pop_front();
      Request queued;
      memcpy(&queued, RecvSlot(next), sizeof(queued));
      ++reads_out_;
      if (!PostRead(next, queued.addr, queued.rkey,
                    server_.store.data + queued.block * server_.block_size,
                    queued.count * server_.block_size)) {
        return End("a post failed");
      }
    }
    return;
  }
  if (!PostRecv(slot)) End("a post failed");  // the reply went out: the slot takes the next request
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  if (event.type == RDMA_CM_EVENT_ESTABLISHED) {
    server_.totals.established.fetch_add(1, std::memory_order_relaxed);
    keepalive_.Heard(Keepalive::Clock::now(), /*answer=*/false);
    established_.store(true, std::memory_order_release);
  } else {
    End(event.type == RDMA_CM_EVENT_DISCONNECTED ? nullptr : rdma_event_str(event.type));
  }
}

void Conn::Tick(std::chrono::steady_clock::time_point now, std::chrono::milliseconds keepalive,
                const Stats& stats) {
  if (!established_.load(std::memory_order_acquire)) return;
  const Keepalive::Due due = keepalive_.Check(now, keepalive, CaughtUp(stats, consumer_));
  if (due == Keepalive::Due::kGiveUp) {
    char reason[64];
    snprintf(reason, sizeof(reason), "keepalive unanswered for %lld ms",
             static_cast<long long>(keepalive_.WaitedMs(now)));
    End(reason);
    return;
  }
  if (due != Keepalive::Due::kProbe) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return;  // End holds mu_ too: nothing is posted once the teardown began
  keepalive_.Probed(now, PostKeepalive(id_->qp, kKeepalive));
}

void Conn::End(const char* failure) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return;
  ending_ = true;
  if (failure != nullptr) {
    server_.totals.failed.fetch_add(1, std::memory_order_relaxed);
    printf("blockd_server: %s connection qp %u failed: %s\n", rping_ ? "rping" : "blockd",
           id_->qp != nullptr ? id_->qp->qp_num : 0, failure);
    fflush(stdout);
  }
  rdma_disconnect(id_);
  auto teardown = server_.engine.runtime->TeardownQp(registration_);
  if (teardown.ok()) {
    teardown_ = *teardown;
  } else {
    fprintf(stderr, "blockd_server: TeardownQp: %s\n", teardown.status().ToString().c_str());
    registration_.Unregister();
    unregistered_ = true;
  }
}

bool Conn::Reapable() {
  std::lock_guard<std::mutex> lock(mu_);
  return ending_ && (unregistered_ || teardown_.done());
}

void Conn::Destroy() {
  if (!unregistered_ && teardown_.Wait().ok()) {
    server_.totals.teardowns_ok.fetch_add(1, std::memory_order_relaxed);
  }
  if (id_->qp != nullptr) rdma_destroy_qp(id_);
  rdma_destroy_id(id_);
}

void Server::OnCmEvent(const CmEvent& event) noexcept {
  if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;  // late events of ended connections
  if (stopping.load(std::memory_order_relaxed)) {
    static constexpr char kWhy[] = "blockd_server: stopping";
    rdma_reject(event.id, kWhy, sizeof(kWhy));
    rdma_destroy_id(event.id);
    return;
  }
  const bool blockd = event.private_data_len >= sizeof(kHello) &&
                      memcmp(event.private_data, kHello, sizeof(kHello)) == 0;
  // Outstanding RDMA READs: what the client grants (its responder resources), at least 1.
  const int depth = std::max<int>(1, event.conn.responder_resources);
  auto conn = std::make_unique<Conn>(*this, event.id, !blockd, depth);
  const uint64_t n = accepted_++;
  if (!conn->Setup(n)) {
    rdma_reject(event.id, nullptr, 0);
    conn->End("its setup failed");
  } else {
    (blockd ? totals.blockd_connections : totals.rping_connections)
        .fetch_add(1, std::memory_order_relaxed);
    Geometry geometry{kMagic, block_size, blocks};
    rdma_conn_param param{};
    param.responder_resources = 1;
    param.initiator_depth = static_cast<uint8_t>(depth);
    param.rnr_retry_count = 7;
    param.private_data = &geometry;
    param.private_data_len = sizeof(geometry);
    if (rdma_accept(event.id, &param) != 0) {
      perror("rdma_accept");
      conn->End("rdma_accept failed");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping.load(std::memory_order_relaxed)) conn->End(nullptr);  // it raced the signal
  conns_.push_back(std::move(conn));
}

int Server::Run() {
  RuntimeOptions options;
  options.pollers = static_cast<int>(flags_.Int("pollers", 2));
  consumers = static_cast<int>(flags_.Int("consumers", 2));
  options.consumers.resize(consumers);
  options.stats_socket = flags_.Str("stats-socket", "");
  options.stats_tcp = flags_.Str("stats-tcp", "");
  if (!engine.Start(options, 4096, flags_.Str("device", ""))) return 1;
  block_size = static_cast<uint32_t>(flags_.Int("block-size", 4096));
  blocks = static_cast<uint64_t>(flags_.Int("blocks", 4096));
  if (!store.Register(engine.pd, block_size * blocks, IBV_ACCESS_LOCAL_WRITE)) return 1;
  if (!engine.WatchCm(*this, 0)) return 1;
  sockaddr_storage addr;
  const long port = flags_.Int("port", 7472);
  if (!ResolveAddress(flags_.Str("addr", "0.0.0.0"), static_cast<uint16_t>(port), /*passive=*/true,
                      &addr)) {
    return 1;
  }
  rdma_cm_id* listener = Listen(engine.channel, addr, 128);
  if (listener == nullptr) return 1;
  printf("cqd-ready blockd_server: %" PRIu64 " blocks of %u bytes on port %ld\n", blocks,
         block_size, port);
  fflush(stdout);
  const uint64_t exit_after = static_cast<uint64_t>(flags_.Int("exit-after", 0));
  const std::chrono::milliseconds keepalive(flags_.Int("keepalive-ms", 500));
  InstallStopSignals();
  std::chrono::steady_clock::time_point stop_deadline{};
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (StopRequested() && !stopping.load(std::memory_order_relaxed)) {
      stopping.store(true, std::memory_order_relaxed);
      stop_deadline = now + std::chrono::seconds(10);  // past every teardown's deadline
      printf("blockd_server: stopping (signal): ending %zu connections\n", conns_.size());
      fflush(stdout);
      for (auto& conn : conns_) conn->End(nullptr);
    }
    const Stats stats = conns_.empty() ? Stats{} : engine.runtime->GetStats();
    for (auto it = conns_.begin(); it != conns_.end();) {
      (*it)->Tick(now, keepalive, stats);
      if ((*it)->Reapable()) {
        (*it)->Destroy();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    if (exit_after > 0 && totals.established.load() >= exit_after && conns_.empty()) break;
    if (stopping.load(std::memory_order_relaxed) && (conns_.empty() || now > stop_deadline)) break;
  }
  printf("blockd_server: blockd_connections=%" PRIu64 " rping_connections=%" PRIu64
         " reads=%" PRIu64 " writes=%" PRIu64 " refused=%" PRIu64 " rping_pings=%" PRIu64
         " failed=%" PRIu64 " teardowns_ok=%" PRIu64 "\n",
         totals.blockd_connections.load(), totals.rping_connections.load(), totals.reads.load(),
         totals.writes.load(), totals.refused.load(), totals.rping_pings.load(),
         totals.failed.load(), totals.teardowns_ok.load());
  WriteStats(*engine.runtime, flags_.Str("stats-json", ""));
  rdma_destroy_id(listener);
  (void)engine.runtime->Shutdown();
  return totals.failed.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cqd::examples::blockd

int main(int argc, char** argv) {
  cqd::examples::Flags flags(
      argc, argv,
      "blockd_server: a block server on cqd (examples/blockd/README.md). Clients read and write\n"
      "blocks by RDMA READ / WRITE; unmodified rping clients are served on the same port.\n\n"
      "usage: blockd_server [flags]",
      {
          {"addr", "ADDRESS", "address to listen on (default 0.0.0.0)"},
          {"port", "PORT", "port to listen on, 1-65535 (default 7472)", 1, 65535},
          {"device", "NAME", "RDMA device (default: librdmacm's first)"},
          {"blocks", "N", "blocks served (default 4096)", 1, 16777216},
          {"block-size", "BYTES", "bytes per block, at most 1 MiB (default 4096)", 1, 1048576},
          {"pollers", "N", "poller threads, 1-256 (default 2)", 1, 256},
          {"consumers", "N", "consumer threads, 1-256 (default 2)", 1, 256},
          {"keepalive-ms", "MS", "idle time before a keepalive probes a connection (default 500)",
           1, 3600000},
          {"exit-after", "N", "exit after N connections came and went (default: run until killed)",
           0, 1099511627776},
          {"stats-json", "FILE|-", "write the runtime's stats as JSON there at exit"},
          {"stats-socket", "PATH", "serve live stats on this Unix socket (tools/cqd_top)"},
          {"stats-tcp", "ADDR:PORT",
           "serve live stats over HTTP there too, for Prometheus (loopback only)"},
      });
  cqd::examples::blockd::Server server(flags);
  return server.Run();
}

// echo_client: many RC connections to echo_server, each checking every reply, coming and going.
//
//   echo_client --server=ADDR [--port=7471] [--device=NAME] [--connections=16] [--requests=200]
//               [--window=8] [--rounds=2] [--pollers=2] [--consumers=2]
//
// Connection i sends requests * (1 + i % 3) requests per round, at most `window` outstanding,
// each 64 bytes naming the connection and sequence number; every reply must come back in order
// and equal to its request. A connection that finished its round disconnects with a drained
// TeardownQp (the main thread waits for it) and, if rounds remain, connects again, while the
// others keep running. Handlers run on runtime-owned consumer threads; connection setup runs in
// the CM channel's CmHandler on consumer 0.
//
// Prints "echo_client: running" once the first connection finished a round, and a summary at
// the end. Exit code 0 when every request of every round was verified and every teardown
// drained; 1 otherwise.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/runtime.h"
#include "examples/common/cm_util.h"
#include "examples/common/stats_out.h"

namespace cqd::examples {
namespace {

constexpr uint32_t kBytes = 64;
constexpr uint64_t kSendBit = 1ull << 32;

void Fill(char* out, uint32_t conn, uint32_t seq) {
  memcpy(out, &conn, 4);
  memcpy(out + 4, &seq, 4);
  for (uint32_t k = 8; k < kBytes; ++k) out[k] = static_cast<char>(conn * 31 + seq * 7 + k);
}

enum class State { kIdle, kConnecting, kRunning, kDone, kFailed };

class Client;

class Conn : public QpHandler {
 public:
  Conn(Client& client, uint32_t index, int window, uint32_t requests)
      : client_(client), index_(index), window_(window), requests_(requests) {}
  bool Connect(rdma_event_channel* channel, const sockaddr_in& server);
  // CmHandler part (consumer 0): address and route resolution.
  void OnSetupEvent(const CmEvent& event) noexcept;
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;
  // Main thread: disconnects, waits for the drained teardown, destroys. Returns its result.
  bool Finish();
  State state() const { return state_.load(std::memory_order_acquire); }
  // Returns true once ESTABLISHED reached the handler (read after state(): set before it).
  bool ran() const { return ran_.load(std::memory_order_relaxed); }
  uint64_t verified() const { return verified_.load(std::memory_order_relaxed); }

 private:
  bool PostRecv(int slot);
  bool PostRequest();
  void Fail(const char* why) noexcept;

  Client& client_;
  const uint32_t index_;
  const int window_;
  const uint32_t requests_;
  rdma_cm_id* id_ = nullptr;
  void* context_ = nullptr;  // the id's context (SetupRouter::Track)
  Region buffers_;           // window receive slots, then window send slots
  Registration registration_;
  uint32_t sent_ = 0;
  uint32_t received_ = 0;
  std::atomic<uint64_t> verified_{0};
  std::atomic<State> state_{State::kIdle};
  std::atomic<bool> ran_{false};
};

class Client {
 public:
  explicit Client(const Flags& flags) : flags_(flags) {}
  int Run();
  SetupRouter<Conn> setup;  // the CM channel's CmHandler, on consumer 0; outlives the runtime
  Engine engine;
  int consumers = 2;

 private:
  const Flags& flags_;
};

bool Conn::Connect(rdma_event_channel* channel, const sockaddr_in& server) {
  sent_ = received_ = 0;
  state_.store(State::kConnecting, std::memory_order_release);
  context_ = client_.setup.Track(this);
  if (rdma_create_id(channel, &id_, context_, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return false;
  }
  sockaddr_in to = server;
  if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&to), 5000) != 0) {
    perror("rdma_resolve_addr");
    return false;
  }
  return true;
}

void Conn::OnSetupEvent(const CmEvent& event) noexcept {
  Engine& e = client_.engine;
  if (event.type == RDMA_CM_EVENT_ADDR_RESOLVED) {
    if (rdma_resolve_route(id_, 5000) != 0) Fail("rdma_resolve_route");
    return;
  }
  if (event.type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    if (state() == State::kConnecting) Fail(rdma_event_str(event.type));
    return;  // late events (TIMEWAIT_EXIT) of an earlier connection
  }
  QpShape shape;
  shape.send_wrs = window_ + 1;
  shape.recv_wrs = window_;
  if (!CreateQp(id_, e.pd, e.CqFor(index_), shape)) return Fail("rdma_create_qp");
  if (buffers_.mr == nullptr &&
      !buffers_.Register(e.pd, 2 * window_ * kBytes, IBV_ACCESS_LOCAL_WRITE)) {
    return Fail("ibv_reg_mr");
  }
  for (int i = 0; i < window_; ++i) {
    if (!PostRecv(i)) return Fail("ibv_post_recv");
  }
  auto registration = e.runtime->RegisterQp(id_, *this, index_ % client_.consumers);
  if (!registration.ok()) return Fail(registration.status().ToString().c_str());
  registration_ = std::move(registration).value();
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = 6;  // both ends' transport retries; rxe takes 7 as "for ever"
  param.rnr_retry_count = 7;
  if (rdma_connect(id_, &param) != 0) Fail("rdma_connect");
}

bool Conn::PostRecv(int slot) {
  return examples::PostRecv(id_->qp, buffers_, buffers_.data + slot * kBytes, kBytes,
                            static_cast<uint64_t>(slot));
}

bool Conn::PostRequest() {
  const int slot = static_cast<int>(sent_ % window_);
  char* request = buffers_.data + (window_ + slot) * kBytes;
  Fill(request, index_, sent_);
  ibv_sge sge{reinterpret_cast<uintptr_t>(request), kBytes, buffers_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kSendBit | sent_;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) return false;
  ++sent_;
  return true;
}

void Conn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  for (const ibv_wc& wc : wcs) {
    const State state = this->state();
    if (state == State::kDone || state == State::kFailed) continue;  // flushed at the end
    if (wc.status != IBV_WC_SUCCESS) {
      char why[160];
      snprintf(why, sizeof(why), "%s (wr_id %#" PRIx64 ", %s, sent %u, received %u)",
               ibv_wc_status_str(wc.status), wc.wr_id,
               state == State::kRunning ? "running" : "before ESTABLISHED", sent_, received_);
      return Fail(why);
    }
    if (wc.wr_id & kSendBit) continue;
    // A reply: it must be the next one, byte for byte.
    const int slot = static_cast<int>(wc.wr_id);
    char expected[kBytes];
    Fill(expected, index_, received_);
    if (wc.byte_len != kBytes || memcmp(buffers_.data + slot * kBytes, expected, kBytes) != 0) {
      return Fail("a reply differs from its request");
    }
    ++received_;
    verified_.fetch_add(1, std::memory_order_relaxed);
    if (!PostRecv(slot)) return Fail("ibv_post_recv");
    if (received_ == requests_) {
      state_.store(State::kDone, std::memory_order_release);
    } else if (sent_ < requests_ && !PostRequest()) {
      return Fail("ibv_post_send");
    }
  }
}

void Conn::OnCmEvent(const CmEvent& event) noexcept {
  if (event.type == RDMA_CM_EVENT_ESTABLISHED) {
    ran_.store(true, std::memory_order_relaxed);
    state_.store(State::kRunning, std::memory_order_release);
    while (sent_ < requests_ && static_cast<int>(sent_) < window_) {
      if (!PostRequest()) return Fail("ibv_post_send");
    }
  } else if (state() != State::kDone) {
    Fail(rdma_event_str(event.type));  // the server went away, or never answered
  }
}

void Conn::Fail(const char* why) noexcept {
  if (state() == State::kFailed) return;
  fprintf(stderr, "echo_client: connection %u: %s\n", index_, why);
  state_.store(State::kFailed, std::memory_order_release);
}

bool Conn::Finish() {
  bool ok = state() == State::kDone;
  if (id_ != nullptr) {
    client_.setup.Forget(context_);
    ok &= CloseConnection(*client_.engine.runtime, id_, registration_);
    id_ = nullptr;
  }
  return ok;
}

int Client::Run() {
  RuntimeOptions options;
  options.pollers = static_cast<int>(flags_.Int("pollers", 2));
  consumers = static_cast<int>(flags_.Int("consumers", 2));
  options.consumers.resize(consumers);
  if (!engine.Start(options, 4096, flags_.Str("device", ""))) return 1;
  sockaddr_in server;
  if (!MakeAddress(flags_.Str("server", ""), flags_.Int("port", 7471), &server)) return 1;
  if (!engine.WatchCm(setup, 0)) return 1;
  rdma_event_channel* channel = engine.channel;
  const int connections = static_cast<int>(flags_.Int("connections", 16));
  const int window = static_cast<int>(flags_.Int("window", 8));
  const uint32_t requests = static_cast<uint32_t>(flags_.Int("requests", 200));
  const int rounds = static_cast<int>(flags_.Int("rounds", 2));
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<int> rounds_left(connections, rounds);
  uint64_t expected = 0, verified = 0, teardowns_ok = 0, failures = 0, setup_retries = 0;
  // A connection whose setup fails (it never reached ESTABLISHED: librdmacm could not move its QP
  // to RTR/RTS, the server did not answer in time) is tried again, as engines do, a few times.
  constexpr int kSetupTries = 3;
  std::vector<int> setup_tries_left(connections, kSetupTries);
  for (int i = 0; i < connections; ++i) {
    const uint32_t n = requests * (1 + i % 3);
    expected += static_cast<uint64_t>(n) * rounds;
    conns.push_back(std::make_unique<Conn>(*this, i, window, n));
    if (!conns.back()->Connect(channel, server)) return 1;
  }
  bool announced = false;
  int active = connections;
  while (active > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < connections; ++i) {
      Conn& conn = *conns[i];
      const State state = conn.state();
      if (rounds_left[i] == 0 || (state != State::kDone && state != State::kFailed)) continue;
      verified += conn.verified();
      const bool setup_failed = state == State::kFailed && !conn.ran();
      const bool closed = conn.Finish();
      if (setup_failed && setup_tries_left[i]-- > 0) {
        ++setup_retries;
        fprintf(stderr, "echo_client: connection %d: its setup failed; connecting again\n", i);
        conns[i] = std::make_unique<Conn>(*this, i, window, requests * (1 + i % 3));
        if (!conns[i]->Connect(channel, server)) return 1;
        continue;
      }
      if (closed) {
        ++teardowns_ok;
      } else {
        ++failures;
      }
      if (!announced) {
        printf("echo_client: running\n");
        fflush(stdout);
        announced = true;
      }
      if (--rounds_left[i] == 0 || state == State::kFailed) {
        rounds_left[i] = 0;
        --active;
        continue;
      }
      // Connect again while the other connections keep running.
      conns[i] = std::make_unique<Conn>(*this, i, window, requests * (1 + i % 3));
      if (!conns[i]->Connect(channel, server)) return 1;
    }
  }
  printf("echo_client: connections=%d rounds=%d verified=%" PRIu64 " of %" PRIu64
         " teardowns_ok=%" PRIu64 " failures=%" PRIu64 " setup_retries=%" PRIu64 "\n",
         connections, rounds, verified, expected, teardowns_ok, failures, setup_retries);
  WriteStats(*engine.runtime, flags_.Str("stats-json", ""));
  (void)engine.runtime->Shutdown();
  conns.clear();
  return failures == 0 && verified == expected ? 0 : 1;
}

}  // namespace
}  // namespace cqd::examples

int main(int argc, char** argv) {
  cqd::examples::Flags flags(argc, argv);
  cqd::examples::Client client(flags);
  return client.Run();
}

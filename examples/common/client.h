// SPDX-License-Identifier: BSD-2-Clause
// examples/common/client.h: the connection life and the main loop both example clients run.
//
// A ClientConn is one connection. Connect (main thread) makes its id and resolves the server's
// address; the CM channel's CmHandler (ClientEngine::setup, consumer 0) hands it the setup
// events: ADDR_RESOLVED resolves the route, ROUTE_RESOLVED calls the subclass's Establish (make
// the QP, Register it, rdma_connect), and an error before then fails it. From registration on,
// its QP's completions and CM events come to the subclass as a QpHandler, on its consumer
// (connection i on consumer i % consumers). Finish (main thread) ends it: a drained teardown,
// then the QP and id are destroyed.
//
// RunConnections is the main loop: it keeps `connections` of them going, each for `rounds`
// lives, replacing one that finished by a new one while the others run on, and trying a setup
// that failed again.
#ifndef CQD_EXAMPLES_COMMON_CLIENT_H_
#define CQD_EXAMPLES_COMMON_CLIENT_H_

#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cqd/runtime.h"
#include "examples/common/cm_util.h"

namespace cqd::examples {

class ClientConn;

// A client process: its runtime on librdmacm's device, the CM channel whose CmHandler (consumer
// 0) routes setup events to connections, and the server's address.
struct ClientEngine {
  // `program` prefixes messages. Takes --server, --port (default `default_port`), --device,
  // --pollers (2) and --consumers (2). False (and a message) on failure.
  bool Start(const char* program, const Flags& flags, uint16_t default_port);
  // Prints the stats digest (and --stats-json), then shuts the runtime down.
  void Stop(const Flags& flags);

  const char* program = "client";
  SetupRouter<ClientConn> setup;  // the CM channel's CmHandler; outlives the runtime
  Engine engine;
  int consumers = 2;
  sockaddr_storage server{};
};

enum class ConnState { kConnecting, kRunning, kDone, kFailed };

class ClientConn : public QpHandler {
 public:
  ClientConn(ClientEngine& client, uint32_t index) : client_(client), index_(index) {}
  // Finish must have run: the runtime may call the handler until then.
  ~ClientConn() override = default;
  ClientConn(const ClientConn&) = delete;
  ClientConn& operator=(const ClientConn&) = delete;

  // Main thread: creates the id and resolves the server's address. False (and a message) if
  // librdmacm refused.
  bool Connect();
  // The channel's CmHandler (consumer 0): a setup event of this connection's id.
  void OnSetupEvent(const CmEvent& event) noexcept;
  // Main thread, once state() is kDone or kFailed: disconnects, waits for the drained teardown
  // and destroys the QP and id. Returns true if the connection was done and its teardown drained,
  // or, with `late` given, ended at its deadline (*late set; nothing was lost).
  bool Finish(bool* late = nullptr);

  ConnState state() const { return state_.load(std::memory_order_acquire); }
  // Returns true once the connection ran (read after state(): set before it).
  bool ran() const { return ran_.load(std::memory_order_relaxed); }
  uint64_t verified() const { return verified_.load(std::memory_order_relaxed); }

 protected:
  // ROUTE_RESOLVED reached the CmHandler: make the QP, Register, rdma_connect (or Fail).
  virtual void Establish() noexcept = 0;
  // Registers id()'s QP with this handler and its rdma_cm_id; false (after Fail) if refused.
  bool Register() noexcept;
  void Running() noexcept;  // on its consumer: ESTABLISHED came, the connection runs
  void Done() noexcept { state_.store(ConnState::kDone, std::memory_order_release); }
  // Prints `why` once and marks the connection failed (a later Done does not undo it).
  void Fail(const char* why) noexcept;
  // Returns true for a completion flushed while the connection was still being set up: the QP
  // went to the error state because the connect failed, and the connection event that says why
  // (REJECTED, UNREACHABLE, CONNECT_ERROR) comes after it; that event fails the connection.
  bool FlushedWhileConnecting(const ibv_wc& wc) const {
    return wc.status == IBV_WC_WR_FLUSH_ERR && state() == ConnState::kConnecting;
  }
  // A connection event other than ESTABLISHED: Fail. Before the connection ran, a rejected
  // connect request or an unreachable server also marks it refused(), with the reason.
  void FailOnCmEvent(const CmEvent& event) noexcept;

 public:
  // Returns what refused the connection before it ran ("" if nothing did); read after state().
  const std::string& refused() const { return refused_; }

 protected:
  void Verified(uint64_t n) noexcept { verified_.fetch_add(n, std::memory_order_relaxed); }
  rdma_cm_id* id() const { return id_; }

  ClientEngine& client_;
  const uint32_t index_;

 private:
  rdma_cm_id* id_ = nullptr;
  void* context_ = nullptr;  // the id's context (SetupRouter::Track)
  Registration registration_;
  std::atomic<uint64_t> verified_{0};
  std::atomic<ConnState> state_{ConnState::kConnecting};
  std::atomic<bool> ran_{false};
  std::string refused_;  // written before the failed state is stored
};

struct LoopTotals {
  uint64_t verified = 0;        // what the connections verified, over all their lives
  uint64_t teardowns_ok = 0;    // lives that ended done, with a drained teardown
  uint64_t teardowns_late = 0;  // lives that ended done, their teardown at its deadline (loaded
                                // emulator): every reply was verified, nothing was lost
  uint64_t failures = 0;        // lives that failed (after running), or whose teardown failed
  uint64_t setup_retries = 0;
};

// Main thread: runs connections 0..connections-1, each made by make(i), for `rounds` lives each.
// A life ends when its connection is done or failed; a connection that failed before it ran
// (librdmacm could not set it up, the server did not answer in time) is made and connected again,
// up to three times, as engines do. A failed life ends that connection's rounds. Prints
// "PROGRAM: running" once the first life ended. Returns false, having finished every
// connection, if one could not even start (Connect failed) or the server refused one before it
// ran (nobody serves the port, or the server said no: the reason is printed, nothing is tried
// again); *totals holds what was counted. Every connection is finished when it returns.
bool RunConnections(ClientEngine& client, int connections, int rounds,
                    const std::function<std::unique_ptr<ClientConn>(int)>& make,
                    LoopTotals* totals);

}  // namespace cqd::examples

#endif  // CQD_EXAMPLES_COMMON_CLIENT_H_

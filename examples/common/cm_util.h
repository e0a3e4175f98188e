// SPDX-License-Identifier: BSD-2-Clause
// examples/common/cm_util.h: the rdma_cm and verbs plumbing the example engines share: flags,
// addresses, listening and connecting ids, RC QPs on cqd's CQs, registered buffers.
//
// Everything here is control path: plain functions that print what failed to stderr and return
// false or nullptr, for the examples' own main loops.
#ifndef CQD_EXAMPLES_COMMON_CM_UTIL_H_
#define CQD_EXAMPLES_COMMON_CM_UTIL_H_

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cqd/runtime.h"

namespace cqd::examples {

// One flag a program takes: --name=VALUE, or --name alone for a switch (value == nullptr).
struct FlagSpec {
  const char* name;   // without the dashes
  const char* value;  // what the value is, for --help ("N", "PATH"); nullptr for a switch
  const char* help;
  long min = 1;  // min <= max: the value is a whole number in [min, max]
  long max = 0;
};

// A program's flags, checked against what it takes. The constructor prints `usage` and every
// flag's help to stdout and exits 0 for --help or -h; it prints an error naming the flag and
// exits 2 for an unknown flag, a switch given a value, a flag without its value, or anything
// that is not a flag, and for a number flag whose value is not a whole number in its range; all
// before the program does anything else.
class Flags {
 public:
  Flags(int argc, char** argv, const char* usage, std::vector<FlagSpec> specs);
  std::string Str(const std::string& name, const std::string& fallback) const;
  // A number flag's value (checked by the constructor), or `fallback` if it was not given.
  long Int(const std::string& name, long fallback) const;
  bool Has(const std::string& name) const { return values_.count(name) != 0; }

 private:
  std::string program_;
  std::map<std::string, std::string> values_;
};

// SIGINT and SIGTERM from here on set StopRequested() instead of killing the process: a server
// then refuses new connections, ends the ones it has (drained teardowns) and exits with its
// totals and stats. A second signal while stopping kills it as usual.
void InstallStopSignals();
bool StopRequested();

// Fills `out` with the address of `host` (a name, an IPv4 or an IPv6 address) and `port`, as
// rdma_getaddrinfo finds it: the address to bind if `passive`, else the one to connect to.
// False (and a message) if it cannot be resolved.
bool ResolveAddress(const std::string& host, uint16_t port, bool passive, sockaddr_storage* out);
// "1.2.3.4:7471" or "[::1]:7471".
std::string AddressText(const sockaddr_storage& addr);

// An id on `channel` bound to `addr` and listening; nullptr (and a message) on failure.
rdma_cm_id* Listen(rdma_event_channel* channel, const sockaddr_storage& addr, int backlog);

// Registered memory: `size` bytes, zeroed, registered with `access`.
struct Region {
  Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region();
  bool Register(ibv_pd* pd, size_t size, int access);
  char* data = nullptr;
  size_t size = 0;
  ibv_mr* mr = nullptr;
};

struct QpShape {
  int send_wrs = 64;
  int recv_wrs = 64;
  int inline_bytes = 64;
};
// Gives `id` an RC QP on `cq` (send and receive) in `pd`; false (and a message) on failure,
// also when the id is on another device than `pd`.
bool CreateQp(rdma_cm_id* id, ibv_pd* pd, const CqHandle& cq, const QpShape& shape);

// One runtime per process, its device taken from librdmacm (the contexts rdma_cm ids use), one
// CQ per shard. `cq_depth` per CQ; CQs grow as QPs register.
struct Engine {
  ~Engine();
  // Starts the runtime on librdmacm's device `name` (empty: the first one). Connections must
  // use that device (bind or resolve to an address of its ports). False (and a message) on
  // failure.
  bool Start(const RuntimeOptions& options, int cq_depth, const std::string& name);
  // The CQ for the `n`th connection: spread over the shards.
  const CqHandle& CqFor(uint64_t n) const { return cqs[n % cqs.size()]; }
  // Creates `channel` and has the runtime deliver its events (WatchCmChannel). False (and a
  // message) on failure.
  bool WatchCm(CmHandler& handler, ConsumerId consumer);

  std::unique_ptr<Runtime> runtime;
  ibv_context** devices = nullptr;  // rdma_get_devices
  ibv_context* context = nullptr;
  DeviceId device = 0;
  ibv_pd* pd = nullptr;
  std::vector<CqHandle> cqs;
  rdma_event_channel* channel = nullptr;  // WatchCm; destroyed after the runtime
};

// Ends a connection from the engine's side, on a thread that is not its consumer: disconnects,
// tears the QP down the drained way and waits for that (an unregistered `registration` skips
// both), then destroys the QP and `id`. Returns true when the teardown drained, or, with `late`
// given, when it ended at its deadline (*late set): what it left is orphaned, never delivered
// to another connection, so a caller that already verified every reply lost nothing.
bool CloseConnection(Runtime& runtime, rdma_cm_id* id, Registration& registration,
                     bool* late = nullptr);

// Posts one receive of `bytes` at `addr` (inside `region`) as `wr_id`; false if refused.
bool PostRecv(ibv_qp* qp, const Region& region, const char* addr, uint32_t bytes, uint64_t wr_id);

// A client's CmHandler: routes the setup events of its connections (ADDR_RESOLVED,
// ROUTE_RESOLVED, errors before a QP is registered) to `Conn::OnSetupEvent`. An event may name an
// id destroyed since it was read, whose address a new id may have, so each id carries a serial
// that is never reused as its context, and events are matched by that. Track and Forget may be
// called from any thread.
template <typename Conn>
class SetupRouter : public CmHandler {
 public:
  void OnCmEvent(const CmEvent& event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(reinterpret_cast<uintptr_t>(event.context));
    if (it != conns_.end()) it->second->OnSetupEvent(event);
  }
  // Returns the context for `conn`'s next id; its events reach `conn` until Forget.
  void* Track(Conn* conn) {
    std::lock_guard<std::mutex> lock(mu_);
    conns_[++serial_] = conn;
    return reinterpret_cast<void*>(serial_);
  }
  void Forget(void* context) {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(reinterpret_cast<uintptr_t>(context));
  }

 private:
  std::mutex mu_;
  std::unordered_map<uintptr_t, Conn*> conns_;
  uintptr_t serial_ = 0;
};

// Zero-length signaled RDMA WRITE: costs the peer nothing, and fails with
// IBV_WC_RETRY_EXC_ERR when the peer is gone, so an idle connection to a dead host is noticed.
bool PostKeepalive(ibv_qp* qp, uint64_t wr_id);

// Returns true if `consumer` held nothing undelivered in `stats` (ConsumerStats::queue_depth and
// spill_depth 0): whatever answer its handlers await had been heard, if it came (keepalive.h).
bool CaughtUp(const Stats& stats, ConsumerId consumer);

}  // namespace cqd::examples

#endif  // CQD_EXAMPLES_COMMON_CM_UTIL_H_

// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/options.h: how a Runtime is shaped. Validated by Runtime::Create, which names the bad field.
#ifndef CQD_OPTIONS_H_
#define CQD_OPTIONS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cqd/status.h"
#include "cqd/version.h"

namespace cqd {

class OrphanHandler;

/// Where a consumer's handlers run.
enum class ConsumerKind {
  kOwnedThread,   // a thread the runtime starts, pins (optionally) and stops
  kEngineDriven,  ///< the engine's own thread calls Runtime::Drain when Runtime::NotifyFd is
                  ///< readable
  /// Run to completion: the handlers run on the thread of poller `ConsumerOptions::poller`, right
  /// after it polls, with no handoff between threads (as SPDK and perftest do). On an
  /// engine-driven shard (RuntimeOptions::engine_shards) that is the engine thread, inside
  /// Runtime::PollShard. The same
  /// guarantees hold as for the other kinds (order, Unregister, TeardownQp, events). A QP on it
  /// must have both CQs on that poller's shard (RegisterQp refuses others). Choose it for
  /// latency-critical QPs whose handlers are short: a slow handler delays every CQ of the shard.
  kRunToCompletion,
};

/// One consumer: where its handlers run (kind), and its queue's bounds.
struct ConsumerOptions {
  ConsumerKind kind = ConsumerKind::kOwnedThread;  ///< where its handlers run
  std::string name{};  ///< shown in stats and thread names; defaults to "consumer<i>"
  /// kOwnedThread: CPU to pin to; -1: none (then RuntimeOptions::auto_placement may confine the
  /// thread to the CPUs of the device's NUMA node). kEngineDriven: ignored. kRunToCompletion: must
  /// be -1 (the poller's CPU applies, RuntimeOptions::poller_cpus).
  int cpu = -1;
  /// kRunToCompletion: the poller (shard) whose thread runs the handlers (0..pollers-1).
  int poller = 0;
  /// Items (completions and async events) handed to this consumer and not yet dispatched, at
  /// most (1..1<<26); the bound holds except at Shutdown, when pollers hand over everything they
  /// hold.
  std::size_t queue_capacity = 1 << 16;
  /// Items each poller holds for this consumer while its queue is full (1..1<<20). When they are
  /// full too, that poller stops polling the CQs this consumer's QPs use until there is room
  /// again; completions stay in those CQs, none is dropped. CQs the consumer does not use are not
  /// held back. kRunToCompletion: its poller dispatches straight from here while the queue is
  /// empty, and queues only what does not fit. Memory for this consumer: one lane per poller of
  /// (queue_capacity + spill_capacity) * 64 bytes, touched as used.
  std::size_t spill_capacity = 4096;
  int dispatch_batch = 64;  ///< items taken off the queue at once (1..1024)
  /// kOwnedThread: spin this long on an empty queue before sleeping (0..24 h), also after a
  /// pre-wake (ConsumerStats::pre_wakes).
  std::chrono::microseconds idle_spin{20};
  /// Record each completion's poll -> dispatch latency in a histogram (ConsumerStats::latency).
  /// Costs, while any consumer has it: one clock read per CQ poll that returned completions (on
  /// every poller); for this consumer one clock read per dispatch batch and one histogram update
  /// per run of completions from the same poll. Off: nothing but a predictable branch.
  bool record_latency = false;
};

/// How much a log message matters, least first.
enum class LogLevel {
  kDebug,    ///< what a user debugging a stall wants
  kInfo,     ///< what the runtime did (a device added)
  kWarning,  ///< something failed and the runtime went on (a teardown past its deadline)
  kError,    ///< something failed that the engine must act on (DEVICE_FATAL, CQ_ERR)
};

/// Returns "debug", "info", "warning" or "error".
std::string_view LogLevelName(LogLevel level);

/// Everything Runtime::Create needs, with its bounds; the defaults make a working runtime.
struct RuntimeOptions {
  int pollers = 1;  ///< poller threads = CQ shards (1..256)
  /// Empty: not pinned (but see auto_placement); else one CPU per poller.
  std::vector<int> poller_cpus{};
  /// Engine-driven shards: the shards (0..pollers-1, each at most once) whose poller is a step of
  /// the engine's own loop rather than a thread of the runtime. No thread is started for them;
  /// one engine thread at a time drives each with Runtime::PollShard and Runtime::TrySleepShard
  /// and sleeps on Runtime::ShardFd (runtime.h, "Engine-driven shards"). Their poller_cpus
  /// entries are ignored (the engine places its own threads); auto_placement never moves them.
  std::vector<int> engine_shards{};
  int poll_batch = 32;  ///< completions per ibv_poll_cq call (1..1024)
  /// A poller that found nothing for this long arms its CQs, polls once more, and sleeps
  /// (0..24 h; to never sleep, use busy_poll).
  std::chrono::microseconds idle_budget{50};
  bool busy_poll = false;  ///< never arm or sleep: poll until shutdown
  /// A CQ that a poller found empty for this long (while the poller itself stayed busy with
  /// others) is armed, polled once more, and left out of the poller's passes until its next
  /// completion event: a shard with many idle CQs costs what its active ones cost. 0: never
  /// park. Not done with busy_poll, for solicited-only CQs, or once a shard's notifications
  /// failed. The price: the first completion on a parked CQ waits for its event (one wake of
  /// the event thread). 0..24 h.
  std::chrono::microseconds cq_park_after{1000};
  uint32_t ack_threshold = 64;  ///< CQ events acked per ibv_ack_cq_events call (>= 1)
  std::vector<ConsumerOptions> consumers{ConsumerOptions{}};  ///< 1..1024 of them
  uint32_t max_registrations = 1 << 16;     ///< concurrently registered QPs (1..1<<24)
  OrphanHandler* orphan_handler = nullptr;  ///< optional; orphans are counted either way
  /// When the first verbs device whose NUMA node is known is added (sysfs numa_node), confine
  /// the pollers and owned consumers that have no CPU of their own to that node's CPUs (those
  /// the process may run on), unless those are all the CPUs it may use anyway; and spread CQs
  /// created with CqOptions::comp_vector == -1 round robin over each device's completion
  /// vectors. Explicit CPUs and vectors always win. Stats reports what was decided. false: no
  /// thread is moved, and comp_vector -1 means vector 0.
  bool auto_placement = true;
  /// Optional: where the runtime's log messages go. Unset, the environment decides: with
  /// CQD_LOG_LEVEL=debug, info, warning (or warn) or error, in any case, messages at that level or
  /// above go to stderr, or appended to the file CQD_LOG_FILE names, one line each
  /// ("cqd: 2026-11-26T10:00:00.000001Z PID:TID info: ..."); CQD_LOG_FILE set and CQD_LOG_LEVEL
  /// unset means warning; both unset, or the level "off", the runtime prints nothing. Called on
  /// control paths only, never from a poller's or consumer's data path: from the thread making a
  /// control call (a handler's included, so a consumer's or, run to completion, a poller's
  /// thread), the event thread, the teardown thread and the stats thread, possibly concurrently,
  /// so it must be thread-safe, and must not take a lock a handler may hold while it calls the
  /// runtime. It must not block for long (it delays the event thread) and must not call the
  /// runtime: it may run under the runtime's mutex, so control calls, Registration::Unregister
  /// (a no-op) and Teardown::Wait from it are refused with kFailedPrecondition, and GetStats
  /// leaves out the CQs. Messages have no trailing newline. Exceptions it throws are swallowed.
  std::function<void(LogLevel level, std::string_view message)> log{};
  /// Optional: a Unix socket path (at most 107 bytes) on which a thread of the runtime serves
  /// GetStats() to whoever connects, one client at a time, then closes the connection. The client
  /// may send one request line: "json" or an empty line (or nothing, closing its sending side or
  /// waiting 200 ms) gets StatsToJson's line and "\n"; "prometheus" gets StatsToPrometheus's text;
  /// "GET <path> HTTP/1.x" (or HEAD) and headers, as curl --unix-socket sends them, get an
  /// HTTP/1.0 response (/metrics: Prometheus; / and /json: JSON; else 404; other methods 405;
  /// a request line still unfinished after 4096 bytes: 414, or after 200 ms: 408); anything
  /// else gets "error: unknown request (json|prometheus)\n". The server reads at most 4096 bytes
  /// of a request and ignores the rest; the response is sent whole all the same. A client that
  /// takes no data for 1 s, or 5 s in all, is dropped. Empty: off. A stale socket file there is
  /// replaced; any other file, or a socket someone serves, fails Runtime::Create. The file is
  /// removed at Shutdown (a relative path: in the directory the process was in at Create).
  std::string stats_socket{};
  /// The socket file's permission bits, set exactly (the umask does not apply): connecting needs
  /// write permission, so the default 0600 lets only the runtime's user read the stats. 0660
  /// adds the group. kInvalidArgument unless at most 0777 with the owner's write bit.
  uint32_t stats_socket_mode = 0600;
  /// Optional: "ADDRESS:PORT" on which the same thread serves the same stats over TCP, for
  /// Prometheus to scrape directly (GET /metrics; / and /json give JSON). Numeric addresses only:
  /// IPv4 "127.0.0.1:9464" or IPv6 "[::1]:9464", PORT 1..65535. Empty: off. The stats carry no
  /// secrets but tell about the engine's load, and the listener has no authentication: an
  /// address that is not loopback is refused with kInvalidArgument unless
  /// stats_tcp_allow_remote is set. An address in use fails Runtime::Create (kAlreadyExists).
  std::string stats_tcp{};
  bool stats_tcp_allow_remote = false;  ///< true: stats_tcp may be an address that is not loopback
  /// false: the endpoint's Prometheus text leaves out the per-CQ families (PrometheusOptions in
  /// cqd/stats_format.h): an engine with a CQ per connection otherwise makes series that come
  /// and go with its connections. The totals over all CQs are always there. JSON keeps them.
  bool stats_per_cq = true;
};

/// Per-CQ settings for Runtime::CreateCq and Runtime::AdoptCq.
struct CqOptions {
  int depth = 4096;             ///< completions the CQ holds; posting more overflows it (S11)
  bool solicited_only = false;  ///< arm for solicited receives and errors only (S8)
  /// RegisterQp adds up the work requests each QP may have outstanding on this CQ (QpOptions).
  /// When the sum would exceed the depth: true grows the CQ first (ibv_resize_cq), false refuses
  /// the registration with kResourceExhausted.
  bool grow = true;
  /// CreateCq only (an adopted CQ keeps the vector the engine created it on): the completion
  /// vector (0..ibv_context::num_comp_vectors-1; the simulated device has one) whose interrupt
  /// signals the CQ's events. -1: the runtime's choice (RuntimeOptions::auto_placement).
  int comp_vector = -1;
};

/// What a QP may have outstanding, for Runtime::RegisterQp's CQ capacity guard. -1: read it from
/// the QP (ibv_query_qp's max_send_wr / max_recv_wr; the simulated QP's options). The runtime
/// adds one work request per queue for TeardownQp's marker: size the QP with that room.
struct QpOptions {
  int send_wrs = -1;  ///< signaled or not: each may produce a completion on the send CQ
  int recv_wrs = -1;  ///< ignored for a QP on an SRQ (its receives are the SRQ's)
};

/// How Runtime::TeardownQp takes a QP out of service.
struct TeardownOptions {
  /// The teardown finishes by then: drained (OK) or not (kDeadlineExceeded); either way the QP is
  /// unregistered. Must be > 0; milliseconds::max() means no deadline.
  std::chrono::milliseconds timeout{5000};
  /// SRQ-attached QPs: how long to wait for IBV_EVENT_QP_LAST_WQE_REACHED after the send queue
  /// has flushed, before taking the device for one that never sends it (rxe does not); then a
  /// fence of the runtime's own, sent behind the QP's completions, stands in for it.
  std::chrono::milliseconds last_wqe_grace{200};
  /// Optional: called once with the result, on the runtime's teardown thread, after the QP was
  /// unregistered. It may call the runtime (Shutdown and Teardown::Wait are refused there with
  /// kFailedPrecondition) and must not block for long: other teardowns' results wait for it.
  std::function<void(const Status&)> on_done{};
};

}  // namespace cqd

#endif  // CQD_OPTIONS_H_

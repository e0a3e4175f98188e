// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/sim.h: a simulated RDMA device, for tests, demos and benchmarks without hardware.
///
/// It behaves as verbs does (the rules S1-S14 of cqd's docs/DESIGN.md), with real file descriptors:
/// a completion channel's fd and the async fd are eventfds that are readable exactly while events
/// are pending, honour O_NONBLOCK, and work with poll/epoll. On top of what verbs offers, it lets a
/// test put completions into CQs (Inject, SimTrafficSource) and inject faults.
///
/// Threading: every call is thread-safe, except that one SimCq is polled by one thread at a time
/// (as a single-threaded verbs CQ). Inject may run concurrently with polling and with itself.
/// A completion published by Inject happens-before the Poll that returns it.
#ifndef CQD_SIM_H_
#define CQD_SIM_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cqd/status.h"
#include "cqd/version.h"
#include "cqd/visibility.h"

namespace cqd {

/// A simulated completion channel (ibv_comp_channel).
class SimChannel {
 public:
  virtual ~SimChannel() = default;
  /// Returns its fd: an eventfd readable exactly while completion events are pending.
  virtual int fd() const = 0;
  /// Returns how many times GetEvent was called on this channel (tests: a reader that spins on a
  /// failing channel shows up here).
  virtual uint64_t get_event_calls() const = 0;
};

/// A simulated CQ (ibv_cq).
class SimCq {
 public:
  virtual ~SimCq() = default;
  /// Returns the completions the CQ holds (it grows when Runtime::RegisterQp resizes it).
  virtual int depth() const noexcept = 0;
  /// Returns the channel its events go to.
  virtual SimChannel* channel() const = 0;
  /// Adds completions as the device would; an armed notification fires if they qualify (S6-S8;
  /// `solicited` marks receives of messages sent with IBV_SEND_SOLICITED). Returns how many were
  /// added: fewer than wcs.size() when the CQ filled up. With `overflow`, adding to a full CQ
  /// overflows it instead (S11): the CQ fails, CQ_ERR and QP_FATAL are raised, and -1 is returned.
  virtual int Inject(std::span<const ibv_wc> wcs, bool solicited = false,
                     bool overflow = false) noexcept = 0;
  /// Returns completions added and not yet polled.
  virtual int size() const noexcept = 0;
  /// Benchmarks: from now on the CQ behaves as a device producing `total` more completions as fast
  /// as they are polled, taken round and round from `pattern` (which must outlive the CQ). A new
  /// call replaces the running replay; Replay({}, 0) ends it. Injected completions are not
  /// returned meanwhile. Starting raises the event a next-completion arm waits for (replayed
  /// completions count as successful, unsolicited receives).
  ///
  /// With `rate_per_sec` > 0 the device is paced instead, an open-loop source: completion k
  /// (from 0) becomes pollable at start + k / rate_per_sec, whether or not earlier ones were
  /// polled, and carries that time (steady clock, ns) in its wr_id. The rate is clamped to
  /// 0.001..1e12 per second; 0, a negative rate or NaN replays unpaced. No event is raised after
  /// the start, so a paced replay is for gaps well below the pollers' idle_budget and
  /// cq_park_after: a sleeping poller, or a parked CQ, would wait for an event that never comes.
  virtual void Replay(std::span<const ibv_wc> pattern, uint64_t total,
                      double rate_per_sec = 0) noexcept = 0;
  /// Returns how many replayed completions are left.
  virtual uint64_t replay_left() const noexcept = 0;
  /// Benchmarks: while on, Poll writes the low 32 bits of the steady-clock time in ns into each
  /// completion it returns, in src_qp (meaningful only for UD, whose value it then replaces), so
  /// that a handler can tell how long after the poll it runs.
  virtual void StampPollTime(bool on) noexcept = 0;
  /// Returns true once the CQ overflowed or the device failed.
  virtual bool failed() const noexcept = 0;
};

/// How a simulated QP is shaped (what ibv_create_qp's init_attr says on verbs). Each queue holds
/// max_*_wr + 1 posted work requests (devices round up; the spare slot is the one a teardown
/// marker needs, as the README asks engines to keep).
struct SimQpOptions {
  int max_send_wr = 0;  ///< what Runtime::RegisterQp's CQ capacity guard reads
  int max_recv_wr = 0;  ///< the receive queue's work requests (0 with an SRQ)
  bool srq = false;     ///< receives come from an SRQ: its teardown has no receive marker
};

/// A simulated QP (ibv_qp).
class SimQp {
 public:
  virtual ~SimQp() = default;
  /// Returns its number (reused once the QP is destroyed, as devices do).
  virtual uint32_t qp_num() const = 0;
  /// Returns its send CQ.
  virtual SimCq* send_cq() const = 0;
  /// Returns its receive CQ.
  virtual SimCq* recv_cq() const = 0;
  /// Returns the options it was created with.
  virtual const SimQpOptions& options() const = 0;
  /// True once the QP was moved to the error state (a teardown started).
  virtual bool in_error() const = 0;
  /// Builds a completion of this QP and injects it into recv_cq (receive opcodes) or send_cq.
  /// Returns the SimCq::Inject result. (Completions made this way need no posted work request.)
  int Complete(uint64_t wr_id, ibv_wc_opcode opcode = IBV_WC_RECV,
               ibv_wc_status status = IBV_WC_SUCCESS, bool solicited = false) noexcept;

  /// Posted work requests, as ibv_post_send / ibv_post_recv: they stay outstanding (taking a
  /// slot of their queue) until the QP is moved to the error state, when they flush as
  /// IBV_WC_WR_FLUSH_ERR completions (SimDeviceOptions says in which order). kResourceExhausted
  /// when the queue is full, kInvalidArgument for PostRecv on an SRQ QP. In the error state a
  /// send flushes at once (kResourceExhausted if its CQ is full) and a receive only at the next
  /// move to the error state, as on rxe. A flush that does not fit its CQ stays outstanding until
  /// the next move to the error state.
  virtual Status PostSend(uint64_t wr_id) = 0;
  /// As PostSend, on the receive queue.
  virtual Status PostRecv(uint64_t wr_id) = 0;
  /// Returns the work requests outstanding on the send (false) or receive (true) queue.
  virtual int outstanding(bool recv) const = 0;
};

/// How a simulated device behaves where devices differ.
struct SimDeviceOptions {
  std::string name = "sim0";  ///< its name (DeviceStats::name)
  int ports = 1;              ///< ports, for port events
  /// An SRQ-attached QP moved to the error state raises IBV_EVENT_QP_LAST_WQE_REACHED, as the
  /// man pages say; false behaves as rxe, which never raises it.
  bool last_wqe_reached = true;
  /// When a QP moves to the error state its outstanding receives flush before its outstanding
  /// sends (rxe: 50 of 50 trials); false: sends first.
  bool flush_receives_first = true;
  /// A send posted in the error state flushes inside the post (rxe); false: at the next move to
  /// the error state, like a receive (with flush_receives_first, a teardown's receive marker then
  /// reaches a shared CQ before its send marker).
  bool flush_sends_at_post = true;
};

/// A simulated RDMA device: channels, CQs and QPs, async events, and faults on request.
class SimDevice {
 public:
  /// Returns a new device; the runtime and the test share it.
  static std::shared_ptr<SimDevice> Create(const SimDeviceOptions& options = {});
  virtual ~SimDevice() = default;
  /// Returns SimDeviceOptions::name.
  virtual const std::string& name() const = 0;

  /// As ibv_create_comp_channel / ibv_destroy_comp_channel (fails while CQs use it).
  virtual Result<SimChannel*> CreateChannel() = 0;
  /// As ibv_destroy_comp_channel.
  virtual Status DestroyChannel(SimChannel* channel) = 0;
  /// As ibv_create_cq / ibv_destroy_cq. DestroyCq blocks until every event read for the CQ and
  /// every async event about it has been acked (S2, S13), and fails while QPs use it.
  virtual Result<SimCq*> CreateCq(int depth, SimChannel* channel) = 0;
  /// As ibv_destroy_cq (see CreateCq).
  virtual Status DestroyCq(SimCq* cq) = 0;
  /// As ibv_create_qp / ibv_destroy_qp (the latter blocks until the QP's async events are acked).
  /// QP numbers are reused, most recently freed first, as devices do.
  virtual Result<SimQp*> CreateQp(SimCq* send_cq, SimCq* recv_cq,
                                  const SimQpOptions& options = {}) = 0;
  /// As ibv_destroy_qp (see CreateQp).
  virtual Status DestroyQp(SimQp* qp) = 0;

  /// Fault injection. The hooks that return nothing ignore a null pointer and an object of
  /// another device.
  /// Raises a QP async event (QP_FATAL, COMM_EST, SQ_DRAINED, LAST_WQE_REACHED, ...).
  virtual Status RaiseQpEvent(SimQp* qp, ibv_event_type type) = 0;
  /// Raises a port event (PORT_ACTIVE, PORT_ERR, LID_CHANGE, ...) or an SRQ event.
  virtual Status RaiseDeviceEvent(ibv_event_type type, int port_num = 1) = 0;
  /// Fails the device: raises DEVICE_FATAL; arming and injecting fail from then on.
  virtual void RaiseDeviceFatal() = 0;
  /// Queues a completion event for `cq` with no completion behind it (S5).
  virtual void AddSpuriousEvent(SimCq* cq) = 0;
  /// The next `times` GetEvent calls on `channel` (or GetAsyncEvent calls) fail with `err`
  /// (EINTR or EAGAIN) without consuming an event.
  virtual void FailGetEvent(SimChannel* channel, int err, int times) = 0;
  /// As FailGetEvent, for the async fd's GetAsyncEvent.
  virtual void FailGetAsyncEvent(int err, int times) = 0;
  /// The next `times` RequestNotify (ibv_req_notify_cq) calls on `cq` fail with `err` and leave
  /// the CQ unarmed.
  virtual void FailRequestNotify(SimCq* cq, int err, int times) = 0;
};

/// What a SimTrafficSource adds.
struct SimTrafficOptions {
  std::vector<SimQp*> qps{};           ///< the QPs, served round robin
  uint64_t completions_per_qp = 1000;  ///< completions for each QP
  double rate_per_sec = 0;             ///< total completions per second; 0: as fast as possible
  int burst = 16;                      ///< completions injected into one CQ at once (1..1024)
  ibv_wc_opcode opcode = IBV_WC_RECV;  ///< every completion's opcode
  uint32_t byte_len = 64;  ///< every receive completion's byte_len (a send's is 0, as on verbs)
  bool solicited = false;  ///< marks them solicited (S8)
};

/// A thread that adds completions for the given QPs, round robin. Completion k of a QP carries
/// wr_id == k, so a receiver can check that each arrives once and in order. A full CQ is waited on,
/// never overflowed: the source behaves like an engine that respects its CQ depth.
class SimTrafficSource {
 public:
  /// A source that adds what `options` says once started.
  explicit SimTrafficSource(SimTrafficOptions options);
  ~SimTrafficSource();  ///< Stop() and join
  SimTrafficSource(const SimTrafficSource&) = delete;
  SimTrafficSource& operator=(const SimTrafficSource&) = delete;

  /// Starts the thread.
  void Start();
  void Stop();  ///< asks the thread to finish early; returns at once
  void Join();  ///< waits for the thread to finish
  /// Returns the completions added so far.
  uint64_t injected() const { return injected_.load(std::memory_order_relaxed); }
  /// Returns the completions it adds in all.
  uint64_t total() const { return options_.completions_per_qp * options_.qps.size(); }

 private:
  CQD_PRIVATE void Run();  ///< the thread's body
  SimTrafficOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> injected_{0};
  std::thread thread_;
};

}  // namespace cqd

#endif  // CQD_SIM_H_

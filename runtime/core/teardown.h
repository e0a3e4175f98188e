// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/teardown.h: QP teardowns (Runtime::TeardownQp) and the thread that ends them.
//
// A teardown's life: the control path marks the registration "tearing down" (registry.h), moves the
// QP to the error state and posts marker work requests whose wr_ids are the TeardownState's
// address (send) and address + 1 (recv). A poller that routes a completion of a QP being torn down
// with a marker wr_id records it in `polled` and writes it into the consumer's lane as a
// kTeardownMarker entry, in order behind the QP's flushed completions; the consumer, on reaching
// it, calls Note().
// LAST_WQE_REACHED events of a QP being torn down are noted the same way after the handler got
// them. On a device that never sends it, once the send marker is back and last_wqe_grace has
// passed, the worker sends a fence instead: an internal event through the shards of the QP's CQs,
// which follows every completion in them, noted as LAST_WQE_REACHED.
//
// The TeardownWorker thread ends each teardown exactly once: drained (OK), device failure
// (kUnavailable), deadline (kDeadlineExceeded) or shutdown (kCancelled). Ending takes two steps,
// neither of which blocks the worker on a consumer, so that one teardown never holds up another
// one's deadline:
//   1. Retire (TeardownHost): the registration dies (nothing is routed to it any more), and
//      what the QP may still have in its CQs is fenced (fences.h): a fence awaits each marker no
//      shard has polled yet, or, for a side with no marker, a catch-up of its CQ; until it ends,
//      the CQ keeps the QP's commitment, whatever that CQ yields for the qp_num goes to the
//      orphan sink, and no later QP of that number is registered there.
//   2. Once the consumer's handler call that may still be under way for the QP is over (polled by
//      the worker, never waited for), the slot is freed, the result published, on_done called.
//
// Threading: TeardownState's `seen` is set by consumers and `polled` by pollers (atomics);
// everything else in it is written before it is shared (control path, under the runtime mutex),
// owned by the worker thread, or guarded by its `mu`. The worker's lists are guarded by its own
// mutex, taken by Add (control path), DeviceFailed (event thread) and Stop; Note never takes it.
#ifndef CQD_RUNTIME_CORE_TEARDOWN_H_
#define CQD_RUNTIME_CORE_TEARDOWN_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "cqd/status.h"
#include "runtime/base/log.h"
#include "runtime/base/mutex.h"
#include "runtime/base/parker.h"

namespace cqd::internal {

class TeardownWorker;

struct alignas(8) TeardownState {
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kSendMarker = 1;
  static constexpr uint32_t kRecvMarker = 2;
  static constexpr uint32_t kLastWqe = 4;

  // Set by the control path before the state is shared.
  TeardownWorker* worker = nullptr;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t qp_num = 0;   // for log messages and the LAST_WQE stand-in
  uint32_t device = 0;   // DeviceId: a DEVICE_FATAL of it ends the teardown
  uint32_t markers = 0;  // k*Marker bits of the markers posted (the worker's once shared)
  bool srq = false;      // receives come from an SRQ: no recv marker; wait for LAST_WQE_REACHED
  // The receive queue had no room for the marker: the worker posts it (TeardownHost::RedriveFlush)
  // once the flushes have made room (then kRecvMarker joins `markers`).
  bool recv_marker_owed = false;
  Clock::time_point deadline;
  std::chrono::milliseconds last_wqe_grace{0};  // TeardownOptions::last_wqe_grace
  std::function<void(const Status&)> on_done;
  std::optional<Status> end_with;  // end at once with this result (nothing can drain)
  // The runtime's engine threads: the "last drainer" token of each engine-driven consumer
  // (Consumer::last_drainer) and the "last driver" token of each engine-driven shard
  // (Shard::last_driver); null when the teardown ended at once. Teardown::Wait refuses them all:
  // the markers may wait behind what any of them delivers or polls (the QP's consumer, a full
  // consumer sharing one of its CQs, its CQs' shards), or that thread may itself be waiting for
  // a teardown that needs the caller. Valid while not done (the runtime ends every teardown
  // before it goes).
  const std::vector<const std::atomic<uintptr_t>*>* engine_threads = nullptr;

  // Returns t + d, or the latest time point where that would overflow (so that a timeout of
  // milliseconds::max() means "no deadline").
  static Clock::time_point After(Clock::time_point t, std::chrono::milliseconds d) noexcept {
    const auto room =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - t);
    return d >= room ? Clock::time_point::max() : t + d;
  }

  std::atomic<uint32_t> seen{0};    // k* bits, set by the QP's consumer
  std::atomic<uint32_t> polled{0};  // k*Marker bits, set by the poller that took the marker
  Clock::time_point grace_ends;     // worker-owned: set when the send marker is seen (SRQ)
  bool fence_posted = false;        // worker-owned: the grace ran out and a fence stands in
  // Worker-owned: while a posted marker has not been polled (or one is owed), the worker redrives
  // the flush at `retry_at`, then at twice the last interval (teardown.cc, kRedriveFirst..Max).
  Clock::time_point retry_at;
  std::chrono::microseconds retry_every{0};

  Mutex mu;
  CondVar cv;
  bool done CQD_GUARDED_BY(mu) = false;
  Status result CQD_GUARDED_BY(mu);

  uint64_t send_marker() const noexcept { return reinterpret_cast<uint64_t>(this); }
  uint64_t recv_marker() const noexcept { return send_marker() + 1; }
  // True once everything the QP had posted has flushed back through the handler.
  bool Flushed() const noexcept {
    uint32_t s = seen.load(std::memory_order_acquire);
    if (!(s & kSendMarker)) return false;
    return srq ? (s & kLastWqe) != 0 : (s & kRecvMarker) != 0;
  }
};

// What retiring a registration left to wait for: the consumer's handler call that may still be
// under way for it, over once the consumer's call word has moved on from `call` (0: there is
// none; Consumer::CallInProgress). `retired` is false if the registration was already gone
// (nothing to free).
struct CallTicket {
  bool retired = false;
  uint32_t consumer = 0;
  uint32_t call = 0;
};

// What the worker needs of the runtime. Each runs on the worker thread; none waits for a
// consumer.
class TeardownHost {
 public:
  virtual ~TeardownHost() = default;
  // Step 1 of an end (see above). Returns the call to wait out before step 2.
  virtual CallTicket RetireTeardown(TeardownState& state) noexcept = 0;
  virtual bool CallOver(const CallTicket& ticket) const noexcept = 0;
  // Step 2's bookkeeping: the slot may be reused.
  virtual void FreeSlot(uint32_t slot) noexcept = 0;
  // Sends the registration's consumer a fence through the shards of its CQs, which the consumer
  // notes as kLastWqe.
  virtual void PostLastWqeStandIn(const TeardownState& state) noexcept = 0;
  // Moves the QP to the error state again (what was posted in it flushes), posting the receive
  // marker first if it is owed; returns false if it is owed and still found no room.
  virtual bool RedriveFlush(const TeardownState& state) noexcept = 0;
};

class TeardownWorker {
 public:
  explicit TeardownWorker(TeardownHost& host) : host_(host) {}
  ~TeardownWorker();
  TeardownWorker(const TeardownWorker&) = delete;
  TeardownWorker& operator=(const TeardownWorker&) = delete;

  // Before Start: where to log teardowns that ran out of time (may stay unset).
  void set_logger(const Logger* log) { log_ = log; }
  void Start();
  // Ends every teardown still running (drained ones OK, the rest kCancelled), lets each finish
  // (its consumer's call over, on_done called) and joins. Consumers must still be running.
  // Must not be called on the worker thread (on_done).
  void Stop();
  // Control path: tracks a started teardown until it ends.
  void Add(std::shared_ptr<TeardownState> state);
  // Consumer thread: the QP's consumer reached a marker or LAST_WQE_REACHED (`what`).
  void Note(TeardownState* state, uint32_t what) noexcept;
  // Event thread: `device` raised DEVICE_FATAL; its teardowns end kUnavailable.
  void DeviceFailed(uint32_t device) noexcept;
  // True on the worker thread (inside on_done).
  static bool OnWorkerThread() noexcept;

 private:
  struct Ending {
    std::shared_ptr<TeardownState> state;
    Status result;
    CallTicket call;
  };
  void Run();
  // Step 2 for every retired teardown whose call is over; returns true if any remain.
  bool FinishRetired();
  void Publish(const std::shared_ptr<TeardownState>& state, const Status& result);

  TeardownHost& host_;
  Mutex mu_;
  // The worker sleeps on it; Add, Note, DeviceFailed and Stop wake it after their change. A
  // futex parker loses no wake-up (glibc's condition variable before 2.41 can: mutex.h), so an
  // idle worker sleeps until one of them without re-checking.
  Parker parker_;
  std::vector<std::shared_ptr<TeardownState>> active_ CQD_GUARDED_BY(mu_);
  std::vector<uint32_t> failed_devices_ CQD_GUARDED_BY(mu_);
  // Something changed that the worker must look at again. Add and DeviceFailed set it under mu_;
  // Note never takes mu_: it sets it and wakes the worker only if it was clear, so that consumers
  // do not queue on mu_ behind the worker's scan; the worker clears it under mu_ before it scans.
  // Every write is an exchange, so that they form one release sequence: the scan after a clear sees
  // the `seen` bits of every Note that set it or found it set before that clear. A Note that found
  // it set wakes nobody: a scan is due, and the worker reads it (seq_cst, as each write) after it
  // announced its sleep (parker.h), so it does not sleep past it.
  std::atomic<bool> noted_{false};
  bool stop_ CQD_GUARDED_BY(mu_) = false;
  std::vector<Ending> retired_;  // worker thread only
  std::thread thread_;
  const Logger* log_ = nullptr;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_TEARDOWN_H_

// runtime/teardown.h: drained QP teardowns (Runtime::TeardownQp) and the thread that ends them.
//
// A teardown's life: the control path marks the registration "draining" (registry.h), moves the
// QP to the error state and posts marker work requests whose wr_ids are the TeardownState's
// address (send) and address + 1 (recv). A poller that routes a completion of a draining QP
// with a marker wr_id queues it as a kTeardownMarker item, in order behind the QP's flushed
// completions; the consumer, on reaching it, calls Note(). LAST_WQE_REACHED events of a draining
// QP are noted the same way after the handler got them. On a device that never sends it, once
// the send marker is back and last_wqe_grace has passed, the worker sends a fence instead: an
// internal event through the pollers of the QP's CQs, which follows every completion in them,
// noted as LAST_WQE_REACHED. The TeardownWorker thread ends each teardown exactly once: drained
// (OK), deadline (kDeadlineExceeded) or shutdown (kCancelled). Ending means: unregister the QP (which waits for the consumer's batch
// that may still read the state), publish the result, call on_done.
//
// Threading: TeardownState's `seen` is set by consumers (atomic); everything else in it is
// written before it is shared (control path, under the runtime mutex) or guarded by its `mu`.
// The worker's list is guarded by its own mutex; consumers take that mutex only in Note().
#ifndef CQD_RUNTIME_TEARDOWN_H_
#define CQD_RUNTIME_TEARDOWN_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cqd/status.h"
#include "runtime/log.h"

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
  uint32_t qp_num = 0;  // for log messages
  bool srq = false;  // receives come from an SRQ: no recv marker; wait for LAST_WQE_REACHED
  Clock::time_point deadline;
  std::chrono::milliseconds last_wqe_grace{0};  // TeardownOptions::last_wqe_grace
  std::function<void(const Status&)> on_done;
  std::optional<Status> end_with;  // end at once with this result (nothing can drain)

  // Returns t + d, or the latest time point where that would overflow (so that a timeout of
  // milliseconds::max() means "no deadline").
  static Clock::time_point After(Clock::time_point t, std::chrono::milliseconds d) noexcept {
    const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
        Clock::time_point::max() - t);
    return d >= room ? Clock::time_point::max() : t + d;
  }

  std::atomic<uint32_t> seen{0};  // k* bits, set by the QP's consumer
  Clock::time_point grace_ends;   // worker-owned: set when the send marker is seen (SRQ)
  bool fence_posted = false;      // worker-owned: the grace ran out and a fence stands in

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  Status result;      // guarded by mu

  uint64_t send_marker() const noexcept { return reinterpret_cast<uint64_t>(this); }
  uint64_t recv_marker() const noexcept { return send_marker() + 1; }
  // True once everything the QP had posted has flushed back through the handler.
  bool Drained() const noexcept {
    uint32_t s = seen.load(std::memory_order_acquire);
    if (!(s & kSendMarker)) return false;
    return srq ? (s & kLastWqe) != 0 : (s & kRecvMarker) != 0;
  }
};

// Markers of teardowns that ended before they came back (deadline, shutdown). They may still be
// in a CQ, where a later registration of the same qp_num would take them for its own: pollers
// drop them instead. Each keeps its TeardownState alive, so that no other allocation can take the
// address a marker's wr_id is made of. Entries go when their marker is polled or their CQ is
// destroyed. Take() costs one relaxed load while the set is empty (it almost always is), and
// pollers call it only for unsuccessful completions (markers complete with a flush error).
class StrayMarkers {
 public:
  // Teardown thread: the markers of `state` not seen yet become strays.
  void Add(const std::shared_ptr<TeardownState>& state, uint32_t send_cq, uint32_t recv_cq);
  // Poller: returns true (and forgets it) if `wr_id` is a stray marker.
  bool Take(uint64_t wr_id) noexcept {
    if (count_.load(std::memory_order_acquire) == 0) return false;
    return TakeSlow(wr_id);
  }
  // Control path: the CQ is gone, and so are the markers in it.
  void ForgetCq(uint32_t cq_id);

 private:
  struct Stray {
    std::shared_ptr<TeardownState> state;
    uint32_t cq_id;
  };
  bool TakeSlow(uint64_t wr_id) noexcept;
  std::mutex mu_;
  std::vector<std::pair<uint64_t, Stray>> strays_;  // guarded by mu_; few
  std::atomic<uint32_t> count_{0};
};

class TeardownWorker {
 public:
  // `unregister` ends a registration (the runtime's Unregister); `post_fence` sends the
  // registration's consumer a fence through the pollers of its CQs, which the consumer notes as
  // kLastWqe; `cqs_of(slot)` returns the registration's send and recv CQ ids, for `strays`. All
  // run on the worker thread.
  TeardownWorker(std::function<void(uint32_t slot, uint32_t generation)> unregister,
                 std::function<void(uint32_t slot, uint32_t generation)> post_fence,
                 std::function<std::pair<uint32_t, uint32_t>(uint32_t slot)> cqs_of,
                 StrayMarkers& strays);
  ~TeardownWorker();
  TeardownWorker(const TeardownWorker&) = delete;
  TeardownWorker& operator=(const TeardownWorker&) = delete;

  // Before Start: where to log teardowns that ran out of time (may stay unset).
  void set_logger(const Logger* log) { log_ = log; }
  void Start();
  // Ends every teardown still running (drained ones OK, the rest kCancelled) and joins.
  void Stop();
  // Control path: tracks a started teardown until it ends.
  void Add(std::shared_ptr<TeardownState> state);
  // Consumer thread: the QP's consumer reached a marker or LAST_WQE_REACHED (`what`).
  void Note(TeardownState* state, uint32_t what) noexcept;

 private:
  void Run();
  void Finish(const std::shared_ptr<TeardownState>& state, Status result);

  const std::function<void(uint32_t, uint32_t)> unregister_;
  const std::function<void(uint32_t, uint32_t)> post_fence_;
  const std::function<std::pair<uint32_t, uint32_t>(uint32_t)> cqs_of_;
  StrayMarkers& strays_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<TeardownState>> active_;  // guarded by mu_
  bool noted_ = false;                                  // guarded by mu_
  bool stop_ = false;                                   // guarded by mu_
  std::thread thread_;
  const Logger* log_ = nullptr;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_TEARDOWN_H_

// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_device.h: the simulated device behind the backend seam (internal).
//
// SimDeviceImpl is both the public cqd::SimDevice (what tests drive) and a backend::Device (what
// the runtime drives); likewise for channels and CQs. See cqd/sim.h for the behaviour.
//
// Locks, in acquisition order: SimDeviceImpl::mu_ (object sets, async events, async acks) ->
// SimChannelImpl::mu_ (pending completion events) -> SimCqImpl::ack_mu_ (completion-event acks).
// The CQ's completion ring is lock-free: many injectors, one poller.
#ifndef CQD_RUNTIME_BACKEND_SIM_SIM_DEVICE_H_
#define CQD_RUNTIME_BACKEND_SIM_SIM_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cqd/sim.h"
#include "runtime/backend/device.h"
#include "runtime/base/mutex.h"

namespace cqd::sim_internal {

class SimDeviceImpl;
class SimCqImpl;

// An eventfd in semaphore mode whose counter always equals the number of queued items, so the fd
// is readable exactly while something is pending. The owner's mutex guards Add/Take.
class PendingFd {
 public:
  PendingFd();
  ~PendingFd();
  int fd() const { return fd_; }
  void Add();            // counter += 1
  void Take(int n = 1);  // counter -= n (never blocks: the caller knows n are pending)
  bool nonblocking() const;
  // Blocks until the fd is readable or a signal arrives; returns false with errno on EINTR.
  bool WaitReadable() const;

 private:
  int fd_ = -1;
};

// Arranges for the next `times` calls to fail with `err` without consuming anything.
class InjectedErrno {
 public:
  void Set(int err, int times) {
    err_.store(err, std::memory_order_relaxed);
    times_.store(times, std::memory_order_release);
  }
  // Returns true (and sets errno) when this call must fail.
  bool Fire();

 private:
  std::atomic<int> err_{0};
  std::atomic<int> times_{0};
};

class SimChannelImpl final : public SimChannel, public backend::Channel {
 public:
  explicit SimChannelImpl(SimDeviceImpl* device) : device_(device) {}
  int fd() const noexcept override { return pending_.fd(); }
  uint64_t get_event_calls() const noexcept override {
    return get_event_calls_.load(std::memory_order_relaxed);
  }
  void* native() const noexcept override {
    return static_cast<SimChannel*>(const_cast<SimChannelImpl*>(this));
  }
  int GetEvent(void** native_cq) noexcept override;

  // Queues one event for `cq` unless it is being destroyed.
  void Push(SimCqImpl* cq);
  // Drops the CQ's unread events (as the kernel does on destroy) and refuses new ones.
  void Retire(SimCqImpl* cq);

  SimDeviceImpl* device() const { return device_; }
  InjectedErrno& injected_errno() { return injected_errno_; }
  int cq_count = 0;  // guarded by the device mutex

 private:
  SimDeviceImpl* device_;
  internal::Mutex mu_;
  std::deque<SimCqImpl*> events_ CQD_GUARDED_BY(mu_);
  PendingFd pending_;
  InjectedErrno injected_errno_;
  std::atomic<uint64_t> get_event_calls_{0};
};

class SimCqImpl final : public SimCq, public backend::Cq {
 public:
  SimCqImpl(SimDeviceImpl* device, int depth, SimChannelImpl* channel);

  // SimCq
  int depth() const noexcept override { return depth_.load(std::memory_order_relaxed); }
  SimChannel* channel() const override { return channel_; }
  int Inject(std::span<const ibv_wc> wcs, bool solicited, bool overflow) noexcept override;
  int size() const noexcept override;
  bool failed() const noexcept override;
  void Replay(std::span<const ibv_wc> pattern, uint64_t total,
              double rate_per_sec) noexcept override;
  uint64_t replay_left() const noexcept override {
    return replay_left_.load(std::memory_order_relaxed);
  }
  void StampPollTime(bool on) noexcept override {
    stamp_poll_time_.store(on, std::memory_order_relaxed);
  }

  // backend::Cq
  void* native() const noexcept override {
    return static_cast<SimCq*>(const_cast<SimCqImpl*>(this));
  }
  int Poll(int n, ibv_wc* wc) noexcept override;
  int RequestNotify(bool solicited_only) noexcept override;
  Status Resize(int depth) override;

  // Event accounting (S2): GetEvent reports, AckCqEvents acks, destroy waits for equality.
  void CountReported() { reported_.fetch_add(1, std::memory_order_relaxed); }
  void Ack(unsigned n);
  // Blocks until every reported event was acked; returns false at once if more were acked than
  // reported (verbs would hang in destroy forever; the simulated device says so instead).
  bool WaitAllAcked();

  SimDeviceImpl* device() const { return device_; }
  SimChannelImpl* sim_channel() const { return channel_; }
  InjectedErrno& notify_errno() { return notify_errno_; }
  // Guarded by the device mutex.
  int qp_refs = 0;
  int async_unacked = 0;
  // Set under the channel mutex; read by CreateQp under the device mutex.
  std::atomic<bool> destroying{false};

 private:
  static constexpr uint8_t kArmSolicited = 1;
  static constexpr uint8_t kArmNext = 2;
  bool Qualifies(uint8_t armed, std::span<const ibv_wc> added, bool solicited) const;
  void Overflow();

  SimDeviceImpl* const device_;
  SimChannelImpl* const channel_;
  std::atomic<int> depth_;
  // Replaced only by Resize, while no injector is inside (InjectGuard) and the poller is not
  // polling; resizing_'s seq_cst store publishes them to the next injector.
  uint64_t mask_;
  std::unique_ptr<ibv_wc[]> ring_;
  class InjectGuard;
  std::atomic<int> injectors_{0};
  std::atomic<bool> resizing_{false};
  // Positions: injectors reserve at tail_, write, then publish in reservation order by moving
  // published_ (so a completion is never visible before an earlier one, as on a device); the
  // poller takes from head_ up to published_.
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<uint64_t> published_{0};
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint8_t> armed_{0};
  std::atomic<bool> overflowed_{false};
  std::atomic<uint64_t> reported_{0};
  InjectedErrno notify_errno_;
  // Replay (benchmarks): each start makes a record, kept until the CQ is destroyed; `next` is the
  // poller's.
  struct ReplayRecord {
    std::span<const ibv_wc> pattern;
    size_t next;
    uint64_t total;         // completions the replay produces
    double ns_per = 0;      // paced: ns between two completions (0: as fast as polled)
    uint64_t start_ns = 0;  // paced: when completion 0 became pollable
  };
  std::atomic<ReplayRecord*> replay_{nullptr};
  std::vector<std::unique_ptr<ReplayRecord>> replay_records_ CQD_GUARDED_BY(ack_mu_);
  std::atomic<uint64_t> replay_left_{0};
  std::atomic<bool> stamp_poll_time_{false};
  // Poll's replay path, kept out of line so the common path stays small.
  int PollReplay(int n, ibv_wc* wc, uint64_t left) noexcept;
  void StampIfAsked(ibv_wc* wc, int n) noexcept;
  // Raises the CQ's event if it is armed for completions like `added` (S6-S8).
  void NotifyIfArmed(std::span<const ibv_wc> added, bool solicited);
  internal::Mutex ack_mu_;
  internal::CondVar ack_cv_;
  uint64_t acked_ CQD_GUARDED_BY(ack_mu_) = 0;
};

// A QP: its CQs, and the work requests posted on it (SimQp::PostSend/PostRecv), which flush
// when it moves to the error state. Threading: the queues are guarded by mu_.
class SimQpImpl final : public SimQp {
 public:
  SimQpImpl(uint32_t qp_num, SimCqImpl* send, SimCqImpl* recv, const SimQpOptions& options,
            const SimDeviceOptions& device)
      : qp_num_(qp_num),
        send_(send),
        recv_(recv),
        options_(options),
        receives_first_(device.flush_receives_first),
        sends_at_post_(device.flush_sends_at_post) {}
  uint32_t qp_num() const override { return qp_num_; }
  SimCq* send_cq() const override { return send_; }
  SimCq* recv_cq() const override { return recv_; }
  const SimQpOptions& options() const override { return options_; }
  bool in_error() const override { return error_.load(std::memory_order_acquire); }
  Status PostSend(uint64_t wr_id) override;
  Status PostRecv(uint64_t wr_id) override;
  int outstanding(bool recv) const override;
  // Moves the QP to the error state (again): what is outstanding flushes, in the device's order,
  // as far as its CQs have room.
  void ModifyToError();
  SimCqImpl* send() const { return send_; }
  SimCqImpl* recv() const { return recv_; }
  int async_unacked = 0;  // guarded by the device mutex

 private:
  // Flushes `queue` into `cq` from its oldest entry while the CQ has room.
  void FlushLocked(std::deque<uint64_t>& queue, SimCqImpl* cq, ibv_wc_opcode opcode)
      CQD_REQUIRES(mu_);

  const uint32_t qp_num_;
  SimCqImpl* const send_;
  SimCqImpl* const recv_;
  const SimQpOptions options_;
  const bool receives_first_;
  const bool sends_at_post_;
  std::atomic<bool> error_{false};
  mutable internal::Mutex mu_;
  std::deque<uint64_t> sends_ CQD_GUARDED_BY(mu_);  // posted, not flushed
  std::deque<uint64_t> recvs_ CQD_GUARDED_BY(mu_);
};

class SimDeviceImpl final : public SimDevice {
 public:
  explicit SimDeviceImpl(const SimDeviceOptions& options);
  ~SimDeviceImpl() override;

  const std::string& name() const override { return options_.name; }
  Result<SimChannel*> CreateChannel() override;
  Status DestroyChannel(SimChannel* channel) override;
  Result<SimCq*> CreateCq(int depth, SimChannel* channel) override;
  Status DestroyCq(SimCq* cq) override;
  // DestroyCq with its error messages prefixed by `who` (the backend's caller names the call).
  Status DestroyCqAs(SimCq* cq, const std::string& who);
  Result<SimQp*> CreateQp(SimCq* send_cq, SimCq* recv_cq, const SimQpOptions& options) override;
  Status DestroyQp(SimQp* qp) override;
  Status RaiseQpEvent(SimQp* qp, ibv_event_type type) override;
  Status RaiseDeviceEvent(ibv_event_type type, int port_num) override;
  void RaiseDeviceFatal() override;
  void AddSpuriousEvent(SimCq* cq) override;
  void FailGetEvent(SimChannel* channel, int err, int times) override;
  void FailGetAsyncEvent(int err, int times) override;
  void FailRequestNotify(SimCq* cq, int err, int times) override;

  // Returns the CQ if `native` is a live SimCq of this device, else nullptr.
  SimCqImpl* FindCq(void* native);
  // Returns the QP if `native` is a live SimQp of this device, else nullptr.
  SimQpImpl* FindQp(void* native);
  // The seam's StartQpFlush (see runtime/backend/device.h).
  Result<backend::FlushStart> StartQpFlush(SimQpImpl* qp, uint64_t send_marker,
                                           uint64_t recv_marker);
  // The seam's RedriveFlush.
  Status RedriveFlush(SimQpImpl* qp, uint64_t recv_marker);
  int async_fd() const { return async_pending_.fd(); }
  int GetAsyncEvent(backend::AsyncEventRecord* out) noexcept;
  void AckAsyncEvent(backend::AsyncEventRecord* record) noexcept;
  bool fatal() const { return fatal_.load(std::memory_order_acquire); }
  // Called by a CQ that overflowed: raises CQ_ERR, and QP_FATAL for its QPs (S11).
  void RaiseOverflow(SimCqImpl* cq);
  // Tests: `hook(arg)` runs on the thread that acks an async event, right after the ack (a
  // DestroyQp waiting for it may return from then on). Set it before raising the events it is
  // for; a null hook: none.
  void SetAfterAsyncAckForTest(void (*hook)(void*), void* arg) {
    after_ack_arg_.store(arg, std::memory_order_relaxed);
    after_ack_hook_.store(hook, std::memory_order_release);
  }

 private:
  struct PendingAsync {
    ibv_event_type type;
    SimQpImpl* qp;
    SimCqImpl* cq;
    int port;
  };
  void PushAsyncLocked(const PendingAsync& event) CQD_REQUIRES(mu_);
  void PurgeAsyncLocked(const void* object) CQD_REQUIRES(mu_);

  SimDeviceOptions options_;
  internal::Mutex mu_;
  internal::CondVar async_acked_cv_;
  std::unordered_map<SimChannelImpl*, std::unique_ptr<SimChannelImpl>> channels_
      CQD_GUARDED_BY(mu_);
  std::unordered_map<SimCqImpl*, std::unique_ptr<SimCqImpl>> cqs_ CQD_GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::unique_ptr<SimQpImpl>> qps_ CQD_GUARDED_BY(mu_);
  uint32_t next_qp_num_ CQD_GUARDED_BY(mu_) = 0x100;
  std::vector<uint32_t> free_qp_nums_ CQD_GUARDED_BY(mu_);  // reused last-freed first
  std::deque<PendingAsync> async_events_ CQD_GUARDED_BY(mu_);
  PendingFd async_pending_;
  InjectedErrno async_errno_;
  std::atomic<bool> fatal_{false};
  std::atomic<void (*)(void*)> after_ack_hook_{nullptr};
  std::atomic<void*> after_ack_arg_{nullptr};
};

// The seam over a simulated device: what the runtime and the conformance suite drive.
class SimBackend final : public backend::Device {
 public:
  // Returns the seam over `device`; kInvalidArgument unless SimDevice::Create made it.
  static Result<std::unique_ptr<SimBackend>> Over(std::shared_ptr<SimDevice> device);
  // `device` must come from SimDevice::Create (Over checks that).
  explicit SimBackend(std::shared_ptr<SimDevice> device)
      : device_(std::static_pointer_cast<SimDeviceImpl>(std::move(device))) {}
  const std::string& name() const override { return device_->name(); }
  backend::Kind kind() const noexcept override { return backend::Kind::kSim; }
  void* native() const noexcept override { return static_cast<SimDevice*>(device_.get()); }
  int comp_vectors() const noexcept override { return 1; }
  bool in_sysfs() const noexcept override { return false; }
  Result<backend::Channel*> CreateChannel() override;
  Status DestroyChannel(backend::Channel* channel) override;
  using backend::Device::CreateCq;
  Result<backend::Cq*> CreateCq(int depth, backend::Channel* channel, int comp_vector) override;
  Result<backend::Cq*> AdoptCq(void* native_cq, backend::Channel* channel) override;
  void ReleaseCq(backend::Cq*) override {}
  Status DestroyCq(backend::Cq* cq) override;
  void AckCqEvents(backend::Cq* cq, unsigned n) noexcept override;
  Result<backend::QpCaps> QueryQp(void* native_qp) override;
  Result<backend::FlushStart> StartQpFlush(void* native_qp, uint64_t send_marker,
                                           uint64_t recv_marker) override;
  Status RedriveFlush(void* native_qp, uint64_t recv_marker) override;
  void AckNativeCqEvent(void* native_cq) noexcept override {
    static_cast<SimCqImpl*>(static_cast<SimCq*>(native_cq))->Ack(1);
  }
  int async_fd() const noexcept override { return device_->async_fd(); }
  int GetAsyncEvent(backend::AsyncEventRecord* out) noexcept override {
    return device_->GetAsyncEvent(out);
  }
  void AckAsyncEvent(backend::AsyncEventRecord* record) noexcept override {
    device_->AckAsyncEvent(record);
  }
  SimDeviceImpl* sim() const { return device_.get(); }

 private:
  std::shared_ptr<SimDeviceImpl> device_;
};

}  // namespace cqd::sim_internal

#endif  // CQD_RUNTIME_BACKEND_SIM_SIM_DEVICE_H_

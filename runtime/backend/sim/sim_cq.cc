// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/sim/sim_cq.cc: the simulated device's completion channels and CQs
// (sim_device.h): pending-event fds, injected errnos, events, arming, injection and overflow,
// replayed traffic, polling and resizing.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "runtime/backend/sim/sim_device.h"
#include "runtime/base/mutex.h"

namespace cqd::sim_internal {

namespace {

// S10: on an error completion only wr_id, status, qp_num and vendor_err are valid. The simulated
// device fills the rest with garbage so that code reading them is caught.
void PoisonInvalidFields(ibv_wc& wc) {
  wc.opcode = static_cast<ibv_wc_opcode>(0x5a5a);
  wc.byte_len = 0xdeadbeef;
  wc.imm_data = 0xdeadbeef;
  wc.src_qp = 0xdeadbeef;
  wc.wc_flags = ~0u;
  wc.pkey_index = 0xdead;
  wc.slid = 0xbeef;
  wc.sl = 0xa5;
  wc.dlid_path_bits = 0xa5;
}

}  // namespace

PendingFd::PendingFd() : fd_(eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC)) {
  if (fd_ < 0) std::abort();  // out of fds at construction: nothing sensible to return
}

PendingFd::~PendingFd() { close(fd_); }

void PendingFd::Add() {
  uint64_t one = 1;
  while (write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void PendingFd::Take(int n) {
  uint64_t value;
  for (int i = 0; i < n; ++i) {
    while (read(fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
    }
  }
}

bool PendingFd::nonblocking() const { return (fcntl(fd_, F_GETFL) & O_NONBLOCK) != 0; }

bool PendingFd::WaitReadable() const {
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, -1) >= 0;
}

bool InjectedErrno::Fire() {
  int times = times_.load(std::memory_order_acquire);
  while (times > 0) {
    if (times_.compare_exchange_weak(times, times - 1, std::memory_order_acq_rel)) {
      errno = err_.load(std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

// ---- channel ----

int SimChannelImpl::GetEvent(void** native_cq) noexcept {
  get_event_calls_.fetch_add(1, std::memory_order_relaxed);
  if (injected_errno_.Fire()) return -1;
  for (;;) {
    {
      internal::MutexLock lock(mu_);
      if (!events_.empty()) {
        SimCqImpl* cq = events_.front();
        events_.pop_front();
        pending_.Take();
        cq->CountReported();
        *native_cq = cq->native();
        return 0;
      }
    }
    if (pending_.nonblocking()) {
      errno = EAGAIN;
      return -1;
    }
    if (!pending_.WaitReadable()) return -1;  // EINTR
  }
}

void SimChannelImpl::Push(SimCqImpl* cq) {
  internal::MutexLock lock(mu_);
  if (cq->destroying.load(std::memory_order_relaxed)) return;
  events_.push_back(cq);
  pending_.Add();
}

void SimChannelImpl::Retire(SimCqImpl* cq) {
  internal::MutexLock lock(mu_);
  cq->destroying.store(true, std::memory_order_relaxed);
  auto it = std::remove(events_.begin(), events_.end(), cq);
  int removed = static_cast<int>(events_.end() - it);
  events_.erase(it, events_.end());
  pending_.Take(removed);
}

// ---- CQ ----

SimCqImpl::SimCqImpl(SimDeviceImpl* device, int depth, SimChannelImpl* channel)
    : device_(device), channel_(channel), depth_(depth) {
  uint64_t ring = std::bit_ceil(static_cast<uint64_t>(depth));
  mask_ = ring - 1;
  ring_ = std::make_unique<ibv_wc[]>(ring);
}

int SimCqImpl::size() const noexcept {
  uint64_t head = head_.load(std::memory_order_acquire);
  uint64_t published = published_.load(std::memory_order_acquire);
  return static_cast<int>(published - head);
}

bool SimCqImpl::failed() const noexcept {
  return overflowed_.load(std::memory_order_acquire) || device_->fatal();
}

bool SimCqImpl::Qualifies(uint8_t armed, std::span<const ibv_wc> added, bool solicited) const {
  if (armed & kArmNext) return true;  // S8: next-completion arming wins
  for (const ibv_wc& wc : added) {
    if (wc.status != IBV_WC_SUCCESS) return true;
    if (solicited && (wc.opcode & IBV_WC_RECV)) return true;
  }
  return false;
}

// Injectors announce themselves in `injectors_`; Resize raises `resizing_` and waits for them to
// leave, so it swaps the ring while nobody writes it (and the poller calls it between polls).
class SimCqImpl::InjectGuard {
 public:
  explicit InjectGuard(SimCqImpl& cq) : cq_(cq) {
    for (;;) {
      while (cq_.resizing_.load(std::memory_order_acquire)) std::this_thread::yield();
      cq_.injectors_.fetch_add(1, std::memory_order_seq_cst);
      if (!cq_.resizing_.load(std::memory_order_seq_cst)) return;
      cq_.injectors_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  ~InjectGuard() { cq_.injectors_.fetch_sub(1, std::memory_order_release); }

 private:
  SimCqImpl& cq_;
};

int SimCqImpl::Inject(std::span<const ibv_wc> wcs, bool solicited, bool overflow) noexcept {
  if (failed()) return -1;
  InjectGuard guard(*this);
  const uint64_t want = wcs.size();
  uint64_t pos = tail_.load(std::memory_order_relaxed);
  uint64_t n;
  for (;;) {
    uint64_t used = pos - head_.load(std::memory_order_acquire);
    const uint64_t depth = static_cast<uint64_t>(depth_.load(std::memory_order_relaxed));
    uint64_t room = used >= depth ? 0 : depth - used;
    if (overflow && room < want) {
      Overflow();
      return -1;
    }
    n = std::min(want, room);
    if (n == 0) return 0;
    if (tail_.compare_exchange_weak(pos, pos + n, std::memory_order_relaxed)) break;
  }
  for (uint64_t i = 0; i < n; ++i) {
    ibv_wc& wc = ring_[(pos + i) & mask_];
    wc = wcs[i];
    if (wc.status != IBV_WC_SUCCESS) PoisonInvalidFields(wc);
  }
  // Publish in reservation order: wait for earlier injectors to publish theirs first.
  for (uint64_t expected = pos; !published_.compare_exchange_weak(
           expected, pos + n, std::memory_order_release, std::memory_order_relaxed);
       expected = pos) {
    std::this_thread::yield();
  }
  NotifyIfArmed(wcs.first(n), solicited);
  return static_cast<int>(n);
}

void SimCqImpl::NotifyIfArmed(std::span<const ibv_wc> added, bool solicited) {
  // Publish-then-check against the poller's arm-then-poll (S6): one of the two sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint8_t armed = armed_.load(std::memory_order_seq_cst);
  while (armed != 0 && Qualifies(armed, added, solicited)) {
    if (armed_.compare_exchange_weak(armed, 0, std::memory_order_seq_cst)) {
      channel_->Push(this);
      break;
    }
  }
}

void SimCqImpl::Overflow() {
  if (overflowed_.exchange(true, std::memory_order_acq_rel)) return;
  device_->RaiseOverflow(this);
}

namespace {
uint64_t SteadyNs() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

void SimCqImpl::Replay(std::span<const ibv_wc> pattern, uint64_t total,
                       double rate_per_sec) noexcept {
  replay_left_.store(0, std::memory_order_seq_cst);  // stops the one running, if any
  if (pattern.empty() || total == 0) return;
  // A fresh record per start: a poller still copying from the previous one keeps valid memory.
  auto record = std::make_unique<ReplayRecord>(ReplayRecord{pattern, 0, total});
  if (rate_per_sec > 0) {  // false for NaN too
    record->ns_per = 1e9 / std::clamp(rate_per_sec, 1e-3, 1e12);
    record->start_ns = SteadyNs();
  }
  replay_.store(record.get(), std::memory_order_release);
  {
    internal::MutexLock lock(ack_mu_);  // not hot: guards the record list only
    replay_records_.push_back(std::move(record));
  }
  replay_left_.store(total, std::memory_order_seq_cst);
  // As a device would, raise the event a sleeping, armed poller waits for.
  if (channel_ != nullptr) NotifyIfArmed(pattern.first(1), false);
}

int SimCqImpl::PollReplay(int n, ibv_wc* wc, uint64_t left) noexcept {
  ReplayRecord& replay = *replay_.load(std::memory_order_acquire);
  uint64_t allowed = std::min<uint64_t>(left, static_cast<uint64_t>(n));
  const uint64_t first = replay.total - left;  // index of the next completion
  if (replay.ns_per > 0) {
    const double elapsed = static_cast<double>(SteadyNs() - replay.start_ns);
    const double due = elapsed / replay.ns_per + 1;  // completions due by now
    const uint64_t arrived = due >= 1e19 ? UINT64_MAX : static_cast<uint64_t>(due);
    allowed = arrived > first ? std::min(allowed, arrived - first) : 0;
    if (allowed == 0) return 0;
  }
  const int taken = static_cast<int>(allowed);
  const size_t size = replay.pattern.size();
  for (int i = 0; i < taken; ++i) {
    wc[i] = replay.pattern[replay.next];
    if (replay.ns_per > 0) {
      wc[i].wr_id =
          replay.start_ns + static_cast<uint64_t>(static_cast<double>(first + i) * replay.ns_per);
    }
    if (++replay.next == size) replay.next = 0;
  }
  // A concurrent Replay wins: what was copied is dropped, as if never produced.
  if (!replay_left_.compare_exchange_strong(left, left - taken, std::memory_order_acq_rel)) {
    return 0;
  }
  StampIfAsked(wc, taken);
  return taken;
}

void SimCqImpl::StampIfAsked(ibv_wc* wc, int n) noexcept {
  if (n <= 0 || !stamp_poll_time_.load(std::memory_order_relaxed)) return;
  auto now = static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now().time_since_epoch())
                                       .count());
  for (int i = 0; i < n; ++i) wc[i].src_qp = now;
}

int SimCqImpl::Poll(int n, ibv_wc* wc) noexcept {
  if (overflowed_.load(std::memory_order_acquire)) return -EIO;  // S11: only destroy works
  if (n < 0) return -EINVAL;
  if (uint64_t left = replay_left_.load(std::memory_order_acquire); left > 0) {
    return PollReplay(n, wc, left);
  }
  const uint64_t head = head_.load(std::memory_order_relaxed);
  // seq_cst: this load follows the poller's arm (S6) in the single total order.
  const uint64_t ready = published_.load(std::memory_order_seq_cst) - head;
  const int taken = static_cast<int>(std::min<uint64_t>(ready, static_cast<uint64_t>(n)));
  for (int i = 0; i < taken; ++i) wc[i] = ring_[(head + i) & mask_];
  if (taken > 0) head_.store(head + taken, std::memory_order_release);
  StampIfAsked(wc, taken);
  return taken;
}

Status SimCqImpl::Resize(int depth) {
  if (depth < size()) {
    return InvalidArgument("Resize: " + std::to_string(depth) + " is less than the " +
                           std::to_string(size()) + " completions the CQ holds");
  }
  if (depth > (1 << 22)) {
    return InvalidArgument("Resize: depth " + std::to_string(depth) + " is not in 1..4194304");
  }
  if (static_cast<uint64_t>(depth) > mask_ + 1) {
    resizing_.store(true, std::memory_order_seq_cst);
    while (injectors_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    // Nobody writes the ring now, and every reservation is published: move what is unpolled.
    const uint64_t size = std::bit_ceil(static_cast<uint64_t>(depth));
    auto ring = std::make_unique<ibv_wc[]>(size);
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = published_.load(std::memory_order_acquire);
    for (uint64_t pos = head; pos != tail; ++pos) ring[pos & (size - 1)] = ring_[pos & mask_];
    ring_ = std::move(ring);
    mask_ = size - 1;
    depth_.store(depth, std::memory_order_relaxed);
    resizing_.store(false, std::memory_order_seq_cst);
    return Status::Ok();
  }
  depth_.store(depth, std::memory_order_relaxed);
  return Status::Ok();
}

int SimCqImpl::RequestNotify(bool solicited_only) noexcept {
  if (device_->fatal() || overflowed_.load(std::memory_order_acquire)) return EIO;
  if (notify_errno_.Fire()) return errno;
  // S7: a pending request absorbs a repeat; S8: next wins over solicited.
  armed_.fetch_or(solicited_only ? kArmSolicited : kArmNext, std::memory_order_seq_cst);
  return 0;
}

void SimCqImpl::Ack(unsigned n) {
  internal::MutexLock lock(ack_mu_);
  acked_ += n;
  ack_cv_.NotifyAll();
}

bool SimCqImpl::WaitAllAcked() {
  internal::MutexLock lock(ack_mu_);
  while (acked_ < reported_.load(std::memory_order_relaxed)) ack_cv_.WaitForRecheck(ack_mu_);
  return acked_ == reported_.load(std::memory_order_relaxed);
}

// ---- device ----

}  // namespace cqd::sim_internal

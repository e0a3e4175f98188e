// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/tbb/arena_drainer.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <set>
#include <string>

namespace cqd::internal {
namespace {

thread_local TaskScope* current_scope = nullptr;

// Consumers hosted by some drainer in this process: each may be drained by one only.
Mutex hosted_mu;
std::set<std::pair<const Runtime*, ConsumerId>>& Hosted() CQD_REQUIRES(hosted_mu) {
  static auto* hosted = new std::set<std::pair<const Runtime*, ConsumerId>>();
  return *hosted;
}

bool FdReadable(int fd) noexcept {
  pollfd p = {fd, POLLIN, 0};
  int n;
  while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR) {
  }
  return n > 0 && (p.revents & POLLIN) != 0;
}

// Drain tasks loop this many times (each a Drain call) before yielding to the arena's others.
constexpr int kRoundsPerTask = 8;
// The longest linger an ArenaConsumers accepts (cqd/tbb.h).
constexpr std::chrono::microseconds kMaxLinger{10000};

}  // namespace

TaskScope::TaskScope(const void* owner, const void* strand) noexcept
    : owner_(owner), strand_(strand), outer_(current_scope) {
  current_scope = this;
}

TaskScope::~TaskScope() { current_scope = outer_; }

bool TaskScope::InAnyTask() noexcept { return current_scope != nullptr; }

bool TaskScope::InTaskOf(const void* owner) noexcept {
  for (TaskScope* s = current_scope; s != nullptr; s = s->outer_) {
    if (s->owner_ == owner) return true;
  }
  return false;
}

bool TaskScope::InStrand(const void* strand) noexcept {
  for (TaskScope* s = current_scope; s != nullptr; s = s->outer_) {
    if (s->strand_ == strand) return true;
  }
  return false;
}

void WaitForZero(const std::atomic<int64_t>& count) noexcept {
  for (int spins = 0; count.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

Status RefuseWaitInCallback(const char* who) {
  if (TaskScope::InAnyTask()) {
    return FailedPrecondition(std::string(who) +
                              ": called from an arena task of cqd (a handler or on_done), which "
                              "the wait may need");
  }
  if (Runtime::InCallback()) {
    return FailedPrecondition(std::string(who) +
                              ": called from a cqd callback (a handler, on_done, OrphanHandler, "
                              "DeviceEventHandler, CmHandler or the log sink), which the wait may "
                              "need");
  }
  return Status::Ok();
}

ArenaDrainer::ArenaDrainer(Runtime& runtime, ::tbb::task_arena& arena, int drain_budget,
                           std::chrono::microseconds linger)
    : runtime_(runtime), arena_(arena), budget_(drain_budget), linger_(linger) {}

Result<std::unique_ptr<ArenaDrainer>> ArenaDrainer::Create(
    Runtime& runtime, ::tbb::task_arena& arena, const std::vector<ConsumerId>& consumers,
    bool watcher_thread, int drain_budget, std::chrono::microseconds linger, const char* who) {
  const std::string name = who;
  if (drain_budget < 1 || drain_budget > (1 << 20)) {
    return InvalidArgument(name + ": drain_budget " + std::to_string(drain_budget) +
                           " is not in 1..1048576");
  }
  if (linger.count() < 0 || linger > kMaxLinger) {
    return InvalidArgument(name + ": linger " + std::to_string(linger.count()) +
                           " us is not in 0..10000 us");
  }
  if (consumers.empty()) return InvalidArgument(name + ": no consumers to host");
  std::unique_ptr<ArenaDrainer> d(new ArenaDrainer(runtime, arena, drain_budget, linger));
  for (ConsumerId id : consumers) {
    Result<int> fd = runtime.NotifyFd(id);
    if (!fd.ok()) return InvalidArgument(name + ": " + fd.status().message());
    if (id < d->by_id_.size() && d->by_id_[id] != nullptr) {
      return InvalidArgument(name + ": consumer " + std::to_string(id) + " is listed twice");
    }
    if (id >= d->by_id_.size()) d->by_id_.resize(id + 1, nullptr);
    auto slot = std::make_unique<Slot>();
    slot->id = id;
    slot->fd = *fd;
    d->by_id_[id] = slot.get();
    d->slots_.push_back(std::move(slot));
  }
  {
    MutexLock lock(hosted_mu);
    for (const auto& slot : d->slots_) {
      if (Hosted().count({&runtime, slot->id}) != 0) {
        return AlreadyExists(name + ": consumer " + std::to_string(slot->id) +
                             " is already hosted by an ArenaConsumers or StrandConsumer");
      }
    }
    for (const auto& slot : d->slots_) Hosted().insert({&runtime, slot->id});
    d->hosting_ = true;
  }
  if (!watcher_thread) return d;
  d->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (d->epoll_fd_ < 0) return ErrnoStatus(name + ": epoll_create1", errno);
  d->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->stop_fd_ < 0) return ErrnoStatus(name + ": eventfd", errno);
  epoll_event stop_event = {};
  stop_event.events = EPOLLIN;
  stop_event.data.ptr = nullptr;
  if (epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, d->stop_fd_, &stop_event) != 0) {
    return ErrnoStatus(name + ": epoll_ctl", errno);
  }
  for (const auto& slot : d->slots_) {
    epoll_event event = {};
    event.events = EPOLLIN | EPOLLET;  // an edge per write: each Drain that leaves work signals
    event.data.ptr = slot.get();
    if (epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, slot->fd, &event) != 0) {
      return ErrnoStatus(name + ": epoll_ctl of consumer " + std::to_string(slot->id), errno);
    }
  }
  try {
    d->watcher_ = std::thread([raw = d.get()] { raw->Watch(); });
  } catch (const std::exception& e) {
    return Internal(name + ": starting the watcher thread: " + e.what());
  }
  return d;
}

ArenaDrainer::~ArenaDrainer() {
  (void)Stop();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  Unhost();
}

void ArenaDrainer::Unhost() noexcept {
  MutexLock lock(hosted_mu);
  if (!hosting_) return;  // a failed Create hosted nothing; or already given up
  for (const auto& slot : slots_) Hosted().erase({&runtime_, slot->id});
  hosting_ = false;
}

bool ArenaDrainer::OnReadable(ConsumerId consumer) noexcept {
  if (consumer >= by_id_.size() || by_id_[consumer] == nullptr) return false;
  Schedule(*by_id_[consumer]);
  return true;
}

void ArenaDrainer::Schedule(Slot& slot) noexcept {
  const uint32_t before = slot.state.fetch_or(kScheduled | kPending, std::memory_order_acq_rel);
  if ((before & kScheduled) != 0) return;  // the task queued or running drains again
  inflight_.fetch_add(1, std::memory_order_seq_cst);
  if (stopping_.load(std::memory_order_seq_cst)) {
    inflight_.fetch_sub(1, std::memory_order_release);  // kScheduled stays: nothing runs again
    return;
  }
  if (!Enqueue(slot)) {
    slot.state.store(0, std::memory_order_release);  // the next readiness of the fd retries
    inflight_.fetch_sub(1, std::memory_order_release);
  }
}

bool ArenaDrainer::Enqueue(Slot& slot) noexcept {
  queued_.fetch_add(1, std::memory_order_relaxed);
  if (EnqueueTask(arena_, [this, s = &slot] { Run(*s); })) return true;
  queued_.fetch_sub(1, std::memory_order_relaxed);
  enqueue_failures_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool ArenaDrainer::Linger(Slot& slot) noexcept {
  if (linger_.count() == 0 || queued_.load(std::memory_order_relaxed) != 0) return false;
  lingers_.fetch_add(1, std::memory_order_relaxed);
  const timespec timeout = {static_cast<time_t>(linger_.count() / 1000000),
                            static_cast<long>(linger_.count() % 1000000) * 1000};
  pollfd p = {slot.fd, POLLIN, 0};
  // EINTR, a timeout or an error: not readable; the caller's check that follows looks again.
  if (ppoll(&p, 1, &timeout, nullptr) != 1 || (p.revents & POLLIN) == 0) return false;
  linger_hits_.fetch_add(1, std::memory_order_release);  // after its linger's count (GetStats)
  return true;
}

void ArenaDrainer::Run(Slot& slot) noexcept {
  queued_.fetch_sub(1, std::memory_order_relaxed);
  {
    TaskScope scope(this, nullptr);
    tasks_.fetch_add(1, std::memory_order_relaxed);
    for (int round = 0; !stopping_.load(std::memory_order_acquire); ++round) {
      slot.state.fetch_and(~kPending, std::memory_order_acq_rel);
      const int n = runtime_.Drain(slot.id, budget_);
      if (n > 0) dispatched_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      if (n == -EBUSY) {
        // Another thread drains it now (a StrandConsumer's user handler may): that Drain may end
        // with work left and no new write of the fd, and a wake may have come meanwhile. Keep
        // the consumer scheduled and try again from a new task, after other work.
        if (Enqueue(slot)) return;  // the new task takes over this one's inflight_ count
        slot.state.store(0, std::memory_order_release);
        break;
      }
      if (n < 0) {  // -EINVAL cannot come for a consumer Create checked; give up this wake
        slot.state.store(0, std::memory_order_release);
        break;
      }
      if (n >= budget_ || round + 1 >= kRoundsPerTask) {
        if (Enqueue(slot)) return;  // the new task takes over this one's inflight_ count
        slot.state.store(0, std::memory_order_release);
        break;
      }
      if (n > 0 && !stopping_.load(std::memory_order_relaxed)) {
        // Drain left the fd readable if more is queued (one call takes at most the consumer's
        // dispatch_batch), or a producer wrote it since: drain again, no linger. Else the task
        // emptied the consumer: wait a little for the next entry while still scheduled.
        if (FdReadable(slot.fd) || Linger(slot)) continue;
      }
      uint32_t expected = kScheduled;
      if (slot.state.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
        // Cleared. A wake from here on enqueues a new task; one that came just before the clear
        // left the fd readable: take the consumer back rather than lose it.
        if (!FdReadable(slot.fd)) break;
        if ((slot.state.fetch_or(kScheduled, std::memory_order_acq_rel) & kScheduled) != 0) break;
      }
      // kPending came in (or the fd was readable): drain again.
    }
  }
  inflight_.fetch_sub(1, std::memory_order_release);  // the last access to this drainer
}

void ArenaDrainer::Watch() noexcept {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // cannot happen with a valid epoll fd; Stop still joins
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) return;  // the stop fd
      Schedule(*static_cast<Slot*>(events[i].data.ptr));
    }
  }
}

Status ArenaDrainer::Stop(const void* also_refuse_owner) {
  if (TaskScope::InTaskOf(this) ||
      (also_refuse_owner != nullptr && TaskScope::InTaskOf(also_refuse_owner))) {
    return FailedPrecondition(
        "Stop: called from one of its own tasks (a handler), which it waits for");
  }
  MutexLock lock(stop_mu_);
  if (stopped_) return Status::Ok();
  stopping_.store(true, std::memory_order_seq_cst);
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    while (write(stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    watcher_.join();
  }
  WaitForZero(inflight_);
  stopped_ = true;
  return Status::Ok();
}

ArenaStats ArenaDrainer::GetStats() const {
  ArenaStats s;
  s.drain_tasks = tasks_.load(std::memory_order_relaxed);
  s.dispatched = dispatched_.load(std::memory_order_relaxed);
  s.enqueue_failures = enqueue_failures_.load(std::memory_order_relaxed);
  // Hits first (acquire): every hit read has its linger's count before it, so hits <= lingers.
  s.linger_hits = linger_hits_.load(std::memory_order_acquire);
  s.lingers = lingers_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace cqd::internal

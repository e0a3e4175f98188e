// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/event_loop.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <string>

#include "runtime/base/pinning.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {
EventLoop::EventLoop(uint32_t ack_threshold, const std::vector<Shard*>& pollers,
                     const std::vector<Consumer*>& consumers, const SlotPool& slots)
    : ack_threshold_(ack_threshold),
      pollers_(pollers),
      consumers_(consumers),
      slots_(slots),
      cm_(slots_, pollers_),
      wake_shard_(pollers.size(), false),
      pre_wake_(consumers.size(), false) {}

EventLoop::~EventLoop() {
  Stop();
  for (const auto& source : sources_) {
    if (source->fd >= 0) close(source->fd);
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (tick_fd_ >= 0) close(tick_fd_);
}

Status EventLoop::Start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return ErrnoStatus("event loop: epoll_create1", errno);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return ErrnoStatus("event loop: eventfd", errno);
  if (Status s = Watch(wake_fd_, {SourceKind::kWake, nullptr, nullptr, -1}); !s.ok()) return s;
  if (tick_) {
    tick_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tick_fd_ < 0) return ErrnoStatus("event loop: timerfd_create", errno);
    itimerspec every_second{};
    every_second.it_value.tv_sec = every_second.it_interval.tv_sec = 1;
    if (timerfd_settime(tick_fd_, 0, &every_second, nullptr) != 0) {
      return ErrnoStatus("event loop: timerfd_settime", errno);
    }
    if (Status s = Watch(tick_fd_, {SourceKind::kTick, nullptr, nullptr, -1}); !s.ok()) return s;
  }
  mailbox_.Open();
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void EventLoop::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  uint64_t one = 1;
  while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void EventLoop::RunSync(const std::function<void()>& fn) {
  mailbox_.RunSync(fn, [this] {
    uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  });
}

Status EventLoop::Watch(int fd, Source source) {
  source.flags = fcntl(fd, F_GETFL);
  if (source.flags < 0) return ErrnoStatus("fcntl(F_GETFL)", errno);
  source.engine_fd = fd;
  source.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (source.fd < 0) return ErrnoStatus("fcntl(F_DUPFD_CLOEXEC)", errno);
  auto owned = std::make_unique<Source>(source);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = owned.get();
  if (fcntl(source.fd, F_SETFL, source.flags | O_NONBLOCK) < 0 ||
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, source.fd, &ev) < 0) {
    const int error = errno;
    fcntl(source.fd, F_SETFL, source.flags);
    close(source.fd);
    return ErrnoStatus("watching an fd", error);
  }
  sources_.push_back(std::move(owned));
  return Status::Ok();
}

Status EventLoop::WatchDevice(DeviceRecord* device) {
  const size_t before = sources_.size();
  Status s = Status::Ok();
  for (size_t shard = 0; shard < device->channels.size() && s.ok(); ++shard) {
    backend::Channel* channel = device->channels[shard];
    s = Watch(channel->fd(), {SourceKind::kChannel, device, channel, static_cast<int>(shard)});
  }
  if (s.ok()) s = Watch(device->backend->async_fd(), {SourceKind::kAsync, device, nullptr, -1});
  if (!s.ok()) {  // the device is not added: none of its fds may stay
    for (size_t i = before; i < sources_.size(); ++i) Remove(*sources_[i]);
  }
  return s;
}

Status EventLoop::WatchCm(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer,
                          int64_t limit) {
  for (const auto& source : sources_) {
    if (source->active && source->kind == SourceKind::kCm && source->cm->channel == channel) {
      return AlreadyExists("WatchCmChannel: the channel is already watched");
    }
  }
  CmWatch* watch = cm_.AddWatch(channel, handler, consumer, limit);
  Source source{SourceKind::kCm, nullptr, nullptr, -1};
  source.cm = watch;
  if (Status s = Watch(channel->fd, source); !s.ok()) {
    return Status(s.code(), "WatchCmChannel: " + s.message());
  }
  return Status::Ok();
}

Status EventLoop::UnwatchCm(rdma_event_channel* channel) {
  for (const auto& source : sources_) {
    if (source->kind != SourceKind::kCm || source->cm->channel != channel) continue;
    if (source->active) {
      Remove(*source);
      return Status::Ok();
    }
    if (source->given_back_at_stop) {  // Shutdown gave it back already
      source->given_back_at_stop = false;
      return Status::Ok();
    }
  }
  return NotFound("UnwatchCmChannel: the channel is not watched");
}

void EventLoop::Remove(Source& source) {
  // By our own dup: it names the registered file whatever became of the engine's number.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, source.fd, nullptr);
  if (source.kind == SourceKind::kCm) {  // its O_NONBLOCK as it came; the other flags as they are
    const int flags = fcntl(source.fd, F_GETFL);
    if (flags >= 0) fcntl(source.fd, F_SETFL, (flags & ~O_NONBLOCK) | (source.flags & O_NONBLOCK));
  }
  close(source.fd);
  source.fd = -1;
  source.active = false;
  if (source.paused) --paused_cm_;
  source.paused = false;
}

void EventLoop::Unwatch(Source& source) {
  const int err = errno;  // of the failed read
  const int fd = source.engine_fd;
  Remove(source);
  failed_fds_.fetch_add(1, std::memory_order_relaxed);
  if (log_ != nullptr && log_->enabled()) {
    log_->Warning("event thread: fd " + std::to_string(fd) + " failed (" + strerror(err) +
                  "); no longer watched");
  }
}

void EventLoop::UnmapCq(CqRecord* cq) {
  auto it = cqs_.find(cq->native);
  if (it != cqs_.end() && it->second == cq) cqs_.erase(it);
}

void EventLoop::Run() {
  MarkRuntimeThread();
  PinAndNameThread(-1, "cqd-events");
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stop_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epoll_fd_, events, kMaxEvents, paused_cm_ > 0 ? 1 : -1);
    if (n < 0) continue;  // EINTR; other errors cannot happen with a valid epoll fd
    for (int i = 0; i < n; ++i) {
      Source& source = *static_cast<Source*>(events[i].data.ptr);
      if (!source.active) continue;  // unwatched by an earlier entry of this batch
      switch (source.kind) {
        case SourceKind::kWake: {
          uint64_t value;
          while (read(wake_fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
          }
          if (mailbox_.pending()) mailbox_.RunPosted();
          break;
        }
        case SourceKind::kChannel:
          ReadChannel(source);
          break;
        case SourceKind::kAsync:
          ReadAsyncEvents(source);
          break;
        case SourceKind::kCm:
          ReadCmChannel(source);
          break;
        case SourceKind::kTick: {
          uint64_t expirations;
          while (read(tick_fd_, &expirations, sizeof(expirations)) < 0 && errno == EINTR) {
          }
          tick_();
          break;
        }
      }
    }
    if (paused_cm_ > 0) ResumeCm();
    // The consumers first (Consumer::PreWake): their wakes overlap the pollers', and no poller
    // can hand over, and wake its consumer itself, before the pre-wake was made.
    for (size_t consumer = 0; consumer < pre_wake_.size(); ++consumer) {
      if (pre_wake_[consumer]) {
        pre_wake_[consumer] = false;
        consumers_[consumer]->PreWake();
      }
    }
    for (size_t shard = 0; shard < wake_shard_.size(); ++shard) {
      if (wake_shard_[shard]) {
        wake_shard_[shard] = false;
        pollers_[shard]->CqEvents();
      }
    }
  }
  // Still on this thread, before RunSync runs callers' functions inline: the sources go (their
  // dups closed, CM channels given back as they came).
  for (const auto& source : sources_) {
    if (!source->active || source->kind == SourceKind::kWake || source->kind == SourceKind::kTick) {
      continue;
    }
    Remove(*source);
    source->given_back_at_stop = source->kind == SourceKind::kCm;
  }
  mailbox_.Close();
}

void EventLoop::ReadChannel(Source& source) {
  for (;;) {
    void* native = nullptr;
    if (source.channel->GetEvent(&native) != 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // empty (S4)
      // The channel is broken (the device is gone): stop watching it, and have the poller stop
      // waiting for its events.
      Unwatch(source);
      pollers_[source.shard]->NotificationsBroken();
      return;
    }
    auto it = cqs_.find(native);
    if (it == cqs_.end()) {
      // A CQ the engine put on our channel without adopting it: ack at once, or its destroy
      // would wait forever (S2). Nobody polls it because of this event.
      source.device->backend->AckNativeCqEvent(native);
      stray_events_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    CqRecord* cq = it->second;
    cq->counts.events.fetch_add(1, std::memory_order_relaxed);
    cq->Ack(cq->acks.Add(1, ack_threshold_));
    if (cq->retiring.load(std::memory_order_seq_cst)) {
      cq->Ack(cq->acks.TakeAll());  // its destroyer may already have flushed: ack our own
      continue;
    }
    cq->armed.store(false, std::memory_order_seq_cst);
    wake_shard_[cq->shard] = true;
    const uint32_t sole = cq->sole_consumer.load(std::memory_order_relaxed);
    if (sole < pre_wake_.size()) pre_wake_[sole] = true;
  }
}

void EventLoop::ReadCmChannel(Source& source) {
  switch (cm_.Read(*source.cm)) {
    case CmRouter::ReadResult::kEmpty:
      return;
    case CmRouter::ReadResult::kFull: {
      // Leave the rest in the kernel until deliveries bring the count down (ResumeCm).
      epoll_event ev{};
      ev.data.ptr = &source;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, source.fd, &ev);
      source.paused = true;
      ++paused_cm_;
      return;
    }
    case CmRouter::ReadResult::kBroken:
      Unwatch(source);  // the channel is broken: do not spin on it
      return;
  }
}

void EventLoop::ResumeCm() {
  for (const auto& source : sources_) {
    if (!source->paused ||
        source->cm->unfinished.load(std::memory_order_acquire) >= source->cm->limit) {
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;  // level-triggered: what waits in the channel is reported at once
    ev.data.ptr = source.get();
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, source->fd, &ev);
    source->paused = false;
    --paused_cm_;
  }
}

}  // namespace cqd::internal

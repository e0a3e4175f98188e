// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/event_loop.h: the runtime's single event thread.
//
// It epolls every completion channel (one per device and shard), every device's async fd and a
// wake eventfd, all non-blocking and level-triggered, and drains each ready fd until EAGAIN
// (retrying EINTR). For a completion event it counts the event against its CQ, acks in batches
// of `ack_threshold` (AckCounter), clears the CQ's `armed` flag and, once the ready fds are
// drained, wakes the CQ's consumer if it has one alone (Consumer::PreWake), then the shard.
// Async events are copied, acked (S13) and routed: QP events to the QP's handler; CQ_ERR and
// DEVICE_FATAL to the device handler and to every QP they affect; port and SRQ events (and QP
// events of unregistered QPs) to the device handler. An event for a QP travels through the
// shards of the QP's CQs (Shard::PostEvent, EventJoin), so it reaches the handler after every
// completion those shards took off the QP's CQs before the event was read.
//
// Each fd is watched through a dup of its own (F_DUPFD_CLOEXEC), registered in the epoll set in
// its place: an fd that fails with anything but EAGAIN or EINTR (a device gone, a channel closed
// behind the runtime's back) leaves the epoll set for certain, by that dup, even when the
// engine closed or reused the original number, so that the level-triggered loop cannot spin on
// it; for a completion channel the shard is told to stop relying on events (its poller then
// sleeps in bounded steps). The dups are closed when a source leaves and, on the event thread,
// when the loop stops.
// A CM channel is read non-blocking while watched and gets its O_NONBLOCK flag back as it came
// when it leaves (UnwatchCm, failure, Stop).
//
// Threading: the native-CQ map and the epoll set belong to the event thread; other threads change
// them through RunSync (see mailbox.h).
#ifndef CQD_RUNTIME_CORE_EVENT_LOOP_H_
#define CQD_RUNTIME_CORE_EVENT_LOOP_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cqd/status.h"
#include "runtime/base/log.h"
#include "runtime/base/mailbox.h"
#include "runtime/core/cm_router.h"
#include "runtime/core/consumer.h"
#include "runtime/core/event_join.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {

class EventLoop {
 public:
  EventLoop(uint32_t ack_threshold, const std::vector<Shard*>& pollers,
            const std::vector<Consumer*>& consumers, const SlotPool& slots);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Before Start: where to log fds given up and DEVICE_FATAL (may stay unset).
  void set_logger(const Logger* log) { log_ = log; }
  // Before Start: called on the event thread once a device raised DEVICE_FATAL (after its QPs'
  // handlers got the event's parts posted); must not block.
  void set_on_device_failed(std::function<void(DeviceId)> fn) { on_device_failed_ = std::move(fn); }
  // Before Start: called on the event thread once a second (a timerfd); must not block. Unset:
  // no timer.
  void set_tick(std::function<void()> fn) { tick_ = std::move(fn); }
  Status Start();
  void Stop();
  // Runs `fn` on the event thread (inline once it stopped) and waits for it.
  void RunSync(const std::function<void()>& fn);

  // Event thread (call through RunSync once started).
  Status WatchDevice(DeviceRecord* device);  // its async fd and all its channels
  // Starts reading a CM channel (kAlreadyExists if it is read already); see cm_router.h.
  // `limit`: events read ahead of their delivery at most (cm_router.h).
  Status WatchCm(rdma_event_channel* channel, CmHandler* handler, uint32_t consumer, int64_t limit);
  // Stops reading a CM channel; kNotFound if it was not read.
  Status UnwatchCm(rdma_event_channel* channel);
  CmRouter& cm() { return cm_; }
  void MapCq(CqRecord* cq) { cqs_[cq->native] = cq; }
  void UnmapCq(CqRecord* cq);

  uint64_t async_events() const { return async_events_.load(std::memory_order_relaxed); }
  uint64_t cm_events() const { return cm_.events(); }
  uint64_t stray_events() const { return stray_events_.load(std::memory_order_relaxed); }
  // fds taken out of the epoll set because they kept failing.
  uint64_t failed_fds() const { return failed_fds_.load(std::memory_order_relaxed); }

 private:
  enum class SourceKind { kWake, kChannel, kAsync, kCm, kTick };
  struct Source {
    SourceKind kind;
    DeviceRecord* device;
    backend::Channel* channel;
    int shard;
    CmWatch* cm = nullptr;
    int fd = -1;          // our dup of the watched fd: what the epoll set holds
    int engine_fd = -1;   // the watched fd's number, for the log
    int flags = 0;        // the watched fd's file status flags before we set O_NONBLOCK
    bool active = true;   // false once unwatched: skipped even if already reported ready
    bool paused = false;  // a CM channel at its limit: in the epoll set without events
    bool given_back_at_stop = false;  // a CM channel the loop's stop removed (UnwatchCm: OK)
  };
  void Run();
  Status Watch(int fd, Source source);
  void ReadChannel(Source& source);
  void ReadAsyncEvents(Source& source);
  void ReadCmChannel(Source& source);
  // Reads again from CM channels that were paused at their limit and are below it now.
  void ResumeCm();
  // A QP event, read and not yet acked (S13: its number names its own QP until then): posts it to
  // the QP's registration; false if there is none.
  bool PostToRegistration(DeviceRecord* device, const AsyncEvent& event);
  // An acked event: to the device handler (a QP event only if `posted` is false), and CQ_ERR and
  // DEVICE_FATAL to every QP they take down.
  void RouteAsyncEvent(DeviceRecord* device, const AsyncEvent& event, bool posted);
  // Sends `event` to the handler of `slot` through the shards of its CQs; false unless the slot
  // holds a live registration of event.qp_num on `device`.
  bool DeliverToSlot(uint32_t slot, const AsyncEvent& event, DeviceId device);
  // Takes `source` out of the epoll set and closes its dup (a CM channel gets its flags back).
  void Remove(Source& source);
  // The same for a failing source (counted in failed_fds, logged).
  void Unwatch(Source& source);

  const uint32_t ack_threshold_;
  std::vector<Shard*> pollers_;
  std::vector<Consumer*> consumers_;
  const SlotPool& slots_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Mailbox mailbox_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::unordered_map<void*, CqRecord*> cqs_;  // native CQ -> record
  CmRouter cm_;
  int paused_cm_ = 0;  // CM sources paused: the loop then wakes every millisecond to resume
  std::vector<bool> wake_shard_;
  std::vector<bool> pre_wake_;  // consumers to pre-wake before this round's pollers
  std::atomic<uint64_t> async_events_{0};
  std::atomic<uint64_t> stray_events_{0};
  std::atomic<uint64_t> failed_fds_{0};
  std::function<void(DeviceId)> on_device_failed_;
  const Logger* log_ = nullptr;
  std::function<void()> tick_;
  int tick_fd_ = -1;
  // CQ_ERR lines: at most one a second, with a count of those left out (event thread only).
  void LogCqError(const DeviceRecord* device, const AsyncEvent& event);
  uint64_t cq_errors_logged_ = 0;
  uint64_t cq_errors_unlogged_ = 0;
  std::chrono::steady_clock::time_point last_cq_error_log_{};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_EVENT_LOOP_H_

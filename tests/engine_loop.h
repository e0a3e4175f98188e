// SPDX-License-Identifier: BSD-2-Clause
// tests/engine_loop.h: a minimal reactor for tests of engine-driven shards.
#ifndef CQD_TESTS_ENGINE_LOOP_H_
#define CQD_TESTS_ENGINE_LOOP_H_

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "cqd/runtime.h"

namespace cqd::testing {

// A reactor thread: polls its shard while there is work, then asks to sleep and sleeps in
// epoll on the shard's fd (and a stop eventfd of its own) when told it may.
class EngineLoop {
 public:
  EngineLoop(Runtime& rt, int shard, int budget = 64) : rt_(rt), shard_(shard), budget_(budget) {
    stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    thread_ = std::thread([this] { Run(); });
  }
  ~EngineLoop() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
    close(stop_fd_);
  }
  // True while the loop is in (or about to enter) an epoll_wait with no timeout.
  bool asleep() const { return asleep_.load(std::memory_order_acquire); }
  std::thread::id id() const { return thread_.get_id(); }
  int errors() const { return errors_.load(); }

 private:
  void Run() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int fd = rt_.ShardFd(shard_).value();
    for (int watched : {fd, stop_fd_}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = watched;
      epoll_ctl(ep, EPOLL_CTL_ADD, watched, &ev);
    }
    while (!stop_.load()) {
      int n = rt_.PollShard(shard_, budget_);
      if (n < 0) errors_.fetch_add(1);
      if (n != 0) continue;
      int verdict = rt_.TrySleepShard(shard_);
      if (verdict < 0) errors_.fetch_add(1);
      if (verdict != 1 && verdict != 2) continue;
      if (verdict == 1) asleep_.store(true, std::memory_order_release);
      epoll_event events[2];
      epoll_wait(ep, events, 2, verdict == 1 ? -1 : 1);  // 2: at most a millisecond
      asleep_.store(false, std::memory_order_release);
    }
    close(ep);
  }

  Runtime& rt_;
  const int shard_;
  const int budget_;
  int stop_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> asleep_{false};
  std::atomic<int> errors_{0};
  std::thread thread_;
};

}  // namespace cqd::testing

#endif  // CQD_TESTS_ENGINE_LOOP_H_

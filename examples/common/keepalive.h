// SPDX-License-Identifier: BSD-2-Clause
// examples/common/keepalive.h: when a server probes an idle connection, and when a probe that
// nobody answers ends it.
//
// A connection idle for `period` gets a probe (a zero-length RDMA WRITE). A live peer's transport
// acknowledges it, and its completion answers the probe. A dead host's never does, and the
// sender's transport may retry for ever: rping connects with retry_count 7, the server's QP
// inherits it, and rxe never counts it down. So the server does not wait for the transport to
// give up: a probe left unanswered for kMissedPeriods periods, with no other completion of the
// connection in that time, ends the connection. The answer is the probe's completion reaching
// the connection's handler, which a backlogged consumer delays: so the verdict waits until the
// connection's consumer has caught up (nothing queued or spilled for it: the caller reads
// ConsumerStats), and judges the peer, not the engine's own queue. A consumer that never
// catches up delays the verdict on a dead peer for as long.
//
// Threading: Heard runs on the connection's handler thread, Check and Probed on the thread that
// ticks the connections; the fields are relaxed atomics (each a moment, read on its own).
#ifndef CQD_EXAMPLES_COMMON_KEEPALIVE_H_
#define CQD_EXAMPLES_COMMON_KEEPALIVE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace cqd::examples {

class Keepalive {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMissedPeriods = 4;

  enum class Due {
    kNothing,  // active, or a probe is out and still has time
    kProbe,    // idle for a period: post a probe, then call Probed
    kGiveUp,   // a probe went unanswered for kMissedPeriods periods: end the connection
  };
  // Returns what the connection needs now. `caught_up`: the connection's consumer holds nothing
  // undelivered (ConsumerStats::queue_depth and spill_depth 0), so an answer that came is heard.
  Due Check(Clock::time_point now, std::chrono::milliseconds period,
            bool caught_up = true) const noexcept {
    const int64_t out = probe_since_.load(std::memory_order_relaxed);
    if (out != 0) {
      return Since(now, out) >= kMissedPeriods * period && caught_up ? Due::kGiveUp : Due::kNothing;
    }
    return Since(now, heard_.load(std::memory_order_relaxed)) >= period ? Due::kProbe
                                                                        : Due::kNothing;
  }
  // A probe was posted at `now` (`posted` false: the post failed, so none is out).
  void Probed(Clock::time_point now, bool posted) noexcept {
    heard_.store(Ticks(now), std::memory_order_relaxed);
    probe_since_.store(posted ? Ticks(now) : 0, std::memory_order_relaxed);
  }
  // A successful completion of the connection came at `now`: the peer is alive. `answer`: it was
  // the probe's own.
  void Heard(Clock::time_point now, bool answer) noexcept {
    heard_.store(Ticks(now), std::memory_order_relaxed);
    if (answer) {
      probe_since_.store(0, std::memory_order_relaxed);
    } else if (probe_since_.load(std::memory_order_relaxed) != 0) {
      probe_since_.store(Ticks(now), std::memory_order_relaxed);  // its wait starts again
    }
  }
  // Check, carried out by the thread that serializes the connection (it also runs Heard): posts
  // a probe with `post()` (true if the post succeeded) when one is due. Returns the reason the
  // connection must end ("keepalive unanswered for N ms"), or an empty string.
  template <typename Post>
  std::string Tick(Clock::time_point now, std::chrono::milliseconds period, Post&& post,
                   bool caught_up = true) {
    const Due due = Check(now, period, caught_up);
    if (due == Due::kProbe) Probed(now, post());
    if (due != Due::kGiveUp) return {};
    return "keepalive unanswered for " + std::to_string(WaitedMs(now)) + " ms";
  }
  // Milliseconds the probe now out has waited; 0 if none is out.
  int64_t WaitedMs(Clock::time_point now) const noexcept {
    const int64_t out = probe_since_.load(std::memory_order_relaxed);
    if (out == 0) return 0;
    return std::chrono::duration_cast<std::chrono::milliseconds>(Since(now, out)).count();
  }

 private:
  static int64_t Ticks(Clock::time_point t) noexcept { return t.time_since_epoch().count(); }
  static Clock::duration Since(Clock::time_point now, int64_t ticks) noexcept {
    return now - Clock::time_point(Clock::duration(ticks));
  }

  std::atomic<int64_t> heard_{Ticks(Clock::now())};  // the last completion, or the last probe
  std::atomic<int64_t> probe_since_{0};              // when the probe now out was posted; 0: none
};

}  // namespace cqd::examples

#endif  // CQD_EXAMPLES_COMMON_KEEPALIVE_H_

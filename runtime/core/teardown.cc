// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/teardown.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/pinning.h"

namespace cqd::internal {
namespace {

thread_local bool tls_teardown_worker = false;

// How often the worker looks again at a handler call it waits out (it never blocks on one).
constexpr std::chrono::microseconds kCallRecheck{200};
// A teardown whose markers are not all back (or whose receive marker is owed) is redriven after
// this, then at twice the last interval, up to kRedriveMax: a marker posted in the error state
// may flush only at the next move to it (rxe's receives; a flush a full CQ could not take), and
// an owed marker's room comes back with the queue's flushes.
constexpr std::chrono::microseconds kRedriveFirst{500};
constexpr std::chrono::microseconds kRedriveMax{64000};

}  // namespace

bool TeardownWorker::OnWorkerThread() noexcept { return tls_teardown_worker; }

TeardownWorker::~TeardownWorker() { Stop(); }

void TeardownWorker::Start() {
  thread_ = std::thread([this] {
    tls_teardown_worker = true;
    PinAndNameThread(-1, "cqd-teardown");
    Run();
  });
}

void TeardownWorker::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  parker_.Wake();
  thread_.join();
}

void TeardownWorker::Add(std::shared_ptr<TeardownState> state) {
  {
    MutexLock lock(mu_);
    active_.push_back(std::move(state));
    noted_.exchange(true, std::memory_order_seq_cst);  // its deadline is new (an RMW: see noted_)
  }
  parker_.Wake();
}

void TeardownWorker::Note(TeardownState* state, uint32_t what) noexcept {
  ChaosPoint();
  state->seen.fetch_or(what, std::memory_order_acq_rel);
  if (noted_.exchange(true, std::memory_order_seq_cst)) return;  // a scan is due: it sees `seen`
  parker_.Wake();
}

void TeardownWorker::DeviceFailed(uint32_t device) noexcept {
  {
    MutexLock lock(mu_);
    if (std::find(failed_devices_.begin(), failed_devices_.end(), device) ==
        failed_devices_.end()) {
      failed_devices_.push_back(device);  // at most one entry per device
    }
    noted_.exchange(true, std::memory_order_seq_cst);
  }
  parker_.Wake();
}

void TeardownWorker::Run() {
  using Clock = TeardownState::Clock;
  MutexLock lock(mu_);
  for (;;) {
    // Decide, under the lock, which teardowns end now and why. Cleared first: a Note from here
    // on sets it again (see noted_), and its marker is then looked at by the next scan.
    noted_.exchange(false, std::memory_order_seq_cst);
    const Clock::time_point now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    std::vector<std::pair<std::shared_ptr<TeardownState>, Status>> ending;
    std::vector<std::shared_ptr<TeardownState>> fencing;
    std::vector<std::shared_ptr<TeardownState>> redriving;
    size_t kept = 0;  // active_[0, kept): the teardowns that go on (compacted in this one pass)
    for (size_t i = 0; i < active_.size(); ++i) {
      std::shared_ptr<TeardownState>& state = active_[i];
      const size_t ending_before = ending.size();
      const bool send_seen =
          (state->seen.load(std::memory_order_acquire) & TeardownState::kSendMarker) != 0;
      if (state->srq && send_seen && state->grace_ends == Clock::time_point{}) {
        state->grace_ends = TeardownState::After(now, state->last_wqe_grace);
      }
      const bool device_failed = std::find(failed_devices_.begin(), failed_devices_.end(),
                                           state->device) != failed_devices_.end();
      if (state->end_with) {
        ending.emplace_back(state, *state->end_with);
      } else if (state->Flushed()) {
        ending.emplace_back(state, Status::Ok());
      } else if (device_failed) {
        ending.emplace_back(state, Unavailable("TeardownQp: the device failed (DEVICE_FATAL) "
                                               "before the QP drained; unregistered anyway"));
      } else if (stop_) {
        ending.emplace_back(state, Cancelled("TeardownQp: the runtime shut down before QP "
                                             "slot " +
                                             std::to_string(state->slot) + " drained"));
      } else if (now >= state->deadline) {
        ending.emplace_back(state,
                            DeadlineExceeded("TeardownQp: the QP's work did not flush back before "
                                             "the deadline; unregistered anyway"));
      } else {
        const uint32_t polled = state->polled.load(std::memory_order_relaxed);
        if (state->recv_marker_owed || (state->markers & ~polled) != 0) {
          if (state->retry_every.count() == 0) {  // first look: from now on
            state->retry_every = kRedriveFirst;
            state->retry_at = now + kRedriveFirst;
          }
          if (now >= state->retry_at) {
            redriving.push_back(state);
          } else {
            wake = std::min(wake, state->retry_at);
          }
        }
        if (state->srq && send_seen && !state->fence_posted) {
          if (now >= state->grace_ends) {
            // The device sends no LAST_WQE_REACHED: stand in for it with a fence that follows
            // every completion now in the QP's CQs (as an event would), noted like one.
            state->fence_posted = true;
            fencing.push_back(state);
          } else {
            wake = std::min(wake, state->grace_ends);
          }
        }
        wake = std::min(wake, state->deadline);
      }
      if (ending.size() == ending_before) {
        if (kept != i) active_[kept] = std::move(state);
        ++kept;
      }
    }
    active_.resize(kept);
    const bool stopping = stop_;
    // Without the lock: retiring takes the runtime mutex, whose holders call Add (which takes
    // mu_); on_done may call the runtime.
    lock.Unlock();
    for (auto& state : fencing) host_.PostLastWqeStandIn(*state);
    for (auto& state : redriving) {
      if (log_ != nullptr && log_->enabled()) {
        char qp[16];
        snprintf(qp, sizeof(qp), "0x%x", state->qp_num);
        log_->Debug(std::string("TeardownQp of qp_num ") + qp + ": markers not polled after " +
                    std::to_string(state->retry_every.count()) +
                    " us more; moving the QP to Error again");
      }
      // Worker-owned fields: the retire that reads `markers` runs on this thread too.
      if (host_.RedriveFlush(*state) && state->recv_marker_owed) {
        state->recv_marker_owed = false;
        state->markers |= TeardownState::kRecvMarker;
      }
      state->retry_every = std::min(2 * state->retry_every, kRedriveMax);
      state->retry_at = Clock::now() + state->retry_every;
    }
    for (auto& [state, result] : ending) {
      if (result.code() == StatusCode::kDeadlineExceeded && log_ != nullptr && log_->enabled()) {
        char qp[16];
        snprintf(qp, sizeof(qp), "0x%x", state->qp_num);
        log_->Warning(std::string("TeardownQp of qp_num ") + qp +
                      ": its work did not flush back before the deadline; unregistered anyway");
      }
      ChaosPoint();  // decided, not yet retired: markers may come meanwhile
      const CallTicket call = host_.RetireTeardown(*state);
      retired_.push_back({state, std::move(result), call});
    }
    const bool waiting_on_calls = FinishRetired();
    lock.Lock();
    if (stopping && active_.empty() && !waiting_on_calls) return;
    if (noted_.load(std::memory_order_relaxed) || !ending.empty() || !fencing.empty() ||
        !redriving.empty()) {
      continue;  // look again at once
    }
    if (waiting_on_calls) {
      wake = std::min(wake, Clock::now() + kCallRecheck);
    } else if (stopping) {
      continue;
    }
    // Sleep until `wake` (max: nothing is due) or a change: announced first, then re-checked
    // (parker.h; Stop sets stop_ under mu_, held here, before it wakes).
    const uint32_t ticket = parker_.Prepare();
    if (noted_.load(std::memory_order_seq_cst) || (stop_ && !stopping)) {
      parker_.Cancel();
      continue;
    }
    lock.Unlock();
    if (wake == Clock::time_point::max()) {
      parker_.Park(ticket);
    } else {
      parker_.ParkFor(ticket, std::max(Clock::duration::zero(), wake - Clock::now()));
    }
    lock.Lock();
  }
}

bool TeardownWorker::FinishRetired() {
  // Not erased in place: on_done may add teardowns, never retired ones (only Run retires).
  std::vector<Ending> over;
  std::erase_if(retired_, [&](Ending& e) {
    if (e.call.retired && e.call.call != 0 && !host_.CallOver(e.call)) return false;
    over.push_back(std::move(e));
    return true;
  });
  for (Ending& e : over) {
    if (e.call.retired) host_.FreeSlot(e.state->slot);
    Publish(e.state, e.result);
  }
  return !retired_.empty();
}

void TeardownWorker::Publish(const std::shared_ptr<TeardownState>& state, const Status& result) {
  {
    MutexLock lock(state->mu);
    state->done = true;
    state->result = result;
  }
  state->cv.NotifyAll();
  if (state->on_done) {
    try {
      state->on_done(result);
    } catch (...) {  // an engine callback must not take the worker thread down
    }
  }
}

}  // namespace cqd::internal

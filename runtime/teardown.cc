#include "runtime/teardown.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/consumer.h"

namespace cqd::internal {

void StrayMarkers::Add(const std::shared_ptr<TeardownState>& state, uint32_t send_cq,
                       uint32_t recv_cq) {
  const uint32_t seen = state->seen.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(mu_);
  if (!(seen & TeardownState::kSendMarker)) {
    strays_.push_back({state->send_marker(), {state, send_cq}});
  }
  if (!state->srq && !(seen & TeardownState::kRecvMarker)) {
    strays_.push_back({state->recv_marker(), {state, recv_cq}});
  }
  count_.store(static_cast<uint32_t>(strays_.size()), std::memory_order_release);
}

bool StrayMarkers::TakeSlow(uint64_t wr_id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < strays_.size(); ++i) {
    if (strays_[i].first == wr_id) {
      strays_.erase(strays_.begin() + i);
      count_.store(static_cast<uint32_t>(strays_.size()), std::memory_order_release);
      return true;
    }
  }
  return false;
}

void StrayMarkers::ForgetCq(uint32_t cq_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(strays_, [&](const auto& entry) { return entry.second.cq_id == cq_id; });
  count_.store(static_cast<uint32_t>(strays_.size()), std::memory_order_release);
}

TeardownWorker::TeardownWorker(
    std::function<void(uint32_t, uint32_t)> unregister,
    std::function<void(uint32_t, uint32_t)> post_fence,
    std::function<std::pair<uint32_t, uint32_t>(uint32_t)> cqs_of, StrayMarkers& strays)
    : unregister_(std::move(unregister)),
      post_fence_(std::move(post_fence)),
      cqs_of_(std::move(cqs_of)),
      strays_(strays) {}

TeardownWorker::~TeardownWorker() { Stop(); }

void TeardownWorker::Start() {
  thread_ = std::thread([this] {
    PinAndNameThread(-1, "cqd-teardown");
    Run();
  });
}

void TeardownWorker::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TeardownWorker::Add(std::shared_ptr<TeardownState> state) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.push_back(std::move(state));
    noted_ = true;  // its deadline is new
  }
  cv_.notify_all();
}

void TeardownWorker::Note(TeardownState* state, uint32_t what) noexcept {
  state->seen.fetch_or(what, std::memory_order_acq_rel);
  {
    std::lock_guard<std::mutex> lock(mu_);
    noted_ = true;
  }
  cv_.notify_all();
}

void TeardownWorker::Run() {
  using Clock = TeardownState::Clock;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Decide, under the lock, which teardowns end now and why.
    const Clock::time_point now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    std::vector<std::pair<std::shared_ptr<TeardownState>, Status>> ending;
    std::vector<std::shared_ptr<TeardownState>> fencing;
    for (auto& state : active_) {
      const bool send_seen =
          (state->seen.load(std::memory_order_acquire) & TeardownState::kSendMarker) != 0;
      if (state->srq && send_seen && state->grace_ends == Clock::time_point{}) {
        state->grace_ends = TeardownState::After(now, state->last_wqe_grace);
      }
      if (state->end_with) {
        ending.emplace_back(state, *state->end_with);
      } else if (state->Drained()) {
        ending.emplace_back(state, Status::Ok());
      } else if (stop_) {
        ending.emplace_back(state, Cancelled("TeardownQp: the runtime shut down before QP "
                                             "slot " + std::to_string(state->slot) +
                                             " drained"));
      } else if (now >= state->deadline) {
        ending.emplace_back(state, DeadlineExceeded(
                                       "TeardownQp: the QP's work did not flush back before "
                                       "the deadline; unregistered anyway"));
      } else {
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
    }
    for (auto& [state, result] : ending) std::erase(active_, state);
    if (!ending.empty() || !fencing.empty()) {
      lock.unlock();  // Unregister may wait for a consumer, whose Note takes mu_
      for (auto& state : fencing) post_fence_(state->slot, state->generation);
      for (auto& [state, result] : ending) Finish(state, std::move(result));
      lock.lock();
      continue;
    }
    if (stop_) return;
    noted_ = false;
    if (wake == Clock::time_point::max()) {  // nothing is due (no teardown, or no deadline)
      cv_.wait(lock, [&] { return noted_ || stop_; });  // Add and Note set noted_
    } else {
      cv_.wait_until(lock, wake, [&] { return noted_ || stop_; });
    }
  }
}

void TeardownWorker::Finish(const std::shared_ptr<TeardownState>& state, Status result) {
  // Markers still out become strays before the registration goes, so that no poller can route
  // one to whatever registers the qp_num next.
  if (!state->end_with) {
    auto [send_cq, recv_cq] = cqs_of_(state->slot);
    strays_.Add(state, send_cq, recv_cq);
  }
  unregister_(state->slot, state->generation);
  if (result.code() == StatusCode::kDeadlineExceeded && log_ != nullptr && log_->enabled()) {
    char qp[16];
    snprintf(qp, sizeof(qp), "0x%x", state->qp_num);
    log_->Warning(std::string("TeardownQp of qp_num ") + qp +
                  ": its work did not flush back before the deadline; unregistered anyway");
  }
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->result = result;
  }
  state->cv.notify_all();
  if (state->on_done) {
    try {
      state->on_done(result);
    } catch (...) {  // an engine callback must not take the worker thread down
    }
  }
}

}  // namespace cqd::internal

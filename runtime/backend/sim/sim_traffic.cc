// SPDX-License-Identifier: BSD-2-Clause
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "cqd/sim.h"

namespace cqd {

SimTrafficSource::SimTrafficSource(SimTrafficOptions options) : options_(std::move(options)) {
  options_.burst = std::clamp(options_.burst, 1, 1024);
}

SimTrafficSource::~SimTrafficSource() {
  Stop();
  Join();
}

void SimTrafficSource::Start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void SimTrafficSource::Stop() { stop_.store(true, std::memory_order_relaxed); }

void SimTrafficSource::Join() {
  if (thread_.joinable()) thread_.join();
}

void SimTrafficSource::Run() {
  using Clock = std::chrono::steady_clock;
  const size_t qps = options_.qps.size();
  std::vector<uint64_t> next(qps, 0);
  std::vector<ibv_wc> wcs(options_.burst);
  const bool recv = (options_.opcode & IBV_WC_RECV) != 0;
  const Clock::time_point start = Clock::now();
  uint64_t done = 0;
  const uint64_t total = this->total();
  while (done < total && !stop_.load(std::memory_order_relaxed)) {
    bool progress = false;
    for (size_t i = 0; i < qps && !stop_.load(std::memory_order_relaxed); ++i) {
      SimQp* qp = options_.qps[i];
      uint64_t left = options_.completions_per_qp - next[i];
      if (left == 0) continue;
      int k = static_cast<int>(std::min<uint64_t>(left, options_.burst));
      for (int j = 0; j < k; ++j) {
        ibv_wc& wc = wcs[j];
        wc = ibv_wc{};
        wc.wr_id = next[i] + j;
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = options_.opcode;
        wc.qp_num = qp->qp_num();
        wc.byte_len = recv ? options_.byte_len : 0;
      }
      SimCq* cq = recv ? qp->recv_cq() : qp->send_cq();
      int added = cq->Inject({wcs.data(), static_cast<size_t>(k)}, options_.solicited);
      if (added < 0) return;  // the CQ or device failed: nothing more can be delivered
      next[i] += added;
      done += added;
      injected_.store(done, std::memory_order_relaxed);
      progress |= added > 0;
      if (options_.rate_per_sec > 0) {
        auto due = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(done / options_.rate_per_sec));
        std::this_thread::sleep_until(due);
      }
    }
    if (!progress) std::this_thread::yield();  // every CQ is full: let the pollers catch up
  }
}

}  // namespace cqd

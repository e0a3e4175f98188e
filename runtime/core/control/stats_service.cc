// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/stats_service.h"

#include <chrono>
#include <utility>

#include "runtime/core/caller.h"

namespace cqd::internal {

Stats StatsService::GetStats() const {
  Stats stats;
  stats.uptime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - core_.created)
                        .count();
  for (const auto& poller : core_.pollers) stats.pollers.push_back(poller->stats());
  for (const auto& consumer : core_.consumers) {
    ConsumerStats c;
    c.name = consumer->name();
    c.delivered = consumer->delivered();
    c.async_events = consumer->async_delivered();
    c.queue_depth = consumer->depth();
    c.high_water = consumer->high_water();
    c.pre_wakes = consumer->pre_wakes();
    c.queue_capacity = core_.options.consumers[consumer->index()].queue_capacity;
    c.spill_capacity = core_.options.consumers[consumer->index()].spill_capacity;
    for (const auto& poller : core_.pollers) poller->AddSpillStats(consumer->index(), c);
    if (consumer->latency() != nullptr) c.latency = consumer->latency()->Snapshot();
    stats.consumers.push_back(std::move(c));
  }
  placement_.FillStats(stats);
  stats.registrations = registrations_.live();
  stats.max_registrations = core_.options.max_registrations;
  stats.orphans = core_.orphans.total();
  stats.async_events = core_.events->async_events();
  stats.failed_fds = core_.events->failed_fds();
  stats.cm_events = core_.events->cm_events();
  if (CallerRoles() & kRefusedControlCallers) return stats;  // these parts need the mutex
  devices_.FillStats(stats);
  cqs_.FillStats(stats);
  return stats;
}

Status StatsService::Start() {
  if (!core_.options.stats_socket.empty() || !core_.options.stats_tcp.empty()) {
    const StatsEndpointOptions endpoint{
        core_.options.stats_socket, core_.options.stats_socket_mode, core_.options.stats_tcp,
        core_.options.stats_tcp_allow_remote, core_.options.stats_per_cq};
    auto server = StatsServer::Start(
        endpoint, [this] { return GetStats(); }, core_.log);
    if (!server.ok()) return server.status();
    server_ = std::move(server).value();
  }
  return Status::Ok();
}

void StatsService::Stop() {
  if (server_ != nullptr) server_->Stop();
}

}  // namespace cqd::internal

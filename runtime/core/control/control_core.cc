// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/control_core.h"

#include <string>

namespace cqd::internal {

ControlCore::ControlCore(const RuntimeOptions& options_in)
    : options(options_in),
      log(options_in.log ? options_in.log : EnvironmentLogSink()),
      slots(options_in.max_registrations),
      orphans(options_in.orphan_handler) {
  std::vector<Consumer*> consumer_list;
  for (size_t i = 0; i < options.consumers.size(); ++i) {
    ConsumerOptions c = options.consumers[i];
    if (c.name.empty()) c.name = "consumer" + std::to_string(i);
    consumers.push_back(
        std::make_unique<Consumer>(static_cast<uint32_t>(i), c, slots, orphans, options.pollers));
    consumer_list.push_back(consumers.back().get());
  }
  std::vector<Shard*> poller_list;
  for (int i = 0; i < options.pollers; ++i) {
    pollers.push_back(std::make_unique<Shard>(i, options, consumer_list, slots, orphans));
    poller_list.push_back(pollers.back().get());
  }
  events = std::make_unique<EventLoop>(options.ack_threshold, poller_list, consumer_list, slots);
  events->set_logger(&log);
  if (log.enabled()) {  // a consumer that holds its pollers back is said in the log
    stall_watch = std::make_unique<StallWatch>(log, pollers, consumers);
    events->set_tick([this] { stall_watch->Tick(); });
  }
}

}  // namespace cqd::internal

// SPDX-License-Identifier: BSD-2-Clause
// sim_engine.h: what the example engine does with cqd (the public API only: cqd/runtime.h and
// cqd/sim.h): completions on a simulated device, through a runtime, to a handler that counts
// each work request it is told of.
#ifndef CQD_BAZEL_ENGINE_SIM_ENGINE_H_
#define CQD_BAZEL_ENGINE_SIM_ENGINE_H_

#include <cstdint>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/status.h"

namespace engine {

// Adds a simulated device to `runtime`, a CQ on shard 0 and a QP whose handler runs on
// `consumer`, completes receive work requests 0..count-1 on the QP, waits (60 s at most) until the
// handler has seen `count` completions, then unregisters the QP and destroys it and the CQ.
// Returns how many times the handler saw each wr_id (index: wr_id; index `count` counts wr_ids
// out of range and completions that were not successful receives).
cqd::Result<std::vector<uint32_t>> DeliverOnSim(cqd::Runtime& runtime, cqd::ConsumerId consumer,
                                                uint32_t count);

}  // namespace engine

#endif  // CQD_BAZEL_ENGINE_SIM_ENGINE_H_

// SPDX-License-Identifier: BSD-2-Clause
// libFuzzer target for the CM hand-on rule (runtime/core/cm_router.h), on the rig of
// tests/cm_handon_rig.h (the runtime's own pollers and consumers, made-up ids and events; the
// simulated device has no rdma_cm, so no public call reaches this path without librdmacm).
//
// Input: byte 0 configures the rig (bit 0: events in two parts, on two shards; bit 1: engine
// threads drain the QPs' consumers in the background, racing the ops below; bits 2-3: the QPs'
// queue capacity, 1, 2, 4 or 64, so that parts wait in spills or not). Each later byte is one
// op, `op = byte >> 5` on id `arg % 3` (`arg = byte & 31`):
//   0, 1  route the id's next event          2  drain its consumer (1 + arg / 4 items; with
//   3     end its registration (Unregister)     background drainers: a pause instead)
//   4     register it afresh if ended         5  pause arg * 10 us
//   6     stop like Shutdown (arg % 8 == 0; no event is routed after it), else route
//   7     route the next event of every id
// Invariants (HandOnRig::Check), checked once everything settled: every event reaches exactly
// one handler, each handler gets its events in read order, the CmHandler starts none before the
// QP handler returned from every earlier event of the id it got, it never runs on two threads
// at once, and nothing still counts against the channel. A broken one aborts with its message.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/cm_handon_rig.h"

using cqd::internal::testing::HandOnRig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const uint32_t kCapacity[] = {1, 2, 4, 64};
  HandOnRig::Options options;
  options.ids = 3;
  options.two_shards = data[0] & 1;
  const bool background = data[0] & 2;
  options.qp_queue_capacity = kCapacity[(data[0] >> 2) & 3];
  HandOnRig rig(options);
  for (int k = 0; k < rig.ids(); ++k) rig.Register(k);

  std::atomic<bool> done{false};
  std::vector<std::thread> drainers;
  if (background) {
    for (int k = 0; k < rig.ids(); ++k) {
      drainers.emplace_back([&, k] {
        while (!done.load(std::memory_order_acquire)) {
          if (rig.Drain(k, 1) == 0) std::this_thread::yield();
        }
      });
    }
  }
  const size_t ops = size < 512 ? size : 512;
  for (size_t i = 1; i < ops; ++i) {
    const int op = data[i] >> 5;
    const int arg = data[i] & 31;
    const int k = arg % rig.ids();
    switch (op) {
      case 0:
      case 1:
        rig.Route(k);
        break;
      case 2:
        if (background) {
          std::this_thread::sleep_for(std::chrono::microseconds(arg));
        } else {
          rig.Drain(k, 1 + arg / 4);
        }
        break;
      case 3:
        rig.End(k);
        break;
      case 4:
        rig.Register(k);
        break;
      case 5:
        std::this_thread::sleep_for(std::chrono::microseconds(arg * 10));
        break;
      case 6:
        if (arg % 8 == 0) {
          rig.StopLikeShutdown();
        } else {
          rig.Route(k);
        }
        break;
      case 7:
        for (int id = 0; id < rig.ids(); ++id) rig.Route(id);
        break;
    }
  }
  done.store(true, std::memory_order_release);
  for (std::thread& t : drainers) t.join();
  const bool settled = rig.Settle();
  const std::string broken = rig.Check();
  if (!settled || !broken.empty()) {
    fprintf(stderr, "cm_handon_fuzz: %s%s\n", settled ? "" : "events never delivered; ",
            broken.c_str());
    abort();
  }
  return 0;
}

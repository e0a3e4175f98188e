// SPDX-License-Identifier: BSD-2-Clause
// engine.cc: a runtime with one poller and one runtime-owned consumer; 1000 completions on a
// simulated device, each of which must reach the handler exactly once. Prints
// "bazel engine: OK <n> completions, cqd <version>" and exits 0, or says what went wrong and
// exits 1.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/version.h"
#include "sim_engine.h"

int main() {
  constexpr uint32_t kCount = 1000;
  cqd::RuntimeOptions options;
  options.pollers = 1;
  options.consumers = {cqd::ConsumerOptions{.name = "engine"}};
  cqd::Result<std::unique_ptr<cqd::Runtime>> rt = cqd::Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "bazel engine: Runtime::Create: %s\n", rt.status().ToString().c_str());
    return 1;
  }
  cqd::Result<std::vector<uint32_t>> seen = engine::DeliverOnSim(**rt, /*consumer=*/0, kCount);
  if (!seen.ok()) {
    std::fprintf(stderr, "bazel engine: %s\n", seen.status().ToString().c_str());
    return 1;
  }
  uint32_t once = 0;
  for (uint32_t k = 0; k < kCount; ++k) once += (*seen)[k] == 1 ? 1 : 0;
  if (cqd::Status s = (*rt)->Shutdown(); !s.ok()) {
    std::fprintf(stderr, "bazel engine: Shutdown: %s\n", s.ToString().c_str());
    return 1;
  }
  if (once != kCount || (*seen)[kCount] != 0) {
    std::fprintf(stderr, "bazel engine: %u of %u completions reached the handler exactly once\n",
                 once, kCount);
    return 1;
  }
  std::printf("bazel engine: OK %u completions, cqd %s\n", kCount, cqd::Version().string);
  return 0;
}

// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

namespace cqd::internal {
namespace {

long Membarrier(int command) noexcept { return syscall(__NR_membarrier, command, 0, 0); }

bool Register() noexcept {
  const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

}  // namespace

bool AsymmetricFenceExpedited() noexcept {
  static const bool expedited = Register();  // once per process; thread-safe initialization
  return expedited;
}

void HeavyFence() noexcept {
  if (!AsymmetricFenceExpedited()) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return;
  }
  // Hot sides count on it: no fallback is correct. A registered process (the registration lasts
  // until exec) fails it only if a seccomp filter installed since forbids it: then this spins
  // (asymmetric_fence.h).
  while (Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
    std::this_thread::yield();
  }
}

}  // namespace cqd::internal

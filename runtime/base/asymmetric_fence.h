// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/asymmetric_fence.h: a store-load fence split unevenly between a hot side and a
// rare side.
//
// Two threads each store one word and then load the other's (Dekker's pattern): at least one of
// them must see the other's store. Both sides usually pay a full fence for that. Here the hot
// side (a consumer entering a handler call, many millions a second) pays nothing but a compiler
// barrier, and the rare side (Unregister, a teardown's end, a few thousand a second at most) pays
// for both: HeavyFence() runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes every
// thread of this process that is running on a CPU execute a full memory barrier before it returns
// (a thread that is not running passes one when it is switched back in). So whichever of the two
// loads comes later in that barrier's order sees the other side's store.
//
// Where the kernel refuses the command (before Linux 4.14, or a seccomp filter in place at the
// first call), Expedited() is false and both sides take a seq_cst fence: the same guarantee at the
// usual price. A seccomp filter that forbids membarrier installed after that first call is not
// supported: HeavyFence then retries for ever (no fallback would be correct). The choice is
// made once per process, on the first call of Expedited(), and never changes: a hot side that
// read it (Consumer caches it at construction) always pairs with a rare side that uses it.
//
// Threading: any thread may call any of these. LightFence(expedited) must get the value
// Expedited() returned.
#ifndef CQD_RUNTIME_BASE_ASYMMETRIC_FENCE_H_
#define CQD_RUNTIME_BASE_ASYMMETRIC_FENCE_H_

#include <atomic>

namespace cqd::internal {

// Returns true if HeavyFence uses membarrier (registered once for the process by the first call).
bool AsymmetricFenceExpedited() noexcept;

// The hot side: between its store and its load.
inline void LightFence(bool expedited) noexcept {
  if (expedited) [[likely]] {
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the order
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

// The rare side: between its store and its load. Costs a system call (microseconds) when
// expedited.
void HeavyFence() noexcept;

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_ASYMMETRIC_FENCE_H_

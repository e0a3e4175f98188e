// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/chaos.h: seeded timing perturbation at the runtime's synchronization points, so
// that interleavings a busy machine produces show on a quiet one.
//
// In a build with CQD_CHAOS defined (bazel --config=chaos), ChaosPoint() takes a pseudo-random
// pause: mostly none, else a yield, a short spin, or a sleep of up to 200 us (about one call in
// 64 pauses at all, one in 1024 sleeps). The draws come from a per-thread generator seeded from
// CQD_CHAOS_SEED (a number; a time-based seed when unset) and the order in which threads first
// reach a point; the seed is printed to stderr once ("cqd chaos: CQD_CHAOS_SEED=N"), so a run that
// fails can be replayed with the same schedule of pauses (not the same interleaving: the kernel
// still schedules). In every other build ChaosPoint() is an empty inline function.
//
// Call sites: the hand-over of a lane's range to a consumer and its release, Retire around the
// registration's death and Unregister before its wait for a handler call, a consumer between
// entering a call and reading the registration, the fences' catch-up (CqSet::CatchUpFences),
// parking, the sleep protocol (the parker, the shard's sleep and the stages' asks for room), the
// engine-driven shard's driver word, TeardownWorker::Note, and the teardown thread between
// deciding and retiring. Any thread may call it; it takes no lock.
#ifndef CQD_RUNTIME_BASE_CHAOS_H_
#define CQD_RUNTIME_BASE_CHAOS_H_

namespace cqd::internal {

#ifdef CQD_CHAOS
void ChaosPoint() noexcept;
#else
inline void ChaosPoint() noexcept {}
#endif

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_CHAOS_H_

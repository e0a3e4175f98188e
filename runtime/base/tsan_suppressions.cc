// SPDX-License-Identifier: BSD-2-Clause
// ThreadSanitizer does not model the standalone fences moodycamel's explicit producers use to
// reuse a block after the consumer emptied it, and reports the block's element write as a race.
// moodycamel marks that very function no_sanitize("thread") itself, but only through clang's
// __has_feature; under g++ we name the same function here.
//
// libtbb (the optional //:cqd_tbb layer) comes from Debian uninstrumented: TSan sees none of its
// own synchronization, only the libc calls it makes through TSan's interceptors (memcpy, free,
// mutexes), and has reported a race between two of those inside libtbb's scheduler.
// called_from_lib ignores the interceptors called from libtbb itself, and nothing more: races in
// cqd's code, tasks run by libtbb's threads included, are still reported. Nothing else is
// suppressed.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "race:moodycamel::ConcurrentQueue*ExplicitProducer::enqueue_bulk\n"
         "called_from_lib:libtbb.so.12\n";
}
#endif

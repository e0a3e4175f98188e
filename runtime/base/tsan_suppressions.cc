// SPDX-License-Identifier: BSD-2-Clause
// ThreadSanitizer does not model the standalone fences moodycamel's explicit producers use to
// reuse a block after the consumer emptied it, and reports the block's element write as a race.
// moodycamel marks that very function no_sanitize("thread") itself, but only through clang's
// __has_feature; under g++ we name the same function here. Nothing else is suppressed.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "race:moodycamel::ConcurrentQueue*ExplicitProducer::enqueue_bulk\n";
}
#endif

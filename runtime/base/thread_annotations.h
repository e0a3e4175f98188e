// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/thread_annotations.h: Clang's thread-safety analysis, spelled once.
//
// Every mutex of the runtime is a capability (mutex.h's Mutex, thread_role.h's ControlMutex),
// every field it guards says so with CQD_GUARDED_BY, and every function that must be called with
// it held says CQD_REQUIRES. `bazel build --config=tsa //...` (clang, -Wthread-safety -Werror,
// run by tools/test.sh) then refuses an access made without the lock. Under g++ the macros expand
// to nothing. See https://clang.llvm.org/docs/ThreadSafetyAnalysis.html for the attributes.
#ifndef CQD_RUNTIME_BASE_THREAD_ANNOTATIONS_H_
#define CQD_RUNTIME_BASE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define CQD_TSA(x) __attribute__((x))
#else
#define CQD_TSA(x)
#endif

// On a class: its objects are locks.
#define CQD_CAPABILITY(name) CQD_TSA(capability(name))
// On a class: an RAII holder of a capability.
#define CQD_SCOPED_CAPABILITY CQD_TSA(scoped_lockable)
// On a field: read or written only with `mu` held.
#define CQD_GUARDED_BY(mu) CQD_TSA(guarded_by(mu))
// On a pointer field: what it points to is read or written only with `mu` held.
#define CQD_PT_GUARDED_BY(mu) CQD_TSA(pt_guarded_by(mu))
// On a function: the caller holds `...` (exclusively).
#define CQD_REQUIRES(...) CQD_TSA(requires_capability(__VA_ARGS__))
// On a function: the caller does not hold `...` (the function takes it).
#define CQD_EXCLUDES(...) CQD_TSA(locks_excluded(__VA_ARGS__))
// On a function: it takes `...` (nothing named: `this`) and returns holding it.
#define CQD_ACQUIRE(...) CQD_TSA(acquire_capability(__VA_ARGS__))
// On a function: it gives `...` (nothing named: `this`) up.
#define CQD_RELEASE_CAPABILITY(...) CQD_TSA(release_capability(__VA_ARGS__))
// On a function: it returns `result` exactly when it took `...`.
#define CQD_TRY_ACQUIRE(...) CQD_TSA(try_acquire_capability(__VA_ARGS__))
// On a function: checks at run time that the caller holds `...`; the analysis believes it after.
#define CQD_ASSERT_CAPABILITY(x) CQD_TSA(assert_capability(x))
// On a function: it returns a reference to `x`.
#define CQD_RETURN_CAPABILITY(x) CQD_TSA(lock_returned(x))
// On a function: the analysis skips it. Each use says why the analysis cannot follow it.
#define CQD_NO_THREAD_SAFETY_ANALYSIS CQD_TSA(no_thread_safety_analysis)

#endif  // CQD_RUNTIME_BASE_THREAD_ANNOTATIONS_H_

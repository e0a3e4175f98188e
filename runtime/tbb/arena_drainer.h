// SPDX-License-Identifier: BSD-2-Clause
// runtime/tbb/arena_drainer.h: drains engine-driven consumers with tasks of a task_arena, at most
// one task per consumer at a time. Used by ArenaConsumers and StrandConsumer (cqd/tbb.h); only
// public cqd/ headers may be included here.
//
// Scheduling. Each hosted consumer has a state word: kScheduled (a drain task is queued or
// running) and kPending (the fd turned readable since that task last looked). OnReadable sets
// both with one fetch_or (acq_rel) and enqueues a task only if kScheduled was clear. The task
// clears kPending, calls Runtime::Drain, and then either re-enqueues itself (the budget was used
// up: more may be queued), or clears kScheduled with a CAS from exactly kScheduled: if kPending
// came in meanwhile the CAS fails and it drains again; if the CAS succeeds it polls the notify fd
// once more and takes kScheduled back if it is readable. Before that CAS, a task whose Drain took
// something and left the fd unreadable (it emptied the consumer) may linger: it waits (ppoll,
// bounded) for the fd while still kScheduled, so a wake meanwhile only sets kPending, and drains
// again if the fd turned readable. It begins a linger only while `queued_` (tasks enqueued, not
// yet started) reads 0: a lingering task may hold the arena's only thread. A task enqueued during
// a linger may wait for it to end (about `linger_`), and the lingering task begins no other linger
// while that one is queued.
// So a wake that arrives while a task runs is never lost: either the task sees kPending, or
// OnReadable sees kScheduled clear and enqueues.
// The acq_rel RMWs on the state word make each drain happen-before the next one of the consumer,
// whichever worker runs it.
//
// Lifetime. `inflight_` counts tasks queued or running; a task's last access to the drainer is
// its decrement (release). Stop sets `stopping_` (seq_cst) and waits for inflight_ == 0; the
// scheduler increments inflight_ (seq_cst) before it reads stopping_, so either it sees stopping_
// or Stop sees its increment.
#ifndef CQD_RUNTIME_TBB_ARENA_DRAINER_H_
#define CQD_RUNTIME_TBB_ARENA_DRAINER_H_

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/status.h"
#include "cqd/tbb.h"
#include "cqd/types.h"
#include "runtime/base/mutex.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace cqd::internal {

// libtbb is not instrumented for ThreadSanitizer, so the happens-before its task hand-off gives is
// invisible to TSan, in both directions: enqueue -> execute (the functor's construction before
// its call), and a task's memory freed on one thread and reused from TBB's pool on another (the
// last accesses to the old task before the writes of the new one). In TSan builds only:
//   - the functor releases on one address when constructed and acquires it before it runs;
//   - EnqueueTask holds a process-wide recursive mutex while it allocates and constructs the task,
//     and a functor's destructor (after every access to the task: TBB has copied its allocator
//     out) locks and unlocks it. A block can be reused only after its old task's destructor ran,
//     so the enqueuer's lock comes after that unlock. Other builds compile none of it.
inline char task_sync_address;
#if defined(__SANITIZE_THREAD__)
inline std::recursive_mutex task_memory_mu;
#endif
inline void TaskObserve() noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(&task_sync_address);
#endif
}
inline void TaskPublish() noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(&task_sync_address);
#endif
}
inline void TaskMemoryOrder() noexcept {
#if defined(__SANITIZE_THREAD__)
  task_memory_mu.lock();
  task_memory_mu.unlock();
#endif
}

// F must be trivially destructible (raw pointers only: a task's functor is then never read after
// the fence in the destructor).
template <typename F>
class AnnotatedTask {
  static_assert(std::is_trivially_destructible_v<F>, "capture raw pointers only");

 public:
  explicit AnnotatedTask(F f) : f_(std::move(f)) { TaskPublish(); }
  AnnotatedTask(const AnnotatedTask& other) : f_(other.f_) { TaskPublish(); }
  AnnotatedTask(AnnotatedTask&& other) noexcept : f_(std::move(other.f_)) { TaskPublish(); }
  AnnotatedTask& operator=(const AnnotatedTask&) = delete;
  ~AnnotatedTask() { TaskMemoryOrder(); }
  void operator()() const {
    TaskObserve();
    f_();
  }

 private:
  F f_;
};

// Returns true once `f` is enqueued into `arena`; false (nothing enqueued) when TBB threw.
template <typename F>
bool EnqueueTask(::tbb::task_arena& arena, F f) noexcept {
  try {
#if defined(__SANITIZE_THREAD__)
    std::lock_guard<std::recursive_mutex> lock(task_memory_mu);
#endif
    arena.enqueue(AnnotatedTask<F>(std::move(f)));
    return true;
  } catch (...) {
    return false;
  }
}

// Marks the current thread as running a task of `owner` (a drainer or a StrandCore), and of
// `strand` (a strand task), while alive. Scopes nest (a handler may run other tasks inside TBB
// waits); each lives on its thread's stack.
class TaskScope {
 public:
  TaskScope(const void* owner, const void* strand) noexcept;
  ~TaskScope();
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

  // Returns true on a thread inside any task of ArenaConsumers or StrandConsumer.
  static bool InAnyTask() noexcept;
  // Returns true on a thread inside a task of `owner`.
  static bool InTaskOf(const void* owner) noexcept;
  // Returns true on a thread inside the strand task of `strand`.
  static bool InStrand(const void* strand) noexcept;

 private:
  const void* owner_;
  const void* strand_;
  TaskScope* outer_;
};

// Waits (sleeping in short steps) until `count` reads 0 (acquire).
void WaitForZero(const std::atomic<int64_t>& count) noexcept;

// Returns kFailedPrecondition naming `who` when the caller runs inside any arena task of these
// classes or any cqd callback (Runtime::InCallback), where waiting for tasks could wait for a
// thread that waits for this one; OK elsewhere.
Status RefuseWaitInCallback(const char* who);

class ArenaDrainer {
 public:
  // Returns a started drainer for `consumers` (engine-driven consumers of `runtime`), or
  // kInvalidArgument (`who` names the caller in the message).
  static Result<std::unique_ptr<ArenaDrainer>> Create(Runtime& runtime, ::tbb::task_arena& arena,
                                                      const std::vector<ConsumerId>& consumers,
                                                      bool watcher_thread, int drain_budget,
                                                      std::chrono::microseconds linger,
                                                      const char* who);
  ~ArenaDrainer();  // Stop()
  ArenaDrainer(const ArenaDrainer&) = delete;
  ArenaDrainer& operator=(const ArenaDrainer&) = delete;

  // Returns false for a consumer not hosted here. Any thread; never blocks.
  bool OnReadable(ConsumerId consumer) noexcept;
  // See ArenaConsumers::Stop. `owner` tasks (besides the drainer's own) also refuse it.
  Status Stop(const void* also_refuse_owner = nullptr);
  // Once its owner has stopped for good (after Stop, and for a StrandConsumer after its last
  // delivery): its consumers leave the process-wide hosted set, so another object may host them,
  // and a runtime made later at this one's address is not taken for it. Idempotent; any thread.
  void Unhost() noexcept;
  ArenaStats GetStats() const;

 private:
  struct Slot {
    ConsumerId id = 0;
    int fd = -1;
    std::atomic<uint32_t> state{0};
  };
  static constexpr uint32_t kScheduled = 1;
  static constexpr uint32_t kPending = 2;

  ArenaDrainer(Runtime& runtime, ::tbb::task_arena& arena, int drain_budget,
               std::chrono::microseconds linger);
  void Schedule(Slot& slot) noexcept;
  bool Enqueue(Slot& slot) noexcept;
  void Run(Slot& slot) noexcept;
  // Returns true if `slot`'s fd turned readable within the linger (see above).
  bool Linger(Slot& slot) noexcept;
  void Watch() noexcept;

  Runtime& runtime_;
  ::tbb::task_arena& arena_;
  const int budget_;
  const std::chrono::microseconds linger_;
  std::vector<std::unique_ptr<Slot>> slots_;  // fixed after Create
  std::vector<Slot*> by_id_;                  // consumer id -> slot or nullptr; fixed after Create
  bool hosting_ = false;  // slots_ are in the process-wide set of hosted consumers (hosted_mu)
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  std::thread watcher_;
  Mutex stop_mu_;  // serializes Stop
  bool stopped_ CQD_GUARDED_BY(stop_mu_) = false;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> inflight_{0};
  std::atomic<int64_t> queued_{0};  // tasks enqueued, not yet started (relaxed: a hint)
  std::atomic<uint64_t> tasks_{0};
  std::atomic<uint64_t> dispatched_{0};
  std::atomic<uint64_t> enqueue_failures_{0};
  std::atomic<uint64_t> lingers_{0};
  std::atomic<uint64_t> linger_hits_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_TBB_ARENA_DRAINER_H_

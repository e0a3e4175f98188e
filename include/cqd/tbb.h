// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/tbb.h: engine-driven consumers drained by a oneTBB task_arena (optional: link //:cqd_tbb,
/// which adds -ltbb; engines that do not include this header never link TBB).
///
/// Two classes, both built only on cqd's public API (ConsumerKind::kEngineDriven consumers,
/// Runtime::NotifyFd and Runtime::Drain):
///
///   ArenaConsumers  hosts engine-driven consumers in the engine's arena: when a consumer's notify
///                   fd turns readable, a drain task is enqueued into the arena, and it calls
///                   Runtime::Drain for that consumer. At most one drain task per consumer is
///                   queued or running at any time, so each consumer's handlers keep every
///                   guarantee of runtime.h (order, never two threads at once), but consecutive
///                   drains may run on different arena workers.
///   StrandConsumer  drains one engine-driven consumer the same way, but its QPs' handlers run in
///                   parallel on the arena's workers, one strand per QP: each QP's completions,
///                   async events and CM events are delivered in order, one call at a time, and a
///                   slow QP delays only itself.
///
/// Watching the fds. By default each object starts a watcher thread that epolls (edge-triggered)
/// the notify fds it hosts. With `watcher_thread = false` the engine adds Runtime::NotifyFd to its
/// own epoll set (EPOLLIN | EPOLLET; level-triggered works too but spins while a drain is queued)
/// and calls OnReadable when it reports the fd; OnReadable never drains on the caller's thread and
/// never blocks, so it may be called from any thread, any number of times.
///
/// Thread contract.
///   - Handlers (QpHandler of hosted consumers, the StrandConsumer's user handlers, its
///     OrphanHandler and TeardownOptions::on_done) run on the arena's threads: a worker, or a
///     thread that joined the arena (task_arena::execute, or a wait inside it); except that the
///     StrandConsumer's OrphanHandler also runs on a thread that unregisters a strand holding
///     items, and a strand teardown's on_done on the runtime's teardown thread when the strand
///     was empty (see StrandConsumerOptions::orphan_handler and StrandConsumer). For one consumer
///     (ArenaConsumers) or one QP (StrandConsumer) one call at a time, and each call happens-before
///     the next (acq_rel on the scheduling flags, plus the arena's own hand-off).
///   - Handlers must not block for long: a blocked handler holds an arena thread, and an arena
///     with one thread then delivers nothing else. On an arena worker never call
///     cqd::Teardown::Wait (the runtime refuses it on every thread that last drained an
///     engine-driven consumer, which any worker may be, and elsewhere it could wait for the very
///     worker it holds) or Runtime::Shutdown. Use TeardownOptions::on_done instead.
///     StrandTeardown::Wait and Stop are refused (kFailedPrecondition, at once) in every arena task
///     of these classes and in every cqd callback (Runtime::InCallback: a runtime handler, on_done,
///     OrphanHandler, ...): what they wait for may need that thread. Control calls (RegisterQp,
///     TeardownQp, Unregister) are allowed from handlers.
///   - Runtime::Drain of a hosted consumer from one of its own handlers returns -EBUSY, as always
///     (an ArenaConsumers handler runs inside the drain task's Drain). A StrandConsumer's user
///     handler runs in a strand task instead: there Drain returns -EBUSY while a drain task is
///     draining the consumer (one thread drains at a time) and otherwise drains it, queueing to
///     strands, not calling user handlers. The engine must not Drain a consumer it handed to one
///     of these classes.
///   - A handler that runs TBB algorithms inside the arena may have other consumers' drain tasks or
///     other strands run nested on its thread (never its own consumer's or strand's: at most one
///     task exists per consumer and strand). Wrap such work in tbb::this_task_arena::isolate.
///   - Create, the StrandConsumer's RegisterQp/TeardownQp and OnReadable may be called from any
///     thread; Stop from any thread but those above (refused there). The destructors Stop, so an
///     object not yet stopped must not be destroyed on those threads either (a destructor cannot
///     refuse: it would wait there); once Stop returned OK, destroying it waits for nothing.
///   - Lifetimes: the Runtime and the arena must outlive the object (until Stop returned); a
///     QpHandler must outlive its registration (StrandRegistration::Unregister returned, or the
///     StrandTeardown is done()).
///
/// Nothing throws across this API: an allocation failure inside TBB (std::bad_alloc) is caught and
/// reported as kResourceExhausted, or counted (Stats::enqueue_failures) on the paths that return no
/// Status; the next readiness of the fd retries.
#ifndef CQD_TBB_H_
#define CQD_TBB_H_

#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/runtime.h"
#include "cqd/status.h"
#include "cqd/types.h"

namespace cqd {

namespace internal {
class ArenaDrainer;
struct Strand;
struct StrandCore;
struct StrandTeardownState;
}  // namespace internal

/// Returns constraints for an arena near `device`: numa_id is the device's NUMA node (from
/// GetStats().devices, else `/sys/class/infiniband/NAME/device/numa_node`) when TBB sees more than
/// one NUMA node on this machine and that node among them; otherwise numa_id stays -1 (automatic).
/// max_concurrency as given (-1: TBB's default). kNotFound for a device the runtime does not have.
Result<::tbb::task_arena::constraints> ArenaConstraintsFor(const Runtime& runtime, DeviceId device,
                                                           int max_concurrency = -1);

/// What an ArenaConsumers hosts, and how.
struct ArenaConsumersOptions {
  /// The engine-driven consumers to host (each at most once; each consumer may be hosted by one
  /// object only, until that object's Stop has returned (before it: kAlreadyExists), and the
  /// engine must not Drain it itself while hosted).
  std::vector<ConsumerId> consumers{};
  /// true: a watcher thread epolls the consumers' notify fds. false: the engine calls OnReadable.
  bool watcher_thread = true;
  /// The `max` of each Runtime::Drain call of a drain task (1..1<<20; one Drain takes at most the
  /// consumer's dispatch_batch). A task drains again while more work is signalled, up to 8 calls;
  /// after a call that took the whole budget, or the 8th, it re-enqueues itself behind the
  /// arena's other tasks.
  int drain_budget = 256;
  /// How long a drain task that emptied its consumer waits on the consumer's notify fd for the
  /// next entry before it ends (0..10000 us; 0: it ends at once). A consumer whose pollers refill
  /// it within the wait is drained again by the same task, on a worker that slept in the kernel,
  /// instead of by a new task through the watcher, the arena's queue and a woken worker, each of
  /// which waits for a core on a machine with more runnable threads than cores. A task begins to
  /// linger only after a Runtime::Drain that took something and left the notify fd unreadable,
  /// only while no other drain task of this object is queued, and not once Stop has begun (a
  /// linger begun just before Stop still runs to its end); the wait holds an arena thread, so a
  /// task enqueued meanwhile may wait up to this long for a thread, and an arena shared with other
  /// work gives up to this much of a thread per drain that emptied its consumer. The wait is the
  /// kernel's: it may overrun `linger` by the timer slack and scheduling delay.
  std::chrono::microseconds linger{200};
};

/// What an ArenaConsumers has done.
struct ArenaStats {
  uint64_t drain_tasks = 0;       ///< drain tasks run
  uint64_t dispatched = 0;        ///< entries their Drain calls took (Runtime::Drain's count)
  uint64_t enqueue_failures = 0;  ///< enqueues that failed (std::bad_alloc), retried on next wake
  uint64_t lingers = 0;           ///< waits for the next entry (ArenaConsumersOptions::linger)
  uint64_t linger_hits = 0;       ///< of those, waits that ended with the fd readable (<= lingers)
};

/// Engine-driven consumers drained by tasks of a task_arena. Thread-safe: every member may be
/// called from any thread (Stop and the destructor not from a hosted consumer's handler).
class ArenaConsumers {
 public:
  /// Returns a started object, or kInvalidArgument naming the consumer that is not engine-driven
  /// or listed twice (or a budget or linger out of range), kAlreadyExists for a consumer another
  /// object hosts (one whose Stop has returned hosts nothing), or kInternal if the watcher's epoll
  /// could not be made.
  static Result<std::unique_ptr<ArenaConsumers>> Create(Runtime& runtime, ::tbb::task_arena& arena,
                                                        const ArenaConsumersOptions& options);
  ~ArenaConsumers();  ///< Stop()
  ArenaConsumers(const ArenaConsumers&) = delete;
  ArenaConsumers& operator=(const ArenaConsumers&) = delete;

  /// The engine's epoll reported NotifyFd(consumer) readable: enqueues a drain task unless one is
  /// queued or running (then that one drains again). Returns false for a consumer not hosted here
  /// (true for one it hosted, after Stop). Never blocks, never drains on this thread; any thread.
  /// After Stop it does nothing.
  bool OnReadable(ConsumerId consumer) noexcept;

  /// Stops watching, stops scheduling drains and waits for the drain tasks in flight (a drain in
  /// progress finishes its Runtime::Drain call, a linger its wait: about `linger`). Work still
  /// queued stays in the consumers: the engine may Drain them itself afterwards. Idempotent.
  /// kFailedPrecondition (nothing waited for) from an arena task of any ArenaConsumers or
  /// StrandConsumer or a cqd callback (Runtime::InCallback).
  Status Stop();

  /// Returns its counters. Any thread.
  ArenaStats GetStats() const;

 private:
  explicit ArenaConsumers(std::unique_ptr<internal::ArenaDrainer> drainer);
  std::unique_ptr<internal::ArenaDrainer> drainer_;
};

/// What a StrandConsumer serves, and how.
struct StrandConsumerOptions {
  /// The engine-driven consumer whose QPs this object serves (no other object may host it, and the
  /// engine must not Drain it itself).
  ConsumerId consumer = 0;
  bool watcher_thread = true;  ///< as ArenaConsumersOptions::watcher_thread
  int drain_budget = 256;      ///< as ArenaConsumersOptions::drain_budget (1..1<<20)
  // (Its drain task never lingers, see ArenaConsumersOptions::linger: the strand tasks it queues
  // need the arena's threads.)
  /// Items (completion runs and events) after which a strand task re-enqueues itself behind the
  /// arena's other tasks (1..1<<20). Checked between the batches a task takes from its strand's
  /// queue (a batch is everything queued then), so one task may deliver a whole batch past it.
  int strand_budget = 64;
  /// Optional, thread-safe: completions that were queued in a strand when it was unregistered
  /// (they are counted either way, StrandStats::orphans). Called on the unregistering thread or
  /// on an arena worker.
  OrphanHandler* orphan_handler = nullptr;
};

/// What a StrandConsumer has done.
struct StrandStats {
  uint64_t strands = 0;           ///< strands alive (registered, or tearing down)
  uint64_t strand_tasks = 0;      ///< strand tasks run
  uint64_t delivered = 0;         ///< completions and events delivered to user handlers
  uint64_t orphans = 0;           ///< completions dropped from strands (see orphan_handler)
  uint64_t dropped_events = 0;    ///< async and CM events dropped from unregistered strands
  uint64_t enqueue_failures = 0;  ///< as ArenaStats
  ArenaStats drain{};             ///< the drain side
};

/// A QP registered through a StrandConsumer. Move-only; destroying it unregisters. Not
/// thread-safe as an object (like Registration): one thread at a time calls its members.
class StrandRegistration {
 public:
  StrandRegistration() = default;
  /// Takes `other`'s registration; `other` then holds none.
  StrandRegistration(StrandRegistration&& other) noexcept = default;
  /// Unregisters what this one holds, then takes `other`'s registration.
  StrandRegistration& operator=(StrandRegistration&& other) noexcept;
  StrandRegistration(const StrandRegistration&) = delete;
  StrandRegistration& operator=(const StrandRegistration&) = delete;
  ~StrandRegistration();  ///< Unregister()

  /// After this returns the user handler is never called again and may be destroyed: it ends the
  /// runtime registration (Registration::Unregister), marks the strand dead and waits for a strand
  /// task delivering to it to return from the handler. Called from this QP's own handler it does
  /// not wait: it takes effect when that handler returns (no further call). Completions still
  /// queued in the strand go to StrandConsumerOptions::orphan_handler (or are counted); queued
  /// async and CM events are dropped and counted. Idempotent. On a poller or the event thread
  /// (an OrphanHandler, a DeviceEventHandler) it does nothing and registered() stays true, as
  /// Registration::Unregister; a StrandRegistration destroyed or assigned over there hands its
  /// strand to the StrandConsumer, whose next RegisterQp, TeardownQp, Stop or destructor
  /// unregisters it (until then its handler may still be called).
  void Unregister() noexcept;
  /// Returns true until Unregister (or a move) ends the registration.
  bool registered() const { return strand_ != nullptr; }
  /// Returns the registered QP's number.
  uint32_t qp_num() const { return qp_num_; }

 private:
  friend class StrandConsumer;
  /// Hands a strand still registered (Unregister did nothing here) to its StrandConsumer.
  void HandOver() noexcept;
  std::shared_ptr<internal::Strand> strand_;
  uint32_t qp_num_ = 0;
};

/// A teardown through a StrandConsumer. Cheap to copy; may outlive the StrandConsumer.
class StrandTeardown {
 public:
  StrandTeardown() = default;
  /// Returns true once the result is known. Never blocks; any thread.
  bool done() const;
  /// Returns the result: OK only when every completion flushed ahead of the markers reached the
  /// USER handler (the strand delivered its queue up to the teardown); otherwise the runtime's
  /// teardown result (kDeadlineExceeded, kUnavailable, kCancelled), or kCancelled when the strand
  /// had to drop completions (StrandConsumer stopped first). A finished teardown's result comes at
  /// once, on any thread. Otherwise blocks until then; kFailedPrecondition at once (the teardown
  /// goes on) from a task of any ArenaConsumers or StrandConsumer (a handler, an on_done), from
  /// a cqd callback (Runtime::InCallback: a runtime handler, on_done, OrphanHandler,
  /// DeviceEventHandler, CmHandler, the log sink), and on a default-constructed StrandTeardown.
  Status Wait() const;

 private:
  friend class StrandConsumer;
  std::shared_ptr<internal::StrandTeardownState> state_;
};

/// One engine-driven consumer whose QPs' handlers run on the arena's workers, one strand per QP.
///
/// Guarantees (as handler.h and runtime.h give for a consumer):
///   - per QP: completions in the order the runtime dispatched them (poll order per CQ), async and
///     CM events after every completion dispatched before them; one call at a time, each
///     happening-before the next; different QPs in parallel;
///   - StrandRegistration::Unregister: the user handler is never called after it returns;
///   - TeardownQp: OK only after every flushed completion reached the user handler; on_done runs
///     once, after the handler's last call, on the thread that delivered the strand's last item
///     (an arena thread), or on the runtime's teardown thread when the strand was empty;
///   - Stop: after Runtime::Shutdown, everything already polled is delivered (or, for unregistered
///     QPs, orphaned); nothing queued is lost silently (a Drain a user handler has in progress is
///     waited for, not taken for the end).
/// Not kept: for a QP registered with its rdma_cm_id, once the registration ends the runtime hands
/// the id's later events to the channel's CmHandler, which may then run before the strand has
/// delivered the id's earlier events to the QP handler (the runtime sees them delivered when the
/// strand queued them).
///
/// Costs: every completion is copied once into its strand's queue (a buffer that grows to its high
/// water mark and is then reused); one spinlock round per dispatched run and per strand batch, and
/// one arena task per strand wake.
class StrandConsumer {
 public:
  /// Returns a started object, or kInvalidArgument if options.consumer is not an engine-driven
  /// consumer of `runtime` or a budget is out of range, kAlreadyExists if another object hosts it.
  static Result<std::unique_ptr<StrandConsumer>> Create(Runtime& runtime, ::tbb::task_arena& arena,
                                                        const StrandConsumerOptions& options);
  ~StrandConsumer();  ///< Stop(); strands still registered then stay valid until unregistered
  StrandConsumer(const StrandConsumer&) = delete;
  StrandConsumer& operator=(const StrandConsumer&) = delete;

  /// Registers the QP on options.consumer with an internal handler that queues its items to the
  /// QP's strand, and `handler` as the strand's user handler. Errors as Runtime::RegisterQp, or
  /// kFailedPrecondition after Stop, kResourceExhausted when memory ran out.
  Result<StrandRegistration> RegisterQp(ibv_qp* qp, QpHandler& handler,
                                        const QpOptions& options = {});
  /// As the verbs RegisterQp, for a QP of the simulated device.
  Result<StrandRegistration> RegisterQp(const SimQp& qp, QpHandler& handler,
                                        const QpOptions& options = {});
  /// As the verbs RegisterQp, for an rdma_cm id's QP (Runtime::RegisterQp(rdma_cm_id*)).
  Result<StrandRegistration> RegisterQp(rdma_cm_id* id, QpHandler& handler,
                                        const QpOptions& options = {});

  /// Runtime::TeardownQp for a strand QP. On success `registration` is handed over (registered()
  /// becomes false) and options.on_done, if set, is called once with the result after the user
  /// handler's last call. Errors as Runtime::TeardownQp (the registration stays as it was), and
  /// kInvalidArgument for a registration of another StrandConsumer or none.
  Result<StrandTeardown> TeardownQp(StrandRegistration& registration,
                                    const TeardownOptions& options = {});

  /// As ArenaConsumers::OnReadable, for options.consumer. Returns true.
  bool OnReadable() noexcept;

  /// Stops watching and scheduling drains, waits for the drain tasks in flight, drains what is left
  /// in the consumer on this thread (so call Runtime::Shutdown first for everything polled), then
  /// waits until the strands have delivered all of it. Items queued afterwards (a teardown's end)
  /// are not delivered: completions are orphaned, events dropped, both counted. Idempotent.
  /// kFailedPrecondition (nothing done) where ArenaConsumers::Stop is refused.
  Status Stop();

  /// Returns its counters. Any thread.
  StrandStats GetStats() const;

 private:
  StrandConsumer(Runtime& runtime, std::shared_ptr<internal::StrandCore> core,
                 std::unique_ptr<internal::ArenaDrainer> drainer);
  template <typename Register>
  Result<StrandRegistration> RegisterWith(QpHandler& handler, const Register& register_qp);
  Runtime& runtime_;
  std::shared_ptr<internal::StrandCore> core_;
  std::unique_ptr<internal::ArenaDrainer> drainer_;
};

}  // namespace cqd

#endif  // CQD_TBB_H_

// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/runtime.h: the completion dispatcher.
///
/// A Runtime owns pollers (one per CQ shard: a thread of its own, or, for an engine-driven shard,
/// a step of the engine's loop), consumers (runtime-owned threads, engine-driven, or run to
/// completion on their poller), and one event thread for completion channels and device async
/// events:
///
///   auto rt = cqd::Runtime::Create(options).value();
///   auto dev = rt->OpenVerbsDevice("rxe0").value();           // or AddSimDevice(sim)
///   cqd::CqHandle cq = rt->CreateCq(dev, /*shard=*/0, {}).value();
///   ibv_qp* qp = ibv_create_qp(pd, &attr);                    // send_cq = recv_cq = cq.verbs()
///   cqd::Registration reg = rt->RegisterQp(qp, handler, /*consumer=*/0).value();
///   ... handler.OnCompletions() runs on consumer 0 ...
///   rt->TeardownQp(reg).value().Wait();                       // flushed, delivered, unregistered
///   ibv_destroy_qp(qp);
///   rt->DestroyCq(cq);
///
/// Threading. Control-path calls (everything returning Status or Result, except NotifyFd and
/// ShardFd, which only read a number and answer any thread) may be made from any thread,
/// concurrently; they serialize on an internal mutex and may block briefly while a poller
/// or consumer reaches a safe point. From the runtime's own pollers and event thread (inside an
/// OrphanHandler or DeviceEventHandler) they are refused with FAILED_PRECONDITION. Drain() is
/// called only by the engine thread that drives that consumer; PollShard() and TrySleepShard() by
/// the engine thread that drives that shard (one at a time; see "Engine-driven shards" below).
/// Handlers run on their consumer (a kRunToCompletion consumer's on its poller's thread); a handler
/// may call control-path functions (including Unregister of its own QP), except Shutdown, on every
/// kind of consumer. Unregister of a QP whose handler is running waits for that handler call to
/// return (so does a TeardownQp the device refuses to start), not for the other handlers of its
/// consumer's batch, so a handler must not unregister or tear down, or hold a lock while another
/// thread does, a QP whose running handler waits for it: two handlers of different consumers
/// that each unregister the other's QP wait for each other for ever. Unregistering QPs of one's
/// own consumer never waits.
///
/// Waiting. No wait in the runtime depends on a thread that is itself waiting for it:
///   - control calls wait only for pollers and the event thread, which never wait for anyone;
///   - a teardown ends (deadline, DEVICE_FATAL, Shutdown) without the teardown thread waiting for
///     any consumer, so teardowns never wait on each other;
///   - Teardown::Wait and Shutdown are refused (kFailedPrecondition, at once) on the threads they
///     could wait for: see each. A handler must not wait for a teardown in any other way either
///     (spinning on Teardown::done()): it may hold back the QP's markers, or be the very handler
///     call the teardown's end waits for.
/// A kRunToCompletion consumer is its poller: while one of its handlers blocks, control calls and
/// teardown ends that need that poller (retiring a QP needs the pollers of its CQs) wait, and
/// they hold the control mutex meanwhile. Its handlers must not block.
///
/// Ordering. Completions of one QP from one CQ reach its handler in the order they were polled.
/// An async event of a QP reaches its handler after every completion of that QP that was in the
/// QP's CQs when the runtime read the event (the pollers poll those CQs up to the event first),
/// and on the same consumer, so a handler never runs on two threads at once. Everything a poller
/// observed before handing a completion over happens-before the handler's call.
///
/// Retired QPs. A registration ends by Unregister or by a teardown, whatever its result. What the
/// QP may still have in its CQs then goes to the OrphanHandler when polled (its teardown markers,
/// which are the runtime's, to nobody), keeps counting against its CQ's capacity until polled,
/// and never reaches a later registration: a new QP that got the number is registered on a CQ
/// only once the runtime has polled out of it whatever the old QP left there (RegisterQp does so
/// itself; see its UNAVAILABLE). That includes what the old QP completed after its registration
/// ended and before the engine destroyed it: the runtime keeps, for each CQ, the numbers whose
/// registration ended there (one bit each, at most 2 MiB per CQ) until they register there again
/// or the CQ is destroyed.
///
/// Bounds. A consumer's queue never holds more than ConsumerOptions::queue_capacity items; each
/// poller holds at most spill_capacity more for it, and then stops polling only the CQs that
/// consumer's QPs use (see README "Failure behaviour").
#ifndef CQD_RUNTIME_H_
#define CQD_RUNTIME_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "cqd/types.h"
#include "cqd/version.h"
#include "cqd/visibility.h"

namespace cqd {

class SimDevice;
class SimCq;
class SimQp;
class SimChannel;

namespace internal {
class RuntimeImpl;
struct TeardownState;
struct PolledCq;
struct RegisteredQp;
}  // namespace internal

/// A CQ the runtime polls. Cheap to copy; valid until Runtime::DestroyCq. It names its runtime
/// too: another runtime refuses it.
class CqHandle {
 public:
  CqHandle() = default;  ///< names no CQ (valid() is false)
  /// Returns the CQ's id: 1, 2, ... in the order the runtime took them (CqStats::id).
  uint32_t id() const { return id_; }
  /// Returns the shard whose poller polls it.
  int shard() const { return shard_; }
  /// Returns the device it is on.
  DeviceId device() const { return device_; }
  /// Returns the verbs CQ, or nullptr on the simulated device.
  ibv_cq* verbs() const { return verbs_; }
  /// Returns the simulated CQ, or nullptr on verbs.
  SimCq* sim() const { return sim_; }
  /// Returns false for a default-constructed handle.
  bool valid() const { return id_ != 0; }

 private:
  friend class Runtime;
  uint64_t runtime_ = 0;
  uint32_t id_ = 0;
  int shard_ = 0;
  DeviceId device_ = 0;
  ibv_cq* verbs_ = nullptr;
  SimCq* sim_ = nullptr;
};

/// Owns one QP's registration. Move-only; destroying it unregisters, except where Unregister does
/// nothing (on a poller, the event thread or in the log sink: there it must not be destroyed or
/// assigned to while it holds one, or the QP stays registered to a handler that may be gone). It
/// must not outlive the Runtime that issued it.
class Registration {
 public:
  Registration() = default;
  /// Takes `other`'s registration; `other` then holds none.
  Registration(Registration&& other) noexcept;
  /// Unregisters what this one holds, then takes `other`'s registration.
  Registration& operator=(Registration&& other) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() { Unregister(); }

  /// After this returns, the handler is never called again and may be destroyed. Completions still
  /// queued for the QP go to the orphan handler, and so do those still in its CQs, which count
  /// against their CQ's capacity until polled and never reach a later QP with the number
  /// (Runtime's "Retired QPs"). Idempotent. It waits while the QP's handler call is
  /// under way on its consumer (not for the rest of that consumer's batch), unless called on a
  /// thread that is running one of that consumer's handlers: there the call may be on this very
  /// stack (a handler that drains another consumer, or runs arena tasks, whose handler
  /// unregisters the first QP), and the QP's handler must not be freed until it has returned.
  /// On a poller or the event thread (OrphanHandler, DeviceEventHandler) or in the log sink it
  /// does nothing and registered() stays true. For an rdma_cm id's QP, its events not yet delivered
  /// go to the channel's CmHandler; after Shutdown has stopped that CmHandler's owned consumer,
  /// they run here, on this thread, before it returns, or, called from a handler, once that
  /// handler's dispatch batch is over (unless another thread is running such events: then that one
  /// runs them).
  void Unregister() noexcept;
  /// Returns true until Unregister (or a move) ends the registration.
  bool registered() const { return impl_ != nullptr; }
  /// Returns the registered QP's number.
  uint32_t qp_num() const { return qp_num_; }

 private:
  friend class Runtime;
  internal::RuntimeImpl* impl_ = nullptr;
  uint32_t slot_ = 0;
  uint32_t generation_ = 0;
  uint32_t qp_num_ = 0;
};

/// A QP teardown in progress (Runtime::TeardownQp). Cheap to copy; may outlive the runtime.
/// done() may be called from any thread; Wait() from the threads it names.
class Teardown {
 public:
  Teardown() = default;
  /// Returns true once the teardown has finished (the QP is unregistered). Never blocks.
  bool done() const;
  /// Returns the result of a finished teardown at once, from any thread: OK when every flushed
  /// completion reached the handler, kDeadlineExceeded when the timeout ran out first,
  /// kUnavailable when the device failed, kCancelled when the runtime shut down first.
  /// Otherwise blocks until it finishes, which it does by its deadline, a DEVICE_FATAL, or
  /// Shutdown, whichever comes first, once the QP's handler call in progress on its
  /// consumer (if any) has returned.
  /// Blocking is allowed only on engine threads that run no cqd code; kFailedPrecondition at once
  /// (the teardown goes on) from every cqd callback (InCallback()): any handler of any consumer
  /// kind (owned, engine-driven inside Drain, run-to-completion), a CmHandler,
  /// TeardownOptions::on_done, an OrphanHandler or DeviceEventHandler,
  /// the RuntimeOptions::log sink, and every engine thread of the runtime: the thread that last
  /// called Drain on any of its engine-driven consumers and the thread that last called
  /// PollShard on any of its engine-driven shards (the QP's markers may wait behind what such a
  /// thread delivers or polls: the QP's own consumer, a full consumer sharing one of its CQs, its
  /// CQs' shards; or that thread may be waiting for a teardown that needs the caller). Those use
  /// on_done, or check done() without waiting on it. kFailedPrecondition also on a
  /// default-constructed Teardown.
  Status Wait() const;

 private:
  friend class Runtime;
  std::shared_ptr<internal::TeardownState> state_;
};

/// The dispatcher: devices, CQs, registrations, teardowns, engine-driven consumers and shards,
/// stats. See the file comment for the threads it runs and which calls each thread may make.
class Runtime {
 public:
  /// Returns a started runtime; kInvalidArgument naming the bad option, kAlreadyExists when
  /// RuntimeOptions::stats_tcp's address is taken, kResourceExhausted when memory or a thread
  /// could not be had (at once, before anything is reserved, when the consumers' queues, about
  /// pollers x (queue_capacity + spill_capacity) x 64 bytes of address space each, could never
  /// fit the process's address space), kInternal (with errno) when a system call such as eventfd
  /// failed. Any thread may call it, inside a cqd callback too: a runtime that failed to start ran
  /// no callback, and is stopped there before the status returns.
  static Result<std::unique_ptr<Runtime>> Create(const RuntimeOptions& options);
  /// Shuts down (see Shutdown) and destroys the CQs and channels the runtime created. Not from
  /// inside a cqd callback of any runtime (InCallback(): a handler, Drain's or PollShard's, an
  /// on_done, ...; where Shutdown is refused): a destructor cannot refuse, and it would join or
  /// free threads still running, perhaps the one it runs on, so the process then terminates
  /// (std::abort, after logging why).
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Adds a verbs device the engine opened (rxe, a NIC); the context must outlive the runtime.
  /// One completion channel per shard is created on it, and from now on the runtime reads the
  /// device's async events (they reach handlers). `events` (optional, must outlive the runtime)
  /// receives device-level async events. A context belongs to one runtime: kAlreadyExists if
  /// this runtime or another of the process (until it is destroyed) added it, since each read
  /// of an async event takes it from every other reader. OpenVerbsDevice opens a context of its
  /// own, so runtimes that each open a device by name never collide.
  Result<DeviceId> AddVerbsDevice(ibv_context* context, DeviceEventHandler* events = nullptr);
  /// Opens the verbs device called `name` (such as "rxe0" or "mlx5_0") and adds it; the runtime
  /// closes it when destroyed. kNotFound lists the devices there are.
  Result<DeviceId> OpenVerbsDevice(const std::string& name, DeviceEventHandler* events = nullptr);
  /// Returns the context of a verbs device, for the engine's PDs, MRs and QPs.
  Result<ibv_context*> VerbsContext(DeviceId device);
  /// Returns the device added with `context` (such as an rdma_cm_id's `verbs`), or kNotFound;
  /// kInvalidArgument for a null `context`.
  Result<DeviceId> FindVerbsDevice(ibv_context* context);
  /// Adds a simulated device: one completion channel per shard is created on it and its async fd is
  /// watched. `events` (optional, must outlive the runtime) receives device-level async events.
  /// As with AddVerbsDevice, kAlreadyExists if this runtime or another live one added it.
  Result<DeviceId> AddSimDevice(std::shared_ptr<SimDevice> device,
                                DeviceEventHandler* events = nullptr);

  /// Creates a CQ on `shard`'s completion channel of `device`; the shard's poller polls it.
  Result<CqHandle> CreateCq(DeviceId device, int shard, const CqOptions& options = {});
  /// Returns the completion channel of `shard` on a verbs (or simulated) device, for CQs the
  /// engine creates itself and then adopts.
  Result<ibv_comp_channel*> VerbsChannelFor(DeviceId device, int shard);
  /// As VerbsChannelFor, for the simulated device.
  Result<SimChannel*> SimChannelFor(DeviceId device, int shard);
  /// Polls a CQ the engine created on VerbsChannelFor(device, shard); kInvalidArgument if the CQ
  /// uses another channel ("wrong shard"), kAlreadyExists if already polled.
  Result<CqHandle> AdoptCq(DeviceId device, int shard, ibv_cq* cq, const CqOptions& options = {});
  /// As the verbs AdoptCq, for a CQ of the simulated device.
  Result<CqHandle> AdoptCq(DeviceId device, int shard, SimCq* cq, const CqOptions& options = {});
  /// Stops polling the CQ, acks its remaining events, and destroys it if the runtime created it
  /// (an adopted CQ is only released: the engine destroys it after this returns). Fails with
  /// kFailedPrecondition while QPs using it are registered. What the CQ holds now goes to the
  /// OrphanHandler; what the runtime knew of it goes with it: the numbers retired there, and the
  /// markers a teardown that did not drain still owes it. So a released CQ adopted again (here or
  /// by another runtime) starts with no history, and what its QPs complete into it after the
  /// release (a retired QP's late completions, an undrained teardown's marker flushed later)
  /// reaches whichever QP is then registered with that qp_num, the same QP registered again
  /// included. Release a CQ for good, or destroy first the QPs that used it.
  Status DestroyCq(CqHandle cq);

  /// Routes the QP's completions and async events to `handler` on `consumer`. Its CQs must be
  /// polled by this runtime. kAlreadyExists if the qp_num is registered. The QP's work requests
  /// (QpOptions, read from the QP by default) plus one marker per queue are added to its CQs'
  /// commitments; a CQ that cannot hold them grows (CqOptions::grow) or the call fails with
  /// kResourceExhausted, so the engine's own posting can never overflow a CQ (S11). The QP must
  /// stay alive while registered. kUnavailable when a retired QP that had this qp_num (see
  /// "Retired QPs" above) may still have completions in one of these CQs and the runtime cannot
  /// poll them out now, because a consumer that CQ serves is full: nothing changed, register
  /// again once that consumer drains (Stats: its spill_depth). A CQ in error (overflowed, S11)
  /// holds nothing back: it is never polled again, so nothing in it reaches `handler`, nor
  /// anything the QP completes there. A QP whose work requests alone
  /// exceed what a CQ could ever hold (its depth with grow = false; 2^30) is kResourceExhausted
  /// whatever the fences, so kUnavailable always means "later". The same QP registered again,
  /// never destroyed, after a teardown that did not drain (it is in the error state) is moved to
  /// the error state again and is kUnavailable until that teardown's markers have come back
  /// through its CQs (unless its device has failed), so that they never reach `handler`.
  Result<Registration> RegisterQp(ibv_qp* qp, QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options = {});
  /// As the verbs RegisterQp, for a QP of the simulated device.
  Result<Registration> RegisterQp(const SimQp& qp, QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options = {});

  /// Connection management (librdmacm). The event thread reads `channel` (its fd is made
  /// non-blocking; the engine must not read it itself) and acks every event after copying it
  /// (CmEvent). Events of an id registered with RegisterQp(rdma_cm_id*) go to that QP's handler,
  /// ordered with its completions (QpHandler::OnCmEvent); every other event goes to `handler` on
  /// `consumer` (CmHandler). The channel is read at most queue_capacity + spill_capacity (of
  /// `consumer`) events ahead of their delivery; beyond that its events wait in the kernel.
  /// `handler` must outlive the runtime. kAlreadyExists if watched, kInvalidArgument for a null
  /// channel or a bad consumer.
  Status WatchCmChannel(rdma_event_channel* channel, CmHandler& handler, ConsumerId consumer);
  /// Stops reading `channel` and gives it back as it came (its fd's O_NONBLOCK flag as it was
  /// before WatchCmChannel); events already read are still delivered. Afterwards the engine may
  /// read or destroy the channel. Shutdown gives every channel back; UnwatchCmChannel then still
  /// returns OK once. kNotFound if not watched (or given up after its fd failed:
  /// Stats::failed_fds); kInvalidArgument for a null `channel`.
  Status UnwatchCmChannel(rdma_event_channel* channel);
  /// RegisterQp(id->qp, ...) for a QP made with rdma_create_qp, and from now on the id's events
  /// on a watched channel go to `handler`. Register before rdma_connect or rdma_accept, so that
  /// ESTABLISHED finds the registration. The device of id->verbs must have been added
  /// (AddVerbsDevice(id->verbs): librdmacm's context, not one OpenVerbsDevice opened). When the
  /// registration ends, the id's events not yet delivered go to the channel's CmHandler, in read
  /// order (handler.h). Like Unregister, if a Shutdown came in meanwhile it may run CM events it
  /// handed on to a stopped consumer's CmHandler on this thread before returning (or after the
  /// calling handler's batch); it never waits for another thread to run them.
  /// kInvalidArgument if the id or its QP is null.
  Result<Registration> RegisterQp(rdma_cm_id* id, QpHandler& handler, ConsumerId consumer,
                                  const QpOptions& options = {});

  /// Takes a registered QP out of service the careful way: moves it to the error state, posts a
  /// signaled marker work request on its send queue (and on its receive queue unless it uses an
  /// SRQ), delivers every completion that flushes ahead of the markers to the handler, waits for
  /// IBV_EVENT_QP_LAST_WQE_REACHED on an SRQ-attached QP (one the runtime reads after TeardownQp
  /// began; an earlier one is delivered as usual but does not count; after
  /// TeardownOptions::last_wqe_grace, a fence the runtime sends behind the QP's completions stands
  /// in for it), then unregisters. The markers are the runtime's: the handler never sees them.
  /// When the receive queue has no room for its marker, the runtime posts it again as the queue's
  /// flushes make room (moving the QP to the error state again, which rxe needs to flush a receive
  /// posted in error); until that marker is back the teardown cannot end OK.
  /// On success `registration` is handed over (registered() becomes false) and the Teardown says
  /// when it is over; once it is, the engine may destroy the QP, and a new QP that gets the same
  /// qp_num receives nothing of the old one: after OK nothing of the QP is left in its CQs; after
  /// any other result, what is left there goes to the orphan handler when polled, and keeps
  /// counting against its CQ's capacity until then ("Retired QPs" above).
  /// Errors: kInvalidArgument (not registered, another runtime's, a UD QP; a Registration whose
  /// TeardownQp returned OK is no longer registered), kFailedPrecondition (shut down), or the
  /// device's error when it refused the error transition or the send marker (kInternal with errno
  /// on verbs; kResourceExhausted when the simulated CQ has no room): the registration stays as it
  /// was, the QP possibly in error, and TeardownQp may be tried again.
  Result<Teardown> TeardownQp(Registration& registration, const TeardownOptions& options = {});

  /// Engine-driven consumers: dispatches up to `max` queued items (completion runs and async
  /// events) to their handlers on the calling thread. Returns the number of entries it took off
  /// the queue: completions and events, counted also when they went to the orphan handler (their
  /// QP was unregistered meanwhile) and a teardown's markers, which reach no handler (so a
  /// positive count need not mean a handler ran; ConsumerStats::delivered counts those that
  /// did); -EINVAL if `consumer` is not an engine-driven consumer of this runtime, or -EBUSY
  /// at once when called from one of that consumer's own handlers (a handler may Drain another
  /// consumer), from an OrphanHandler or DeviceEventHandler on a runtime thread or the
  /// RuntimeOptions::log sink (the handlers' control calls would be refused there), or while
  /// another thread's Drain of the consumer is in progress (one thread at a time).
  int Drain(ConsumerId consumer, int max) noexcept;
  /// Returns a non-blocking fd that is readable while `consumer` has queued work, for the engine's
  /// epoll set (level- or edge-triggered). Valid until the runtime is destroyed.
  Result<int> NotifyFd(ConsumerId consumer);

  /// Engine-driven shards (RuntimeOptions::engine_shards): the engine's loop is the shard's
  /// poller. One engine thread at a time drives a shard (a call while another thread drives it
  /// returns 0 at once); it may be any thread, and a different one from call to call, except
  /// that one thread at a time sleeps on it: after TrySleepShard returned 1 or 2 to a thread, a
  /// PollShard or TrySleepShard of another thread wakes it (makes the fd readable) and returns 0
  /// until it has called again. Every guarantee of runtime-owned shards holds (order, events
  /// after completions, parking, capacity, TeardownQp, Unregister, Shutdown): control calls that
  /// need the shard (CreateCq, RegisterQp, Unregister, a teardown's end...) run their part on it
  /// themselves when no PollShard or TrySleepShard is in progress, else that call runs it before
  /// it returns (or, from one of the shard's handlers waiting for the runtime, while it waits).
  /// So no control call waits for the engine to come back: a shard that is not polled delays
  /// only its own completions (and, if it is shard 0, the events of watched rdma_cm channels
  /// that no registered QP's id takes: they are placed by shard 0's pass), and its teardowns end
  /// by their deadline. OrphanHandlers run inside
  /// these calls as on a poller (no control calls from them). Neither call may be made from a
  /// cqd handler or callback of any kind (they would nest one poller's pass inside another's
  /// batch): there they return -EBUSY.
  ///
  /// One step of the shard's poller: places posted async events, hands spilled entries to
  /// consumers that have room, polls the shard's CQs round robin for up to `budget` completions
  /// (at most poll_batch per CQ; a pass the budget cuts short resumes where it stopped) and
  /// routes them, then runs the shard's run-to-completion handlers inline, a few batches each.
  /// After Shutdown it runs those handlers on what they still hold, and then returns 0 for good.
  /// Returns > 0 if it did work, 0 if it found none (the value weighs the work, not a count of
  /// completions: each completion taken off a CQ adds one, and placing events, handing a spill
  /// over and each entry a hosted consumer dispatches from its queue add more, so a completion
  /// polled and then dispatched by a separate step counts twice, one run by the fused poll
  /// once), -EINVAL if `shard` is not an engine-driven shard of this runtime or
  /// `budget` < 1, -EBUSY from any cqd callback (a QpHandler, CmHandler, OrphanHandler,
  /// DeviceEventHandler, TeardownOptions::on_done or the log sink: InCallback()).
  int PollShard(int shard, int budget) noexcept;
  /// The sleep protocol (Seastar's try_enter_interrupt_mode). Arms the shard's CQs that are not
  /// armed, polls them once more (what that finds is routed, not dropped) and checks for posted
  /// work. Returns 1 when the engine may sleep until ShardFd(shard) is readable: from the arm on,
  /// a completion on any of the shard's CQs, an async event posted to it, an item queued for one
  /// of its run-to-completion consumers, a control call run on it, room freed by a full consumer
  /// the shard holds entries for, and Shutdown each make the fd readable, so no wakeup is lost.
  /// Returns 2 when it may sleep that way but for at most a millisecond (an epoll timeout),
  /// because something the fd cannot report needs a retry: an arm failed, or the shard's
  /// completion channel failed.
  /// Returns 0 when the engine must poll again: it found work, or another thread was driving (or
  /// sleeping on) the shard. Errors as PollShard. The engine may skip it and keep polling; asking
  /// twice in a row is harmless (0 if the fd was made readable in between).
  int TrySleepShard(int shard) noexcept;
  /// Returns the shard's fd (an eventfd, non-blocking) for the engine's epoll set: EPOLLIN, level-
  /// or edge-triggered. PollShard reads it; the engine must not. Valid until the runtime is
  /// destroyed. kInvalidArgument if `shard` is not an engine-driven shard.
  Result<int> ShardFd(int shard);

  /// Returns a snapshot of the counters (cqd/stats.h). Any thread; never blocks on the data
  /// path. From a runtime thread or the log sink it leaves out the CQs (they need the control
  /// mutex): Stats::cqs is empty and the cq_* totals are 0; every other field is filled.
  Stats GetStats() const;

  /// Ends every pending teardown (OK if drained, kUnavailable if its device failed, else
  /// kCancelled), then stops the event thread and
  /// the pollers (everything already polled is still delivered), and drains and stops owned
  /// consumers. Engine-driven consumers may Drain() what is left until the runtime is destroyed,
  /// and an engine-driven shard's PollShard() runs its run-to-completion handlers on what they
  /// still hold; the destructor hands anything still queued to the orphan handler. Idempotent.
  /// Blocks until the runtime's threads are joined (an engine-driven shard: until a PollShard or
  /// TrySleepShard in progress has returned); kFailedPrecondition at once from inside any cqd
  /// callback (whenever InCallback() is true: a handler, a CmHandler, TeardownOptions::on_done,
  /// an OrphanHandler, a DeviceEventHandler, the log sink) and from a poller or the event thread.
  Status Shutdown();

  /// Returns true when the calling thread is running a cqd callback of any runtime: a QpHandler
  /// the runtime calls (any consumer kind), TeardownOptions::on_done, an OrphanHandler, a
  /// DeviceEventHandler, a CmHandler or the RuntimeOptions::log sink. Layers that block
  /// (cqd/tbb.h) refuse their waits there. A cqd/tbb.h StrandConsumer's user handler is not one:
  /// a strand task calls it, outside the runtime's batch (false there; the strand's own waits are
  /// refused in its tasks all the same). Any thread; never blocks.
  static bool InCallback() noexcept;

 private:
  CQD_PRIVATE explicit Runtime(std::unique_ptr<internal::RuntimeImpl> impl);
  CQD_PRIVATE static Result<CqHandle> ToHandle(Result<internal::PolledCq> polled);
  CQD_PRIVATE Result<Registration> ToRegistration(Result<internal::RegisteredQp> registered);
  std::unique_ptr<internal::RuntimeImpl> impl_;
};

}  // namespace cqd

#endif  // CQD_RUNTIME_H_

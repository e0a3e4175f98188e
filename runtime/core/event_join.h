// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/event_join.h: an event on its way to one handler, and every way it can get there.
//
// The one home of EventJoin: where it is made (PostQpEvent; the CM router makes CM ones), how it
// travels (PostAlong: one part per shard of the registration's CQs, each behind what that shard
// took off those CQs first, so the consumer, which delivers the event when it has every part,
// gets it after them), how a part is released without delivery (DropEventPart), and how a CM
// event is handed on to its channel's CmHandler (PostToListener, HeldEvents). Whether a CM event
// whose last part arrived is delivered or handed on is its id's binding's call: CmEventGate is
// the interface, CmBinding (cm_router.h) the implementation, so a consumer needs no router.
//
// Threading: each function says who may call it. A join's fields are fixed once posted, except
// the atomics and what a gate guards with its lock (`next`, `left`).
#ifndef CQD_RUNTIME_CORE_EVENT_JOIN_H_
#define CQD_RUNTIME_CORE_EVENT_JOIN_H_

#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "cqd/handler.h"
#include "cqd/types.h"
#include "runtime/base/mutex.h"
#include "runtime/core/registry.h"
#include "runtime/core/route.h"

namespace cqd::internal {

class HeldEvents;
class Shard;
struct EventJoin;

// A watched rdma_event_channel (cm_router.h). Lives as long as the runtime, because joins in
// flight point at it; its fields are fixed once made except `unfinished`.
struct CmWatch {
  rdma_event_channel* channel = nullptr;
  CmHandler* handler = nullptr;
  uint32_t consumer = 0;
  Shard* poller = nullptr;     // listener events travel through it
  HeldEvents* held = nullptr;  // where they wait once the consumer has closed
  int64_t limit = 0;           // events read and not yet delivered, at most
  std::atomic<int64_t> unfinished{0};
};

// Decides, for a CM event routed to a registration, whether its consumer delivers it or it is
// handed on to the CmHandler, so that an id's events leave in the order they were read
// (cm_router.h, "One rule for handing on"). Implemented by CmBinding.
class CmEventGate {
 public:
  enum class Arrival { kDeliver, kDone };
  // The last part of `join` was released, by its consumer (`slot` is the registration's slot) or
  // by a thread dropping it (`slot` null). kDeliver: the registration is live (read seq_cst under
  // the gate's lock, as consumer.h requires before a handler call); the caller delivers to the
  // QP's handler, drops the route's hold and then calls Delivered(). kDone: handed on, or left
  // already; the caller drops the route's hold. Callers hold a reference to the gate across
  // these calls: a join may be freed inside.
  virtual Arrival Arrived(EventJoin* join, const Slot* slot) noexcept = 0;
  virtual void Delivered() noexcept = 0;
  // Runtime destruction: `join` (its last part released) leaves without being delivered.
  virtual void Drop(EventJoin* join) noexcept = 0;

 protected:
  ~CmEventGate() = default;
};

// One event for one registration, travelling as one part per shard of the QP's CQs (one, or two
// when its send and recv CQs are on different shards). Each part follows what its shard took
// off the CQs before it; the consumer delivers the event when it dequeues the last part, so
// after everything either shard had taken. Made by the event thread (or a teardown, for a
// LAST_WQE_REACHED stand-in).
//
// An async event or stand-in is freed by whoever releases its last part (the consumer, or a shard
// purging a dead registration's items). A CM event (kCm, kListener) has up to three holders at
// once: its binding's list (until it leaves, cm_router.h), its route's parts (until the last is
// released) and, once handed on to its channel's CmHandler, a listener item; `holds` counts them
// and the last to let go frees it.
struct EventJoin {
  enum class Kind : uint8_t {
    kAsync,           // `event` for QpHandler::OnAsyncEvent
    kLastWqeStandIn,  // a teardown's stand-in for LAST_WQE_REACHED: noted, never delivered
    kCm,              // `cm` for QpHandler::OnCmEvent (or, handed on, for the CmHandler of `watch`)
    kListener,        // `cm` for the CmHandler of `watch`
  };
  EventJoin() = default;
  EventJoin(const EventJoin&) = delete;
  EventJoin& operator=(const EventJoin&) = delete;
  ~EventJoin() { Finish(); }
  Kind kind = Kind::kAsync;
  AsyncEvent event;
  CmEvent cm;
  CmWatch* watch = nullptr;           // kCm, kListener: the channel the event came from
  std::shared_ptr<CmEventGate> gate;  // kCm: the id's binding (cm_router.h)
  std::atomic<int> parts{0};
  std::atomic<int> holds{0};  // kCm, kListener (see above)
  // kCm, guarded by the gate's lock: the binding's next event in read order; and whether this one
  // has left the binding (delivered to the QP's handler, or handed on).
  EventJoin* next = nullptr;
  bool left = false;
  EventJoin* next_held = nullptr;  // in HeldEvents
  // kAsync, kLastWqeStandIn: the slot's teardown_epoch if it was tearing down when the event was
  // posted, else 0. Only a LAST_WQE_REACHED posted during the teardown attempt still under way ends
  // its receive side: one posted earlier caught up on the CQs before that attempt's flush (and
  // before any completion added after it), so it proves nothing.
  uint32_t teardown_epoch = 0;
  // Returns true for the caller that released the last part.
  bool DropPart() noexcept { return parts.fetch_sub(1, std::memory_order_acq_rel) == 1; }
  // kCm, kListener: drops one hold; the last frees the join.
  static void DropHold(EventJoin* join) noexcept {
    if (join->holds.fetch_sub(1, std::memory_order_acq_rel) == 1) delete join;
  }
  // A CM event was delivered (or dropped): it no longer counts against its channel's read-ahead.
  // Called once, by the one thread that delivers it; the destructor calls it for events dropped.
  void Finish() noexcept;

 private:
  bool finished_ = false;
};

// CM events for CmHandlers whose consumer has closed (cm_router.h): they run, in the order they
// came, on a thread that handed one on, one thread at a time.
class HeldEvents {
 public:
  // Any thread, under any runtime lock: `join` (holding one hold) waits here.
  void Push(EventJoin* join) noexcept;
  // A thread that holds no runtime lock and is in no dispatch batch: runs the CmHandler of each
  // event held, unless another thread is doing so (that one runs them all). Returns at once when
  // none is held.
  void DeliverAll() noexcept;
  // The same, except on a thread inside a dispatch batch: there the outermost batch runs them
  // once it is over (Consumer::DeliverHeldEvents).
  void DeliverAllOrAfterBatch() noexcept;
  // Destruction: drops what is held.
  void DropAll() noexcept;

 private:
  Mutex mu_;
  EventJoin* first_ CQD_GUARDED_BY(mu_) = nullptr;  // linked by next_held
  EventJoin* last_ CQD_GUARDED_BY(mu_) = nullptr;
  bool delivering_ CQD_GUARDED_BY(mu_) = false;
  std::atomic<bool> any_{false};
};

// Posts `join` (parts unset) along `route`: one part per shard, each behind what that shard
// takes off the route's CQs first (see shard/spills.h). The consumer delivers it if the
// registration is still the routed one, and otherwise releases it (a CM event's gate hands it on to
// the CmHandler). A part a closed consumer refuses (after Shutdown) is released at once. Any
// thread.
void PostAlong(const EventRoute& route, EventJoin* join, const std::vector<Shard*>& pollers);

// Posts an async event (or, with `stand_in`, a teardown's stand-in for LAST_WQE_REACHED: the
// consumer only notes it for the slot's teardown, see teardown.h) along the route of the live
// registration of event.qp_num on `device` in `slot` (of `generation`, if given), as RouteQpEvent
// (route.h) decides; false if there is none, or memory ran out. Any thread.
bool PostQpEvent(const SlotPool& slots, const std::vector<Shard*>& pollers, uint32_t slot,
                 const AsyncEvent& event, DeviceId device, bool stand_in,
                 const uint32_t* generation = nullptr);

// Any thread: releases an event part without delivering it (its registration is gone). The last
// part of a CM event goes to its gate, which hands it on to the channel's CmHandler with the rest
// of its binding, unless `hand_on` is false (the runtime is being destroyed). Hands on to a
// closed consumer's CmHandler are held: the caller runs HeldEvents::DeliverAll once it holds no
// runtime lock.
void DropEventPart(EventJoin* join, bool hand_on = true) noexcept;

// Any thread: hands `join` (kCm or kListener) on to its channel's CmHandler, through the channel's
// shard, or into HeldEvents if the CmHandler's consumer has closed. Adds the hold it takes.
void PostToListener(EventJoin* join) noexcept;

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_EVENT_JOIN_H_

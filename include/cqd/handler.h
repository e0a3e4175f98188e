// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/handler.h: the callbacks an engine implements.
///
/// QpHandler receives one QP's completions, async events and (for a QP registered with its
/// rdma_cm_id) connection events on the consumer the QP was registered with. A handler never runs
/// on two threads at once and never runs after its Registration was unregistered (see runtime.h).
/// All callbacks are `noexcept`: an override that is not noexcept does not compile, so an exception
/// can never unwind through a poller or consumer.
#ifndef CQD_HANDLER_H_
#define CQD_HANDLER_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <span>

#include "cqd/version.h"

namespace cqd {

/// A device async event, copied out of `ibv_async_event` and acked before delivery (S13), so it
/// holds numbers rather than pointers to objects that may already be gone.
struct AsyncEvent {
  ibv_event_type type = IBV_EVENT_DEVICE_FATAL;  ///< what happened
  uint32_t qp_num = 0;  ///< QP events, and the per-QP copies of CQ_ERR and DEVICE_FATAL
  uint32_t cq_id = 0;   ///< CQ_ERR (and its per-QP copies): the runtime's CqHandle::id()
  uint32_t device = 0;  ///< the runtime's DeviceId
  int port_num = 0;     ///< port events
};

/// A connection-manager event, copied out of `rdma_cm_event` and acked before delivery, so that
/// the engine may rdma_destroy_id from its handler. `id` and `listen_id` are the engine's; the
/// runtime never dereferences them after the ack.
struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;  ///< what happened
  int status = 0;                   ///< rdma_cm_event::status (0, -errno, or a reject reason)
  rdma_cm_id* id = nullptr;         ///< the connection's id; for CONNECT_REQUEST the new one
  rdma_cm_id* listen_id = nullptr;  ///< CONNECT_REQUEST: the listening id it arrived on
  /// id->context when the event was read. The id may have been destroyed (and its address reused
  /// by a new id) by the time a CmHandler gets the event: give each id a context that is never
  /// reused (a connection serial, say) and match events by it, not by `id`.
  void* context = nullptr;
  uint32_t qp_num = 0;  ///< the registered QP it was routed to; 0 if none
  /// Connected port spaces (RDMA_PS_TCP, RDMA_PS_IB): connection parameters of CONNECT_REQUEST,
  /// CONNECT_RESPONSE, ESTABLISHED and REJECTED.
  /// conn.private_data is null: the bytes are copied into `private_data` below.
  rdma_conn_param conn{};
  /// UD port spaces (RDMA_PS_UDP, RDMA_PS_IPOIB): the remote QP number, qkey and address of a
  /// SIDR ESTABLISHED or a multicast join. ud.private_data is null, as above.
  rdma_ud_param ud{};
  uint8_t private_data_len = 0;    ///< bytes of private_data that the peer sent
  uint8_t private_data[255] = {};  ///< the private data, copied (at most 255 bytes)
};

/// What the runtime calls for one registered QP: its completions, its async events and its
/// connection events, on the QP's consumer (RuntimeOptions::consumers).
class QpHandler {
 public:
  virtual ~QpHandler() = default;
  /// Runs on the QP's consumer. `wcs` holds one or more completions of this QP in poll order; it is
  /// valid only during the call. For `status != IBV_WC_SUCCESS` only wr_id, status, qp_num and
  /// vendor_err are meaningful (S10).
  virtual void OnCompletions(std::span<const ibv_wc> wcs) noexcept = 0;
  /// Runs on the QP's consumer, after every completion of the QP that was in its CQs when the
  /// runtime read the event (so QP_FATAL, LAST_WQE_REACHED or DEVICE_FATAL mean "everything before
  /// has arrived").
  virtual void OnAsyncEvent(const AsyncEvent& event) noexcept { (void)event; }
  /// Runs on the QP's consumer, for a QP registered with RegisterQp(rdma_cm_id*, ...): the events
  /// of that id (ESTABLISHED, DISCONNECTED, errors) in the order they were read, each after every
  /// completion of the QP that was in its CQs when the runtime read it (so DISCONNECTED means
  /// "every completion polled before it has arrived"). Once the registration ends (Unregister, a
  /// teardown's end), the id's events not yet delivered here, and its later ones, go to the
  /// channel's CmHandler instead, in read order, after this handler has returned from the id's
  /// last event it got: no connection event is dropped or reordered.
  virtual void OnCmEvent(const CmEvent& event) noexcept { (void)event; }
};

/// Takes the connection events of a watched rdma_event_channel that belong to no registered QP:
/// CONNECT_REQUEST on a listener, ADDR_RESOLVED and ROUTE_RESOLVED, errors before a QP is
/// registered, and events of an id whose registration has ended (TIMEWAIT_EXIT after a teardown).
/// Runs on the consumer given to Runtime::WatchCmChannel, so, like a QpHandler, it may call the
/// runtime (create, register and accept a QP for a CONNECT_REQUEST).
///
/// Events of one id arrive in the order they were read, whatever ended the id's registration:
/// when it ends, the id's events still on their way to the QP's consumer (queued there, even on a
/// consumer that never drains again, or held in a poller's spill) are handed on here at once, in
/// order, after the QP's handler returned from the id's event it was delivering, if any; later
/// ones follow. Events of different ids may interleave differently from their read order, and
/// so may those of an id registered again (its new QP handler may get the new registration's
/// first events before this handler gets the old one's last). An ended registration never
/// routes a new id that got the destroyed id's address: CONNECT_REQUEST and address and route
/// resolution events always come here.
///
/// Never runs on two threads at once. None is dropped before the runtime is destroyed: once
/// Shutdown has stopped an owned consumer, events handed on to its CmHandler run on a thread that
/// handed one on (an engine thread in Drain, after the batch, or at the end of
/// Registration::Unregister; during Shutdown, a consumer or run-to-completion poller dispatching
/// its last items), one thread at a time, in the order they were handed on. "Read order" is per
/// channel: an id moved to another channel (rdma_migrate_id) has its events handed on to each
/// channel's CmHandler as read from it.
class CmHandler {
 public:
  virtual ~CmHandler() = default;
  /// Takes one event of the channel (see the class comment for the thread and the order).
  virtual void OnCmEvent(const CmEvent& event) noexcept = 0;
};

/// Takes completions that no handler may receive: an unknown qp_num, a QP unregistered while its
/// completions were queued or still in its CQs, or a retired QP's completions polled after a new
/// QP took its number (so that, for example, SRQ receive buffers can be recycled). A teardown's
/// own marker work requests never reach it: the runtime takes them. May be called concurrently
/// from any thread that polls or dispatches: it must be thread-safe. Those are the pollers, the
/// consumer threads, an engine's thread inside Drain, PollShard or TrySleepShard, and also the
/// thread of a control call (Unregister, DestroyCq, RegisterQp, ...) that does a poller's work in
/// its place (on an engine-driven shard nobody drives at that moment, or once the poller has
/// stopped), and the thread that destroys the runtime (what engine-driven queues still hold): so
/// it must not take a lock that a thread making a control call may hold. Where it does a poller's
/// work it must not call the runtime: control calls there return FAILED_PRECONDITION and
/// Registration::Unregister does nothing (hand such work to another thread).
class OrphanHandler {
 public:
  virtual ~OrphanHandler() = default;
  /// Takes `wcs`, completions no handler may receive (never a teardown's own marker).
  virtual void OnOrphans(std::span<const ibv_wc> wcs) noexcept = 0;
};

/// Takes device-level async events (port, SRQ, CQ_ERR, DEVICE_FATAL, and QP events of QPs that are
/// not registered) on the runtime's event thread. It must not block for long: it delays every
/// other event. Like an OrphanHandler on a poller, it must not call the runtime.
class DeviceEventHandler {
 public:
  virtual ~DeviceEventHandler() = default;
  /// Takes one device-level event, on the event thread.
  virtual void OnDeviceEvent(const AsyncEvent& event) noexcept = 0;
};

}  // namespace cqd

#endif  // CQD_HANDLER_H_

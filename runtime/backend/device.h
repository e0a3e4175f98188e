// SPDX-License-Identifier: BSD-2-Clause
// runtime/backend/device.h: the narrow seam between the runtime and a verbs implementation.
//
// Two implementations: the simulated device (sim_device.h) and libibverbs. Every call mirrors one
// verbs call and keeps its contract (docs/DESIGN.md rules S1-S14); the conformance suite checks
// both. Objects are owned by their Device, as verbs objects are owned by their context: create and
// destroy through the Device. The hot-path calls (Cq::Poll, Cq::RequestNotify) are one virtual
// call per batch, next to the indirect call ibv_poll_cq itself makes.
//
// Threading: as verbs. Poll and RequestNotify of one Cq come from one thread at a time (its
// poller); GetEvent and GetAsyncEvent may block unless their fd is O_NONBLOCK; the rest is
// thread-safe.
#ifndef CQD_RUNTIME_BACKEND_DEVICE_H_
#define CQD_RUNTIME_BACKEND_DEVICE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cqd/status.h"

namespace cqd::backend {

// Returns true for the async event types that name a QP (S14).
inline bool IsQpEvent(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

// Returns true for the async event types that name a port (S14).
inline bool IsPortEvent(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_GID_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
      return true;
    default:
      return false;
  }
}

class Cq {
 public:
  virtual ~Cq() = default;
  // Returns the backend's own CQ (ibv_cq* or SimCq*): the key GetEvent hands back.
  virtual void* native() const noexcept = 0;
  // S9: returns the number of completions written to `wc` (0..n), or a negative errno.
  virtual int Poll(int n, ibv_wc* wc) noexcept = 0;
  // S6-S8: asks for one event on the next (or next solicited) completion; 0 or a positive errno.
  virtual int RequestNotify(bool solicited_only) noexcept = 0;
  // Returns the number of completions the CQ holds (ibv_cq::cqe: at least what was asked).
  virtual int depth() const noexcept = 0;
  // As ibv_resize_cq: grows the CQ to hold at least `depth`. Call only while nobody polls it.
  virtual Status Resize(int depth) = 0;
};

// What StartQpFlush posted.
enum class FlushStart {
  kAllMarkers,          // the send marker, and the receive marker unless the QP uses an SRQ
  kSendMarkerOnly,      // the receive queue had no room for its marker: RedriveFlush posts it
  kNothingOutstanding,  // the QP was in RESET: no work can be outstanding, nothing was posted
};

// What a QP may have outstanding (ibv_query_qp's caps) and whether it receives from an SRQ.
struct QpCaps {
  int max_send_wr = 0;
  int max_recv_wr = 0;
  bool srq = false;
  bool in_error = false;  // the QP is in the error state
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual void* native() const noexcept = 0;  // ibv_comp_channel* or SimChannel*
  virtual int fd() const noexcept = 0;
  // S1/S4: returns 0 and sets *native_cq to the CQ of the next event, or -1 with errno set
  // (EAGAIN when the fd is O_NONBLOCK and no event is pending; EINTR).
  virtual int GetEvent(void** native_cq) noexcept = 0;
};

// One async event between GetAsyncEvent and AckAsyncEvent (S13): the fields are copied out on
// get, so nothing here points at an object that may be destroyed after the ack. What the backend
// needs for the ack it keeps in the record (Keep, Kept); the core never reads it.
struct AsyncEventRecord {
  ibv_event_type type = IBV_EVENT_DEVICE_FATAL;
  uint32_t qp_num = 0;        // QP events
  void* native_cq = nullptr;  // CQ_ERR
  int port_num = 0;           // port events

  // Backend only: stores `value` in the record, for its AckAsyncEvent.
  template <typename T>
  void Keep(const T& value) noexcept {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(backend_data_));
    std::memcpy(backend_data_, &value, sizeof(T));
  }
  // Backend only: returns what Keep stored.
  template <typename T>
  T Kept() const noexcept {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(backend_data_));
    T value;
    std::memcpy(&value, backend_data_, sizeof(T));
    return value;
  }

 private:
  alignas(8) unsigned char backend_data_[32] = {};
};

// Which implementation a Device is. The core never branches on it: the facade uses it to check
// that what an engine hands in (an ibv_cq* or a SimCq*) is of the device's kind.
enum class Kind : uint8_t { kVerbs, kSim };

class Device {
 public:
  virtual ~Device() = default;
  virtual const std::string& name() const = 0;
  virtual Kind kind() const noexcept = 0;
  // Returns the object the engine knows the device by (ibv_context* or SimDevice*).
  virtual void* native() const noexcept = 0;
  // Returns the device's completion vectors (ibv_context::num_comp_vectors; 1 when simulated).
  virtual int comp_vectors() const noexcept = 0;
  // Returns true when /sys/class/infiniband/<name()> describes the device (its NUMA node).
  virtual bool in_sysfs() const noexcept = 0;

  virtual Result<Channel*> CreateChannel() = 0;
  // Fails while CQs still use the channel.
  virtual Status DestroyChannel(Channel* channel) = 0;
  // `comp_vector`: as ibv_create_cq's (the simulated device has one vector and ignores it).
  virtual Result<Cq*> CreateCq(int depth, Channel* channel, int comp_vector) = 0;
  Result<Cq*> CreateCq(int depth, Channel* channel) { return CreateCq(depth, channel, 0); }
  // Wraps a CQ the engine created; kInvalidArgument unless it belongs to this device and uses
  // `channel`.
  virtual Result<Cq*> AdoptCq(void* native_cq, Channel* channel) = 0;
  // Forgets an adopted CQ without destroying it.
  virtual void ReleaseCq(Cq* cq) = 0;
  // S2: blocks until every event read for the CQ has been acked; then destroys it.
  virtual Status DestroyCq(Cq* cq) = 0;
  // S2/S3: acknowledges `n` events of `cq` in one call (takes a lock).
  virtual void AckCqEvents(Cq* cq, unsigned n) noexcept = 0;
  // Acknowledges one event read for a CQ that has no Cq wrapper here (a CQ the engine put on a
  // runtime channel without adopting it): unacked, it would hang the engine's destroy (S2).
  virtual void AckNativeCqEvent(void* native_cq) noexcept = 0;

  // Returns the QP's caps; `native_qp` is an ibv_qp* or SimQp* of this device.
  virtual Result<QpCaps> QueryQp(void* native_qp) = 0;
  // Moves the QP to the error state (S10: everything outstanding flushes) and posts a signaled
  // marker work request behind it on the send queue (wr_id `send_marker`) and, unless the QP
  // uses an SRQ, on the receive queue (`recv_marker`). Each marker needs a free slot in its
  // queue. Returns what was posted, or an error when nothing was.
  virtual Result<FlushStart> StartQpFlush(void* native_qp, uint64_t send_marker,
                                          uint64_t recv_marker) = 0;
  // A flush whose markers have not come back: moves the QP (in the error state) to the error
  // state again, which flushes what was posted in it since (rxe flushes a receive posted in error
  // only then), after posting the receive marker first if `recv_marker` is not 0 (it found no
  // room at StartQpFlush). OK once done; kResourceExhausted while the receive queue is still
  // full (its flushes free it), with nothing posted.
  virtual Status RedriveFlush(void* native_qp, uint64_t recv_marker) = 0;

  virtual int async_fd() const noexcept = 0;
  // S12: returns 0 and fills *out, or -1 with errno set (EAGAIN when O_NONBLOCK, EINTR).
  virtual int GetAsyncEvent(AsyncEventRecord* out) noexcept = 0;
  // S13: acknowledges an event from GetAsyncEvent.
  virtual void AckAsyncEvent(AsyncEventRecord* record) noexcept = 0;
};

}  // namespace cqd::backend

#endif  // CQD_RUNTIME_BACKEND_DEVICE_H_

// SPDX-License-Identifier: BSD-2-Clause
// tests/rxe/cm_bed.h: what the rdma_cm tests on rxe share. A CmBed has a server and a client CM
// channel, a listening id bound to the device's address (not yet listening), a runtime on that
// device (librdmacm's context) with a PD, registered buffers and one CQ per poller; a
// RecordingCmHandler records what a channel's CmHandler got, and a CmConn what one connection's
// QP handler got.
//
// Server and client share the one device: rdma_cm loops back over its address, $CQD_RDMA_ADDR,
// default the VM's 10.0.2.15.
#ifndef CQD_TESTS_RXE_CM_BED_H_
#define CQD_TESTS_RXE_CM_BED_H_

#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cqd/runtime.h"
#include "tools/rdma/verbs_util.h"

namespace cqd::rxe {

// Returns $CQD_RDMA_ADDR, or the VM's address 10.0.2.15.
const char* CmAddress();

// Records the events a channel's CmHandler got, in arrival order, and runs `react` for each on
// its consumer. Reads are safe from any thread.
class RecordingCmHandler : public CmHandler {
 public:
  struct Seen {
    rdma_cm_event_type type;
    rdma_cm_id* id;
    void* context;
  };
  void OnCmEvent(const CmEvent& event) noexcept override;
  std::vector<Seen> seen() const;
  std::vector<rdma_cm_event_type> types() const;
  std::vector<void*> contexts() const;
  bool Saw(rdma_cm_event_type type) const;
  // The types seen, as rdma_event_str names separated by spaces.
  std::string Names() const;

  std::function<void(const CmEvent&)> react;  // set before events can come

 private:
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
};

// One connection's QP handler: records each CM event (with how many successful completions had
// arrived before it) and the wr_ids of its completions, then runs `on_event`. Given `per_batch`,
// it is a slow consumer: each OnCompletions call first sleeps that long. Reads are safe from any
// thread.
class CmConn : public QpHandler {
 public:
  struct Seen {
    rdma_cm_event_type type;
    int status;
    uint32_t qp_num;
    int successes_before;
  };
  explicit CmConn(std::chrono::microseconds per_batch = {}) : per_batch_(per_batch) {}
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;
  std::vector<Seen> seen() const;
  std::vector<CmEvent> events() const;   // the events themselves, in arrival order
  std::vector<uint64_t> wr_ids() const;  // every completion's, in delivery order
  bool Saw(rdma_cm_event_type type) const;
  int successes() const { return successes_.load(std::memory_order_acquire); }

  // Set while no event of this QP can come (before it connects, or while only the test thread
  // drains its consumer).
  std::function<void(const CmEvent&)> on_event;
  Registration registration;  // touched on its consumer, then by the test
  Teardown teardown;

 private:
  const std::chrono::microseconds per_batch_;
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
  std::vector<CmEvent> events_;
  std::vector<uint64_t> wr_ids_;
  std::atomic<int> successes_{0};
};

class CmBed {
 protected:
  // Makes the channels and the listening id, then the runtime with `options` on the id's device,
  // a PD, `buffer_slots` registered 64-byte buffers and a CQ per shard (options.pollers). Call
  // with ASSERT_NO_FATAL_FAILURE.
  void StartBed(const RuntimeOptions& options, int buffer_slots);
  // Once the test's own ids are gone: destroys the listening id, the CQs (each must succeed when
  // `expect_cqs_destroyed`), the buffers, the PD, the runtime and the channels.
  void StopBed(bool expect_cqs_destroyed);
  // Gives `id` a QP made with `attr` in pd_, posts `recvs` receives (buffer i as wr_id i) and
  // registers it with its id for `handler` on `consumer` into *registration. False (and a test
  // failure) if any step fails.
  bool MakeCmQp(rdma_cm_id* id, ibv_qp_init_attr attr, int recvs, QpHandler& handler,
                ConsumerId consumer, Registration* registration);

  std::unique_ptr<Runtime> rt_;
  DeviceId dev_ = 0;
  rdma_event_channel* server_channel_ = nullptr;
  rdma_event_channel* client_channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  sockaddr_in server_addr_{};  // the listening id's address and port
  ibv_pd* pd_ = nullptr;
  Buffers buffers_;
  std::vector<CqHandle> cqs_;  // one per shard
};

}  // namespace cqd::rxe

#endif  // CQD_TESTS_RXE_CM_BED_H_

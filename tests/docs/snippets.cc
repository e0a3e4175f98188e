// SPDX-License-Identifier: BSD-2-Clause
// tests/docs/snippets.cc: the C++ blocks of the README and docs/, compiled.
//
// Each block a document shows sits here between "// [snippet NAME]" and "// [end NAME]", in the
// context it needs (the variables it uses, declared before it). The document marks the block
// with "<!-- snippet NAME -->" on the line before its ```cpp fence. snippets_test.sh checks that
// every C++ block of the documents is marked and equals its region here (less the region's
// indentation), and compiles this file with g++ and clang++ under -Wall -Wextra -Werror. Nothing
// here runs: the blocks need an RDMA device.
#include <infiniband/verbs.h>
#include <oneapi/tbb/task_arena.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>

#include <cstdint>
#include <memory>
#include <span>

#include "cqd/runtime.h"
#include "cqd/tbb.h"

namespace snippets {

// [snippet handler]
class MyHandler : public cqd::QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) {
      if (wc.status != IBV_WC_SUCCESS) {  // only wr_id, status, qp_num, vendor_err are valid
        Fail(wc.wr_id, wc.status);        // e.g. IBV_WC_WR_FLUSH_ERR during a teardown
        continue;
      }
      if (wc.opcode & IBV_WC_RECV)
        OnMessage(wc.wr_id, wc.byte_len);
      else
        OnSent(wc.wr_id);
    }
  }
  void OnAsyncEvent(const cqd::AsyncEvent& event) noexcept override {
    if (event.type == IBV_EVENT_QP_FATAL) broken_ = true;  // every completion before it came first
  }

 private:
  void Fail(uint64_t wr_id, ibv_wc_status status);
  void OnMessage(uint64_t wr_id, uint32_t bytes);
  void OnSent(uint64_t wr_id);
  bool broken_ = false;
};
// [end handler]

void MyHandler::Fail(uint64_t, ibv_wc_status) {}
void MyHandler::OnMessage(uint64_t, uint32_t) {}
void MyHandler::OnSent(uint64_t) {}

void MinimalEngine() {
  // [snippet minimal-engine]
  cqd::RuntimeOptions options;
  options.pollers = 2;
  options.consumers = {cqd::ConsumerOptions{}, cqd::ConsumerOptions{}};
  auto rt = cqd::Runtime::Create(options).value();  // failed: prints the Status, aborts
  cqd::DeviceId dev = rt->OpenVerbsDevice("rxe0").value();
  ibv_pd* pd = ibv_alloc_pd(rt->VerbsContext(dev).value());
  cqd::CqHandle cq = rt->CreateCq(dev, /*shard=*/0, {.depth = 4096}).value();
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq.verbs();
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 64;  // leave room for a teardown's markers
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  ibv_qp* qp = ibv_create_qp(pd, &attr);
  MyHandler handler;  // : cqd::QpHandler, below
  cqd::Registration reg = rt->RegisterQp(qp, handler, /*consumer=*/1).value();
  // connect, post: completions for qp now reach handler.OnCompletions on consumer 1
  cqd::Teardown done = rt->TeardownQp(reg).value();  // error state, flush, then unregister
  cqd::Status drained = done.Wait();                 // OK: every flushed completion handled
  ibv_destroy_qp(qp);
  cqd::Status destroyed = rt->DestroyCq(cq);  // what is left goes to the orphan handler; destroys
  // [end minimal-engine]
  (void)drained;
  (void)destroyed;
}

int engine_work();
bool engine_may_sleep();

void EngineDrivenShard(int i, int ep) {
  cqd::RuntimeOptions options;
  epoll_event events[64];
  // [snippet engine-shard]
  options.pollers = 2;             // one shard per reactor thread
  options.engine_shards = {0, 1};  // no cqd poller threads for them
  options.consumers = {{.kind = cqd::ConsumerKind::kRunToCompletion, .poller = 0},
                       {.kind = cqd::ConsumerKind::kRunToCompletion, .poller = 1}};
  auto rt = cqd::Runtime::Create(options).value();
  // devices, CQs and QPs as above; then reactor thread i, whose epoll set `ep` holds
  // rt->ShardFd(i).value() beside its timers and eventfds:
  for (;;) {
    int work = rt->PollShard(i, /*budget=*/64) + engine_work();  // handlers run inline here
    if (work > 0) continue;
    int verdict = rt->TrySleepShard(i);  // 1: sleep; 2: sleep at most 1 ms; 0: poll again
    if (verdict > 0 && engine_may_sleep()) epoll_wait(ep, events, 64, verdict == 1 ? -1 : 1);
  }
  // [end engine-shard]
}

void CmSetup(cqd::Runtime* rt, cqd::CmHandler& listener, sockaddr* addr) {
  // [snippet cm-setup]
  rdma_event_channel* channel = rdma_create_event_channel();
  cqd::Status watched = rt->WatchCmChannel(channel, listener, /*consumer=*/0);  // a CmHandler
  rdma_cm_id* listen_id = nullptr;
  rdma_create_id(channel, &listen_id, nullptr, RDMA_PS_TCP);
  rdma_bind_addr(listen_id, addr);                                   // the device: listen_id->verbs
  cqd::DeviceId dev = rt->AddVerbsDevice(listen_id->verbs).value();  // librdmacm's context
  rdma_listen(listen_id, 128);
  // [end cm-setup]
  (void)watched;
  (void)dev;
}

struct Conn : cqd::QpHandler {
  explicit Conn(cqd::Runtime& rt) : rt_(rt) {}
  void OnCompletions(std::span<const ibv_wc>) noexcept override {}
  void OnCmEvent(const cqd::CmEvent& event) noexcept override;
  cqd::Runtime& rt_;
  cqd::Registration reg;
  cqd::Teardown teardown;
};

struct Listener : cqd::CmHandler {
  Listener(cqd::Runtime& rt, ibv_pd* pd, const ibv_qp_init_attr& attr)
      : rt_(rt), pd_(pd), attr_(attr) {}
  void OnCmEvent(const cqd::CmEvent& event) noexcept override;
  cqd::Runtime& rt_;
  ibv_pd* pd_;
  ibv_qp_init_attr attr_;
};

// [snippet cm-handlers]
void Listener::OnCmEvent(const cqd::CmEvent& event) noexcept {  // on consumer 0
  if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;
  Conn* conn = new Conn(rt_);             // the engine's connection table owns it
  rdma_create_qp(event.id, pd_, &attr_);  // attr_.send_cq = cq.verbs(), ...
  conn->reg = rt_.RegisterQp(event.id, *conn, /*consumer=*/1).value();  // before accepting
  rdma_conn_param param{};
  rdma_accept(event.id, &param);
}

// On the connection's consumer, after every completion polled before the event:
void Conn::OnCmEvent(const cqd::CmEvent& event) noexcept {
  if (event.type != RDMA_CM_EVENT_DISCONNECTED) return;
  rdma_disconnect(event.id);               // answer the peer
  teardown = rt_.TeardownQp(reg).value();  // flush, deliver, unregister
}
// [end cm-handlers]

void Strands(cqd::Runtime* rt, cqd::DeviceId dev, ibv_qp* qp, MyHandler& handler) {
  // [snippet tbb-strands]
  tbb::task_arena arena(cqd::ArenaConstraintsFor(*rt, dev, 4).value());  // near the NIC's node
  cqd::StrandConsumerOptions options;
  options.consumer = 2;  // an engine-driven consumer
  auto strands = cqd::StrandConsumer::Create(*rt, arena, options).value();
  cqd::StrandRegistration reg = strands->RegisterQp(qp, handler).value();
  // handler.OnCompletions runs on arena workers, one call at a time for this QP
  auto teardown = strands->TeardownQp(reg, {.on_done = [](const cqd::Status&) {}});
  cqd::Status shut = rt->Shutdown();
  cqd::Status stopped = strands->Stop();  // delivers what was polled
  // [end tbb-strands]
  (void)teardown;
  (void)shut;
  (void)stopped;
}

}  // namespace snippets

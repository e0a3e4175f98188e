// SPDX-License-Identifier: BSD-2-Clause
#include "examples/common/cm_util.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cqd::examples {

Flags::Flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      values_[arg.substr(2)] = "true";
    } else {
      values_[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
    }
  }
}

std::string Flags::Str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

long Flags::Int(const std::string& name, long fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : strtol(it->second.c_str(), nullptr, 10);
}

bool MakeAddress(const std::string& host, uint16_t port, sockaddr_in* out) {
  *out = sockaddr_in{};
  out->sin_family = AF_INET;
  out->sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) != 1) {
    fprintf(stderr, "not an IPv4 address: %s\n", host.c_str());
    return false;
  }
  return true;
}

rdma_cm_id* Listen(rdma_event_channel* channel, const sockaddr_in& addr, int backlog) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return nullptr;
  }
  sockaddr_in bind_to = addr;
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&bind_to)) != 0 ||
      rdma_listen(id, backlog) != 0) {
    perror("rdma_bind_addr/rdma_listen");
    rdma_destroy_id(id);
    return nullptr;
  }
  return id;
}

Region::~Region() {
  if (mr != nullptr) ibv_dereg_mr(mr);
  free(data);
}

bool Region::Register(ibv_pd* pd, size_t bytes, int access) {
  data = static_cast<char*>(aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (data == nullptr) return false;
  memset(data, 0, bytes);
  size = bytes;
  mr = ibv_reg_mr(pd, data, bytes, access);
  if (mr == nullptr) perror("ibv_reg_mr");
  return mr != nullptr;
}

bool CreateQp(rdma_cm_id* id, ibv_pd* pd, const CqHandle& cq, const QpShape& shape) {
  if (id->verbs != pd->context) {
    fprintf(stderr, "the connection is on device %s, not on %s (pick it with --device)\n",
            ibv_get_device_name(id->verbs->device), ibv_get_device_name(pd->context->device));
    return false;
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = cq.verbs();
  attr.recv_cq = cq.verbs();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = shape.send_wrs;
  attr.cap.max_recv_wr = shape.recv_wrs;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = shape.inline_bytes;
  if (rdma_create_qp(id, pd, &attr) != 0) {
    perror("rdma_create_qp");
    return false;
  }
  return true;
}

Engine::~Engine() {
  runtime.reset();  // first: it polls the CQs of this context and reads the channel
  if (channel != nullptr) rdma_destroy_event_channel(channel);
  if (pd != nullptr) ibv_dealloc_pd(pd);
  if (devices != nullptr) rdma_free_devices(devices);
}

bool Engine::Start(const RuntimeOptions& options, int cq_depth, const std::string& name) {
  int count = 0;
  devices = rdma_get_devices(&count);
  for (int i = 0; i < count && context == nullptr; ++i) {
    if (name.empty() || name == ibv_get_device_name(devices[i]->device)) context = devices[i];
  }
  if (context == nullptr) {
    fprintf(stderr, "no RDMA device%s%s among librdmacm's %d\n", name.empty() ? "" : " named ",
            name.c_str(), count);
    if (count == 0) {
      fprintf(stderr,
              "this machine has no RDMA device: load rdma_rxe and add a soft-RoCE one over an "
              "Ethernet interface (rdma link add rxe0 type rxe netdev eth0); see docs/RXE.md\n");
    }
    return false;
  }
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    fprintf(stderr, "%s\n", rt.status().ToString().c_str());
    return false;
  }
  runtime = std::move(rt).value();
  auto dev = runtime->AddVerbsDevice(context);
  if (!dev.ok()) {
    fprintf(stderr, "%s\n", dev.status().ToString().c_str());
    return false;
  }
  device = *dev;
  pd = ibv_alloc_pd(context);
  if (pd == nullptr) {
    perror("ibv_alloc_pd");
    return false;
  }
  for (int shard = 0; shard < options.pollers; ++shard) {
    CqOptions cq_options;
    cq_options.depth = cq_depth;
    auto cq = runtime->CreateCq(device, shard, cq_options);
    if (!cq.ok()) {
      fprintf(stderr, "%s\n", cq.status().ToString().c_str());
      return false;
    }
    cqs.push_back(*cq);
  }
  return true;
}

bool Engine::WatchCm(CmHandler& handler, ConsumerId consumer) {
  channel = rdma_create_event_channel();
  if (channel == nullptr) {
    perror("rdma_create_event_channel");
    return false;
  }
  if (Status s = runtime->WatchCmChannel(channel, handler, consumer); !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return false;
  }
  return true;
}

bool CloseConnection(Runtime& runtime, rdma_cm_id* id, Registration& registration) {
  bool drained = true;
  if (registration.registered()) {
    rdma_disconnect(id);
    auto teardown = runtime.TeardownQp(registration);
    Status status = teardown.ok() ? teardown->Wait() : teardown.status();
    if (!status.ok()) {
      fprintf(stderr, "teardown of qp %u: %s\n", id->qp->qp_num, status.ToString().c_str());
      registration.Unregister();
      drained = false;
    }
  }
  if (id->qp != nullptr) rdma_destroy_qp(id);
  rdma_destroy_id(id);
  return drained;
}

bool PostRecv(ibv_qp* qp, const Region& region, const char* addr, uint32_t bytes, uint64_t wr_id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(addr), bytes, region.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad) == 0;
}

bool PostKeepalive(ibv_qp* qp, uint64_t wr_id) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.num_sge = 0;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad) == 0;
}

}  // namespace cqd::examples

// SPDX-License-Identifier: BSD-2-Clause
#include "examples/common/cm_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cqd/version.h"

namespace cqd::examples {

Flags::Flags(int argc, char** argv, const char* usage, std::vector<FlagSpec> specs) {
  program_ = argc > 0 ? argv[0] : "example";
  program_ = program_.substr(program_.rfind('/') + 1);
  auto fail = [&](const std::string& why) {
    fprintf(stderr, "%s: %s (see %s --help)\n", program_.c_str(), why.c_str(), program_.c_str());
    exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--version") {
      printf("%s (cqd) %s\n", program_.c_str(), Version().string);
      exit(0);
    }
    if (arg == "--help" || arg == "-h") {
      printf("%s\n\nflags:\n", usage);
      for (const FlagSpec& f : specs) {
        const std::string left =
            "--" + std::string(f.name) + (f.value != nullptr ? "=" + std::string(f.value) : "");
        printf("  %-28s %s\n", left.c_str(), f.help);
      }
      printf("  %-28s %s\n", "--help", "prints this and exits");
      printf("  %-28s %s\n", "--version", "prints the cqd version and exits");
      exit(0);
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) fail("unexpected argument \"" + arg + "\"");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : specs) {
      if (name == f.name) spec = &f;
    }
    if (spec == nullptr) fail("unknown flag --" + name);
    if (spec->value == nullptr) {
      if (eq != std::string::npos) fail("--" + name + " is a switch and takes no value");
      values_[name] = "true";
      continue;
    }
    if (eq == std::string::npos) {
      fail("--" + name + " needs a value: --" + name + "=" + spec->value);
    }
    const std::string value = arg.substr(eq + 1);
    if (spec->min <= spec->max) {
      const bool digits = !value.empty() && value.find_first_not_of(
                                                "0123456789", value[0] == '-') == std::string::npos;
      if (!digits) {
        fail("--" + name + "=" + value + ": expected a whole number from " +
             std::to_string(spec->min) + " to " + std::to_string(spec->max));
      }
      errno = 0;
      char* end = nullptr;
      const long number = strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || number < spec->min || number > spec->max) {
        fail("--" + name + "=" + value + ": expected a whole number from " +
             std::to_string(spec->min) + " to " + std::to_string(spec->max));
      }
    }
    values_[name] = value;
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

namespace {
volatile sig_atomic_t stop_requested = 0;
}  // namespace

void InstallStopSignals() {
  struct sigaction action {};
  action.sa_handler = [](int signo) {
    stop_requested = 1;
    (void)signo;
    signal(SIGINT, SIG_DFL);  // the next one, of either kind, kills
    signal(SIGTERM, SIG_DFL);
  };
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopRequested() { return stop_requested != 0; }

bool ResolveAddress(const std::string& host, uint16_t port, bool passive, sockaddr_storage* out) {
  *out = sockaddr_storage{};
  if (host.empty()) {
    fprintf(stderr, "no address given\n");
    return false;
  }
  rdma_addrinfo hints{};
  hints.ai_flags = passive ? RAI_PASSIVE : 0;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  errno = 0;
  const int rc = rdma_getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    // rdma_getaddrinfo returns getaddrinfo's EAI_* code, or -1 with errno set.
    const int error = errno;
    fprintf(stderr, "cannot resolve \"%s\": %s\n", host.c_str(),
            rc == -1 || rc == EAI_SYSTEM ? strerror(error) : gai_strerror(rc));
    if ((rc == -1 || rc == EAI_SYSTEM) && error == ENODEV) {
      // librdmacm resolves through an RDMA device: none is there, or none is up.
      fprintf(stderr,
              "  librdmacm found no RDMA device to resolve it with: load rxe (docs/RXE.md) or "
              "check `rdma link`\n");
    }
    if (found != nullptr) rdma_freeaddrinfo(found);
    return false;
  }
  const sockaddr* addr = passive ? found->ai_src_addr : found->ai_dst_addr;
  const socklen_t len = passive ? found->ai_src_len : found->ai_dst_len;
  const bool ok = addr != nullptr && len <= sizeof(*out);
  if (ok) memcpy(out, addr, len);
  rdma_freeaddrinfo(found);
  if (!ok) fprintf(stderr, "cannot resolve \"%s\": no address\n", host.c_str());
  return ok;
}

std::string AddressText(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof(text));
    port = ntohs(a.sin6_port);
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
  inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  port = ntohs(a.sin_port);
  return std::string(text) + ":" + std::to_string(port);
}

rdma_cm_id* Listen(rdma_event_channel* channel, const sockaddr_storage& addr, int backlog) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return nullptr;
  }
  sockaddr_storage bind_to = addr;
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&bind_to)) != 0 ||
      rdma_listen(id, backlog) != 0) {
    fprintf(stderr, "cannot listen on %s: %s\n", AddressText(addr).c_str(), strerror(errno));
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

bool CloseConnection(Runtime& runtime, rdma_cm_id* id, Registration& registration, bool* late) {
  bool drained = true;
  if (registration.registered()) {
    rdma_disconnect(id);
    auto teardown = runtime.TeardownQp(registration);
    Status status = teardown.ok() ? teardown->Wait() : teardown.status();
    if (status.code() == StatusCode::kDeadlineExceeded && late != nullptr) {
      *late = true;
    } else if (!status.ok()) {
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

bool CaughtUp(const Stats& stats, ConsumerId consumer) {
  if (consumer >= stats.consumers.size()) return true;
  const ConsumerStats& c = stats.consumers[consumer];
  return c.queue_depth == 0 && c.spill_depth == 0;
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

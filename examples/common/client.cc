// SPDX-License-Identifier: BSD-2-Clause
#include "examples/common/client.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "examples/common/stats_out.h"

namespace cqd::examples {

bool ClientEngine::Start(const char* name, const Flags& flags, uint16_t default_port) {
  program = name;
  RuntimeOptions options;
  options.pollers = static_cast<int>(flags.Int("pollers", 2));
  consumers = static_cast<int>(flags.Int("consumers", 2));
  options.consumers.resize(consumers);
  if (!flags.Has("server")) {
    fprintf(stderr, "%s: --server=HOST is required (see %s --help)\n", name, name);
    return false;
  }
  const auto port = static_cast<uint16_t>(flags.Int("port", default_port));
  if (!ResolveAddress(flags.Str("server", ""), port, /*passive=*/false, &server)) return false;
  if (!engine.Start(options, 4096, flags.Str("device", ""))) return false;
  return engine.WatchCm(setup, 0);
}

void ClientEngine::Stop(const Flags& flags) {
  WriteStats(*engine.runtime, flags.Str("stats-json", ""));
  (void)engine.runtime->Shutdown();
}

bool ClientConn::Connect() {
  context_ = client_.setup.Track(this);
  if (rdma_create_id(client_.engine.channel, &id_, context_, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return false;
  }
  sockaddr_storage to = client_.server;
  if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&to), 5000) != 0) {
    perror("rdma_resolve_addr");
    return false;
  }
  return true;
}

void ClientConn::OnSetupEvent(const CmEvent& event) noexcept {
  if (event.type == RDMA_CM_EVENT_ADDR_RESOLVED) {
    if (rdma_resolve_route(id_, 5000) != 0) Fail("rdma_resolve_route");
  } else if (event.type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
    Establish();
  } else if (state() == ConnState::kConnecting) {
    FailOnCmEvent(event);  // ADDR_ERROR, ROUTE_ERROR: nobody to reach at that address
  }                        // else a late event (TIMEWAIT_EXIT) of this id
}

bool ClientConn::Register() noexcept {
  auto registration = client_.engine.runtime->RegisterQp(id_, *this, index_ % client_.consumers);
  if (!registration.ok()) {
    Fail(registration.status().ToString().c_str());
    return false;
  }
  registration_ = std::move(registration).value();
  return true;
}

void ClientConn::Running() noexcept {
  ran_.store(true, std::memory_order_relaxed);
  state_.store(ConnState::kRunning, std::memory_order_release);
}

void ClientConn::FailOnCmEvent(const CmEvent& event) noexcept {
  if (state() == ConnState::kDone) return;
  const bool refusal =
      event.type == RDMA_CM_EVENT_REJECTED || event.type == RDMA_CM_EVENT_UNREACHABLE ||
      event.type == RDMA_CM_EVENT_CONNECT_ERROR || event.type == RDMA_CM_EVENT_ADDR_ERROR ||
      event.type == RDMA_CM_EVENT_ROUTE_ERROR;
  if (refusal && !ran() && state() == ConnState::kConnecting) {
    refused_ = std::string(rdma_event_str(event.type)) + ", status " + std::to_string(event.status);
    // A server that says why puts a string in the reject's private data.
    const auto* text = reinterpret_cast<const char*>(event.private_data);
    size_t len = 0;
    while (len < event.private_data_len && isprint(static_cast<unsigned char>(text[len]))) ++len;
    if (len > 0 && len < event.private_data_len && text[len] == '\0') {
      refused_ += ": " + std::string(text, len);
    }
  }
  Fail(rdma_event_str(event.type));
}

void ClientConn::Fail(const char* why) noexcept {
  if (state() == ConnState::kFailed) return;
  fprintf(stderr, "%s: connection %u: %s\n", client_.program, index_, why);
  state_.store(ConnState::kFailed, std::memory_order_release);
}

bool ClientConn::Finish(bool* late) {
  bool ok = state() == ConnState::kDone;
  if (context_ != nullptr) client_.setup.Forget(context_);
  context_ = nullptr;
  if (id_ != nullptr) {
    ok &= CloseConnection(*client_.engine.runtime, id_, registration_, late);
    id_ = nullptr;
  }
  return ok;
}

bool RunConnections(ClientEngine& client, int connections, int rounds,
                    const std::function<std::unique_ptr<ClientConn>(int)>& make,
                    LoopTotals* totals) {
  constexpr int kSetupTries = 3;
  std::vector<std::unique_ptr<ClientConn>> conns;
  // Ends every connection while it is whole (its handler may still be called until then).
  auto give_up = [&] {
    for (auto& conn : conns) conn->Finish();
    return false;
  };
  std::vector<int> rounds_left(connections, rounds);
  std::vector<int> setup_tries_left(connections, kSetupTries);
  for (int i = 0; i < connections; ++i) {
    conns.push_back(make(i));
    if (!conns.back()->Connect()) return give_up();
  }
  bool announced = false;
  int active = connections;
  while (active > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < connections; ++i) {
      ClientConn& conn = *conns[i];
      const ConnState state = conn.state();
      if (rounds_left[i] == 0 || (state != ConnState::kDone && state != ConnState::kFailed)) {
        continue;
      }
      totals->verified += conn.verified();
      const bool setup_failed = state == ConnState::kFailed && !conn.ran();
      if (setup_failed && !conn.refused().empty()) {
        fprintf(stderr,
                "%s: %s refused connection %d (%s): is a server listening there? giving up\n",
                client.program, AddressText(client.server).c_str(), i, conn.refused().c_str());
        ++totals->failures;
        return give_up();
      }
      bool late = false;
      const bool closed = conn.Finish(&late);
      if (setup_failed && setup_tries_left[i]-- > 0) {
        ++totals->setup_retries;
        fprintf(stderr, "%s: connection %d: its setup failed; connecting again\n", client.program,
                i);
        conns[i] = make(i);
        if (!conns[i]->Connect()) return give_up();
        continue;
      }
      if (closed) {
        ++(late ? totals->teardowns_late : totals->teardowns_ok);
      } else {
        ++totals->failures;
      }
      if (!announced) {
        printf("%s: running\n", client.program);
        fflush(stdout);
        announced = true;
      }
      if (--rounds_left[i] == 0 || state == ConnState::kFailed) {
        rounds_left[i] = 0;
        --active;
        continue;
      }
      // Connect again while the other connections keep running.
      conns[i] = make(i);
      if (!conns[i]->Connect()) return give_up();
    }
  }
  return true;
}

}  // namespace cqd::examples

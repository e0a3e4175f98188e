// SPDX-License-Identifier: BSD-2-Clause
#include "tests/rxe/cm_bed.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd::rxe {

const char* CmAddress() {
  const char* addr = getenv("CQD_RDMA_ADDR");
  return addr != nullptr && *addr != '\0' ? addr : "10.0.2.15";
}

void RecordingCmHandler::OnCmEvent(const CmEvent& event) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({event.type, event.id, event.context});
  }
  if (react) react(event);
}

std::vector<RecordingCmHandler::Seen> RecordingCmHandler::seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

std::vector<rdma_cm_event_type> RecordingCmHandler::types() const {
  std::vector<rdma_cm_event_type> out;
  for (const Seen& s : seen()) out.push_back(s.type);
  return out;
}

std::vector<void*> RecordingCmHandler::contexts() const {
  std::vector<void*> out;
  for (const Seen& s : seen()) out.push_back(s.context);
  return out;
}

bool RecordingCmHandler::Saw(rdma_cm_event_type type) const {
  for (const Seen& s : seen()) {
    if (s.type == type) return true;
  }
  return false;
}

std::string RecordingCmHandler::Names() const {
  std::string out;
  for (const Seen& s : seen()) out += std::string(rdma_event_str(s.type)) + " ";
  return out;
}

void CmBed::StartBed(const RuntimeOptions& options, int buffer_slots) {
  server_channel_ = rdma_create_event_channel();
  client_channel_ = rdma_create_event_channel();
  ASSERT_NE(server_channel_, nullptr) << "rdma_create_event_channel: " << strerror(errno);
  ASSERT_NE(client_channel_, nullptr);
  ASSERT_EQ(rdma_create_id(server_channel_, &listen_id_, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ASSERT_EQ(inet_pton(AF_INET, CmAddress(), &addr.sin_addr), 1);
  ASSERT_EQ(rdma_bind_addr(listen_id_, reinterpret_cast<sockaddr*>(&addr)), 0) << strerror(errno);
  ASSERT_NE(listen_id_->verbs, nullptr) << CmAddress() << " is not an RDMA device's address";
  server_addr_ = addr;
  server_addr_.sin_port = rdma_get_src_port(listen_id_);

  auto rt = Runtime::Create(options);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  rt_ = std::move(rt).value();
  auto dev = rt_->AddVerbsDevice(listen_id_->verbs);  // librdmacm's context
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  dev_ = *dev;
  pd_ = ibv_alloc_pd(listen_id_->verbs);
  ASSERT_NE(pd_, nullptr);
  CQD_ASSERT_OK(buffers_.Register(pd_, buffer_slots, 64));
  for (int shard = 0; shard < options.pollers; ++shard) {
    auto cq = rt_->CreateCq(dev_, shard, {});
    ASSERT_TRUE(cq.ok()) << cq.status().ToString();
    cqs_.push_back(*cq);
  }
}

void CmBed::StopBed(bool expect_cqs_destroyed) {
  if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
  listen_id_ = nullptr;
  if (rt_ != nullptr) {
    for (CqHandle cq : cqs_) {
      Status s = rt_->DestroyCq(cq);
      if (expect_cqs_destroyed) {
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    }
    cqs_.clear();
    if (buffers_.mr != nullptr) ibv_dereg_mr(buffers_.mr);
    buffers_.mr = nullptr;
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    pd_ = nullptr;
    rt_.reset();
  }
  if (server_channel_ != nullptr) rdma_destroy_event_channel(server_channel_);
  if (client_channel_ != nullptr) rdma_destroy_event_channel(client_channel_);
  server_channel_ = client_channel_ = nullptr;
}

void CmConn::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  if (per_batch_.count() > 0) std::this_thread::sleep_for(per_batch_);  // a slow consumer
  std::lock_guard<std::mutex> lock(mu_);
  for (const ibv_wc& wc : wcs) {
    wr_ids_.push_back(wc.wr_id);
    if (wc.status == IBV_WC_SUCCESS) successes_.fetch_add(1, std::memory_order_release);
  }
}

void CmConn::OnCmEvent(const CmEvent& event) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(
        {event.type, event.status, event.qp_num, successes_.load(std::memory_order_acquire)});
    events_.push_back(event);
  }
  if (on_event) on_event(event);
}

std::vector<CmConn::Seen> CmConn::seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

std::vector<CmEvent> CmConn::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<uint64_t> CmConn::wr_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wr_ids_;
}

bool CmConn::Saw(rdma_cm_event_type type) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Seen& s : seen_) {
    if (s.type == type) return true;
  }
  return false;
}

bool CmBed::MakeCmQp(rdma_cm_id* id, ibv_qp_init_attr attr, int recvs, QpHandler& handler,
                     ConsumerId consumer, Registration* registration) {
  if (rdma_create_qp(id, pd_, &attr) != 0) {
    ADD_FAILURE() << "rdma_create_qp: " << strerror(errno);
    return false;
  }
  for (int i = 0; i < recvs; ++i) {
    if (Status s = PostRecv(id->qp, i, buffers_, i); !s.ok()) {
      ADD_FAILURE() << s.ToString();
      return false;
    }
  }
  auto registered = rt_->RegisterQp(id, handler, consumer);
  if (!registered.ok()) {
    ADD_FAILURE() << registered.status().ToString();
    return false;
  }
  *registration = std::move(registered).value();
  return true;
}

}  // namespace cqd::rxe

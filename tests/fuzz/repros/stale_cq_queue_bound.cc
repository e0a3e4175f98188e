// SPDX-License-Identifier: BSD-2-Clause
// Reproduction (found by //tests/fuzz:runtime_fuzz): completions left in a CQ by a QP that was
// destroyed reach the consumer of a new QP that got the same qp_num on another CQ, and they are
// queued there without regard to queue_capacity: ConsumerStats::high_water exceeds it before any
// Shutdown (options.h: "Items ... queued for this consumer at most; the bound holds except at
// Shutdown").
//
// Why: the pollers bound what they poll from a CQ by the consumers that CQ's registered QPs use
// (CqRecord uses). The new QP's CQ is another one, so its consumer is not among the CQ's uses,
// and the leftovers are routed to it by qp_num alone. (They also reach the new QP's handler,
// which is allowed without a drained teardown, but from a CQ the new QP does not use.)
//
// Steps (an engine that unregisters a QP plainly while its CQ is released, as the README allows
// for adopted CQs): adopt CQ A on shard 0, create QP 1 on it, release A, let the device complete
// 8 of QP 1's work requests into A, destroy QP 1, create QP 2 on CQ B (shard 1): the device hands
// it QP 1's qp_num; register QP 2 on an engine-driven consumer with queue_capacity 1 and
// spill_capacity 1 that is not drained; adopt A again. Exits 1 if the consumer's queue high water
// exceeds 1, 0 otherwise.
//
//   bazel run //tests/fuzz:repro_stale_cq_queue_bound
#include <chrono>
#include <cstdio>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"

namespace {

class Counting final : public cqd::QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override { n += wcs.size(); }
  size_t n = 0;
};

}  // namespace

int main() {
  cqd::RuntimeOptions options;
  options.pollers = 2;
  options.consumers.resize(1);
  options.consumers[0].kind = cqd::ConsumerKind::kEngineDriven;
  options.consumers[0].queue_capacity = 1;
  options.consumers[0].spill_capacity = 1;
  auto rt = cqd::Runtime::Create(options).value();
  auto sim = cqd::SimDevice::Create();
  cqd::DeviceId dev = rt->AddSimDevice(sim).value();

  cqd::SimCq* cq_a = sim->CreateCq(16, rt->SimChannelFor(dev, 0).value()).value();
  cqd::CqHandle a = rt->AdoptCq(dev, 0, cq_a).value();
  cqd::CqHandle b = rt->CreateCq(dev, 1, {.depth = 16}).value();

  cqd::SimQp* qp1 = sim->CreateQp(cq_a, cq_a).value();
  const uint32_t qp_num = qp1->qp_num();
  if (cqd::Status s = rt->DestroyCq(a); !s.ok()) {  // release A: nobody polls it now
    fprintf(stderr, "DestroyCq (release): %s\n", s.ToString().c_str());
    return 2;
  }
  for (uint64_t k = 0; k < 8; ++k) qp1->Complete(k);  // left in A
  if (cqd::Status s = sim->DestroyQp(qp1); !s.ok()) {
    fprintf(stderr, "DestroyQp: %s\n", s.ToString().c_str());
    return 2;
  }
  cqd::SimQp* qp2 = sim->CreateQp(b.sim(), b.sim()).value();
  if (qp2->qp_num() != qp_num) {
    fprintf(stderr, "the device did not reuse qp_num 0x%x\n", qp_num);
    return 2;
  }
  Counting handler;
  cqd::Registration reg = rt->RegisterQp(*qp2, handler, 0).value();
  a = rt->AdoptCq(dev, 0, cq_a).value();  // its leftovers are polled now

  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cqd::Stats stats = rt->GetStats();
  const cqd::ConsumerStats& c = stats.consumers[0];
  printf(
      "queue_capacity 1, spill_capacity 1: queue depth %llu, high water %llu, spill depth %llu"
      "; CQ A still holds %d\n",
      static_cast<unsigned long long>(c.queue_depth), static_cast<unsigned long long>(c.high_water),
      static_cast<unsigned long long>(c.spill_depth), cq_a->size());
  while (rt->Drain(0, 64) > 0) {
  }
  for (int i = 0; i < 50 && handler.n < 8; ++i) {  // the last one may wait in a spill
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    while (rt->Drain(0, 64) > 0) {
    }
  }
  printf("the new QP's handler (on CQ B) got %zu completions the old QP left in CQ A\n", handler.n);
  const bool bound_held = c.high_water <= 1;
  reg.Unregister();
  (void)rt->DestroyCq(a);
  (void)sim->DestroyCq(cq_a);
  (void)sim->DestroyQp(qp2);
  (void)rt->DestroyCq(b);
  if (!bound_held) {
    printf("queue_capacity exceeded before Shutdown\n");
    return 1;
  }
  printf("bound held\n");
  return 0;
}

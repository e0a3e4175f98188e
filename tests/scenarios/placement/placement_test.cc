// SPDX-License-Identifier: BSD-2-Clause
// NUMA placement and completion vectors (runtime/core/placement.h): cpulist and sysfs parsing on a
// fake sysfs tree, the placement decision with real threads, and what the runtime reports on the
// simulated device (no NUMA node, one vector).
#include "runtime/core/placement.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "cqd/runtime.h"
#include "cqd/sim.h"
#include "tests/fixtures/fixtures.h"

namespace cqd::internal {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int>;

TEST(CpuList, Parses) {
  EXPECT_EQ(ParseCpuList("0-3,8-11\n"), V({0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(ParseCpuList("5"), V({5}));
  EXPECT_EQ(ParseCpuList("3,1-2,2"), V({1, 2, 3}));  // sorted, once each
  EXPECT_EQ(ParseCpuList(""), V());                  // a node without CPUs
  EXPECT_EQ(ParseCpuList("\n"), V());
  EXPECT_EQ(ParseCpuList("7-7"), V({7}));
}

TEST(CpuList, RefusesMalformed) {
  for (const char* bad :
       {"a", "3-1", "0-", "-1", "0,,1", "0-3,", ",0", "1 2", "0x1", "1-2-3", "99999999"}) {
    EXPECT_EQ(ParseCpuList(bad), std::nullopt) << bad;
  }
}

TEST(CpuList, Formats) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 9, 10, 11}), "0-3,8-11");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({1, 3, 4}), "1,3-4");
  EXPECT_EQ(FormatCpuList({}), "");
}

// A fake sysfs tree under the test's temporary directory.
class FakeSysfs {
 public:
  FakeSysfs() {
    static int serial = 0;
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = fs::path(tmp != nullptr ? tmp : "/tmp") /
            ("sysfs." + std::to_string(getpid()) + "." + std::to_string(serial++));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void Device(const std::string& name, const std::string& numa_node) {
    Write("class/infiniband/" + name + "/device/numa_node", numa_node);
  }
  void Node(int node, const std::string& cpulist) {
    Write("devices/system/node/node" + std::to_string(node) + "/cpulist", cpulist);
  }
  std::string root() const { return root_.string(); }

 private:
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  fs::path root_;
};

TEST(Sysfs, DeviceNumaNode) {
  FakeSysfs sys;
  sys.Device("mlx5_0", "1\n");
  sys.Device("mlx5_1", "-1\n");  // what a one-node machine or a device without affinity says
  sys.Device("bad0", "one\n");
  sys.Device("empty0", "");
  EXPECT_EQ(DeviceNumaNode(sys.root(), "mlx5_0"), 1);
  EXPECT_EQ(DeviceNumaNode(sys.root(), "mlx5_1"), -1);
  EXPECT_EQ(DeviceNumaNode(sys.root(), "bad0"), -1);
  EXPECT_EQ(DeviceNumaNode(sys.root(), "empty0"), -1);
  EXPECT_EQ(DeviceNumaNode(sys.root(), "rxe0"), -1);  // missing: virtual devices have no node
  EXPECT_EQ(DeviceNumaNode(sys.root(), "../mlx5_0"), -1);
  EXPECT_EQ(DeviceNumaNode(sys.root() + "/nowhere", "mlx5_0"), -1);
}

TEST(Sysfs, NodeCpus) {
  FakeSysfs sys;
  sys.Node(0, "0-3,8-11\n");
  sys.Node(1, "\n");
  sys.Node(2, "0-3,,\n");
  EXPECT_EQ(NodeCpus(sys.root(), 0), V({0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(NodeCpus(sys.root(), 1), V());
  EXPECT_EQ(NodeCpus(sys.root(), 2), V());  // malformed
  EXPECT_EQ(NodeCpus(sys.root(), 3), V());  // missing
  EXPECT_EQ(NodeCpus(sys.root(), -1), V());
}

TEST(Placement, LocalCpus) {
  EXPECT_EQ(LocalCpus({0, 1, 2, 3, 8, 9, 10, 11}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}),
            V({0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(LocalCpus({1, 2}, {0, 1}), V({1}));  // only CPUs the process may use
  EXPECT_EQ(LocalCpus({4, 5}, {0, 1}), V());     // none of them: leave the threads alone
  EXPECT_EQ(LocalCpus({0, 1}, {0, 1}), V());     // one node: nothing to gain
  EXPECT_EQ(LocalCpus({0, 1, 2}, {0, 1}), V());  // every allowed CPU is local
  EXPECT_EQ(LocalCpus({}, {0, 1}), V());
  EXPECT_EQ(LocalCpus({0}, {}), V());
}

TEST(Placement, ChooseCompVector) {
  uint32_t next = 0;
  std::vector<int> got;
  for (int i = 0; i < 4; ++i) got.push_back(ChooseCompVector(-1, 3, true, next).value());
  EXPECT_EQ(got, V({0, 1, 2, 0}));                            // round robin
  EXPECT_EQ(ChooseCompVector(2, 3, true, next).value(), 2);   // explicit wins...
  EXPECT_EQ(ChooseCompVector(-1, 3, true, next).value(), 1);  // ... and takes no turn
  EXPECT_EQ(ChooseCompVector(-1, 3, false, next).value(), 0);
  EXPECT_EQ(ChooseCompVector(0, 0, true, next).value(), 0);  // a device reporting none
  for (int bad : {3, 7, -2}) {
    Result<int> r = ChooseCompVector(bad, 3, true, next);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("0..2"), std::string::npos) << r.status().message();
  }
}

V AffinityOf(pthread_t thread) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(thread, sizeof(set), &set), 0);
  V cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Threads standing in for the runtime's pollers and consumers, blocked until destroyed.
class Parked {
 public:
  explicit Parked(int n) {
    std::shared_future<void> released = release_.get_future().share();
    for (int i = 0; i < n; ++i) threads_.emplace_back([released] { released.wait(); });
  }
  ~Parked() {
    release_.set_value();
    for (auto& t : threads_) t.join();
  }
  pthread_t handle(int i) { return threads_[i].native_handle(); }

 private:
  std::promise<void> release_;
  std::vector<std::thread> threads_;
};

// Two or more CPUs this process may use: node 1 of the fake tree gets the first of them only, so
// that placement has something to do on any machine.
class PlacementOnFakeNode : public ::testing::Test {
 protected:
  void SetUp() override {
    allowed_ = AllowedCpus();
    if (allowed_.size() < 2) GTEST_SKIP() << "needs two CPUs this process may use";
    local_ = allowed_[0];
    sys_.Device("mlx5_0", "1\n");
    sys_.Device("mlx5_1", "0\n");
    sys_.Device("mlx5_9", "-1\n");
    sys_.Node(0, FormatCpuList(allowed_) + "\n");  // the rest of the machine
    sys_.Node(1, std::to_string(local_) + "\n");
  }
  FakeSysfs sys_;
  V allowed_;
  int local_ = -1;
};

TEST_F(PlacementOnFakeNode, ConfinesThreadsWithoutExplicitCpus) {
  RuntimeOptions options;
  options.pollers = 2;
  options.consumers.resize(3);
  options.consumers[1].cpu = allowed_[1];                   // explicit: stays
  options.consumers[2].kind = ConsumerKind::kEngineDriven;  // not the runtime's thread
  Placement placement(options, sys_.root());
  Parked threads(4);
  Placement::Threads handles{{threads.handle(0), threads.handle(1)},
                             {threads.handle(2), threads.handle(3), 0}};
  const V before = AffinityOf(threads.handle(3));

  // The simulated device first: no node, nothing moves.
  placement.OnDeviceAdded(1, "sim0", /*verbs=*/false, 1, handles);
  EXPECT_EQ(AffinityOf(threads.handle(0)), before);
  // A verbs device on node 1 places what has no CPU of its own.
  placement.OnDeviceAdded(2, "mlx5_0", /*verbs=*/true, 4, handles);
  EXPECT_EQ(AffinityOf(threads.handle(0)), V({local_}));
  EXPECT_EQ(AffinityOf(threads.handle(1)), V({local_}));
  EXPECT_EQ(AffinityOf(threads.handle(2)), V({local_}));
  EXPECT_EQ(AffinityOf(threads.handle(3)), before);
  // A later device on another node moves nothing: the threads serve both.
  placement.OnDeviceAdded(3, "mlx5_1", /*verbs=*/true, 2, handles);
  EXPECT_EQ(AffinityOf(threads.handle(0)), V({local_}));

  Stats stats;
  stats.pollers.resize(2);
  stats.consumers.resize(3);
  placement.FillStats(stats);
  EXPECT_EQ(stats.pollers[0].numa_node, 1);
  EXPECT_EQ(stats.pollers[1].numa_node, 1);
  EXPECT_EQ(stats.consumers[0].numa_node, 1);
  EXPECT_EQ(stats.consumers[0].cpu, -1);
  EXPECT_EQ(stats.consumers[1].numa_node, -1);
  EXPECT_EQ(stats.consumers[1].cpu, allowed_[1]);
  EXPECT_EQ(stats.consumers[2].numa_node, -1);
  EXPECT_EQ(stats.placement_cpus, std::to_string(local_));
  ASSERT_EQ(stats.devices.size(), 3u);
  EXPECT_EQ(stats.devices[0].name, "sim0");
  EXPECT_EQ(stats.devices[0].numa_node, -1);
  EXPECT_EQ(stats.devices[0].comp_vectors, 1);
  EXPECT_EQ(stats.devices[1].numa_node, 1);
  EXPECT_EQ(stats.devices[1].comp_vectors, 4);
  EXPECT_EQ(stats.devices[2].numa_node, 0);

  // Completion vectors: round robin per device.
  EXPECT_EQ(placement.CompVector(2, -1).value(), 0);
  EXPECT_EQ(placement.CompVector(2, -1).value(), 1);
  EXPECT_EQ(placement.CompVector(3, -1).value(), 0);
  EXPECT_EQ(placement.CompVector(2, -1).value(), 2);
  EXPECT_EQ(placement.CompVector(2, 3).value(), 3);
  EXPECT_EQ(placement.CompVector(2, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(placement.CompVector(1, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(placement.CompVector(9, -1).status().code(), StatusCode::kNotFound);
}

TEST_F(PlacementOnFakeNode, ExplicitPollerCpusWin) {
  RuntimeOptions options;
  options.pollers = 1;
  options.poller_cpus = {allowed_[1]};
  Placement placement(options, sys_.root());
  Parked threads(2);
  const V before = AffinityOf(threads.handle(0));
  placement.OnDeviceAdded(1, "mlx5_0", true, 1, {{threads.handle(0)}, {threads.handle(1)}});
  EXPECT_EQ(AffinityOf(threads.handle(0)), before);       // the poller: explicit CPU
  EXPECT_EQ(AffinityOf(threads.handle(1)), V({local_}));  // the consumer: placed
}

TEST_F(PlacementOnFakeNode, OffMovesNothingAndUsesVectorZero) {
  RuntimeOptions options;
  options.auto_placement = false;
  Placement placement(options, sys_.root());
  Parked threads(2);
  const V before = AffinityOf(threads.handle(0));
  placement.OnDeviceAdded(1, "mlx5_0", true, 4, {{threads.handle(0)}, {threads.handle(1)}});
  EXPECT_EQ(AffinityOf(threads.handle(0)), before);
  EXPECT_EQ(AffinityOf(threads.handle(1)), before);
  EXPECT_EQ(placement.CompVector(1, -1).value(), 0);
  EXPECT_EQ(placement.CompVector(1, -1).value(), 0);
  EXPECT_EQ(placement.CompVector(1, 2).value(), 2);
  Stats stats;
  stats.pollers.resize(1);
  stats.consumers.resize(1);
  placement.FillStats(stats);
  EXPECT_EQ(stats.pollers[0].numa_node, -1);
  EXPECT_EQ(stats.placement_cpus, "");
  ASSERT_EQ(stats.devices.size(), 1u);
  EXPECT_EQ(stats.devices[0].numa_node, 1);  // still reported
}

TEST_F(PlacementOnFakeNode, NoNodeOrOneNodeMovesNothing) {
  RuntimeOptions options;
  Parked threads(2);
  const V before = AffinityOf(threads.handle(0));
  Placement::Threads handles{{threads.handle(0)}, {threads.handle(1)}};
  {
    Placement placement(options, sys_.root());
    placement.OnDeviceAdded(1, "mlx5_9", true, 1, handles);  // numa_node -1
    placement.OnDeviceAdded(2, "rxe0", true, 1, handles);    // no sysfs entry at all
    EXPECT_EQ(AffinityOf(threads.handle(0)), before);
  }
  {
    // Node 0 holds every CPU the process may use: the one-node case.
    Placement placement(options, sys_.root());
    placement.OnDeviceAdded(1, "mlx5_1", true, 1, handles);
    EXPECT_EQ(AffinityOf(threads.handle(0)), before);
    EXPECT_EQ(AffinityOf(threads.handle(1)), before);
    Stats stats;
    stats.pollers.resize(1);
    stats.consumers.resize(1);
    placement.FillStats(stats);
    EXPECT_EQ(stats.pollers[0].numa_node, -1);
    EXPECT_EQ(stats.devices[0].numa_node, 0);
  }
  {
    // The process may use none of the node's CPUs (an injected affinity mask).
    Placement placement(options, sys_.root(), V{allowed_[1]});
    placement.OnDeviceAdded(1, "mlx5_0", true, 1, handles);
    EXPECT_EQ(AffinityOf(threads.handle(0)), before);
  }
}

// Through the public API on the simulated device: no NUMA node, one completion vector.
TEST(PlacementRuntime, SimulatedDevice) {
  const V allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  RuntimeOptions options;
  options.pollers = 2;
  options.consumers = {ConsumerOptions{}, ConsumerOptions{}};
  options.consumers[1].cpu = allowed.back();
  testing::Bed bed;
  CQD_ASSERT_OK(bed.StartWithoutLedger(options));
  auto& rt = bed.rt;
  const DeviceId dev = bed.dev;

  Result<CqHandle> bad = rt->CreateCq(dev, 0, {.comp_vector = 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("CreateCq: comp_vector 1 is not in 0..0"),
            std::string::npos)
      << bad.status().message();
  CQD_ASSERT_OK_AND_ASSIGN(cq0, rt->CreateCq(dev, 0, {.comp_vector = 0}));
  CQD_ASSERT_OK_AND_ASSIGN(cq1, rt->CreateCq(dev, 1));

  Stats stats = rt->GetStats();
  ASSERT_EQ(stats.devices.size(), 1u);
  EXPECT_EQ(stats.devices[0].id, dev);
  EXPECT_EQ(stats.devices[0].name, "sim0");
  EXPECT_EQ(stats.devices[0].numa_node, -1);
  EXPECT_EQ(stats.devices[0].comp_vectors, 1);
  EXPECT_EQ(stats.placement_cpus, "");
  for (const PollerStats& p : stats.pollers) {
    EXPECT_EQ(p.cpu, -1);
    EXPECT_EQ(p.numa_node, -1);
  }
  ASSERT_EQ(stats.consumers.size(), 2u);
  EXPECT_EQ(stats.consumers[0].cpu, -1);
  EXPECT_EQ(stats.consumers[1].cpu, allowed.back());
  EXPECT_EQ(stats.consumers[1].numa_node, -1);
  ASSERT_EQ(stats.cqs.size(), 2u);
  for (const CqStats& c : stats.cqs) EXPECT_EQ(c.comp_vector, 0);
  CQD_ASSERT_OK(rt->DestroyCq(cq0));
  CQD_ASSERT_OK(rt->DestroyCq(cq1));
  CQD_ASSERT_OK(rt->Shutdown());
}

}  // namespace
}  // namespace cqd::internal

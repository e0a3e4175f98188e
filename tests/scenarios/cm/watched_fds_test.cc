// SPDX-License-Identifier: BSD-2-Clause
// The fds the event thread watches, at their edges: one that fails leaves the epoll set for
// certain, even when the engine closed or reused its number, so that the level-triggered loop
// cannot spin on it; a CM channel comes back from UnwatchCmChannel as it came. Both failed before
// the event thread kept its own dup of each fd (issue 15, items 4 and 6).
//
// The channels here are rdma_event_channels made by hand around an eventfd: the runtime only
// epolls the fd and reads it with rdma_get_cm_event, which fails on it, as on a broken channel.
#include <dirent.h>
#include <fcntl.h>
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "cqd/runtime.h"
#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd {
namespace {

using testing::WaitFor;

class NoCm : public CmHandler {
 public:
  void OnCmEvent(const CmEvent&) noexcept override {}
};

// CPU time (clock ticks, user + system) of this process's threads named `name`.
uint64_t ThreadTicks(const std::string& name) {
  uint64_t ticks = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (dirent* entry = readdir(dir)) {
    const std::string task = std::string("/proc/self/task/") + entry->d_name;
    std::ifstream comm(task + "/comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    std::ifstream stat_file(task + "/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), {});
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    // Fields 3..13 (state .. cmajflt), then utime (14) and stime (15).
    for (int i = 3; i <= 13; ++i) fields >> field;
    uint64_t utime = 0, stime = 0;
    fields >> utime >> stime;
    ticks += utime + stime;
  }
  closedir(dir);
  return ticks;
}

// The fds watched by this process's epoll sets: the "tfd:" lines of their /proc fdinfo.
int EpollTargets() {
  int targets = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    char link[64] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    if (readlink(path.c_str(), link, sizeof(link) - 1) <= 0) continue;
    if (std::string(link) != "anon_inode:[eventpoll]") continue;
    std::ifstream info(std::string("/proc/self/fdinfo/") + entry->d_name);
    for (std::string line; std::getline(info, line);) {
      if (line.rfind("tfd:", 0) == 0) ++targets;
    }
  }
  closedir(dir);
  return targets;
}

// The fds this process has open.
int OpenFds() {
  int fds = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) fds += entry->d_name[0] != '.';
  closedir(dir);
  return fds - 1;  // the directory's own
}

TEST(WatchedFds, FailedFdWhoseNumberWasReusedLeavesTheEventLoop) {
  testing::Bed bed;  // a runtime and no device: every fd watched is the test's
  CQD_ASSERT_OK(bed.CreateRuntime(RuntimeOptions{}));
  auto& rt = bed.rt;
  const int fd = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  rdma_event_channel channel{fd};
  NoCm handler;
  const int targets_before = EpollTargets();
  const int fds_before = OpenFds();
  ASSERT_GE(targets_before, 1) << "no epoll set found";
  CQD_ASSERT_OK(rt->WatchCmChannel(&channel, handler, 0));
  EXPECT_EQ(EpollTargets(), targets_before + 1);
  // The engine keeps the file open through another fd and gives the channel's number to another
  // file; then the channel becomes readable for good, and reading it through its number fails.
  const int keep = dup(fd);
  ASSERT_GE(keep, 0);
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(null, 0);
  ASSERT_EQ(dup2(null, fd), fd);
  close(null);
  const uint64_t one = 1;
  ASSERT_EQ(write(keep, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  ASSERT_TRUE(WaitFor([&] { return rt->GetStats().failed_fds == 1; }));
  // Given up, the fd must leave the epoll set: a level-triggered registration that survived
  // would report it on every epoll_wait, and the event thread would use a whole core.
  EXPECT_EQ(EpollTargets(), targets_before) << "the failed fd is still in the epoll set";
  EXPECT_EQ(OpenFds(), fds_before + 1) << "the runtime's own fd for it is still open";  // + keep
  const uint64_t before = ThreadTicks("cqd-events");
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t used = ThreadTicks("cqd-events") - before;
  const long per_second = sysconf(_SC_CLK_TCK);
  EXPECT_LE(used, static_cast<uint64_t>(per_second / 10))
      << "the event thread used " << used << " of " << per_second
      << " ticks in the second after the fd failed: it spins";
  EXPECT_EQ(rt->GetStats().failed_fds, 1u);
  EXPECT_EQ(rt->UnwatchCmChannel(&channel).code(), StatusCode::kNotFound);  // given up already
  rt.reset();
  close(keep);
  close(fd);
}

TEST(WatchedFds, UnwatchedCmChannelComesBackAsItCame) {
  testing::Bed bed;  // a runtime and no device: every fd watched is the test's
  CQD_ASSERT_OK(bed.CreateRuntime(RuntimeOptions{}));
  auto& rt = bed.rt;
  NoCm handler;
  for (const bool nonblocking : {false, true}) {
    SCOPED_TRACE(nonblocking ? "non-blocking channel" : "blocking channel");
    const int fd = eventfd(0, EFD_CLOEXEC | (nonblocking ? EFD_NONBLOCK : 0));
    ASSERT_GE(fd, 0);
    rdma_event_channel channel{fd};
    CQD_ASSERT_OK(rt->WatchCmChannel(&channel, handler, 0));
    EXPECT_NE(fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "the event thread reads it non-blocking";
    CQD_ASSERT_OK(rt->UnwatchCmChannel(&channel));
    EXPECT_EQ((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0, nonblocking)
        << "UnwatchCmChannel changed the channel's O_NONBLOCK flag";
    // Watched again after it came back, it is read as before.
    CQD_ASSERT_OK(rt->WatchCmChannel(&channel, handler, 0));
    CQD_ASSERT_OK(rt->UnwatchCmChannel(&channel));
    EXPECT_EQ((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0, nonblocking);
    close(fd);
  }
}

// A CM channel whose reads fail is given up (Stats::failed_fds) and, as the README's failure
// table says, gets its O_NONBLOCK flag back as it came, blocking or not.
TEST(WatchedFds, AFailedCmChannelGetsItsFlagBack) {
  testing::Bed bed;  // a runtime and no device: every fd watched is the test's
  CQD_ASSERT_OK(bed.CreateRuntime(RuntimeOptions{}));
  auto& rt = bed.rt;
  NoCm handler;
  uint64_t failed = 0;
  for (const bool nonblocking : {false, true}) {
    SCOPED_TRACE(nonblocking ? "non-blocking channel" : "blocking channel");
    const int fd = eventfd(0, EFD_CLOEXEC | (nonblocking ? EFD_NONBLOCK : 0));
    ASSERT_GE(fd, 0);
    rdma_event_channel channel{fd};
    CQD_ASSERT_OK(rt->WatchCmChannel(&channel, handler, 0));
    EXPECT_NE(fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "the event thread reads it non-blocking";
    const uint64_t one = 1;  // readable: rdma_get_cm_event on an eventfd fails
    ASSERT_EQ(write(fd, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
    ++failed;
    ASSERT_TRUE(WaitFor([&] { return rt->GetStats().failed_fds == failed; }));
    EXPECT_EQ((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0, nonblocking)
        << "the failed channel did not get its O_NONBLOCK flag back";
    EXPECT_EQ(rt->UnwatchCmChannel(&channel).code(), StatusCode::kNotFound);
    close(fd);
  }
}

}  // namespace
}  // namespace cqd

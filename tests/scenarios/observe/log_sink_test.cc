// SPDX-License-Identifier: BSD-2-Clause
// The log sink: control-path events, CQD_LOG_LEVEL and CQD_LOG_FILE, a stuck consumer.
#include <string>
#include <vector>

#include "tests/scenarios/observe/observe_checks.h"

namespace cqd::observe_test {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::WaitFor;

TEST(LogSink, HearsControlPathEvents) {
  LogCollector log;
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // never drained: the teardown times out
  options.log = log.Sink();
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  EXPECT_TRUE(log.Saw(LogLevel::kInfo, "added as device 1"));

  // A teardown that cannot drain runs out of time.
  Recorder handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 3));
  TeardownOptions teardown_options;
  teardown_options.timeout = std::chrono::milliseconds(50);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(reg, teardown_options));
  EXPECT_EQ(teardown.Wait().code(), StatusCode::kDeadlineExceeded);
  char qp[16];
  snprintf(qp, sizeof(qp), "0x%x", bed.qp->qp_num());
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, qp); }));
  EXPECT_TRUE(log.Saw(LogLevel::kWarning, "did not flush back before the deadline"));

  // A completion channel whose reads keep failing is given up, and said so.
  CQD_ASSERT_OK_AND_ASSIGN(channel, bed.rt->SimChannelFor(bed.dev, 0));
  Recorder second;
  CQD_ASSERT_OK_AND_ASSIGN(qp2, bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()));
  second.qp_num = qp2->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg2, bed.rt->RegisterQp(*qp2, second, 0));
  ASSERT_TRUE(testing::WaitForPollersAsleep(*bed.rt));
  bed.sim->FailGetEvent(channel, EIO, 1 << 30);
  ASSERT_TRUE(InjectRecvs(qp2, 0, 1));  // raises the event the poller is armed for
  ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().failed_fds == 1; }));
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, "no longer watched"); }));

  // A CQ that overflows (S11): CQ_ERR, logged at error level with the CQ's id.
  CqOptions small;
  small.depth = 8;
  CQD_ASSERT_OK_AND_ASSIGN(doomed, bed.rt->CreateCq(bed.dev, 0, small));
  CQD_ASSERT_OK_AND_ASSIGN(qp3, bed.sim->CreateQp(doomed.sim(), doomed.sim()));
  std::vector<ibv_wc> burst(9);
  for (auto& wc : burst) wc.qp_num = qp3->qp_num();
  EXPECT_EQ(doomed.sim()->Inject(burst, false, /*overflow=*/true), -1);
  EXPECT_TRUE(WaitFor([&] {
    return log.Saw(LogLevel::kError, "CQ_ERR on cq " + std::to_string(doomed.id()) + ":");
  }));

  // DEVICE_FATAL.
  bed.sim->RaiseDeviceFatal();
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kError, "DEVICE_FATAL"); }));
  reg2.Unregister();
  bed.sim->FailGetEvent(channel, 0, 0);
}

// Runs `body` with stdout and stderr sent to a file; returns what was printed.
std::string Printed(const std::function<void()>& body) {
  fflush(stdout);
  fflush(stderr);
  const std::string capture = SocketPath("printed.txt");
  const int file = open(capture.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (file < 0) return "open failed";
  const int saved_out = dup(1);
  const int saved_err = dup(2);
  dup2(file, 1);
  dup2(file, 2);
  body();
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  close(file);
  std::ifstream in(capture);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Builds a runtime with one simulated QP (which logs "device ... added as device 1" at info),
// with CQD_LOG_LEVEL set to `level` (nullptr: unset) and no sink of the engine's unless `sink`.
std::string PrintedWithLogLevel(const char* level, LogCollector* sink = nullptr) {
  if (level != nullptr) {
    setenv("CQD_LOG_LEVEL", level, 1);
  } else {
    unsetenv("CQD_LOG_LEVEL");
  }
  std::string printed = Printed([&] {
    RuntimeOptions options;
    if (sink != nullptr) options.log = sink->Sink();
    testing::OneQp bed;
    EXPECT_TRUE(bed.Build(options).ok());
  });
  unsetenv("CQD_LOG_LEVEL");
  return printed;
}

TEST(LogSink, TheEnvironmentChoosesAStderrSink) {
  EXPECT_EQ(PrintedWithLogLevel(nullptr), "");
  EXPECT_EQ(PrintedWithLogLevel("off"), "");
  EXPECT_EQ(PrintedWithLogLevel(""), "");
  const std::string info = PrintedWithLogLevel("info");
  // "cqd: <UTC time>Z <pid>:<tid> info: device ... added as device 1"
  const std::regex line(
      "cqd: 2[0-9]{3}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\\.[0-9]{6}Z "
      "[0-9]+:[0-9]+ info: device .* added as device 1.*\n");
  EXPECT_TRUE(std::regex_match(info, line)) << info;
  EXPECT_NE(info.find(" " + std::to_string(getpid()) + ":"), std::string::npos) << info;
  EXPECT_NE(PrintedWithLogLevel("debug").find(" info: device "), std::string::npos);
  // Levels in any case, as rdma-core's and UCX's switches take them.
  EXPECT_TRUE(std::regex_match(PrintedWithLogLevel("INFO"), line));
  EXPECT_TRUE(std::regex_match(PrintedWithLogLevel("Debug"), line));
  EXPECT_EQ(PrintedWithLogLevel("OFF"), "");
  // Above the message's level: nothing.
  EXPECT_EQ(PrintedWithLogLevel("warning"), "");
  EXPECT_EQ(PrintedWithLogLevel("WARN"), "") << "UCX's spelling is known too";
  EXPECT_EQ(PrintedWithLogLevel("error"), "");
  // A value it does not know is said once, and the log stays off.
  EXPECT_EQ(PrintedWithLogLevel("loud"),
            "cqd: CQD_LOG_LEVEL=loud is not one of debug, info, warning (warn), error, off: the "
            "log "
            "stays off\n");
  // The engine's sink wins over the environment.
  LogCollector engine;
  EXPECT_EQ(PrintedWithLogLevel("debug", &engine), "");
  EXPECT_TRUE(engine.Saw(LogLevel::kInfo, "added as device 1"));
}

// A consumer that stops draining holds its poller back; once that has lasted a second the log
// says which consumer and how full, once, and says again when it drains. Meanwhile the metrics
// show the stall in progress.
TEST(LogSink, AStuckConsumerIsLoggedOnceAndItsEndToo) {
  LogCollector log;
  RuntimeOptions options;
  options.consumers[0].kind = ConsumerKind::kEngineDriven;  // drained only below
  options.consumers[0].name = "stuck";
  options.consumers[0].queue_capacity = 1;
  options.consumers[0].spill_capacity = 1;
  options.log = log.Sink();
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  Recorder handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 8));  // more than the queue and the spill hold
  const std::string held = "consumer 0 (stuck) has held its pollers back for ";
  ASSERT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kWarning, held); }));
  const auto warnings = [&] {
    std::lock_guard<std::mutex> lock(log.mu);
    return std::count_if(log.lines.begin(), log.lines.end(), [&](const auto& line) {
      return line.second.find(held) != std::string::npos;
    });
  };
  EXPECT_EQ(warnings(), 1);
  // What a Prometheus scrape shows meanwhile: the stall in progress beside the queue's bound.
  Samples samples;
  CheckPrometheus(StatsToPrometheus(bed.rt->GetStats()), &samples);
  ASSERT_EQ(samples["cqd_consumer_stall_seconds"].size(), 1u);
  EXPECT_GE(samples["cqd_consumer_stall_seconds"][0].value, 1.0);
  ASSERT_EQ(samples["cqd_consumer_queue_capacity"].size(), 1u);
  EXPECT_EQ(samples["cqd_consumer_queue_capacity"][0].value, 1);
  while (handler.received() < 8) bed.rt->Drain(0, 64);
  EXPECT_TRUE(WaitFor([&] { return log.Saw(LogLevel::kInfo, "consumer 0 (stuck) drains again"); }));
  EXPECT_EQ(warnings(), 1) << "one warning for the one stall";
  reg.Unregister();
}

// CQD_LOG_FILE: the lines are appended to that file, not printed; a file that cannot be opened
// is said on stderr, and the lines go there.
TEST(LogSink, CqdLogFileTakesTheLines) {
  const std::string path = SocketPath("cqd.log");
  {
    std::ofstream earlier(path);
    earlier << "an earlier line\n";
  }
  setenv("CQD_LOG_FILE", path.c_str(), 1);
  EXPECT_EQ(PrintedWithLogLevel("info"), "");
  std::ifstream in(path);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written.rfind("an earlier line\ncqd: ", 0), 0u) << written;
  EXPECT_NE(written.find(" info: device "), std::string::npos) << written;
  setenv("CQD_LOG_FILE", "/nonexistent-dir/cqd.log", 1);
  const std::string printed = PrintedWithLogLevel("info");
  unsetenv("CQD_LOG_FILE");
  EXPECT_EQ(printed.rfind("cqd: CQD_LOG_FILE=/nonexistent-dir/cqd.log cannot be opened (", 0), 0u)
      << printed;
  EXPECT_NE(printed.find(" info: device "), std::string::npos) << printed;
}

// The environment's sink writes each message on one line, whatever the engine named things: a
// newline in a device name went out as is and forged a line of its own.
TEST(LogSink, TheEnvironmentsSinkKeepsEachMessageOnOneLine) {
  const std::string path = SocketPath("cqd_escape.log");
  std::remove(path.c_str());
  setenv("CQD_LOG_FILE", path.c_str(), 1);
  setenv("CQD_LOG_LEVEL", "info", 1);
  {
    testing::Bed bed;
    ASSERT_TRUE(bed.CreateRuntime(RuntimeOptions{}).ok());
    SimDeviceOptions device;
    device.name = "evil\ncqd: 2026-01-01T00:00:00.000000Z 1:1 error: forged\\";
    EXPECT_TRUE(bed.AddDevice(device).ok());
  }
  unsetenv("CQD_LOG_LEVEL");
  unsetenv("CQD_LOG_FILE");
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  bool escaped = false;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_NE(line.rfind("cqd: 2026-01-01", 0), 0u) << "a forged line: " << line;
    if (line.find("evil\\x0acqd: 2026-01-01T00:00:00.000000Z 1:1 error: forged\\x5c") !=
        std::string::npos) {
      escaped = true;
    }
  }
  EXPECT_GT(lines, 0);
  EXPECT_TRUE(escaped) << "the device's name, escaped, in the line that says it was added";
}

// CQD_LOG_FILE without CQD_LOG_LEVEL: the file is made and takes warnings (it logged nothing,
// and made no file, before); an info message stays out; CQD_LOG_LEVEL=off still silences it.
TEST(LogSink, ALogFileAloneMeansWarnings) {
  const std::string path = SocketPath("cqd_file_alone.log");
  std::remove(path.c_str());
  unsetenv("CQD_LOG_LEVEL");
  setenv("CQD_LOG_FILE", path.c_str(), 1);
  {
    testing::OneQp bed;  // logs "device ... added" at info: not in the file
    ASSERT_TRUE(bed.Build(RuntimeOptions{}).ok());
    auto channel = bed.rt->SimChannelFor(bed.dev, 0);
    ASSERT_TRUE(channel.ok());
    ASSERT_TRUE(testing::WaitForPollersAsleep(*bed.rt));
    bed.sim->FailGetEvent(*channel, EIO, 1 << 30);  // logged at warning: its fd leaves the loop
    ASSERT_TRUE(InjectRecvs(bed.qp, 0, 1));
    ASSERT_TRUE(WaitFor([&] { return bed.rt->GetStats().failed_fds == 1; }));
  }
  unsetenv("CQD_LOG_FILE");
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "the file CQD_LOG_FILE names is made";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find(" info: "), std::string::npos) << text;
  EXPECT_NE(text.find(" warning: "), std::string::npos) << text;
  // With the level "off" the file is not even made.
  std::remove(path.c_str());
  setenv("CQD_LOG_FILE", path.c_str(), 1);
  setenv("CQD_LOG_LEVEL", "off", 1);
  {
    testing::OneQp bed;
    ASSERT_TRUE(bed.Build(RuntimeOptions{}).ok());
  }
  unsetenv("CQD_LOG_LEVEL");
  unsetenv("CQD_LOG_FILE");
  EXPECT_FALSE(std::ifstream(path).good());
}

// Without a sink the library writes nothing to stdout or stderr, even when things go wrong.
TEST(LogSink, NothingIsPrintedWithoutOne) {
  unsetenv("CQD_LOG_LEVEL");
  fflush(stdout);
  fflush(stderr);
  const std::string capture = SocketPath("captured.txt");
  const int file = open(capture.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  const int saved_out = dup(1);
  const int saved_err = dup(2);
  dup2(file, 1);
  dup2(file, 2);
  bool ok = true;
  {
    RuntimeOptions options;
    options.stats_socket = SocketPath("quiet.sock");
    testing::OneQp bed;
    ok = bed.Build(options).ok();
    if (ok) {
      auto channel = bed.rt->SimChannelFor(bed.dev, 0);
      Recorder handler;
      auto reg = bed.rt->RegisterQp(*bed.qp, handler, 0);
      ok = channel.ok() && reg.ok() && testing::WaitForPollersAsleep(*bed.rt);
      if (ok) {
        bed.sim->FailGetEvent(*channel, EIO, 1 << 30);
        ok = InjectRecvs(bed.qp, 0, 1) &&
             WaitFor([&] { return bed.rt->GetStats().failed_fds == 1; });
        (void)Ask(options.stats_socket, "bogus\n");
        bed.sim->RaiseDeviceFatal();
        bed.sim->FailGetEvent(*channel, 0, 0);
      }
      if (reg.ok()) reg->Unregister();
    }
  }
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  close(file);
  ASSERT_TRUE(ok);
  std::ifstream in(capture);
  const std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(printed, "");
  unlink(capture.c_str());
}

}  // namespace
}  // namespace cqd::observe_test

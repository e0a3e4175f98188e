// SPDX-License-Identifier: BSD-2-Clause
// The stats endpoint (RuntimeOptions::stats_socket, stats_tcp) and the live registrations it
// counts.
#include <string>
#include <vector>

#include "tests/scenarios/observe/observe_checks.h"

namespace cqd::observe_test {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::WaitFor;

// What creating a runtime with `options` returns (a runtime it makes is destroyed at once).
Status Created(const RuntimeOptions& options) {
  testing::Bed bed;
  return bed.CreateRuntime(options);
}

TEST(StatsEndpoint, ServesJsonAndPrometheus) {
  RuntimeOptions options = testing::OwnedConsumers(2, 2);
  options.consumers[0].name = "fast \"lane\"";
  options.consumers[1].record_latency = true;
  options.consumers[0].queue_capacity = 1000;  // bounds of its own, told apart from the defaults
  options.consumers[1].spill_capacity = 77;
  options.max_registrations = 300;
  options.stats_socket = SocketPath("stats.sock");
  testing::Topology topo;
  CQD_ASSERT_OK(topo.Build(options, 2, 4));
  ASSERT_TRUE(Exists(options.stats_socket));
  for (SimQp* qp : topo.qps) ASSERT_TRUE(InjectRecvs(qp, 0, 50));
  ASSERT_TRUE(WaitFor([&] { return topo.received() == 200; }));

  // JSON, asked for by name.
  std::string error;
  const std::string body = Ask(options.stats_socket, "json\n");
  ASSERT_FALSE(body.empty());
  EXPECT_EQ(body.back(), '\n');
  std::optional<Json> root = Parse(body, &error);
  ASSERT_TRUE(root) << error << "\n" << body;
  EXPECT_GT(root->at("uptime_ns").get<uint64_t>(), 0u);
  ASSERT_EQ(root->at("pollers").size(), 2u);
  ASSERT_EQ(root->at("cqs").size(), 2u);
  ASSERT_EQ(root->at("devices").size(), 1u);
  EXPECT_EQ(root->at("devices").at(0).at("name").get<std::string>(), "sim0");
  const Json* consumers = &root->at("consumers");
  ASSERT_EQ(consumers->size(), 2u);
  EXPECT_EQ(consumers->at(0).at("name").get<std::string>(), "fast \"lane\"");
  EXPECT_EQ(consumers->at(0).at("delivered").get<uint64_t>(), 100u);
  EXPECT_EQ(consumers->at(1).at("delivered").get<uint64_t>(), 100u);
  EXPECT_EQ(consumers->at(1).at("latency").at("count").get<uint64_t>(), 100u);
  uint64_t polled = 0;
  for (const Json& p : root->at("pollers")) polled += p.at("completions").get<uint64_t>();
  EXPECT_EQ(polled, 200u);
  EXPECT_EQ(root->at("registrations").get<uint64_t>(), 4u);

  // JSON when the client sends nothing and closes its side; and with an empty line.
  EXPECT_TRUE(Parse(Ask(options.stats_socket, "", /*shut=*/true), &error)) << error;
  EXPECT_TRUE(Parse(Ask(options.stats_socket, "\r\n"), &error)) << error;
  // ... and when it sends nothing at all (after the server's short wait).
  EXPECT_TRUE(Parse(Ask(options.stats_socket, ""), &error)) << error;

  // Prometheus.
  const std::string prom = Ask(options.stats_socket, "prometheus\n");
  Samples samples;
  CheckPrometheus(prom, &samples);
  ASSERT_EQ(samples["cqd_consumer_delivered_total"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_delivered_total"][0], "consumer"), "fast \"lane\"");
  EXPECT_EQ(samples["cqd_consumer_delivered_total"][0].value, 100);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_count"].size(), 1u);
  ASSERT_EQ(samples["cqd_registrations"].size(), 1u);
  EXPECT_EQ(samples["cqd_registrations"][0].value, 4);
  // The bounds beside the depths, so that a fill ratio needs no configuration: what the runtime
  // was created with.
  ASSERT_EQ(samples["cqd_max_registrations"].size(), 1u);
  EXPECT_EQ(samples["cqd_max_registrations"][0].value, options.max_registrations);
  ASSERT_EQ(samples["cqd_consumer_queue_capacity"].size(), 2u);
  EXPECT_EQ(samples["cqd_consumer_queue_capacity"][0].value, options.consumers[0].queue_capacity);
  ASSERT_EQ(samples["cqd_consumer_spill_capacity"].size(), 2u);
  EXPECT_EQ(samples["cqd_consumer_spill_capacity"][1].value, options.consumers[1].spill_capacity);
  ASSERT_EQ(samples["cqd_build_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_build_info"][0], "version"), Version().string);
  EXPECT_EQ(samples["cqd_build_info"][0].value, 1);

  // HTTP, as curl --unix-socket sends it.
  const std::string http =
      Ask(options.stats_socket, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  ASSERT_EQ(http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << http.substr(0, 200);
  EXPECT_NE(http.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  const size_t header_end = http.find("\r\n\r\n");
  ASSERT_NE(header_end, std::string::npos);
  const std::string http_body = http.substr(header_end + 4);
  EXPECT_NE(http.find("Content-Length: " + std::to_string(http_body.size()) + "\r\n"),
            std::string::npos);
  CheckPrometheus(http_body);
  const std::string http_json = Ask(options.stats_socket, "GET /json HTTP/1.0\r\n\r\n");
  ASSERT_EQ(http_json.rfind("HTTP/1.0 200 OK\r\n", 0), 0u);
  EXPECT_TRUE(Parse(http_json.substr(http_json.find("\r\n\r\n") + 4), &error)) << error;
  EXPECT_EQ(Ask(options.stats_socket, "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(Ask(options.stats_socket, "POST / HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  // HEAD: GET's headers, its Content-Length included, and no body.
  const std::string head = Ask(options.stats_socket, "HEAD /json HTTP/1.1\r\n\r\n");
  ASSERT_EQ(head.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("\r\n\r\n"), head.size() - 4) << head;
  EXPECT_NE(head.find("Content-Length: "), std::string::npos) << head;
  EXPECT_EQ(Ask(options.stats_socket, "HEAD /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);

  EXPECT_EQ(Ask(options.stats_socket, "xml\n"), "error: unknown request (json|prometheus)\n");

  // Shutdown removes the file and stops answering.
  CQD_ASSERT_OK(topo.TearDown());
  CQD_ASSERT_OK(topo.rt->Shutdown());
  EXPECT_FALSE(Exists(options.stats_socket));
  EXPECT_LT(Connect(options.stats_socket), 0);
}

// Stats::registrations follows every way a registration begins and ends.
TEST(Stats, CountLiveRegistrations) {
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build());
  EXPECT_EQ(bed.rt->GetStats().registrations, 0u);
  Recorder handlers[4];
  std::vector<SimQp*> qps{bed.qp};
  for (int i = 1; i < 4; ++i) {
    CQD_ASSERT_OK_AND_ASSIGN(qp, bed.sim->CreateQp(bed.cq.sim(), bed.cq.sim()));
    qps.push_back(qp);
  }
  std::vector<Registration> regs;
  for (int i = 0; i < 4; ++i) {
    handlers[i].qp_num = qps[i]->qp_num();
    CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*qps[i], handlers[i], 0));
    regs.push_back(std::move(reg));
  }
  EXPECT_EQ(bed.rt->GetStats().registrations, 4u);
  // A refused registration (the same QP twice) counts nothing.
  Recorder again;
  EXPECT_FALSE(bed.rt->RegisterQp(*qps[0], again, 0).ok());
  EXPECT_EQ(bed.rt->GetStats().registrations, 4u);
  regs[0].Unregister();
  EXPECT_EQ(bed.rt->GetStats().registrations, 3u);
  regs[0].Unregister();  // a second time: a no-op
  EXPECT_EQ(bed.rt->GetStats().registrations, 3u);
  CQD_ASSERT_OK_AND_ASSIGN(teardown, bed.rt->TeardownQp(regs[1]));
  CQD_ASSERT_OK(teardown.Wait());
  EXPECT_EQ(bed.rt->GetStats().registrations, 2u);
  { Registration gone = std::move(regs[2]); }  // destroyed: unregistered
  EXPECT_EQ(bed.rt->GetStats().registrations, 1u);
  EXPECT_NE(StatsToJson(bed.rt->GetStats()).find("\"registrations\":1,"), std::string::npos);
  regs[3].Unregister();
  EXPECT_EQ(bed.rt->GetStats().registrations, 0u);
}

// Prometheus scrapes the TCP listener directly; loopback only unless the engine says otherwise.
TEST(StatsEndpoint, ServesPrometheusOverLoopbackTcp) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  RuntimeOptions options;
  options.stats_tcp = "127.0.0.1:" + std::to_string(port);
  options.stats_per_cq = false;
  testing::OneQp bed;
  CQD_ASSERT_OK(bed.Build(options));
  Recorder handler;
  handler.qp_num = bed.qp->qp_num();
  CQD_ASSERT_OK_AND_ASSIGN(reg, bed.rt->RegisterQp(*bed.qp, handler, 0));
  ASSERT_TRUE(InjectRecvs(bed.qp, 0, 10));
  ASSERT_TRUE(WaitFor([&] { return handler.received() == 10; }));

  const std::string http = AskTcp(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << http.substr(0, 200);
  const size_t header_end = http.find("\r\n\r\n");
  ASSERT_NE(header_end, std::string::npos);
  Samples samples;
  CheckPrometheus(http.substr(header_end + 4), &samples);
  EXPECT_EQ(samples["cqd_registrations"][0].value, 1);
  EXPECT_EQ(samples["cqd_cqs"][0].value, 1);
  EXPECT_EQ(samples["cqd_consumer_delivered_total"][0].value, 10);
  EXPECT_EQ(samples.count("cqd_cq_completions_total"), 0u) << "stats_per_cq = false";
  const std::string json_http = AskTcp(port, "GET /json HTTP/1.0\r\n\r\n");
  ASSERT_EQ(json_http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u);
  std::optional<Json> root = Parse(json_http.substr(json_http.find("\r\n\r\n") + 4));
  ASSERT_TRUE(root);
  EXPECT_EQ(root->at("cqs").size(), 1u) << "JSON keeps the CQs";
  // The plain protocol too.
  EXPECT_TRUE(Parse(AskTcp(port, "json\n")));

  // The port is taken: a second runtime on it fails to start.
  RuntimeOptions twice;
  twice.stats_tcp = options.stats_tcp;
  EXPECT_EQ(Created(twice).code(), StatusCode::kAlreadyExists);

  reg.Unregister();
  CQD_ASSERT_OK(bed.rt->Shutdown());
  EXPECT_EQ(AskTcp(port, "json\n").rfind("<connect failed", 0), 0u) << "Shutdown closes it";
}

TEST(StatsEndpoint, TcpAddressesAreCheckedAndRemoteOnesRefusedUnlessAllowed) {
  for (const char* bad :
       {"localhost:9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
        "127.0.0.1:12ab", "[::1]9464", "[::1:9464", ":9464", "300.0.0.1:9464", "::1:9464"}) {
    RuntimeOptions options;
    options.stats_tcp = bad;
    const Status s = Created(options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad << ": " << s.ToString();
    EXPECT_NE(s.message().find("stats_tcp"), std::string::npos) << s.ToString();
  }
  for (const char* remote : {"0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "[2001:db8::1]:9464"}) {
    RuntimeOptions options;
    options.stats_tcp = remote;
    const Status s = Created(options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << remote;
    EXPECT_NE(s.message().find("stats_tcp_allow_remote"), std::string::npos) << s.ToString();
  }
  // Allowed: it binds (every interface here, reached through loopback).
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  RuntimeOptions options;
  options.stats_tcp = "0.0.0.0:" + std::to_string(port);
  options.stats_tcp_allow_remote = true;
  testing::Bed remote;
  CQD_ASSERT_OK(remote.CreateRuntime(options));
  EXPECT_TRUE(Parse(AskTcp(port, "json\n")));
  CQD_ASSERT_OK(remote.rt->Shutdown());
  // IPv6 loopback, where this machine has it.
  const int port6 = FreeTcpPort();
  RuntimeOptions v6;
  v6.stats_tcp = "[::1]:" + std::to_string(port6);
  testing::Bed loopback6;
  const Status created = loopback6.CreateRuntime(v6);
  if (created.ok()) {
    EXPECT_TRUE(Parse(AskTcp(port6, "json\n", /*v6=*/true)));
  } else {
    EXPECT_EQ(created.code(), StatusCode::kInternal) << created.ToString();
    EXPECT_NE(created.message().find("bind"), std::string::npos);
  }
}

TEST(StatsEndpoint, BadPathsFailCreate) {
  RuntimeOptions options;
  options.stats_socket = "/tmp/" + std::string(200, 'x');
  Status created = Created(options);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(created.message().find("stats_socket"), std::string::npos);

  options.stats_socket = std::string("/tmp/a\0b", 8);
  EXPECT_EQ(Created(options).code(), StatusCode::kInvalidArgument);

  options.stats_socket = "/nonexistent-cqd-dir/stats.sock";
  created = Created(options);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.code(), StatusCode::kInternal);
  EXPECT_NE(created.message().find("bind"), std::string::npos) << created.ToString();
  EXPECT_NE(created.message().find("/nonexistent-cqd-dir/stats.sock"), std::string::npos);

  // A regular file is in the way: refused, and left alone.
  const std::string file = SocketPath("plain-file");
  std::ofstream(file) << "keep me";
  options.stats_socket = file;
  created = Created(options);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.code(), StatusCode::kAlreadyExists) << created.ToString();
  std::ifstream in(file);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "keep me");
  unlink(file.c_str());
}

// The socket file is owner-only by default, whatever the umask (under umask 0 any local user
// could read the stats), and gets exactly the mode the engine asks for.
TEST(StatsEndpoint, SocketFileModeIsOwnerOnlyUnlessAsked) {
  const mode_t old_umask = umask(0);
  for (uint32_t mode : {0600u, 0660u, 0700u}) {
    RuntimeOptions options;
    options.stats_socket = SocketPath("mode.sock");
    if (mode != 0600) options.stats_socket_mode = mode;
    testing::Bed bed;
    const Status created = bed.CreateRuntime(options);
    ASSERT_TRUE(created.ok()) << created.ToString();
    struct stat st;
    ASSERT_EQ(stat(options.stats_socket.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, mode);
  }
  umask(old_umask);
  for (uint32_t bad : {01000u, 0444u, 0u}) {
    RuntimeOptions options;
    options.stats_socket = SocketPath("mode.sock");
    options.stats_socket_mode = bad;
    const Status created = Created(options);
    EXPECT_EQ(created.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(created.message().find("stats_socket_mode"), std::string::npos);
  }
}

TEST(StatsEndpoint, StaleSocketIsReplacedLiveOneIsNot) {
  const std::string path = SocketPath("stale.sock");
  {  // A socket file nobody listens on, as a crashed process leaves it.
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path.data(), path.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
    ASSERT_TRUE(Exists(path));
  }
  LogCollector log;
  RuntimeOptions options;
  options.stats_socket = path;
  options.log = log.Sink();
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  EXPECT_TRUE(log.Saw(LogLevel::kInfo, "replaced a stale socket"));
  EXPECT_TRUE(Parse(Ask(path, "json\n")));

  // A second runtime on the same path: refused; the first keeps serving.
  const Status second = Created(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.code(), StatusCode::kAlreadyExists) << second.ToString();
  EXPECT_TRUE(Parse(Ask(path, "json\n")));

  // The destructor alone (no Shutdown) removes the file too.
  bed.rt.reset();
  EXPECT_FALSE(Exists(path));
}

// A client that sends nothing and reads nothing neither holds up Shutdown nor, once dropped,
// other clients.
TEST(StatsEndpoint, SlowClientsDoNotHoldAnythingUp) {
  LogCollector log;
  RuntimeOptions options;
  // A response far bigger than a socket buffer: long consumer names in every consumer line.
  options.consumers.assign(4, ConsumerOptions{});
  for (size_t i = 0; i < options.consumers.size(); ++i) {
    options.consumers[i].kind = ConsumerKind::kEngineDriven;
    options.consumers[i].queue_capacity = 1;
    options.consumers[i].name = std::string(40000, static_cast<char>('a' + i));
  }
  options.stats_socket = SocketPath("slow.sock");
  options.log = log.Sink();
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  const std::string full = StatsToPrometheus(rt->GetStats());
  // The server's socket buffer (net.core.wmem_default) must be far smaller than the response
  // for the client to be dropped mid-way.
  uint64_t wmem = 0;
  std::ifstream("/proc/sys/net/core/wmem_default") >> wmem;
  const bool fits = wmem == 0 || full.size() < 2 * wmem;

  // Asks for Prometheus and does not read.
  int stuck = Connect(options.stats_socket);
  ASSERT_GE(stuck, 0);
  ASSERT_EQ(write(stuck, "prometheus\n", 11), 11);
  // Another client is answered once the server has given up on the first.
  std::optional<Json> root = Parse(Ask(options.stats_socket, "json\n"));
  ASSERT_TRUE(root);
  EXPECT_EQ(root->at("consumers").size(), 4u);
  const std::string partial = ReadAll(stuck);
  close(stuck);
  if (!fits) {
    EXPECT_LT(partial.size(), full.size()) << "dropped before it was all written";
    EXPECT_TRUE(log.Saw(LogLevel::kDebug, "dropped a client"));
  }

  // A silent client is connected while the runtime shuts down: Shutdown returns anyway.
  int silent = Connect(options.stats_socket);
  ASSERT_GE(silent, 0);
  CQD_ASSERT_OK(rt->Shutdown());
  EXPECT_FALSE(Exists(options.stats_socket));
  close(silent);
}

// A request bigger than the server reads (16 KB of headers) still gets its whole response: the
// unread part must not make the close reset the connection, which cut the response short.
TEST(StatsEndpoint, ARequestWithLargeHeadersGetsTheWholeResponse) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  RuntimeOptions options;
  options.consumers.assign(8, ConsumerOptions{});  // a response of several socket buffers' worth
  for (size_t i = 0; i < options.consumers.size(); ++i) {
    options.consumers[i].name = std::string(20000, static_cast<char>('a' + i));
  }
  options.stats_tcp = "127.0.0.1:" + std::to_string(port);
  options.stats_socket = SocketPath("large_headers.sock");
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nCookie: " + std::string(16384, 'c') + "\r\n\r\n";
  for (int round = 0; round < 10; ++round) {
    for (const bool tcp : {true, false}) {
      const std::string http = tcp ? AskTcp(port, request) : Ask(options.stats_socket, request);
      ASSERT_EQ(http.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << round << " " << http.substr(0, 80);
      const size_t header_end = http.find("\r\n\r\n");
      ASSERT_NE(header_end, std::string::npos);
      const size_t length_at = http.find("Content-Length: ");
      ASSERT_LT(length_at, header_end);
      const size_t length = std::stoul(http.substr(length_at + 16));
      EXPECT_EQ(http.size() - header_end - 4, length)
          << "round " << round << (tcp ? " (TCP)" : " (Unix)") << ": the response was cut short";
    }
  }
  CQD_ASSERT_OK(rt->Shutdown());
}

// An HTTP request line that does not end within the server's limits gets an HTTP error (414,
// 408), not the line protocol's.
TEST(StatsEndpoint, AnHttpRequestLineTooLongOrTooSlowGetsAnHttpError) {
  RuntimeOptions options;
  options.stats_socket = SocketPath("long_line.sock");
  testing::Bed bed;
  CQD_ASSERT_OK(bed.CreateRuntime(options));
  auto& rt = bed.rt;
  const std::string too_long =
      Ask(options.stats_socket, "GET /metrics?" + std::string(5000, 'x') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(too_long.rfind("HTTP/1.0 414 ", 0), 0u) << too_long.substr(0, 80);
  // Never a newline: the server answers when its wait for the request line ends.
  const std::string unfinished = Ask(options.stats_socket, "GET /metrics HTT");
  EXPECT_EQ(unfinished.rfind("HTTP/1.0 408 ", 0), 0u) << unfinished.substr(0, 80);
  // The line protocol's answers stay as they were.
  EXPECT_EQ(Ask(options.stats_socket, "bogus\n"), "error: unknown request (json|prometheus)\n");
  EXPECT_TRUE(Parse(Ask(options.stats_socket, "json", /*shut=*/true)));
  CQD_ASSERT_OK(rt->Shutdown());
}

// A relative stats_socket names a file in the directory the process was in at Create: Shutdown
// removes that file even after the process changed directory.
TEST(StatsEndpoint, ARelativeSocketIsRemovedAfterAChdir) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string base =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/cqd-rel-" + std::to_string(getpid());
  const std::string first = base + "-a", second = base + "-b";
  ASSERT_EQ(mkdir(first.c_str(), 0700), 0) << strerror(errno);
  ASSERT_EQ(mkdir(second.c_str(), 0700), 0) << strerror(errno);
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(chdir(first.c_str()), 0);
  RuntimeOptions options;
  options.stats_socket = "rel.sock";
  testing::Bed bed;
  const Status created = bed.CreateRuntime(options);
  ASSERT_EQ(chdir(second.c_str()), 0);
  EXPECT_TRUE(created.ok()) << created.ToString();
  if (created.ok()) {
    EXPECT_TRUE(Exists(first + "/rel.sock"));
    const Status shutdown = bed.rt->Shutdown();
    EXPECT_TRUE(shutdown.ok()) << shutdown.ToString();
    EXPECT_FALSE(Exists(first + "/rel.sock")) << "the socket file was left behind";
  }
  ASSERT_EQ(chdir(cwd), 0);
  rmdir(first.c_str());
  rmdir(second.c_str());
}

// ---- the log sink ----

}  // namespace
}  // namespace cqd::observe_test

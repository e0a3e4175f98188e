// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_server.h's checks, made before anything is bound: CheckTcp takes a
// numeric IPv4 "a.b.c.d:PORT" or IPv6 "[addr]:PORT" with PORT 1..65535, a loopback address
// unless remote ones are allowed (127/8, ::1 and IPv4-mapped 127/8 are loopback), and says what
// is wrong with the rest; CheckPath refuses what cannot be a Unix socket path.
#include "runtime/observe/stats_server.h"

#include <sys/un.h>

#include <string>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

void ExpectRefused(const Status& s, const std::string& says) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(says), std::string::npos) << s.ToString();
}

TEST(StatsServerCheckTcp, TakesNumericLoopbackAddressesWithAPort) {
  for (const char* ok : {"127.0.0.1:9464", "127.1.2.3:1", "127.0.0.1:65535", "[::1]:9464",
                         "[::ffff:127.0.0.2]:80", "[0:0:0:0:0:0:0:1]:8080"}) {
    const Status s = StatsServer::CheckTcp(ok, /*allow_remote=*/false);
    EXPECT_TRUE(s.ok()) << ok << ": " << s.ToString();
  }
}

TEST(StatsServerCheckTcp, RemoteAddressesOnlyWhenAllowed) {
  for (const char* remote : {"0.0.0.0:9464", "10.1.2.3:80", "128.0.0.1:80", "[::]:9464",
                             "[2001:db8::1]:9464", "[::ffff:10.0.0.1]:80"}) {
    ExpectRefused(StatsServer::CheckTcp(remote, false), "stats_tcp_allow_remote");
    const Status allowed = StatsServer::CheckTcp(remote, /*allow_remote=*/true);
    EXPECT_TRUE(allowed.ok()) << remote << ": " << allowed.ToString();
  }
}

TEST(StatsServerCheckTcp, SaysWhatIsWrong) {
  ExpectRefused(StatsServer::CheckTcp("127.0.0.1", false), "expected ADDRESS:PORT");
  ExpectRefused(StatsServer::CheckTcp("::1:9464", false), "[ADDRESS]:PORT");
  ExpectRefused(StatsServer::CheckTcp("[::1]9464", false), "[ADDRESS]:PORT");
  ExpectRefused(StatsServer::CheckTcp("[::1:9464", false), "[ADDRESS]:PORT");
  for (const char* port : {"127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:12ab",
                           "127.0.0.1:+80", "127.0.0.1:099999", "[::1]:-1"}) {
    ExpectRefused(StatsServer::CheckTcp(port, true), "the port must be a number from 1 to 65535");
  }
  for (const char* host : {"localhost:9464", ":9464", "300.0.0.1:9464", "[fe80::1%lo]:80"}) {
    ExpectRefused(StatsServer::CheckTcp(host, true), "is not a numeric IPv4 or IPv6 address");
  }
  // The message quotes what it was given.
  ExpectRefused(StatsServer::CheckTcp("localhost:9464", true), "stats_tcp \"localhost:9464\"");
}

TEST(StatsServerCheckPath, RefusesWhatCannotBeAUnixSocketPath) {
  constexpr size_t kMax = sizeof(sockaddr_un::sun_path) - 1;  // and its NUL
  EXPECT_TRUE(StatsServer::CheckPath(std::string(kMax, 'p')).ok());
  EXPECT_TRUE(StatsServer::CheckPath("relative/stats.sock").ok());
  ExpectRefused(StatsServer::CheckPath(std::string(kMax + 1, 'p')),
                "is " + std::to_string(kMax + 1) + " bytes long");
  ExpectRefused(StatsServer::CheckPath(std::string("/tmp/a\0b", 8)), "NUL");
}

}  // namespace
}  // namespace cqd::internal

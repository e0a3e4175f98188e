// SPDX-License-Identifier: BSD-2-Clause
// Stats as JSON and as Prometheus text (cqd/stats_format.h), checked by strict parsers.
#include <string>
#include <vector>

#include "tests/scenarios/observe/observe_checks.h"

namespace cqd::observe_test {
namespace {

using testing::InjectRecvs;
using testing::Recorder;
using testing::WaitFor;

// ---- the formats ----

TEST(StatsFormat, JsonIsWellFormedAndCarriesEveryField) {
  const Stats s = SampleStats();
  const std::string text = StatsToJson(s);
  std::string error;
  std::optional<Json> root = Parse(text, &error);
  ASSERT_TRUE(root) << error << "\n" << text;
  EXPECT_EQ(text.find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(root->at("version").get<std::string>(), Version().string);
  EXPECT_EQ(root->at("uptime_ns").get<uint64_t>(), s.uptime_ns);
  EXPECT_EQ(root->at("orphans").get<uint64_t>(), 3u);
  EXPECT_EQ(root->at("failed_fds").get<uint64_t>(), 1u);
  EXPECT_EQ(root->at("cm_events").get<uint64_t>(), 9u);
  EXPECT_EQ(root->at("cq_ack_calls").get<uint64_t>(), 1u);
  const Json* pollers = &root->at("pollers");
  ASSERT_TRUE(pollers && pollers->is_array());
  ASSERT_EQ(pollers->size(), 2u);
  EXPECT_EQ(pollers->at(0).at("cpu").get<int64_t>(), 2);
  EXPECT_EQ(pollers->at(1).at("cpu").get<int64_t>(), -1);
  EXPECT_EQ(pollers->at(0).at("completions").get<uint64_t>(), 18'446'744'073'709'551'615u);
  EXPECT_EQ(pollers->at(0).at("empty_polls").get<uint64_t>(), 10u);
  EXPECT_EQ(pollers->at(1).at("index").get<uint64_t>(), 1u);
  EXPECT_EQ(pollers->at(0).at("numa_node").get<int64_t>(), 1);
  EXPECT_EQ(pollers->at(1).at("numa_node").get<int64_t>(), -1);
  const Json* cqs = &root->at("cqs");
  ASSERT_TRUE(cqs && cqs->size() == 1);
  EXPECT_EQ(cqs->at(0).at("id").get<uint64_t>(), 7u);
  EXPECT_EQ(cqs->at(0).at("shard").get<int64_t>(), 1);
  EXPECT_EQ(cqs->at(0).at("events").get<uint64_t>(), 100u);
  EXPECT_EQ(cqs->at(0).at("comp_vector").get<int64_t>(), 3);
  const Json* devices = &root->at("devices");
  ASSERT_TRUE(devices && devices->size() == 2);
  EXPECT_EQ(devices->at(0).at("name").get<std::string>(), "mlx5_0");
  EXPECT_EQ(devices->at(0).at("comp_vectors").get<int64_t>(), 8);
  EXPECT_EQ(devices->at(0).at("failed").get<uint64_t>(), 1u);
  EXPECT_EQ(devices->at(0).at("cq_errors").get<uint64_t>(), 4u);
  EXPECT_EQ(devices->at(1).at("failed").get<uint64_t>(), 0u);
  EXPECT_EQ(devices->at(1).at("id").get<uint64_t>(), 2u);
  EXPECT_EQ(devices->at(1).at("name").get<std::string>(), "sim\"0\"");
  EXPECT_EQ(devices->at(1).at("numa_node").get<int64_t>(), -1);
  EXPECT_EQ(root->at("placement_cpus").get<std::string>(), "0-3,8-11");
  const Json* consumers = &root->at("consumers");
  ASSERT_TRUE(consumers && consumers->size() == 2);
  const Json& a = consumers->at(0);
  EXPECT_EQ(a.at("name").get<std::string>(), s.consumers[0].name) << "escaped and decoded back";
  EXPECT_EQ(a.at("delivered").get<uint64_t>(), 42u);
  EXPECT_EQ(a.at("cpu").get<int64_t>(), 5);
  EXPECT_EQ(a.at("numa_node").get<int64_t>(), 0);
  EXPECT_EQ(consumers->at(1).at("cpu").get<int64_t>(), -1);
  EXPECT_EQ(a.at("stalled_ns").get<uint64_t>(), 1'500'000'001u);
  const Json* latency = &a.at("latency");
  ASSERT_TRUE(latency && latency->at("enabled").get<bool>());
  EXPECT_EQ(latency->at("count").get<uint64_t>(), 6u);
  EXPECT_EQ(latency->at("p50_ns").get<uint64_t>(), 1024u);
  EXPECT_EQ(latency->at("max_ns").get<uint64_t>(), 1070u);
  const Json* buckets = &latency->at("buckets");
  ASSERT_TRUE(buckets && buckets->size() == 3);
  EXPECT_EQ(buckets->at(2).at(0).get<uint64_t>(), 1088u);
  EXPECT_EQ(buckets->at(2).at(1).get<uint64_t>(), 3u);
  EXPECT_EQ(consumers->at(1).at("name").get<std::string>(), kBadNameSanitized);
  EXPECT_FALSE(consumers->at(1).at("latency").at("enabled").get<bool>());
  // No raw control characters anywhere (the tab, newline and bell were escaped).
  for (char c : text) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
  // An empty Stats is valid JSON too.
  EXPECT_TRUE(Parse(StatsToJson(Stats{}), &error)) << error;
}

TEST(StatsFormat, TheValidatorIsStrict) {
  for (const char* bad :
       {"",        "{",           "{\"a\":1,}",  "[1,]",     "01",           "-",
        "1.",      "1e",          "+1",          "'a'",      "{\"a\" 1}",    "\"\x01\"",
        "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
        "{} {}",   "nul",         "[1 2]",       "{1:2}"}) {
    EXPECT_FALSE(Parse(bad)) << "accepted: " << bad;
  }
  for (const char* good : {"0", "-0.5e+3", "[]", "{}", " {\"a\" : [true, false, null]} ",
                           "\"\\ud83d\\ude00 \\u00fc \xc3\xbc\"", "18446744073709551615"}) {
    EXPECT_TRUE(Parse(good)) << "rejected: " << good;
  }
  EXPECT_EQ(Parse("\"\\ud83d\\ude00\"")->get<std::string>(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(Parse("18446744073709551615")->get<uint64_t>(), 18'446'744'073'709'551'615u);
}

// A NUL in a name would stop Prometheus's parser inside the label value: it becomes U+FFFD.
TEST(StatsFormat, ANulInANameNeverReachesThePrometheusText) {
  Stats s = SampleStats();
  ASSERT_FALSE(s.consumers.empty());
  s.consumers[0].name = std::string("a\0b", 3);
  ASSERT_FALSE(s.devices.empty());
  s.devices[0].name = std::string("\0dev", 4);
  const std::string text = StatsToPrometheus(s);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  EXPECT_NE(text.find("consumer=\"a\xEF\xBF\xBD"
                      "b\""),
            std::string::npos);
  CheckPrometheus(text);
}

TEST(StatsFormat, PrometheusFollowsTheExpositionFormat) {
  const Stats s = SampleStats();
  const std::string text = StatsToPrometheus(s);
  Samples samples;
  CheckPrometheus(text, &samples);
  ASSERT_FALSE(::testing::Test::HasFailure()) << text;

  ASSERT_EQ(samples["cqd_poller_completions_total"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_poller_completions_total"][0], "poller"), "0");
  EXPECT_EQ(samples["cqd_poller_completions_total"][0].value_text, "18446744073709551615");
  // Placement ids are labels of info families, empty where there is none; no -1 gauges.
  for (const char* gone : {"cqd_poller_cpu", "cqd_poller_numa_node", "cqd_cq_comp_vector",
                           "cqd_consumer_cpu", "cqd_consumer_numa_node", "cqd_device_numa_node"}) {
    EXPECT_EQ(samples.count(gone), 0u) << gone;
  }
  ASSERT_EQ(samples["cqd_poller_info"].size(), 2u);
  EXPECT_EQ(samples["cqd_poller_info"][0].value, 1);
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "poller"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "cpu"), "2");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][0], "numa_node"), "1");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][1], "cpu"), "");
  EXPECT_EQ(LabelOf(samples["cqd_poller_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_cq_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_cq_info"][0], "cq"), "7");
  EXPECT_EQ(LabelOf(samples["cqd_cq_info"][0], "comp_vector"), "3");
  ASSERT_EQ(samples["cqd_consumer_info"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][0], "cpu"), "5");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][0], "numa_node"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][1], "cpu"), "");
  EXPECT_EQ(LabelOf(samples["cqd_consumer_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_device_info"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][0], "numa_node"), "0");
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][1], "name"), "sim\"0\"");
  EXPECT_EQ(LabelOf(samples["cqd_device_info"][1], "numa_node"), "");
  ASSERT_EQ(samples["cqd_cqs"].size(), 1u);
  EXPECT_EQ(samples["cqd_cqs"][0].value, 1);
  ASSERT_EQ(samples["cqd_cq_events_total"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_cq_events_total"][0], "cq"), "7");
  EXPECT_EQ(LabelOf(samples["cqd_cq_events_total"][0], "shard"), "1");
  ASSERT_EQ(samples["cqd_consumer_delivered_total"].size(), 2u);
  const Sample& delivered = samples["cqd_consumer_delivered_total"][0];
  EXPECT_EQ(LabelOf(delivered, "consumer"), s.consumers[0].name) << "escaped and read back";
  EXPECT_EQ(LabelOf(delivered, "consumer_id"), "0");
  EXPECT_EQ(delivered.value, 42);
  EXPECT_EQ(LabelOf(samples["cqd_consumer_delivered_total"][1], "consumer"), kBadNameSanitized);
  EXPECT_EQ(samples["cqd_consumer_stalled_seconds_total"][0].value_text, "1.500000001");
  EXPECT_EQ(samples["cqd_uptime_seconds"][0].value_text, "12.345678901");
  EXPECT_EQ(samples["cqd_failed_fds_total"][0].value, 1);
  EXPECT_EQ(samples["cqd_cm_events_total"][0].value, 9);
  ASSERT_EQ(samples["cqd_device_comp_vectors"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_device_comp_vectors"][0], "device"), "1");
  EXPECT_EQ(LabelOf(samples["cqd_device_comp_vectors"][0], "name"), "mlx5_0");
  EXPECT_EQ(samples["cqd_device_comp_vectors"][0].value, 8);
  ASSERT_EQ(samples["cqd_device_failed"].size(), 2u);
  EXPECT_EQ(samples["cqd_device_failed"][0].value, 1);
  EXPECT_EQ(samples["cqd_device_failed"][1].value, 0);
  ASSERT_EQ(samples["cqd_device_cq_errors_total"].size(), 2u);
  EXPECT_EQ(LabelOf(samples["cqd_device_cq_errors_total"][0], "name"), "mlx5_0");
  EXPECT_EQ(samples["cqd_device_cq_errors_total"][0].value, 4);
  ASSERT_EQ(samples["cqd_placement_info"].size(), 1u);
  EXPECT_EQ(LabelOf(samples["cqd_placement_info"][0], "cpus"), "0-3,8-11");

  // The histogram: only the consumer that records latency; exact counts at powers of two.
  ASSERT_EQ(samples["cqd_consumer_latency_seconds_count"].size(), 1u);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_count"][0].value, 6);
  EXPECT_EQ(samples["cqd_consumer_latency_seconds_sum"][0].value_text, "0.000006000");
  std::map<std::string, double> by_le;
  for (const Sample& b : samples["cqd_consumer_latency_seconds_bucket"]) {
    by_le[LabelOf(b, "le")] = b.value;
  }
  EXPECT_EQ(by_le["0.000000016"], 1);  // the bucket ending at 16 ns
  EXPECT_EQ(by_le["0.000000512"], 1);
  EXPECT_EQ(by_le["0.000001024"], 3);  // + the two ending at 1024 ns
  EXPECT_EQ(by_le["0.000002048"], 6);  // + the three ending at 1088 ns
  EXPECT_EQ(by_le["4.294967296"], 6);
  EXPECT_EQ(by_le["+Inf"], 6);
  EXPECT_EQ(samples["cqd_consumer_latency_max_seconds"][0].value_text, "0.000001070");

  // No consumer records latency: no histogram family at all.
  Stats plain = s;
  for (auto& c : plain.consumers) c.latency = LatencyStats{};
  const std::string plain_text = StatsToPrometheus(plain);
  EXPECT_EQ(plain_text.find("latency"), std::string::npos);
  CheckPrometheus(plain_text);
  CheckPrometheus(StatsToPrometheus(Stats{}));

  // Without the per-CQ families: no cq label anywhere, the totals still there.
  Samples lean;
  const std::string lean_text = StatsToPrometheus(s, {.per_cq = false});
  CheckPrometheus(lean_text, &lean);
  EXPECT_EQ(lean_text.find("cq=\""), std::string::npos);
  EXPECT_EQ(lean.count("cqd_cq_events_total"), 0u);
  EXPECT_EQ(lean.count("cqd_cq_info"), 0u);
  EXPECT_EQ(lean["cqd_cqs"][0].value, 1);
  EXPECT_EQ(lean.count("cqd_cq_events_all_total"), 1u);
  EXPECT_EQ(lean["cqd_poller_completions_total"].size(), 2u);
}

// ---- the histogram ----

}  // namespace
}  // namespace cqd::observe_test

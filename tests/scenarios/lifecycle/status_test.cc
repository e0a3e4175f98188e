// SPDX-License-Identifier: BSD-2-Clause
// Result<T>: a failed result's value() prints its status and aborts in every build mode (never
// throws, never loses the message); a Result built from an OK status is failed and says why.
// And cqd::Version() agrees with the headers' macros.
#include "cqd/status.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "cqd/runtime.h"
#include "cqd/version.h"

namespace cqd {
namespace {

constexpr char kDies[] =
    "cqd: Result::value\\(\\) of a failed result: RESOURCE_EXHAUSTED: RegisterQp: all 4 "
    "registrations \\(max_registrations\\) are in use";

Result<int> Exhausted() {
  return ResourceExhausted("RegisterQp: all 4 registrations (max_registrations) are in use");
}

TEST(ResultDeathTest, ValueOfAFailedResultPrintsTheStatusAndAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH((void)Exhausted().value(), kDies);  // rvalue
  Result<int> failed = Exhausted();
  EXPECT_DEATH((void)failed.value(), kDies);  // lvalue
  const Result<int>& constant = failed;
  EXPECT_DEATH((void)constant.value(), kDies);
  EXPECT_DEATH((void)*failed, kDies);
  Result<std::string> text = NotFound("no such CQ");
  EXPECT_DEATH((void)text->size(), "failed result: NOT_FOUND: no such CQ");
}

TEST(ResultDeathTest, AFailedCreateDiesWithItsMessageNotAnException) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RuntimeOptions options;
  options.pollers = 0;  // never valid
  Result<std::unique_ptr<Runtime>> created = Runtime::Create(options);
  ASSERT_FALSE(created.ok());
  const std::string message = created.status().ToString();
  EXPECT_FALSE(message.empty());
  // The whole status text reaches stderr (escaped: it is matched as a regular expression).
  std::string pattern;
  for (char c : message) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) pattern += '\\';
    pattern += c;
  }
  EXPECT_DEATH((void)std::move(created).value(), "failed result: " + pattern);
}

TEST(ResultTest, AValueIsReturnedUntouched) {
  Result<std::string> text = std::string("kept");
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text.status().ok());
  EXPECT_EQ(text.value(), "kept");
  EXPECT_EQ(text->size(), 4u);
  EXPECT_EQ(*text, "kept");
  EXPECT_EQ(std::move(text).value(), "kept");
}

TEST(ResultTest, AResultBuiltFromAnOkStatusIsFailedAndSaysSo) {
  Result<int> odd = Status::Ok();
  EXPECT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInternal);
  EXPECT_NE(odd.status().message().find("OK status"), std::string::npos);
}

TEST(VersionTest, TheLibraryAgreesWithTheHeaders) {
  const VersionInfo v = Version();
  EXPECT_EQ(v.major, CQD_VERSION_MAJOR);
  EXPECT_EQ(v.minor, CQD_VERSION_MINOR);
  EXPECT_EQ(v.patch, CQD_VERSION_PATCH);
  EXPECT_STREQ(v.string, CQD_VERSION_STRING);
  EXPECT_EQ(std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch),
            v.string);
  EXPECT_EQ(CQD_VERSION_NUMBER, v.major * 10000 + v.minor * 100 + v.patch);
}

}  // namespace
}  // namespace cqd

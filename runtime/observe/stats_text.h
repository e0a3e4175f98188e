// SPDX-License-Identifier: BSD-2-Clause
// runtime/observe/stats_text.h: the text writers both stats formats share (stats_format_json.cc,
// stats_format_prometheus.cc): UTF-8 decoding with U+FFFD for bad bytes, and decimal integers.
//
// Threading: pure functions; any thread.
#ifndef CQD_RUNTIME_OBSERVE_STATS_TEXT_H_
#define CQD_RUNTIME_OBSERVE_STATS_TEXT_H_

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace cqd::stats_text {
// Calls emit(code_point) for each character of `s`, decoded as UTF-8; a byte that does not start
// a valid, shortest-form sequence of a scalar value comes out as U+FFFD.
template <typename Emit>
void DecodeUtf8(std::string_view s, Emit&& emit) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      emit(static_cast<char32_t>(b0));
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = (b & 0xc0) == 0x80;
      cp = (cp << 6) | (b & 0x3f);
    }
    ok = ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      emit(char32_t{0xfffd});
      ++i;
      continue;
    }
    emit(cp);
    i += len;
  }
}

inline void AppendU64(std::string& out, uint64_t v) {
  char buf[24];
  int n = snprintf(buf, sizeof(buf), "%" PRIu64, v);
  out.append(buf, static_cast<size_t>(n));
}

inline void AppendI64(std::string& out, int64_t v) {
  char buf[24];
  int n = snprintf(buf, sizeof(buf), "%" PRId64, v);
  out.append(buf, static_cast<size_t>(n));
}

}  // namespace cqd::stats_text

#endif  // CQD_RUNTIME_OBSERVE_STATS_TEXT_H_

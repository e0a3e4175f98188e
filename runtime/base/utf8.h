// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/utf8.h: UTF-8 encoding of one code point, for the stats formats. Pure function;
// any thread.
#ifndef CQD_RUNTIME_BASE_UTF8_H_
#define CQD_RUNTIME_BASE_UTF8_H_

#include <string>

namespace cqd::internal {

// Appends `cp` (a Unicode scalar value, at most U+10FFFF) to `out` as UTF-8.
inline void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_UTF8_H_

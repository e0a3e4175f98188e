// SPDX-License-Identifier: BSD-2-Clause
// tools/mini_json.h: a small, strict JSON (RFC 8259) parser for cqd's own tools and tests.
//
// It accepts exactly the JSON grammar (no comments, no trailing commas, no leading zeros, no
// raw control characters or invalid UTF-8 in strings, nothing after the value) and builds a
// tree. Numbers keep their text, so that 64-bit counters come back exact (AsU64). Nesting is
// limited to 64 levels. Not made for speed: stats documents are small.
#ifndef CQD_TOOLS_MINI_JSON_H_
#define CQD_TOOLS_MINI_JSON_H_

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/utf8.h"

namespace cqd::json {

struct Value {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string text;          // kString: the decoded string; kNumber: the number as written
  std::vector<Value> items;  // kArray
  std::vector<std::pair<std::string, Value>> fields;  // kObject, in document order

  bool is(Type t) const { return type == t; }
  // kObject: the first field called `key`, or null.
  const Value* Get(std::string_view key) const {
    if (type != Type::kObject) return nullptr;
    for (const auto& [k, v] : fields) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  // kNumber holding a non-negative integer that fits: its value.
  std::optional<uint64_t> AsU64() const {
    if (type != Type::kNumber || text.empty() || text[0] == '-') return std::nullopt;
    if (text.find_first_of(".eE") != std::string::npos) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    unsigned long long v = strtoull(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return std::nullopt;
    return static_cast<uint64_t>(v);
  }
  std::optional<int64_t> AsI64() const {
    if (type != Type::kNumber || text.find_first_of(".eE") != std::string::npos) {
      return std::nullopt;
    }
    errno = 0;
    char* end = nullptr;
    long long v = strtoll(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return std::nullopt;
    return static_cast<int64_t>(v);
  }
  std::optional<double> AsDouble() const {
    if (type != Type::kNumber) return std::nullopt;
    return strtod(text.c_str(), nullptr);
  }
  // Shorthands for objects: the field as a number, or `fallback` when missing or not one.
  uint64_t U64(std::string_view key, uint64_t fallback = 0) const {
    const Value* v = Get(key);
    return v != nullptr && v->AsU64() ? *v->AsU64() : fallback;
  }
  int64_t I64(std::string_view key, int64_t fallback = 0) const {
    const Value* v = Get(key);
    return v != nullptr && v->AsI64() ? *v->AsI64() : fallback;
  }
  std::string Str(std::string_view key, std::string fallback = "") const {
    const Value* v = Get(key);
    return v != nullptr && v->is(Type::kString) ? v->text : fallback;
  }
};

namespace detail {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::optional<Value> Document(std::string* error) {
    Value v;
    bool ok = ParseValue(v, 0);
    if (ok) {
      SkipSpace();
      if (pos_ != s_.size()) ok = Fail("unexpected text after the value");
    }
    if (!ok) {
      if (error != nullptr) *error = error_ + " at byte " + std::to_string(pos_);
      return std::nullopt;
    }
    return v;
  }

 private:
  bool Fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return Fail("invalid literal");
    pos_ += word.size();
    return true;
  }
  bool Digits() {
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ > start || Fail("digit expected");
  }

  bool ParseValue(Value& v, int depth) {
    if (depth > 64) return Fail("nested too deeply");
    SkipSpace();
    if (pos_ >= s_.size()) return Fail("value expected");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(v, depth);
    if (c == '[') return ParseArray(v, depth);
    if (c == '"') {
      v.type = Value::Type::kString;
      return ParseString(v.text);
    }
    if (c == 't' || c == 'f') {
      v.type = Value::Type::kBool;
      v.boolean = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v.type = Value::Type::kNull;
      return Literal("null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(v);
    return Fail("value expected");
  }

  bool ParseNumber(Value& v) {
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;  // a leading zero stands alone
    } else if (!Digits()) {
      return false;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!Digits()) return false;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!Digits()) return false;
    }
    v.type = Value::Type::kNumber;
    v.text = std::string(s_.substr(start, pos_ - start));
    return true;
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Fail("bad hex digit in \\u escape");
      }
    }
    *out = v;
    return true;
  }

  // A raw UTF-8 sequence starting at pos_ (its first byte >= 0x80): copied if valid.
  bool Utf8(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[pos_]);
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      return Fail("invalid UTF-8");
    }
    if (pos_ + len > s_.size()) return Fail("truncated UTF-8");
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s_[pos_ + k]);
      if ((b & 0xc0) != 0x80) return Fail("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return Fail("invalid UTF-8");
    }
    out.append(s_.substr(pos_, len));
    pos_ += len;
    return true;
  }

  bool ParseString(std::string& out) {
    ++pos_;  // the opening quote
    for (;;) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("raw control character in string");
      if (c >= 0x80) {
        if (!Utf8(out)) return false;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) return Fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xdc00 && cp <= 0xdfff) return Fail("lone low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t low;
            if (s_.substr(pos_, 2) != "\\u") return Fail("lone high surrogate");
            pos_ += 2;
            if (!Hex4(&low)) return false;
            if (low < 0xdc00 || low > 0xdfff) return Fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          internal::AppendUtf8(out, static_cast<char32_t>(cp));
          break;
        }
        default:
          return Fail("invalid escape");
      }
    }
  }

  bool ParseArray(Value& v, int depth) {
    v.type = Value::Type::kArray;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      v.items.emplace_back();
      if (!ParseValue(v.items.back(), depth + 1)) return false;
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("',' or ']' expected");
    }
  }

  bool ParseObject(Value& v, int depth) {
    v.type = Value::Type::kObject;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("field name expected");
      std::string key;
      if (!ParseString(key)) return false;
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("':' expected");
      ++pos_;
      v.fields.emplace_back(std::move(key), Value());
      if (!ParseValue(v.fields.back().second, depth + 1)) return false;
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("',' or '}' expected");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace detail

// Returns the document's value, or nullopt (and, if `error` is set, what is wrong and where).
inline std::optional<Value> Parse(std::string_view text, std::string* error = nullptr) {
  return detail::Parser(text).Document(error);
}

}  // namespace cqd::json

#endif  // CQD_TOOLS_MINI_JSON_H_

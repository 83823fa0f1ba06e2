#pragma once
// Small tokenizer.json documents written by hand for the unit tests, and the helpers to build them.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "engine/text/detail/byte_level.hpp"
#include "engine/text/text_codec.hpp"
#include "engine/text/tokenizer_json.hpp"

namespace troupe::text::testing {

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// A vocab object from tokens numbered in order.
inline std::string vocab_json(const std::vector<std::string>& tokens) {
  std::string out = "{";
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += ",";
    out += json_string(tokens[i]) + ":" + std::to_string(i);
  }
  return out + "}";
}

// The 256 characters of the byte-level alphabet, in byte order (ids 0..255), then `extra`.
inline std::vector<std::string> byte_level_tokens(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(detail::byte_level_char(static_cast<unsigned char>(b)));
  t.insert(t.end(), extra.begin(), extra.end());
  return t;
}

// The byte-level form of a text, as a vocabulary holds it.
inline std::string byte_level(std::string_view s) {
  std::string out;
  detail::byte_level_encode(s, out);
  return out;
}

// The 256 <0xXX> tokens (ids 0..255), then `extra`: a SentencePiece-style vocabulary.
inline std::vector<std::string> byte_fallback_tokens(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> t;
  static constexpr char hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) t.push_back(std::string{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'});
  t.insert(t.end(), extra.begin(), extra.end());
  return t;
}

inline text_codec codec_from(const std::string& json) {
  auto tok = parse_tokenizer_json(json, "test-tokenizer.json");
  EXPECT_TRUE(tok) << tok.error().message();
  return text_codec(std::move(*tok), {}, "");
}

inline std::vector<token_id> ids_of(const text_codec& c, std::string_view text, bool add_special = false) {
  auto r = c.encode(text, add_special);
  EXPECT_TRUE(r) << r.error().message();
  return r ? *r : std::vector<token_id>{};
}

}  // namespace troupe::text::testing

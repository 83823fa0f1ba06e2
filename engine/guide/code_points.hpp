#pragma once
// Code points for the guide's grammar builders (the GBNF parser, the regex translator): a code point's
// UTF-8 bytes, and sets of code points as sorted inclusive ranges.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::guide {

inline std::string encode_utf8(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

using cp_range = std::pair<std::uint32_t, std::uint32_t>;  // inclusive
using cp_set = std::vector<cp_range>;                      // normalized: sorted, disjoint, not adjacent
inline constexpr std::uint32_t max_code_point = 0x10FFFF;

inline cp_set normalize(cp_set rs) {
  std::sort(rs.begin(), rs.end());
  cp_set out;
  for (auto r : rs) {
    if (r.first > r.second) continue;
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

// Every code point up to U+10FFFF not in rs.
inline cp_set complement(const cp_set& rs) {
  cp_set out;
  std::uint32_t next = 0;
  for (auto [lo, hi] : normalize(rs)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= max_code_point) out.emplace_back(next, max_code_point);
  return out;
}

}  // namespace troupe::guide

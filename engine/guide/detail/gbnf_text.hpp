#pragma once
// Small builders of GBNF text shared by the JSON-schema converter and its number ranges.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::guide::detail {

inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string s;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!s.empty()) s += sep;
    s += p;
  }
  return s;
}

// One alternative set as a sequence element; "" in `alts` is the empty string.
inline std::string group(const std::vector<std::string>& alts) {
  std::vector<std::string> ne;
  bool eps = false;
  for (const auto& a : alts) {
    if (a.empty()) eps = true;
    else ne.push_back(a);
  }
  if (ne.empty()) return "";
  if (ne.size() == 1 && !eps) return ne[0];
  return "(" + join(ne, " | ") + ")" + (eps ? "?" : "");
}

// `atom` (one element) repeated min..max times (max < 0: unbounded).
inline std::string repeated(const std::string& atom, std::int64_t min, std::int64_t max) {
  if (max == 0) return "";
  if (min == 1 && max == 1) return atom;
  if (max < 0) return atom + (min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}");
  if (min == 0 && max == 1) return atom + "?";
  if (min == max) return atom + "{" + std::to_string(min) + "}";
  return atom + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

}  // namespace troupe::guide::detail

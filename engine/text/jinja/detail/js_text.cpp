#include "engine/text/jinja/detail/js_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/text/jinja/detail/case_table.hpp"

namespace troupe::text::jinja::detail {
namespace {

constexpr char32_t replacement = 0xFFFD;

// The length of the valid UTF-8 sequence at s[i], 0 when the bytes there start none.
std::size_t valid_sequence_at(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  std::size_t len = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) len = 2, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, min = 0x10000;
  else return 0;
  if (i + len > s.size()) return 0;
  char32_t cp = b0 & (0x7F >> len);
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// The UTF-16 code units of a code point: one, or a surrogate pair.
int utf16_units(char32_t cp, char16_t out[2]) {
  if (cp < 0x10000) {
    out[0] = static_cast<char16_t>(cp);
    return 1;
  }
  cp -= 0x10000;
  out[0] = static_cast<char16_t>(0xD800 + (cp >> 10));
  out[1] = static_cast<char16_t>(0xDC00 + (cp & 0x3FF));
  return 2;
}

void append_mapped(std::string& out, char32_t cp, const case_table& table) {
  const auto& exp = table.expansions;
  auto e = std::lower_bound(exp.begin(), exp.end(), cp,
                            [](const case_expansion& x, char32_t c) { return x.from < c; });
  if (e != exp.end() && e->from == cp) {
    for (char32_t t : e->to)
      if (t != 0) append_utf8(out, t);
    return;
  }
  const auto& rs = table.ranges;
  auto r = std::upper_bound(rs.begin(), rs.end(), cp, [](char32_t c, const case_range& x) { return c < x.first; });
  if (r != rs.begin()) {
    --r;
    const char32_t offset = cp - r->first;
    if (offset % r->stride == 0 && offset / r->stride < r->count) {
      append_utf8(out, static_cast<char32_t>(static_cast<std::int64_t>(cp) + r->delta));
      return;
    }
  }
  append_utf8(out, cp);
}

std::string map_case(std::string_view s, const case_table& table, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      // ASCII is most text; the tables agree with this shortcut.
      if (upper) out.push_back(static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c));
      else out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    append_mapped(out, next_code_point(s, i), table);
  }
  return out;
}

// The digits and decimal exponent of the shortest round-trip form of a finite, positive v:
// v = 0.d1d2...dk * 10^n.
void shortest_digits(double v, std::string& digits, int& n) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  const auto e = sci.find('e');
  digits.clear();
  for (char c : sci.substr(0, e))
    if (c != '.') digits.push_back(c);
  int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  n = exp10 + 1;
}

// The longest prefix of s that is a StrDecimalLiteral; `consumed` says how many bytes it took.
std::optional<double> parse_decimal_prefix(std::string_view s, std::size_t& consumed) {
  std::size_t i = 0;
  std::string text;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) text.push_back(s[i++]);
  if (s.substr(i).starts_with("Infinity")) {
    consumed = i + 8;
    return text == "-" ? -HUGE_VAL : HUGE_VAL;
  }
  std::size_t int_digits = 0, frac_digits = 0;
  while (i < s.size() && is_ascii_digit(s[i])) text.push_back(s[i++]), ++int_digits;
  if (i < s.size() && s[i] == '.') {
    std::size_t j = i + 1;
    std::string frac;
    while (j < s.size() && is_ascii_digit(s[j])) frac.push_back(s[j++]), ++frac_digits;
    if (int_digits > 0 || frac_digits > 0) {
      text += "." + frac;
      i = j;
    }
  }
  if (int_digits == 0 && frac_digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    std::size_t j = i + 1;
    std::string exp = "e";
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) exp.push_back(s[j++]);
    std::size_t exp_digits = 0;
    while (j < s.size() && is_ascii_digit(s[j])) exp.push_back(s[j++]), ++exp_digits;
    if (exp_digits > 0) {
      text += exp;
      i = j;
    }
  }
  consumed = i;
  return std::strtod(text.c_str(), nullptr);
}

}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = valid_sequence_at(s, i);
    if (len == 0) {
      append_utf8(out, replacement);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t len = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : 4;
  if (i + len > s.size()) len = s.size() - i;
  char32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
  for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = replacement;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_js_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::size_t js_space_at(std::string_view s, std::size_t i) {
  if (i >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return is_js_space(c) ? 1 : 0;
  // Only U+00A0 (C2), U+1680 and U+2000 up (E1, E2, E3, EF) can be whitespace.
  if (c != 0xC2 && c != 0xE1 && c != 0xE2 && c != 0xE3 && c != 0xEF) return 0;
  std::size_t j = i;
  const char32_t cp = next_code_point(s, j);
  return is_js_space(cp) ? j - i : 0;
}

std::string_view js_trim_start(std::string_view s) {
  std::size_t i = 0;
  while (std::size_t n = js_space_at(s, i)) i += n;
  return s.substr(i);
}

std::string_view js_trim_end(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    // Step back to the start of the last code point.
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (js_space_at(s, start) != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string_view js_trim(std::string_view s) { return js_trim_end(js_trim_start(s)); }

std::size_t utf16_length(std::string_view s) {
  std::size_t n = 0;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c & 0xC0) != 0x80) n += c >= 0xF0 ? 2 : 1;
  }
  return n;
}

std::optional<std::string> utf16_at(std::string_view s, std::int64_t index) {
  const auto len = static_cast<std::int64_t>(utf16_length(s));
  if (index < 0) index += len;
  if (index < 0 || index >= len) return std::nullopt;
  std::int64_t unit = 0;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t start = i;
    const char32_t cp = next_code_point(s, i);
    const std::int64_t width = cp >= 0x10000 ? 2 : 1;
    if (index < unit + width) {
      if (width == 2) return std::string("\xEF\xBF\xBD");  // half of a surrogate pair
      return std::string(s.substr(start, i - start));
    }
    unit += width;
  }
  return std::nullopt;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t start = i;
    next_code_point(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

int utf16_compare(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  char16_t ua[2], ub[2];
  int na = 0, nb = 0, ka = 0, kb = 0;
  while (true) {
    if (ka == na) {
      if (i >= a.size()) na = 0;
      else na = utf16_units(next_code_point(a, i), ua);
      ka = 0;
    }
    if (kb == nb) {
      if (j >= b.size()) nb = 0;
      else nb = utf16_units(next_code_point(b, j), ub);
      kb = 0;
    }
    if (na == 0 || nb == 0) return na == 0 ? (nb == 0 ? 0 : -1) : 1;
    if (ua[ka] != ub[kb]) return ua[ka] < ub[kb] ? -1 : 1;
    ++ka;
    ++kb;
  }
}

std::string js_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  if (v == 0) return "0";
  std::string out = v < 0 ? "-" : "";
  std::string d;
  int n = 0;
  shortest_digits(std::fabs(v), d, n);
  const int k = static_cast<int>(d.size());
  if (k <= n && n <= 21) {
    out += d + std::string(static_cast<std::size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += d.substr(0, static_cast<std::size_t>(n)) + "." + d.substr(static_cast<std::size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-n), '0') + d;
  } else {
    const int e = n - 1;
    out += d.substr(0, 1);
    if (k > 1) out += "." + d.substr(1);
    out += e < 0 ? "e-" : "e+";
    out += std::to_string(e < 0 ? -e : e);
  }
  return out;
}

std::string js_integer(std::int64_t v) {
  constexpr std::int64_t exact = std::int64_t{1} << 53;
  if (v >= -exact && v <= exact) return std::to_string(v);
  return js_number(static_cast<double>(v));
}

std::string js_float(double v) {
  if (v == 0 && std::signbit(v)) return "-0.0";
  if (std::isfinite(v) && std::trunc(v) == v && std::fabs(v) < 1e21) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  return js_number(v);
}

std::optional<double> js_parse_int(std::string_view s) {
  s = js_trim_start(s);
  std::size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const std::size_t start = i;
  while (i < s.size() && is_ascii_digit(s[i])) ++i;
  if (i == start) return std::nullopt;
  const double v = std::strtod(std::string(s.substr(start, i - start)).c_str(), nullptr);
  return negative ? -v : v;
}

std::optional<double> js_parse_float(std::string_view s) {
  std::size_t consumed = 0;
  return parse_decimal_prefix(js_trim_start(s), consumed);
}

double js_to_number(std::string_view s) {
  s = js_trim(s);
  if (s.empty()) return 0.0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X' || s[1] == 'o' || s[1] == 'O' || s[1] == 'b' || s[1] == 'B')) {
    const int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
    double v = 0;
    for (const char c : s.substr(2)) {
      int d = is_ascii_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 99;
      if (d >= base) return std::nan("");
      v = v * base + d;
    }
    return v;
  }
  std::size_t consumed = 0;
  auto v = parse_decimal_prefix(s, consumed);
  if (!v || consumed != s.size()) return std::nan("");
  return *v;
}

std::string js_upper(std::string_view s) { return map_case(s, upper_case_table(), true); }
std::string js_lower(std::string_view s) { return map_case(s, lower_case_table(), false); }

std::string js_capitalize(std::string_view s) {
  if (s.empty()) return {};
  std::size_t i = 0;
  const char32_t first = next_code_point(s, i);
  // An astral first code point is a surrogate pair in JavaScript: its first half does not change.
  if (first >= 0x10000) return std::string(s);
  std::string out = js_upper(s.substr(0, i));
  out.append(s.substr(i));
  return out;
}

std::string js_title(std::string_view s) {
  std::string out(s);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const bool word = is_ascii_word(out[i]);
    const bool boundary = i == 0 || !is_ascii_word(out[i - 1]);
    if (word && boundary && out[i] >= 'a' && out[i] <= 'z') out[i] = static_cast<char>(out[i] - 32);
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  static constexpr char hex[] = "0123456789abcdef";
  auto unit_escape = [&](char16_t u) {
    out += "\\u";
    out.push_back(hex[(u >> 12) & 0xF]);
    out.push_back(hex[(u >> 8) & 0xF]);
    out.push_back(hex[(u >> 4) & 0xF]);
    out.push_back(hex[u & 0xF]);
  };
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7F)) unit_escape(c);
          else out.push_back(static_cast<char>(c));
      }
      continue;
    }
    const std::size_t start = i;
    const char32_t cp = next_code_point(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
      continue;
    }
    char16_t units[2];
    const int n = utf16_units(cp, units);
    for (int k = 0; k < n; ++k) unit_escape(units[k]);
  }
  out.push_back('"');
}

}  // namespace troupe::text::jinja::detail

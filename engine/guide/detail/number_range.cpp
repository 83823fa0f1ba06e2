#include "engine/guide/detail/number_range.hpp"

#include <charconv>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "engine/guide/detail/gbnf_text.hpp"
#include "engine/guide/grammar.hpp"

namespace troupe::guide::detail {
namespace {



std::string digit(char d) { return std::string("\"") + d + "\""; }
std::string digit_class(char lo, char hi) {
  if (lo == hi) return digit(lo);
  if (lo == '0' && hi == '9') return "[0-9]";
  return std::string("[") + lo + "-" + hi + "]";
}
std::string any_digits(std::size_t n) { return n == 0 ? "" : repeated("[0-9]", static_cast<std::int64_t>(n), static_cast<std::int64_t>(n)); }

// ---- exact decimals -----------------------------------------------------------------------------------

// Leading zeros of the integer digits and trailing ones of the fraction dropped; zero not negative.
decimal canonical(bool neg, std::string ip, std::string fp) {
  const auto nz = ip.find_first_not_of('0');
  ip = nz == std::string::npos ? "0" : ip.substr(nz);
  while (!fp.empty() && fp.back() == '0') fp.pop_back();
  return {neg && !(ip == "0" && fp.empty()), std::move(ip), std::move(fp)};
}

int compare_mag(const decimal& a, const decimal& b) {
  if (a.ip.size() != b.ip.size()) return a.ip.size() < b.ip.size() ? -1 : 1;
  if (auto c = a.ip.compare(b.ip)) return c < 0 ? -1 : 1;
  if (auto c = a.fp.compare(b.fp)) return c < 0 ? -1 : 1;
  return 0;
}

// Digit strings of integers, plus and minus one.
std::string inc(std::string s) {
  for (auto i = s.size(); i-- > 0;) {
    if (s[i] != '9') return ++s[i], s;
    s[i] = '0';
  }
  return "1" + s;
}
std::string dec(std::string s) {  // s > 0
  for (auto i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  return canonical(false, s, "").ip;
}
bool le(const std::string& a, const std::string& b) { return compare({false, a, ""}, {false, b, ""}) <= 0; }

// ---- integer and number ranges ------------------------------------------------------------------------

// Digit strings of a's length from a to b (a <= b), leading zeros allowed.
std::string digits_between(std::string_view a, std::string_view b) {
  std::size_t same = 0;
  while (same < a.size() && a[same] == b[same]) ++same;
  if (same > 0) return join({gbnf_literal(a.substr(0, same)), digits_between(a.substr(same), b.substr(same))}, " ");
  if (a.empty()) return "";
  const auto n = a.size() - 1;
  const bool a_full = a.substr(1).find_first_not_of('0') == std::string_view::npos;
  const bool b_full = b.substr(1).find_first_not_of('9') == std::string_view::npos;
  const char mid_lo = a_full ? a[0] : static_cast<char>(a[0] + 1), mid_hi = b_full ? b[0] : static_cast<char>(b[0] - 1);
  std::vector<std::string> alts;
  if (!a_full) alts.push_back(join({digit(a[0]), digits_between(a.substr(1), std::string(n, '9'))}, " "));
  if (mid_lo <= mid_hi) alts.push_back(join({digit_class(mid_lo, mid_hi), any_digits(n)}, " "));
  if (!b_full) alts.push_back(join({digit(b[0]), digits_between(std::string(n, '0'), b.substr(1))}, " "));
  return alts.size() == 1 ? alts[0] : "(" + join(alts, " | ") + ")";
}

// Canonical naturals from a to b (nullopt: unbounded), a <= b.
std::string natural_range(const std::string& a, const std::optional<std::string>& b) {
  const auto la = a.size();
  if (b && b->size() == la) return digits_between(a, *b);
  std::vector<std::string> alts{digits_between(a, std::string(la, '9'))};
  if (!b) {
    alts.push_back("[1-9] " + repeated("[0-9]", static_cast<std::int64_t>(la), -1));
  } else {
    const auto lb = b->size();
    if (lb - la >= 2) alts.push_back("[1-9] " + repeated("[0-9]", static_cast<std::int64_t>(la), static_cast<std::int64_t>(lb - 2)));
    alts.push_back(digits_between("1" + std::string(lb - 1, '0'), *b));
  }
  return "(" + join(alts, " | ") + ")";
}

// Fraction digit strings F (0.F against the fractions of the bounds): a digit automaton whose state is
// (digits read, still equal to the lower bound's digits, still equal to the upper's). Alternatives;
// "" is the empty string, none at all is no string.
struct fraction_bounds {
  std::optional<std::pair<std::string, bool>> lo, hi;  // fraction digits, exclusive
};

bool frac_accepts(const fraction_bounds& b, std::size_t i, bool tl, bool th) {
  return (!tl || (i >= b.lo->first.size() && !b.lo->second)) && (!th || i < b.hi->first.size() || !b.hi->second);
}

std::vector<std::string> frac_rest(const fraction_bounds& b, std::size_t i, bool tl, bool th);

std::vector<std::string> frac_nonempty(const fraction_bounds& b, std::size_t i, bool tl, bool th) {
  const bool lo_done = !tl || i >= b.lo->first.size(), hi_done = !th || i >= b.hi->first.size();
  if (lo_done && hi_done) {  // every later bound digit is 0: closed forms
    if (!tl && !th) return {"[0-9]+"};
    if (tl && !th) return {b.lo->second ? "\"0\"* [1-9] [0-9]*" : "[0-9]+"};
    return frac_accepts(b, i, tl, th) ? std::vector<std::string>{"\"0\"+"} : std::vector<std::string>{};
  }
  const char l = tl && i < b.lo->first.size() ? b.lo->first[i] : '0';
  const char h = th ? (i < b.hi->first.size() ? b.hi->first[i] : '0') : '9';
  std::vector<std::string> alts;
  auto step = [&](std::string first, bool ntl, bool nth) {
    auto rest = frac_rest(b, i + 1, ntl, nth);
    if (!rest.empty()) alts.push_back(join({first, group(rest)}, " "));
  };
  if (l > h) return alts;
  if (tl && th && l == h) {
    step(digit(l), true, true);
    return alts;
  }
  if (tl) step(digit(l), true, false);
  const char mid_lo = tl ? static_cast<char>(l + 1) : '0', mid_hi = th ? static_cast<char>(h - 1) : '9';
  if (mid_lo <= mid_hi) alts.push_back(digit_class(mid_lo, mid_hi) + " [0-9]*");
  if (th) step(digit(h), false, true);
  return alts;
}

std::vector<std::string> frac_rest(const fraction_bounds& b, std::size_t i, bool tl, bool th) {
  auto alts = frac_nonempty(b, i, tl, th);
  if (frac_accepts(b, i, tl, th)) alts.insert(alts.begin(), "");
  return alts;
}

// What follows the integer digits: nothing or "." and fraction digits. nullopt: nothing fits.
std::optional<std::string> fraction(const fraction_bounds& b) {
  const bool tl = b.lo.has_value(), th = b.hi.has_value();
  std::vector<std::string> alts;
  if (frac_accepts(b, 0, tl, th)) alts.push_back("");
  if (auto digits = frac_nonempty(b, 0, tl, th); !digits.empty()) alts.push_back("\".\" " + group(digits));
  if (alts.empty()) return std::nullopt;
  return group(alts);
}

// Magnitudes y >= 0 in (lo, hi) written as digits ("." digits)?, without exponent. nullopt: none.
std::optional<std::string> magnitude_range(const bound& lo, const std::optional<bound>& hi) {
  const std::pair lf{lo.v.fp, lo.exclusive};
  if (hi && hi->v.ip == lo.v.ip) {
    auto f = fraction({lf, std::pair{hi->v.fp, hi->exclusive}});
    if (!f) return std::nullopt;
    return join({gbnf_literal(lo.v.ip), *f}, " ");
  }
  std::vector<std::string> alts;
  std::string start = inc(lo.v.ip);
  if (lo.v.fp.empty() && !lo.exclusive) start = lo.v.ip;  // at the lower integer any fraction fits
  else if (auto f = fraction({lf, std::nullopt})) alts.push_back(join({gbnf_literal(lo.v.ip), *f}, " "));
  const std::string any_fraction = "(\".\" [0-9]+)?";
  if (!hi) {
    alts.push_back(natural_range(start, std::nullopt) + " " + any_fraction);
  } else {
    if (const auto end = dec(hi->v.ip); hi->v.ip != "0" && le(start, end))
      alts.push_back(natural_range(start, end) + " " + any_fraction);
    if (auto f = fraction({std::nullopt, std::pair{hi->v.fp, hi->exclusive}}))
      alts.push_back(join({gbnf_literal(hi->v.ip), *f}, " "));
  }
  if (alts.empty()) return std::nullopt;
  return group(alts);
}

}  // namespace

decimal decimal_from_integer(bool negative, std::uint64_t magnitude) { return canonical(negative, std::to_string(magnitude), ""); }

decimal decimal_from_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc{} ? end : buf);
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) s.erase(0, 1);
  long exp = 0;
  if (auto e = s.find_first_of("eE"); e != std::string::npos) {
    exp = std::stol(s.substr(e + 1));
    s.resize(e);
  }
  auto dot = s.find('.');
  std::string digits = s;
  long point = static_cast<long>(s.size());
  if (dot != std::string::npos) {
    digits = s.substr(0, dot) + s.substr(dot + 1);
    point = static_cast<long>(dot);
  }
  point += exp;
  if (point < 0) digits.insert(0, static_cast<std::size_t>(-point), '0'), point = 0;
  if (point > static_cast<long>(digits.size())) digits.append(static_cast<std::size_t>(point) - digits.size(), '0');
  return canonical(neg, digits.substr(0, static_cast<std::size_t>(point)), digits.substr(static_cast<std::size_t>(point)));
}

int compare(const decimal& a, const decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  return a.neg ? -compare_mag(a, b) : compare_mag(a, b);
}

decimal to_integer(const decimal& x, bool up, bool strict) {
  const bool frac = !x.fp.empty();
  if (!frac && !strict) return x;
  if (up) return x.neg ? canonical(true, frac ? x.ip : dec(x.ip), "") : canonical(false, inc(x.ip), "");
  if (x.neg) return canonical(true, inc(x.ip), "");
  if (frac) return canonical(false, x.ip, "");
  return x.ip == "0" ? canonical(true, "1", "") : canonical(false, dec(x.ip), "");
}

// The positive side and the negative side ("-" and magnitudes), each as naturals.
std::string integer_range(const std::optional<decimal>& lo, const std::optional<decimal>& hi) {
  std::vector<std::string> alts;
  if (!hi || !hi->neg)
    alts.push_back(natural_range(lo && !lo->neg ? lo->ip : "0", hi ? std::optional(hi->ip) : std::nullopt));
  if (!lo || lo->neg)
    alts.push_back("\"-\" " + natural_range(hi && hi->neg ? hi->ip : "1", lo ? std::optional(lo->ip) : std::nullopt));
  return group(alts);
}

// Sign split off: the negative side is "-" and magnitudes.
std::optional<std::string> number_range(const std::optional<bound>& lo, const std::optional<bound>& hi) {
  const decimal zero;
  std::vector<std::string> alts;
  const bool nonneg = !hi || compare(hi->v, zero) > 0 || (compare(hi->v, zero) == 0 && !hi->exclusive);
  if (nonneg) {
    if (auto m = magnitude_range(lo && !lo->v.neg ? *lo : bound{zero, false}, hi)) alts.push_back(*m);
  }
  if (!lo || lo->v.neg) {
    auto abs = [](bound b) {
      b.v.neg = false;
      return b;
    };
    const bound from = hi && hi->v.neg ? abs(*hi) : bound{zero, true};
    if (auto m = magnitude_range(from, lo ? std::optional(abs(*lo)) : std::nullopt)) alts.push_back("\"-\" " + *m);
  }
  if (alts.empty()) return std::nullopt;
  return group(alts);
}

}  // namespace troupe::guide::detail

#include "engine/guide/regex_gbnf.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "engine/guide/grammar.hpp"
#include "engine/guide/code_points.hpp"

namespace troupe::guide {
namespace {

using range = cp_range;
constexpr int max_group_depth = 200;           // parentheses, for the parser's and emitter's stacks
constexpr std::int64_t max_unrolled = 200000;  // code point matchers once every count is unrolled

cp_set intersect(const cp_set& a, const cp_set& b) {
  cp_set out;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const auto lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) ++i; else ++j;
  }
  return out;
}

bool contains(const cp_set& s, std::uint32_t cp) {
  return std::any_of(s.begin(), s.end(), [&](const range& r) { return r.first <= cp && cp <= r.second; });
}


std::string hex(std::uint32_t v, int digits) {
  static constexpr char d[] = "0123456789ABCDEF";
  std::string s(static_cast<std::size_t>(digits), '0');
  for (int k = digits - 1; k >= 0; --k, v >>= 4) s[static_cast<std::size_t>(k)] = d[v & 15];
  return s;
}

// A code point inside a GBNF class: alphanumerics as themselves, everything else escaped, so no class
// metacharacter (`]`, `-`, `^`, `\`) and no multi-byte source ever needs care.
std::string class_char(std::uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
    return std::string(1, static_cast<char>(cp));
  if (cp < 0x80) return "\\x" + hex(cp, 2);
  if (cp <= 0xFFFF) return "\\u" + hex(cp, 4);
  return "\\U" + hex(cp, 8);
}

std::string class_body(const cp_set& s) {
  std::string out;
  for (auto [lo, hi] : s) {
    out += class_char(lo);
    if (hi == lo) continue;
    if (hi > lo + 1) out += '-';
    out += class_char(hi);
  }
  return out;
}

// A non-empty set of more than one code point as a GBNF class, in its shorter form.
std::string class_expr(const cp_set& s) {
  const auto neg = complement(s);
  if (neg.empty()) return ".";
  if (neg.size() <= s.size()) return "[^" + class_body(neg) + "]";
  return "[" + class_body(s) + "]";
}

// ---- the syntax tree ----------------------------------------------------------------------------------

struct node {
  enum class kind : unsigned char { set, seq, alt, rep };
  kind k = kind::seq;
  cp_set set;               // set: one code point of these
  std::vector<node> kids;   // seq, alt; rep: exactly one
  int min = 1, max = 1;     // rep; max < 0: unbounded

  static node of_set(cp_set s) {
    node n;
    n.k = kind::set;
    n.set = std::move(s);
    return n;
  }
};

bool nullable(const node& n) {
  switch (n.k) {
    case node::kind::set: return false;
    case node::kind::seq: return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case node::kind::alt: return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case node::kind::rep: return n.min == 0 || nullable(n.kids[0]);
  }
  return false;
}

node repeat(node kid, int min, int max) {
  node r;
  r.k = node::kind::rep;
  r.min = min;
  r.max = max;
  r.kids.push_back(std::move(kid));
  return r;
}

// The node's language without the empty string (nullopt: nothing is left). Repetition needs it: `x*`
// with a nullable x would be a rule that reaches itself without consuming (refused as left recursion).
std::optional<node> non_empty(const node& n) {
  if (!nullable(n)) return n;
  switch (n.k) {
    case node::kind::set: return n;
    case node::kind::seq: {
      // K1..Kn all nullable: (K1-e)K2..Kn | (K2-e)K3..Kn | ... | (Kn-e).
      node alt;
      alt.k = node::kind::alt;
      for (std::size_t i = 0; i < n.kids.size(); ++i) {
        auto head = non_empty(n.kids[i]);
        if (!head) continue;
        node s;
        s.kids.push_back(std::move(*head));
        s.kids.insert(s.kids.end(), n.kids.begin() + static_cast<std::ptrdiff_t>(i) + 1, n.kids.end());
        alt.kids.push_back(std::move(s));
      }
      if (alt.kids.empty()) return std::nullopt;
      return alt;
    }
    case node::kind::alt: {
      node alt;
      alt.k = node::kind::alt;
      for (const auto& k : n.kids)
        if (auto e = non_empty(k)) alt.kids.push_back(std::move(*e));
      if (alt.kids.empty()) return std::nullopt;
      return alt;
    }
    case node::kind::rep: {
      // x{m,n} with x nullable is x'{0,n}; without the empty string, x'{1,n}.
      if (n.max == 0) return std::nullopt;
      auto kid = non_empty(n.kids[0]);
      if (!kid) return std::nullopt;
      return repeat(std::move(*kid), 1, n.max);
    }
  }
  return std::nullopt;
}

std::int64_t unrolled(const node& n) {
  switch (n.k) {
    case node::kind::set: return 1;
    case node::kind::seq:
    case node::kind::alt: {
      std::int64_t w = 0;
      for (const auto& k : n.kids) w = std::min<std::int64_t>(w + unrolled(k), max_unrolled + 1);
      return w;
    }
    case node::kind::rep: {
      const std::int64_t copies = n.max < 0 ? std::max(n.min, 1) + 1 : std::max(n.max, 1);
      return std::min<std::int64_t>(unrolled(n.kids[0]) * copies, max_unrolled + 1);
    }
  }
  return 0;
}

// ---- the parser ---------------------------------------------------------------------------------------

const cp_set digit_set{{'0', '9'}};
const cp_set word_set{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const cp_set space_set{{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

class regex_parser {
 public:
  explicit regex_parser(std::string_view src) : src_(src) {}

  result<node, guide_error> run() {
    auto n = parse_alt(0);
    if (!n) return n;
    if (pos_ < src_.size()) return fail(guide_error_code::bad_regex, "unmatched ')'");
    return n;
  }

 private:
  std::string_view src_;
  std::size_t pos_ = 0;

  unexpected<guide_error> fail(guide_error_code code, std::string why) const {
    return unexpected(guide_error{code, "at " + std::to_string(pos_), std::move(why)});
  }
  bool at(char c) const { return pos_ < src_.size() && src_[pos_] == c; }
  bool ahead(std::string_view s) const { return src_.substr(pos_, s.size()) == s; }

  result<node, guide_error> parse_alt(int depth) {
    node alt;
    alt.k = node::kind::alt;
    while (true) {
      auto s = parse_seq(depth);
      if (!s) return s;
      alt.kids.push_back(std::move(*s));
      if (!at('|')) break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  // `^` and `$` only where they change nothing: the start and the end of a top-level alternative.
  result<node, guide_error> parse_seq(int depth) {
    node seq;
    const bool top = depth == 0;
    if (top && at('^')) ++pos_;
    while (pos_ < src_.size() && !at('|') && !at(')')) {
      if (at('$')) {
        if (top && (pos_ + 1 == src_.size() || src_[pos_ + 1] == '|')) {
          ++pos_;
          break;
        }
        return fail(guide_error_code::unsupported, "'$' is supported only at the end of the expression");
      }
      if (at('^')) return fail(guide_error_code::unsupported, "'^' is supported only at the start of the expression");
      auto atom = parse_atom(depth);
      if (!atom) return atom;
      auto q = parse_quantifier();
      if (!q) return unexpected(q.error());
      if (*q) {
        const auto [min, max] = **q;
        if (at('?')) ++pos_;  // lazy: the same language when the match must cover the whole text
        else if (at('+')) return fail(guide_error_code::unsupported, "possessive quantifiers are not supported");
        if (auto again = brace_at(pos_); at('*') || at('+') || at('?') || again)
          return fail(guide_error_code::bad_regex, "a quantifier follows a quantifier");
        seq.kids.push_back(repeat(std::move(*atom), min, max));
      } else {
        seq.kids.push_back(std::move(*atom));
      }
    }
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    return seq;
  }

  // `{m}`, `{m,}`, `{m,n}`, `{,n}` at `p` as (min, max, end), or nullopt when `{` is a literal there.
  struct brace { int min, max; std::size_t end; };
  std::optional<brace> brace_at(std::size_t p) const {
    if (p >= src_.size() || src_[p] != '{') return std::nullopt;
    auto number = [&](std::size_t& q) -> std::optional<int> {
      const auto start = q;
      long v = 0;
      while (q < src_.size() && src_[q] >= '0' && src_[q] <= '9') v = std::min(v * 10 + (src_[q++] - '0'), 1L << 30);
      if (q == start) return std::nullopt;
      return static_cast<int>(v);
    };
    std::size_t q = p + 1;
    auto m = number(q);
    int max = m.value_or(0);
    if (q < src_.size() && src_[q] == ',') {
      ++q;
      auto n = number(q);
      if (!m && !n) return std::nullopt;
      max = n ? *n : -1;
    } else if (!m) {
      return std::nullopt;
    }
    if (q >= src_.size() || src_[q] != '}') return std::nullopt;
    return brace{m.value_or(0), max, q + 1};
  }

  result<std::optional<std::pair<int, int>>, guide_error> parse_quantifier() {
    std::optional<std::pair<int, int>> q;
    if (at('*')) q = {0, -1};
    else if (at('+')) q = {1, -1};
    else if (at('?')) q = {0, 1};
    if (q) {
      ++pos_;
      return q;
    }
    auto b = brace_at(pos_);
    if (!b) return q;
    if (b->max >= 0 && b->max < b->min) return fail(guide_error_code::bad_regex, "a count {m,n} with n < m");
    if (b->min > regex_max_repeat || b->max > regex_max_repeat)
      return fail(guide_error_code::too_large, "a count past " + std::to_string(regex_max_repeat));
    pos_ = b->end;
    return std::optional<std::pair<int, int>>{std::pair{b->min, b->max}};
  }

  result<std::uint32_t, guide_error> code_point() {
    const auto c = static_cast<unsigned char>(src_[pos_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + static_cast<std::size_t>(n) > src_.size()) return fail(guide_error_code::bad_regex, "invalid UTF-8");
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(src_[pos_ + static_cast<std::size_t>(k)]);
      if ((d & 0xC0) != 0x80) return fail(guide_error_code::bad_regex, "invalid UTF-8");
      cp = (cp << 6) | (d & 0x3Fu);
    }
    static constexpr std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > max_code_point || (cp >= 0xD800 && cp <= 0xDFFF))
      return fail(guide_error_code::bad_regex, "invalid UTF-8");
    pos_ += static_cast<std::size_t>(n);
    return cp;
  }

  std::optional<std::uint32_t> hex_digits(std::size_t count) {
    if (pos_ + count > src_.size()) return std::nullopt;
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < count; ++k) {
      const char c = src_[pos_ + k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    pos_ += count;
    return v;
  }

  // After a backslash: one code point, or a set (\d \w \s and negations). `in_class`: \b is backspace.
  result<cp_set, guide_error> parse_escape(bool in_class) {
    if (pos_ >= src_.size()) return fail(guide_error_code::bad_regex, "a pattern ends with '\\'");
    const char c = src_[pos_];
    auto one = [](std::uint32_t cp) { return cp_set{{cp, cp}}; };
    ++pos_;
    switch (c) {
      case 'd': return digit_set;
      case 'D': return complement(digit_set);
      case 'w': return word_set;
      case 'W': return complement(word_set);
      case 's': return space_set;
      case 'S': return complement(space_set);
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0':
        if (at('0') || (pos_ < src_.size() && src_[pos_] >= '1' && src_[pos_] <= '9'))
          return fail(guide_error_code::unsupported, "octal escapes are not supported");
        return one(0);
      case 'x': {
        auto v = hex_digits(2);
        if (!v) return fail(guide_error_code::bad_regex, "\\x needs two hex digits");
        return one(*v);
      }
      case 'u': {
        if (at('{')) {
          ++pos_;
          std::uint32_t v = 0;
          std::size_t n = 0;
          while (pos_ < src_.size() && src_[pos_] != '}' && n < 8) {
            auto d = hex_digits(1);
            if (!d) return fail(guide_error_code::bad_regex, "\\u{...} needs hex digits");
            v = v * 16 + *d;
            ++n;
          }
          if (n == 0 || !at('}') || v > max_code_point) return fail(guide_error_code::bad_regex, "a bad \\u{...} escape");
          ++pos_;
          return one(v);
        }
        auto v = hex_digits(4);
        if (!v) return fail(guide_error_code::bad_regex, "\\u needs four hex digits");
        if (*v >= 0xD800 && *v <= 0xDBFF && ahead("\\u")) {  // a UTF-16 surrogate pair, as JSON writes it
          const auto save = pos_;
          pos_ += 2;
          auto lo = hex_digits(4);
          if (lo && *lo >= 0xDC00 && *lo <= 0xDFFF) return one(0x10000 + ((*v - 0xD800) << 10) + (*lo - 0xDC00));
          pos_ = save;
        }
        if (*v >= 0xD800 && *v <= 0xDFFF) return fail(guide_error_code::bad_regex, "a lone surrogate escape");
        return one(*v);
      }
      case 'b':
        if (in_class) return one('\b');
        return fail(guide_error_code::unsupported, "word boundaries (\\b) are not supported");
      case 'B': return fail(guide_error_code::unsupported, "word boundaries (\\B) are not supported");
      case 'A': case 'Z': case 'z': case 'G':
        return fail(guide_error_code::unsupported, std::string("the anchor \\") + c + " is not supported");
      case 'k': return fail(guide_error_code::unsupported, "backreferences are not supported");
      case 'p': case 'P': return fail(guide_error_code::unsupported, "Unicode property escapes are not supported");
      case 'c': return fail(guide_error_code::unsupported, "control escapes (\\cX) are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') return fail(guide_error_code::unsupported, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      return fail(guide_error_code::bad_regex, std::string("unknown escape \\") + c);
    --pos_;
    auto cp = code_point();  // an escaped metacharacter or any other symbol: itself
    if (!cp) return unexpected(cp.error());
    return one(*cp);
  }

  result<node, guide_error> parse_class() {
    ++pos_;  // '['
    const bool negated = at('^');
    if (negated) ++pos_;
    cp_set items;
    bool first = true;
    while (true) {
      if (pos_ >= src_.size()) return fail(guide_error_code::bad_regex, "unterminated character class");
      if (at(']') && !first) break;
      first = false;
      auto lo = class_atom();
      if (!lo) return unexpected(lo.error());
      if (at('-') && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
        ++pos_;
        auto hi = class_atom();
        if (!hi) return unexpected(hi.error());
        if (lo->size() != 1 || lo->front().first != lo->front().second || hi->size() != 1 ||
            hi->front().first != hi->front().second)
          return fail(guide_error_code::bad_regex, "a class range with a class (\\d, \\w, \\s) at an end");
        if (hi->front().first < lo->front().first) return fail(guide_error_code::bad_regex, "a class range out of order");
        items.emplace_back(lo->front().first, hi->front().first);
      } else {
        items.insert(items.end(), lo->begin(), lo->end());
      }
    }
    ++pos_;  // ']'
    auto s = normalize(std::move(items));
    return node::of_set(negated ? complement(s) : s);
  }

  result<cp_set, guide_error> class_atom() {
    if (at('\\')) {
      ++pos_;
      return parse_escape(true);
    }
    auto cp = code_point();
    if (!cp) return unexpected(cp.error());
    return cp_set{{*cp, *cp}};
  }

  result<node, guide_error> parse_atom(int depth) {
    const char c = src_[pos_];
    if (c == '(') {
      if (depth + 1 > max_group_depth) return fail(guide_error_code::too_large, "groups nested past " + std::to_string(max_group_depth));
      ++pos_;
      if (at('?')) {
        if (ahead("?:")) {
          pos_ += 2;
        } else if (ahead("?=") || ahead("?!") || ahead("?<=") || ahead("?<!")) {
          return fail(guide_error_code::unsupported, "lookarounds are not supported");
        } else if (ahead("?P=")) {
          return fail(guide_error_code::unsupported, "backreferences are not supported");
        } else if (ahead("?<") || ahead("?P<")) {
          pos_ += ahead("?<") ? 2 : 3;
          const auto start = pos_;
          while (pos_ < src_.size() && src_[pos_] != '>') ++pos_;
          if (!at('>') || pos_ == start) return fail(guide_error_code::bad_regex, "a bad group name");
          ++pos_;
        } else {
          return fail(guide_error_code::unsupported, "group flags and other (?...) groups are not supported");
        }
      }
      auto inner = parse_alt(depth + 1);
      if (!inner) return inner;
      if (!at(')')) return fail(guide_error_code::bad_regex, "missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return node::of_set(complement(cp_set{{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++pos_;
      auto s = parse_escape(false);
      if (!s) return unexpected(s.error());
      return node::of_set(std::move(*s));
    }
    if (c == '*' || c == '+' || c == '?' || brace_at(pos_)) return fail(guide_error_code::bad_regex, "a quantifier repeats nothing");
    auto cp = code_point();
    if (!cp) return unexpected(cp.error());
    return node::of_set(cp_set{{*cp, *cp}});
  }
};

// ---- emitting GBNF ------------------------------------------------------------------------------------

struct piece {
  enum class shape : unsigned char { empty, atom, seq, alt };
  shape sh = shape::empty;
  std::string text;
  std::optional<std::string> bytes;  // a fixed run of bytes (a literal), which merges with its neighbours
};

piece literal(std::string bytes) {
  piece p;
  p.sh = bytes.size() == 1 ? piece::shape::atom : piece::shape::seq;
  p.text = gbnf_literal(bytes);
  p.bytes = std::move(bytes);
  return p;
}

std::string grouped(const piece& p) { return p.sh == piece::shape::alt ? "(" + p.text + ")" : p.text; }
std::string atomic(const piece& p) { return p.sh == piece::shape::atom ? p.text : "(" + p.text + ")"; }

std::string alternatives(const std::vector<std::string>& alts) {
  std::string s;
  for (const auto& a : alts) s += (s.empty() ? "" : " | ") + a;
  return s;
}

// The JSON escapes of control characters: \b \t \n \f \r where they exist, and \u00XX with either case
// of hex digit.
std::string control_escapes(const cp_set& controls) {
  std::string letters;
  for (auto [c, e] : {std::pair{8u, 'b'}, {9u, 't'}, {10u, 'n'}, {12u, 'f'}, {13u, 'r'}})
    if (contains(controls, c)) letters += e;
  std::vector<std::string> alts, u;
  if (!letters.empty()) alts.push_back(letters.size() == 1 ? "\"" + letters + "\"" : "[" + letters + "]");
  for (std::uint32_t high = 0; high < 2; ++high) {
    std::string low;
    for (std::uint32_t n = 0; n < 16; ++n) {
      if (!contains(controls, high * 16 + n)) continue;
      low += static_cast<char>(n < 10 ? '0' + n : 'a' + n - 10);
      if (n >= 10) low += static_cast<char>('A' + n - 10);
    }
    if (!low.empty()) u.push_back("\"" + std::to_string(high) + "\" " + (low.size() == 22 ? "[0-9a-fA-F]" : "[" + low + "]"));
  }
  alts.push_back("\"u00\" (" + alternatives(u) + ")");
  return "\"\\\\\" (" + alternatives(alts) + ")";
}

class emitter {
 public:
  explicit emitter(regex_alphabet a) : alphabet_(a) {}

  result<piece, guide_error> emit(const node& n) {
    switch (n.k) {
      case node::kind::set: return emit_set(n.set);
      case node::kind::seq: {
        std::vector<piece> parts;
        for (const auto& k : n.kids) {
          auto p = emit(k);
          if (!p) return p;
          if (p->sh == piece::shape::empty) continue;
          if (p->bytes && !parts.empty() && parts.back().bytes)
            parts.back() = literal(*parts.back().bytes + *p->bytes);
          else
            parts.push_back(std::move(*p));
        }
        if (parts.size() <= 1) return parts.empty() ? piece{} : std::move(parts[0]);
        piece out;
        out.sh = piece::shape::seq;
        for (const auto& p : parts) out.text += (out.text.empty() ? "" : " ") + grouped(p);
        return out;
      }
      case node::kind::alt: {
        std::vector<piece> parts;
        bool with_empty = false;
        for (const auto& k : n.kids) {
          auto p = emit(k);
          if (!p) return p;
          if (p->sh == piece::shape::empty) with_empty = true;
          else parts.push_back(std::move(*p));
        }
        if (parts.empty()) return piece{};
        piece out;
        if (parts.size() == 1) {
          out = std::move(parts[0]);
        } else {
          out.sh = piece::shape::alt;
          for (const auto& p : parts) out.text += (out.text.empty() ? "" : " | ") + p.text;
        }
        if (!with_empty) return out;
        return piece{piece::shape::seq, atomic(out) + "?", std::nullopt};  // seq: a postfix needs parentheses
      }
      case node::kind::rep: {
        int min = n.min, max = n.max;
        const node* kid = &n.kids[0];
        std::optional<node> stripped;
        if (nullable(*kid)) {
          stripped = non_empty(*kid);
          if (!stripped) return piece{};
          kid = &*stripped;
          min = 0;
        }
        if (max == 0) return piece{};
        auto p = emit(*kid);
        if (!p) return p;
        if (p->sh == piece::shape::empty) return piece{};
        if (min == 1 && max == 1) return p;
        std::string suffix = max < 0 ? (min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}")
                             : min == 0 && max == 1 ? "?"
                             : min == max          ? "{" + std::to_string(min) + "}"
                                                   : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
        return piece{piece::shape::seq, atomic(*p) + suffix, std::nullopt};
      }
    }
    return piece{};
  }

 private:
  regex_alphabet alphabet_;

  result<piece, guide_error> emit_set(const cp_set& s) {
    if (s.empty()) return unexpected(guide_error{guide_error_code::unsupported, "pattern", "a character class that matches no character"});
    if (alphabet_ == regex_alphabet::text) {
      if (s.size() == 1 && s[0].first == s[0].second) return literal(encode_utf8(s[0].first));
      return piece{piece::shape::atom, class_expr(s), std::nullopt};
    }
    // Inside a JSON string: `"` and `\` escaped, control characters as \b \f \n \r \t or \u00XX.
    std::vector<piece> parts;
    const cp_set plain = intersect(s, complement(cp_set{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    if (plain.size() == 1 && plain[0].first == plain[0].second) parts.push_back(literal(encode_utf8(plain[0].first)));
    else if (!plain.empty()) parts.push_back(piece{piece::shape::atom, class_expr(plain), std::nullopt});
    if (contains(s, '"')) parts.push_back(literal("\\\""));
    if (contains(s, '\\')) parts.push_back(literal("\\\\"));
    if (const cp_set controls = intersect(s, cp_set{{0, 0x1F}}); !controls.empty())
      parts.push_back(piece{piece::shape::seq, control_escapes(controls), std::nullopt});
    if (parts.size() == 1) return std::move(parts[0]);
    std::vector<std::string> texts;
    for (const auto& p : parts) texts.push_back(p.text);
    return piece{piece::shape::alt, alternatives(texts), std::nullopt};
  }
};

bool valid_rule_name(std::string_view n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

}  // namespace

result<std::string, guide_error> regex_to_gbnf_expression(std::string_view pattern, regex_alphabet alphabet) {
  auto tree = regex_parser(pattern).run();
  if (!tree) return unexpected(tree.error());
  if (unrolled(*tree) > max_unrolled)
    return unexpected(guide_error{guide_error_code::too_large, "pattern",
                                  "the expression unrolls past " + std::to_string(max_unrolled) + " characters"});
  auto p = emitter(alphabet).emit(*tree);
  if (!p) return unexpected(p.error());
  return std::move(p->text);
}

result<std::string, guide_error> regex_to_gbnf(std::string_view pattern, std::string_view root_name) {
  if (!valid_rule_name(root_name))
    return unexpected(guide_error{guide_error_code::bad_grammar, std::string(root_name), "a rule name needs [a-zA-Z0-9_-]+"});
  auto e = regex_to_gbnf_expression(pattern);
  if (!e) return unexpected(e.error());
  return std::string(root_name) + " ::= " + (e->empty() ? "\"\"" : *e) + "\n";
}

}  // namespace troupe::guide

#include "engine/guide/grammar.hpp"
#include "engine/guide/code_points.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

namespace troupe::guide {
namespace {

using range = cp_range;

// ---- code point classes to UTF-8 byte sequences --------------------------------------------------------


int utf8_length(std::uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

using byte_ranges = std::vector<std::pair<std::uint8_t, std::uint8_t>>;

// Splits [lo, hi] (one encoded length, no surrogates) until every piece is a product of byte ranges,
// the classic construction of UTF-8 range automata.
void split_utf8(std::uint32_t lo, std::uint32_t hi, std::vector<byte_ranges>& out) {
  const int n = utf8_length(lo);
  if (utf8_length(hi) != n) {
    const std::uint32_t edge = n == 1 ? 0x7F : n == 2 ? 0x7FF : 0xFFFF;
    split_utf8(lo, edge, out);
    split_utf8(edge + 1, hi, out);
    return;
  }
  for (int i = 1; i < n; ++i) {
    const std::uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_utf8(lo, lo | m, out);
        split_utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_utf8(lo, (hi & ~m) - 1, out);
        split_utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = encode_utf8(lo), b = encode_utf8(hi);
  byte_ranges r;
  for (std::size_t k = 0; k < a.size(); ++k)
    r.emplace_back(static_cast<std::uint8_t>(a[k]), static_cast<std::uint8_t>(b[k]));
  out.push_back(std::move(r));
}

std::vector<range> without_surrogates(const std::vector<range>& rs) {
  std::vector<range> out;
  for (auto [lo, hi] : rs) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

// ---- the builder --------------------------------------------------------------------------------------

using sequence = std::vector<element>;

struct builder {
  std::vector<std::string> names;
  std::vector<std::vector<sequence>> rules;
  std::vector<bool> defined;
  std::vector<std::size_t> first_use;  // byte offset of a rule's first reference (for undefined_rule)
  std::map<std::string, std::uint32_t, std::less<>> ids;
  std::vector<byte_set> sets;
  std::map<std::string, std::uint32_t> set_ids;  // a set's bits as text -> its index
  std::map<std::vector<range>, std::uint32_t> class_rules;
  std::size_t elements = 0;

  std::uint32_t symbol(std::string_view name, std::size_t at) {
    if (auto it = ids.find(name); it != ids.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(names.size());
    names.emplace_back(name);
    rules.emplace_back();
    defined.push_back(false);
    first_use.push_back(at);
    ids.emplace(std::string(name), id);
    return id;
  }
  std::uint32_t generated(std::string_view base) {
    std::string n = std::string(base) + "~" + std::to_string(names.size());  // "~": no source name collides
    auto id = symbol(n, 0);
    defined[id] = true;
    return id;
  }
  std::uint32_t set(const byte_set& s) {
    auto key = s.to_string();
    if (auto it = set_ids.find(key); it != set_ids.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(sets.size());
    sets.push_back(s);
    set_ids.emplace(std::move(key), id);
    return id;
  }
  element bytes(const byte_set& s) { return {element::kind::bytes, set(s)}; }
  element byte(std::uint8_t b) {
    byte_set s;
    s.set(b);
    return bytes(s);
  }
  // The elements matching one code point of `rs` (normalized, no surrogates): one set when every code
  // point is ASCII, else a reference to a rule with one alternative per UTF-8 byte-range product.
  void append_class(std::vector<range> rs, sequence& out) {
    rs = normalize(without_surrogates(rs));
    std::vector<byte_ranges> seqs;
    for (auto [lo, hi] : rs) split_utf8(lo, hi, seqs);
    byte_set single;
    std::vector<byte_ranges> multi;
    for (auto& s : seqs) {
      if (s.size() == 1)
        for (unsigned b = s[0].first; b <= s[0].second; ++b) single.set(b);
      else
        multi.push_back(std::move(s));
    }
    if (multi.empty()) {
      out.push_back(bytes(single));  // an empty class matches nothing: an empty set
      return;
    }
    if (auto it = class_rules.find(rs); it != class_rules.end()) {
      out.push_back({element::kind::rule, it->second});
      return;
    }
    const auto id = generated("char");
    class_rules.emplace(rs, id);
    std::vector<sequence> alts;
    if (single.any()) alts.push_back({bytes(single)});
    for (const auto& m : multi) {
      sequence seq;
      for (auto [lo, hi] : m) {
        byte_set s;
        for (unsigned b = lo; b <= hi; ++b) s.set(b);
        seq.push_back(bytes(s));
      }
      alts.push_back(std::move(seq));
    }
    for (auto& a : alts) elements += a.size() + 1;
    rules[id] = std::move(alts);
    out.push_back({element::kind::rule, id});
  }
};

// ---- the parser ---------------------------------------------------------------------------------------

class parser {
 public:
  parser(std::string_view text, const grammar_limits& limits) : src_(text), limits_(limits) {}

  result<builder, guide_error> run() {
    skip(true);
    while (pos_ < src_.size()) {
      auto name = parse_name();
      if (!name) return fail("expected a rule name");
      skip(false);
      if (src_.substr(pos_, 3) != "::=") return fail("expected '::=' after rule name '" + std::string(*name) + "'");
      pos_ += 3;
      skip(true);
      const auto id = b_.symbol(*name, pos_);
      if (b_.defined[id] && !b_.rules[id].empty()) return fail("rule '" + std::string(*name) + "' is defined twice");
      b_.defined[id] = true;
      auto alts = parse_alternates(std::string(*name), false);
      if (!alts) return unexpected(alts.error());
      b_.rules[id] = std::move(*alts);
      if (pos_ < src_.size() && src_[pos_] != '\n' && src_[pos_] != '\r')
        return fail(std::string("unexpected '") + src_[pos_] + "'");
      skip(true);
      if (error_) return unexpected(*error_);
    }
    if (error_) return unexpected(*error_);
    return std::move(b_);
  }

 private:
  std::string_view src_;
  grammar_limits limits_;
  std::size_t pos_ = 0;
  builder b_;
  std::optional<guide_error> error_;

  unexpected<guide_error> fail(std::string why) const {
    return unexpected(guide_error{guide_error_code::bad_grammar, "at " + std::to_string(pos_), std::move(why)});
  }
  void too_large(std::string why) {
    if (!error_) error_ = guide_error{guide_error_code::too_large, "at " + std::to_string(pos_), std::move(why)};
  }

  // Spaces, tabs and comments; newlines too when `newlines` (inside parentheses, after `::=` and `|`).
  void skip(bool newlines) {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::optional<std::string_view> parse_name() {
    const auto start = pos_;
    while (pos_ < src_.size() && name_char(src_[pos_])) ++pos_;
    if (pos_ == start) return std::nullopt;
    return src_.substr(start, pos_ - start);
  }

  // One UTF-8 code point of the source (invalid bytes are refused).
  result<std::uint32_t, guide_error> raw_code_point() {
    const auto c = static_cast<unsigned char>(src_[pos_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + static_cast<std::size_t>(n) > src_.size()) return fail("invalid UTF-8");
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(src_[pos_ + static_cast<std::size_t>(k)]);
      if ((d & 0xC0) != 0x80) return fail("invalid UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    pos_ += static_cast<std::size_t>(n);
    return cp;
  }
  result<std::uint32_t, guide_error> hex(int digits) {
    std::uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++pos_) {
      if (pos_ >= src_.size()) return fail("truncated escape");
      const char c = src_[pos_];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return fail("bad hex digit in escape");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    if (v > max_code_point) return fail("escape past U+10FFFF");
    return v;
  }
  // A character of a literal or class, escapes decoded.
  result<std::uint32_t, guide_error> parse_char() {
    if (pos_ >= src_.size()) return fail("unexpected end of grammar");
    if (src_[pos_] != '\\') return raw_code_point();
    ++pos_;
    if (pos_ >= src_.size()) return fail("unexpected end after '\\'");
    const char c = src_[pos_++];
    switch (c) {
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case 't': return std::uint32_t{'\t'};
      case 'r': return std::uint32_t{'\r'};
      case 'n': return std::uint32_t{'\n'};
      case '\\': case '"': case '[': case ']': case '-': case '/': case '^': case '.': case '\'':
        return static_cast<std::uint32_t>(c);
      default: --pos_; return fail(std::string("unknown escape '\\") + c + "'");
    }
  }

  result<std::vector<sequence>, guide_error> parse_alternates(const std::string& name, bool nested) {
    std::vector<sequence> alts;
    while (true) {
      auto seq = parse_sequence(name, nested);
      if (!seq) return unexpected(seq.error());
      b_.elements += seq->size() + 1;
      if (b_.elements > limits_.max_elements) too_large("the grammar unrolls past " + std::to_string(limits_.max_elements) + " elements");
      alts.push_back(std::move(*seq));
      if (error_) return unexpected(*error_);
      if (pos_ < src_.size() && src_[pos_] == '|') {
        ++pos_;
        skip(true);
        continue;
      }
      return alts;
    }
  }

  result<sequence, guide_error> parse_sequence(const std::string& name, bool nested) {
    sequence seq;
    std::size_t last = 0;  // where the last symbol (what a repetition repeats) starts in seq
    bool have_symbol = false;
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == '"') {
        ++pos_;
        last = seq.size();
        while (pos_ < src_.size() && src_[pos_] != '"') {
          auto cp = parse_char();
          if (!cp) return unexpected(cp.error());
          for (char ch : encode_utf8(*cp)) seq.push_back(b_.byte(static_cast<std::uint8_t>(ch)));
        }
        if (pos_ >= src_.size()) return fail("unterminated literal");
        ++pos_;
        have_symbol = true;
      } else if (c == '[') {
        ++pos_;
        const bool negated = pos_ < src_.size() && src_[pos_] == '^';
        if (negated) ++pos_;
        std::vector<range> rs;
        while (pos_ < src_.size() && src_[pos_] != ']') {
          auto lo = parse_char();
          if (!lo) return unexpected(lo.error());
          std::uint32_t hi = *lo;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            auto h = parse_char();
            if (!h) return unexpected(h.error());
            hi = *h;
            if (hi < *lo) return fail("class range out of order");
          }
          rs.emplace_back(*lo, hi);
        }
        if (pos_ >= src_.size()) return fail("unterminated character class");
        ++pos_;
        last = seq.size();
        b_.append_class(negated ? complement(rs) : rs, seq);
        have_symbol = true;
      } else if (c == '.') {
        ++pos_;
        last = seq.size();
        b_.append_class({{0, max_code_point}}, seq);
        have_symbol = true;
      } else if (name_char(c)) {
        const auto at = pos_;
        auto n = parse_name();
        last = seq.size();
        seq.push_back({element::kind::rule, b_.symbol(*n, at)});
        have_symbol = true;
      } else if (c == '(') {
        ++pos_;
        skip(true);
        const auto id = b_.generated(name);
        auto alts = parse_alternates(name, true);
        if (!alts) return unexpected(alts.error());
        b_.rules[id] = std::move(*alts);
        if (pos_ >= src_.size() || src_[pos_] != ')') return fail("expected ')'");
        ++pos_;
        last = seq.size();
        seq.push_back({element::kind::rule, id});
        have_symbol = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_symbol) return fail(std::string("'") + c + "' repeats nothing");
        ++pos_;
        std::uint32_t lo = 0, hi = 0;
        bool unbounded = false;
        if (c == '*') {
          unbounded = true;
        } else if (c == '+') {
          lo = 1;
          unbounded = true;
        } else if (c == '?') {
          hi = 1;
        } else {
          skip(false);
          auto m = number();
          if (!m) return fail("expected a count after '{'");
          lo = hi = *m;
          skip(false);
          if (pos_ < src_.size() && src_[pos_] == ',') {
            ++pos_;
            skip(false);
            if (pos_ < src_.size() && src_[pos_] == '}') {
              unbounded = true;
            } else {
              auto n = number();
              if (!n) return fail("expected a count after ','");
              hi = *n;
            }
            skip(false);
          }
          if (pos_ >= src_.size() || src_[pos_] != '}') return fail("expected '}'");
          ++pos_;
          if (!unbounded && hi < lo) return fail("repetition {m,n} with n < m");
        }
        if (lo > limits_.max_repeat || (!unbounded && hi > limits_.max_repeat)) {
          too_large("repetition count past " + std::to_string(limits_.max_repeat));
          return unexpected(*error_);
        }
        repeat(name, seq, last, lo, hi, unbounded);
        if (error_) return unexpected(*error_);
        have_symbol = false;  // "x**" is refused, as llama.cpp does
      } else {
        break;
      }
      skip(nested);
    }
    return seq;
  }

  std::optional<std::uint32_t> number() {
    const auto start = pos_;
    std::uint64_t v = 0;
    while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      v = v * 10 + static_cast<std::uint64_t>(src_[pos_] - '0');
      if (v > 0xFFFFFFFFu) v = 0xFFFFFFFFu;
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return static_cast<std::uint32_t>(v);
  }

  // seq[last..] repeated lo..hi times (hi unbounded: any number past lo).
  void repeat(const std::string& name, sequence& seq, std::size_t last, std::uint32_t lo, std::uint32_t hi, bool unbounded) {
    sequence sym(seq.begin() + static_cast<std::ptrdiff_t>(last), seq.end());
    seq.resize(last);
    // A symbol of several elements is wrapped in a rule so that the copies stay one element each.
    element one;
    if (sym.size() == 1) {
      one = sym[0];
    } else {
      const auto id = b_.generated(name);
      b_.rules[id] = {sym};
      b_.elements += sym.size() + 1;
      one = {element::kind::rule, id};
    }
    for (std::uint32_t k = 0; k < lo; ++k) seq.push_back(one);
    b_.elements += lo;
    if (unbounded) {
      const auto id = b_.generated(name);  // r ::= x r |
      b_.rules[id] = {{one, {element::kind::rule, id}}, {}};
      b_.elements += 5;
      seq.push_back({element::kind::rule, id});
    } else if (hi > lo) {
      std::optional<std::uint32_t> inner;  // r_k ::= x r_{k-1} |
      for (std::uint32_t k = lo; k < hi; ++k) {
        const auto id = b_.generated(name);
        sequence s{one};
        if (inner) s.push_back({element::kind::rule, *inner});
        b_.rules[id] = {s, {}};
        b_.elements += s.size() + 3;
        inner = id;
        if (b_.elements > limits_.max_elements) {
          too_large("the grammar unrolls past " + std::to_string(limits_.max_elements) + " elements");
          return;
        }
      }
      seq.push_back({element::kind::rule, *inner});
    }
    if (b_.elements > limits_.max_elements) too_large("the grammar unrolls past " + std::to_string(limits_.max_elements) + " elements");
  }
};

// Rules that derive the empty string.
std::vector<bool> nullable_rules(const builder& b) {
  std::vector<bool> n(b.rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < b.rules.size(); ++r) {
      if (n[r]) continue;
      for (const auto& alt : b.rules[r]) {
        bool all = std::all_of(alt.begin(), alt.end(), [&](const element& e) { return e.k == element::kind::rule && n[e.index]; });
        if (all) {
          n[r] = changed = true;
          break;
        }
      }
    }
  }
  return n;
}

// A rule that reaches itself through references each preceded only by nullable elements.
std::optional<std::uint32_t> left_recursive(const builder& b, const std::vector<bool>& nullable) {
  const auto R = b.rules.size();
  std::vector<std::vector<std::uint32_t>> edges(R);
  for (std::size_t r = 0; r < R; ++r)
    for (const auto& alt : b.rules[r])
      for (const auto& e : alt) {
        if (e.k != element::kind::rule) break;
        edges[r].push_back(e.index);
        if (!nullable[e.index]) break;
      }
  std::vector<std::uint8_t> color(R, 0);  // 0 new, 1 on the path, 2 done
  for (std::uint32_t start = 0; start < R; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<std::uint32_t, std::size_t>> stack{{start, 0}};
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < edges[r].size()) {
        const auto next = edges[r][i++];
        if (color[next] == 1) return next;
        if (color[next] == 0) {
          color[next] = 1;
          stack.emplace_back(next, 0);
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
  return std::nullopt;
}

}  // namespace

result<grammar, guide_error> parse_gbnf(std::string_view text, std::string_view root, const grammar_limits& limits) {
  if (text.size() > limits.max_source_bytes)
    return unexpected(guide_error{guide_error_code::too_large, "grammar", "the grammar text is past " + std::to_string(limits.max_source_bytes) + " bytes"});
  auto built = parser(text, limits).run();
  if (!built) return unexpected(built.error());
  auto& b = *built;
  for (std::size_t r = 0; r < b.rules.size(); ++r)
    if (!b.defined[r])
      return unexpected(guide_error{guide_error_code::undefined_rule, "at " + std::to_string(b.first_use[r]), "rule '" + b.names[r] + "' is used but never defined"});
  auto root_it = b.ids.find(root);
  if (root_it == b.ids.end())
    return unexpected(guide_error{guide_error_code::undefined_rule, std::string(root), "the grammar has no rule '" + std::string(root) + "'"});
  if (auto r = left_recursive(b, nullable_rules(b)))
    return unexpected(guide_error{guide_error_code::left_recursion, b.names[*r], "rule '" + b.names[*r] + "' can reach itself without consuming input (left recursion)"});

  grammar g;
  g.names = std::move(b.names);
  g.sets = std::move(b.sets);
  g.root = root_it->second;
  g.alts.resize(b.rules.size());
  for (std::size_t r = 0; r < b.rules.size(); ++r)
    for (const auto& alt : b.rules[r]) {
      g.alts[r].push_back(static_cast<std::uint32_t>(g.flat.size()));
      g.flat.insert(g.flat.end(), alt.begin(), alt.end());
      g.flat.push_back({element::kind::end, 0});
    }
  return g;
}

std::string gbnf_literal(std::string_view bytes) {
  std::string s = "\"";
  static const char* digits = "0123456789ABCDEF";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      s += '\\';
      s += static_cast<char>(c);
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '\r') {
      s += "\\r";
    } else if (c == '\t') {
      s += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      s += "\\x";
      s += digits[c >> 4];
      s += digits[c & 15];
    } else {
      s += static_cast<char>(c);
    }
  }
  return s + "\"";
}

}  // namespace troupe::guide

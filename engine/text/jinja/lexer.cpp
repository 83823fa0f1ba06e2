#include "engine/text/jinja/lexer.hpp"

#include <array>
#include <limits>
#include <utility>

#include "engine/text/jinja/detail/js_text.hpp"
#include "engine/text/jinja/detail/source_position.hpp"

namespace troupe::text::jinja {
namespace {

using detail::is_ascii_digit;
using detail::is_ascii_word;
using detail::js_space_at;

// A text being rewritten, each byte remembering where in the original source it came from.
struct mapped_text {
  std::string text;
  std::vector<std::uint32_t> origin;

  void append(const mapped_text& src, std::size_t from, std::size_t to) {
    text.append(src.text, from, to - from);
    origin.insert(origin.end(), src.origin.begin() + static_cast<std::ptrdiff_t>(from),
                  src.origin.begin() + static_cast<std::ptrdiff_t>(to));
  }
};

// Where a line starts for the `^` of a multiline JavaScript regex: after \n, \r, U+2028 or U+2029.
bool starts_line(std::string_view s, std::size_t i) {
  if (i == 0) return true;
  if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
  return i >= 3 && s.substr(i - 3, 2) == "\xE2\x80" && (s[i - 1] == '\xA8' || s[i - 1] == '\xA9');
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1".
mapped_text strip_block_indents(const mapped_text& in) {
  mapped_text out;
  const std::string_view s = in.text;
  std::size_t copied = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!starts_line(s, i)) continue;
    std::size_t j = i;
    while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
    if (j + 1 < s.size() && s[j] == '{' && (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) {
      out.append(in, copied, i);
      copied = j;
    }
  }
  out.append(in, copied, s.size());
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
mapped_text trim_block_newlines(const mapped_text& in) {
  mapped_text out;
  const std::string_view s = in.text;
  std::size_t copied = 0;
  for (std::size_t i = 0; i + 2 < s.size(); ++i) {
    if ((s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' && s[i + 2] == '\n') {
      out.append(in, copied, i + 2);
      copied = i + 3;
      i += 2;
    }
  }
  out.append(in, copied, s.size());
  return out;
}

std::size_t skip_js_spaces(std::string_view s, std::size_t i) {
  while (std::size_t n = js_space_at(s, i)) i += n;
  return i;
}

// The length of a {% generation %} or {% endgeneration %} tag at s[i] (with its `-` markers), 0 if
// there is none.
std::size_t generation_tag_at(std::string_view s, std::size_t i, bool& lstrip, bool& rstrip) {
  if (s.substr(i, 2) != "{%") return 0;
  std::size_t j = i + 2;
  lstrip = j < s.size() && s[j] == '-';
  if (lstrip) ++j;
  j = skip_js_spaces(s, j);
  if (s.substr(j, 3) == "end") j += 3;
  if (s.substr(j, 10) != "generation") return 0;
  j = skip_js_spaces(s, j + 10);
  rstrip = j < s.size() && s[j] == '-';
  if (rstrip) ++j;
  if (s.substr(j, 2) != "%}") return 0;
  return j + 2 - i;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : before) + (rstrip ? "" : after).
mapped_text remove_generation_tags(const mapped_text& in) {
  const std::string_view s = in.text;
  if (s.find("generation") == std::string_view::npos) return in;
  mapped_text out;
  std::size_t copied = 0;
  for (std::size_t i = s.find("{%"); i != std::string_view::npos; i = s.find("{%", i + 1)) {
    if (i < copied) continue;
    bool lstrip = false, rstrip = false;
    const std::size_t len = generation_tag_at(s, i, lstrip, rstrip);
    if (len == 0) continue;
    // The whitespace run before the tag, no further back than the previous match.
    std::size_t before = i;
    while (before > copied) {
      std::size_t start = before - 1;
      while (start > copied && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      if (js_space_at(s, start) != before - start) break;
      before = start;
    }
    const std::size_t after_end = skip_js_spaces(s, i + len);
    out.append(in, copied, lstrip ? before : i);
    if (!rstrip) out.append(in, i + len, after_end);
    copied = after_end;
    i = after_end == 0 ? 0 : after_end - 1;
  }
  out.append(in, copied, s.size());
  return out;
}

// The reference's table, in its order: longer operators before their prefixes.
constexpr std::array<std::pair<std::string_view, token_kind>, 29> operator_table{{
    {"{%", token_kind::open_statement},  {"%}", token_kind::close_statement}, {"{{", token_kind::open_expression},
    {"}}", token_kind::close_expression}, {"(", token_kind::open_paren},       {")", token_kind::close_paren},
    {"{", token_kind::open_curly},       {"}", token_kind::close_curly},      {"[", token_kind::open_square},
    {"]", token_kind::close_square},     {",", token_kind::comma},            {".", token_kind::dot},
    {":", token_kind::colon},            {"|", token_kind::pipe},             {"<=", token_kind::comparison},
    {">=", token_kind::comparison},      {"==", token_kind::comparison},      {"!=", token_kind::comparison},
    {"<", token_kind::comparison},       {">", token_kind::comparison},       {"+", token_kind::additive},
    {"-", token_kind::additive},         {"~", token_kind::additive},         {"**", token_kind::exponent},
    {"*", token_kind::multiplicative},   {"//", token_kind::multiplicative},  {"/", token_kind::multiplicative},
    {"%", token_kind::multiplicative},   {"=", token_kind::equals},
}};

class lexer {
 public:
  lexer(std::string_view source, const preprocessed_source& pre)
      : src_(pre.text), origin_(pre.origin), positions_(source) {}

  result<std::vector<token>, template_error> run();

 private:
  char at(std::size_t i) const { return i < src_.size() ? src_[i] : '\0'; }
  token_kind last_kind(bool& any) const {
    any = !tokens_.empty();
    return any ? tokens_.back().kind : token_kind::text;
  }
  void push(token_kind kind, std::string value, std::size_t start) {
    token t;
    t.kind = kind;
    t.value = std::move(value);
    const auto [line, column] = positions_.locate(start < origin_.size() ? origin_[start] : positions_.size());
    t.line = line;
    t.column = column;
    tokens_.push_back(std::move(t));
  }
  template_error error(std::string message, std::size_t at_offset) {
    template_error e;
    e.code = template_error_code::syntax_error;
    e.message = std::move(message);
    const auto [line, column] =
        positions_.locate(at_offset < origin_.size() ? origin_[at_offset] : positions_.size());
    e.line = line;
    e.column = column;
    return e;
  }
  void strip_trailing_whitespace() {
    if (tokens_.empty() || tokens_.back().kind != token_kind::text) return;
    auto& v = tokens_.back().value;
    v.resize(detail::js_trim_end(v).size());
    if (v.empty()) tokens_.pop_back();
  }
  void skip_leading_whitespace() { pos_ = skip_js_spaces(src_, pos_); }
  // consumeWhile(isWhitespace) inside a tag: running into the end of the source is an error there.
  result<void, template_error> skip_tag_whitespace() {
    while (std::size_t n = js_space_at(src_, pos_)) {
      pos_ += n;
      if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input", pos_));
    }
    return {};
  }
  result<std::string, template_error> digits() {
    std::string out;
    while (is_ascii_digit(at(pos_))) {
      out.push_back(src_[pos_++]);
      if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input", pos_));
    }
    return out;
  }
  result<std::string, template_error> string_body(char quote);

  std::string_view src_;
  const std::vector<std::uint32_t>& origin_;
  detail::source_positions positions_;
  std::vector<token> tokens_;
  std::size_t pos_ = 0;
  int curly_depth_ = 0;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

result<std::string, template_error> lexer::string_body(char quote) {
  std::string out;
  char32_t pending_high = 0;  // a \u high surrogate waiting for its low half
  auto put_unit = [&](char32_t unit) {
    if (pending_high != 0) {
      if (unit >= 0xDC00 && unit <= 0xDFFF) {
        detail::append_utf8(out, 0x10000 + ((pending_high - 0xD800) << 10) + (unit - 0xDC00));
        pending_high = 0;
        return;
      }
      detail::append_utf8(out, 0xFFFD);
      pending_high = 0;
    }
    if (unit >= 0xD800 && unit <= 0xDBFF) pending_high = unit;
    else detail::append_utf8(out, unit);
  };
  auto flush = [&] {
    if (pending_high != 0) detail::append_utf8(out, 0xFFFD);
    pending_high = 0;
  };
  while (pos_ >= src_.size() || src_[pos_] != quote) {
    if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input in a string", pos_));
    if (src_[pos_] == '\\') {
      ++pos_;
      if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input in a string", pos_));
      const char escaped = src_[pos_++];
      if (escaped == 'x' || escaped == 'u') {
        const std::size_t len = escaped == 'x' ? 2 : 4;
        char32_t unit = 0;
        for (std::size_t k = 0; k < len; ++k) {
          const int d = hex_digit(at(pos_ + k));
          if (d < 0 || pos_ + k >= src_.size())
            return troupe::unexpected(error(std::string("invalid hexadecimal escape \\") + escaped, pos_));
          unit = unit * 16 + static_cast<char32_t>(d);
        }
        pos_ += len;
        put_unit(unit);
        continue;
      }
      char32_t unescaped = 0;
      switch (escaped) {
        case 'n': unescaped = '\n'; break;
        case 't': unescaped = '\t'; break;
        case 'r': unescaped = '\r'; break;
        case 'b': unescaped = '\b'; break;
        case 'f': unescaped = '\f'; break;
        case 'v': unescaped = '\v'; break;
        case '\'': unescaped = '\''; break;
        case '"': unescaped = '"'; break;
        case '\\': unescaped = '\\'; break;
        default:
          return troupe::unexpected(error(std::string("unexpected escaped character '") + escaped + "'", pos_ - 1));
      }
      put_unit(unescaped);
      continue;
    }
    flush();
    out.push_back(src_[pos_++]);
    if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input in a string", pos_));
  }
  flush();
  return out;
}

result<std::vector<token>, template_error> lexer::run() {
  while (pos_ < src_.size()) {
    bool any = false;
    const token_kind last = last_kind(any);
    if (!any || last == token_kind::close_statement || last == token_kind::close_expression ||
        last == token_kind::comment) {
      const std::size_t start = pos_;
      while (pos_ < src_.size() && !(src_[pos_] == '{' && (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' ||
                                                           at(pos_ + 1) == '#')))
        ++pos_;
      if (pos_ > start) {
        push(token_kind::text, std::string(src_.substr(start, pos_ - start)), start);
        continue;
      }
    }

    if (src_[pos_] == '{' && at(pos_ + 1) == '#') {
      const std::size_t start = pos_;
      pos_ += 2;
      const bool strip_before = at(pos_) == '-';
      if (strip_before) ++pos_;
      std::string comment;
      while (at(pos_) != '#' || at(pos_ + 1) != '}') {
        if (pos_ + 2 >= src_.size()) return troupe::unexpected(error("missing end of comment tag", start));
        comment.push_back(src_[pos_++]);
      }
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      push(token_kind::comment, std::move(comment), start);
      pos_ += 2;
      if (strip_after) skip_leading_whitespace();
      continue;
    }

    if (src_.substr(pos_, 3) == "{%-") {
      strip_trailing_whitespace();
      push(token_kind::open_statement, "{%", pos_);
      pos_ += 3;
      continue;
    }
    if (src_.substr(pos_, 3) == "{{-") {
      strip_trailing_whitespace();
      push(token_kind::open_expression, "{{", pos_);
      curly_depth_ = 0;
      pos_ += 3;
      continue;
    }

    if (auto r = skip_tag_whitespace(); !r) return troupe::unexpected(std::move(r.error()));

    if (src_.substr(pos_, 3) == "-%}") {
      push(token_kind::close_statement, "%}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      continue;
    }
    if (src_.substr(pos_, 3) == "-}}") {
      push(token_kind::close_expression, "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      continue;
    }

    const char c = src_[pos_];
    if (c == '-' || c == '+') {
      bool has_last = false;
      const token_kind lk = last_kind(has_last);
      if (!has_last || lk == token_kind::text)
        return troupe::unexpected(error(std::string("unexpected character '") + c + "'", pos_));
      const bool binary = lk == token_kind::identifier || lk == token_kind::numeric_literal ||
                          lk == token_kind::string_literal || lk == token_kind::close_paren ||
                          lk == token_kind::close_square;
      if (!binary) {
        const std::size_t start = pos_++;
        auto num = digits();
        if (!num) return troupe::unexpected(std::move(num.error()));
        if (!num->empty() && at(pos_) == '.' && is_ascii_digit(at(pos_ + 1))) {
          ++pos_;
          auto frac = digits();
          if (!frac) return troupe::unexpected(std::move(frac.error()));
          *num += "." + *frac;
        }
        const bool numeric = !num->empty();
        push(numeric ? token_kind::numeric_literal : token_kind::unary, std::string(1, c) + *num, start);
        continue;
      }
    }

    bool matched = false;
    for (const auto& [seq, kind] : operator_table) {
      if (seq == "}}" && curly_depth_ > 0) continue;
      if (src_.substr(pos_, seq.size()) != seq) continue;
      push(kind, std::string(seq), pos_);
      if (kind == token_kind::open_expression) curly_depth_ = 0;
      else if (kind == token_kind::open_curly) ++curly_depth_;
      else if (kind == token_kind::close_curly) --curly_depth_;
      pos_ += seq.size();
      matched = true;
      break;
    }
    if (matched) continue;

    if (c == '\'' || c == '"') {
      const std::size_t start = pos_++;
      auto body = string_body(c);
      if (!body) return troupe::unexpected(std::move(body.error()));
      push(token_kind::string_literal, std::move(*body), start);
      ++pos_;
      continue;
    }
    if (is_ascii_digit(c)) {
      const std::size_t start = pos_;
      auto num = digits();
      if (!num) return troupe::unexpected(std::move(num.error()));
      bool any_token = false;
      const bool after_dot = last_kind(any_token) == token_kind::dot && any_token;
      if (!after_dot && at(pos_) == '.' && is_ascii_digit(at(pos_ + 1))) {
        ++pos_;
        auto frac = digits();
        if (!frac) return troupe::unexpected(std::move(frac.error()));
        *num += "." + *frac;
      }
      push(token_kind::numeric_literal, std::move(*num), start);
      continue;
    }
    if (is_ascii_word(c)) {
      const std::size_t start = pos_;
      while (is_ascii_word(at(pos_))) {
        ++pos_;
        if (pos_ >= src_.size()) return troupe::unexpected(error("unexpected end of input", pos_));
      }
      push(token_kind::identifier, std::string(src_.substr(start, pos_ - start)), start);
      continue;
    }
    std::size_t end = pos_;
    detail::next_code_point(src_, end);
    return troupe::unexpected(
        error("unexpected character '" + std::string(src_.substr(pos_, end - pos_)) + "'", pos_));
  }
  return std::move(tokens_);
}

}  // namespace

preprocessed_source preprocess(std::string_view source, const lex_options& options) {
  mapped_text text;
  text.text.assign(source);
  text.origin.resize(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) text.origin[i] = static_cast<std::uint32_t>(i);
  if (!text.text.empty() && text.text.back() == '\n') {
    text.text.pop_back();
    text.origin.pop_back();
  }
  if (options.lstrip_blocks) text = strip_block_indents(text);
  if (options.trim_blocks) text = trim_block_newlines(text);
  text = remove_generation_tags(text);
  return {std::move(text.text), std::move(text.origin)};
}

result<std::vector<token>, template_error> tokenize(std::string_view source, const lex_options& options) {
  if (source.size() >= std::numeric_limits<std::uint32_t>::max()) {
    template_error e;
    e.code = template_error_code::syntax_error;
    e.message = "the template source is 4 GiB or longer";
    return troupe::unexpected(std::move(e));
  }
  const auto pre = preprocess(source, options);
  lexer lex(source, pre);
  return lex.run();
}

}  // namespace troupe::text::jinja

#include "engine/text/normalizer.hpp"

#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

detail::unicode_form to_detail(normalization_form f) {
  switch (f) {
    case normalization_form::nfc: return detail::unicode_form::nfc;
    case normalization_form::nfd: return detail::unicode_form::nfd;
    case normalization_form::nfkc: return detail::unicode_form::nfkc;
    case normalization_form::nfkd: return detail::unicode_form::nfkd;
  }
  return detail::unicode_form::nfc;
}

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};

// The text without the characters `drop` holds for.
template <class Pred>
std::string without(std::string_view s, Pred drop) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    if (!drop(detail::next_scalar(s, i))) out.append(s, start, i - start);
  }
  return out;
}

// The CJK Unified Ideographs blocks and their extensions and compatibility forms, as BERT counts them
// (not kana or Hangul, which are written with spaces).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::string bert_clean(std::string_view s, const bert_normalizer& n) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const char32_t c = detail::next_scalar(s, i);
    const bool kept_control = c == '\t' || c == '\n' || c == '\r';
    if (n.clean_text && (c == 0 || c == 0xFFFD || (!kept_control && detail::is_other(c)))) continue;
    if (n.clean_text && (kept_control || detail::is_white_space(c))) {
      out += ' ';
    } else if (n.handle_chinese_chars && is_chinese_char(c)) {
      out += ' ';
      out.append(s, start, i - start);
      out += ' ';
    } else {
      out.append(s, start, i - start);
    }
  }
  return out;
}

}  // namespace

std::string normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const auto& step : steps_) {
    std::visit(overloaded{
                   [&](const unicode_normalizer& n) { s = detail::normalize(s, to_detail(n.form)); },
                   [&](const replace_normalizer& n) { s = n.pattern.replace_all(s, n.content); },
                   [&](const prepend_normalizer& n) {
                     if (!s.empty()) s.insert(0, n.prefix);
                   },
                   [&](const lowercase_normalizer&) { s = detail::to_lower(s); },
                   [&](const strip_normalizer& n) {
                     const std::size_t lead = n.left ? detail::leading_white_space(s) : 0;
                     const std::size_t trail = n.right && lead < s.size() ? detail::trailing_white_space(s) : 0;
                     s = s.substr(lead, s.size() - lead - trail);
                   },
                   [&](const strip_accents_normalizer&) { s = without(s, detail::is_combining_mark); },
                   [&](const bert_normalizer& n) {
                     if (n.clean_text || n.handle_chinese_chars) s = bert_clean(s, n);
                     if (n.strip_accents.value_or(n.lowercase))
                       s = without(detail::normalize(s, detail::unicode_form::nfd), detail::is_nonspacing_mark);
                     if (n.lowercase) s = detail::to_lower(s);
                   },
               },
               step);
  }
  return s;
}

}  // namespace troupe::text

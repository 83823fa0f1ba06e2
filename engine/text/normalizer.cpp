#include "engine/text/normalizer.hpp"

#include <utf8proc.h>

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
                   [&](const strip_accents_normalizer&) {
                     std::string out;
                     out.reserve(s.size());
                     std::size_t i = 0;
                     while (i < s.size()) {
                       const std::size_t start = i;
                       const char32_t c = detail::next_scalar(s, i);
                       if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN)
                         out.append(s, start, i - start);
                     }
                     s = std::move(out);
                   },
               },
               step);
  }
  return s;
}

}  // namespace troupe::text

#include "engine/text/text_pattern.hpp"

namespace troupe::text {

text_pattern text_pattern::literal(std::string s) {
  text_pattern p;
  p.literal_ = std::move(s);
  return p;
}

result<text_pattern, std::string> text_pattern::regex(std::string_view pattern) {
  auto r = detail::regex::compile(pattern);
  if (!r) return troupe::unexpected(std::move(r.error()));
  text_pattern p;
  p.regex_.push_back(std::move(*r));
  return p;
}

void text_pattern::find_all(std::string_view text, std::vector<match_span>& out) const {
  if (!regex_.empty()) {
    regex_.front().find_all(text, out);
    return;
  }
  if (literal_.empty()) return;
  std::size_t pos = 0;
  while (true) {
    const auto at = text.find(literal_, pos);
    if (at == std::string_view::npos) return;
    out.push_back({at, at + literal_.size()});
    pos = at + literal_.size();
  }
}

std::string text_pattern::replace_all(std::string_view text, std::string_view with) const {
  std::vector<match_span> matches;
  find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * with.size());
  std::size_t prev = 0;
  for (const auto& m : matches) {
    out.append(text.substr(prev, m.start - prev));
    out.append(with);
    prev = m.end;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace troupe::text

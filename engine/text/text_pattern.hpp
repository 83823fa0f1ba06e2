#pragma once
// The pattern a Split pre-tokenizer, a Replace normalizer or a Replace decoder looks for: a literal
// string or a regex (tokenizer.json's {"String": ...} and {"Regex": ...}). Not a general regex API:
// it finds non-overlapping matches, leftmost first, and replaces them.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/detail/regex.hpp"

namespace troupe::text {

using match_span = detail::regex_match;

class text_pattern {
 public:
  static text_pattern literal(std::string s);
  // On failure, PCRE2's message.
  static result<text_pattern, std::string> regex(std::string_view pattern);

  // Appends every match in `text`, leftmost first. A literal that is empty matches nothing.
  void find_all(std::string_view text, std::vector<match_span>& out) const;
  std::string replace_all(std::string_view text, std::string_view with) const;

 private:
  text_pattern() = default;
  std::string literal_;
  std::vector<detail::regex> regex_;  // empty for a literal; one element otherwise
};

}  // namespace troupe::text

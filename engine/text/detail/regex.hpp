#pragma once
// A compiled PCRE2 pattern (UTF and UCP, JIT where available) with the one operation the tokenizer
// needs: every leftmost, non-overlapping match. Patterns in tokenizer.json were written for Oniguruma,
// which Hugging Face's tokenizers uses; where the two engines read a construct differently (\s and \S:
// Oniguruma takes Unicode White_Space, PCRE2 also counts U+180E, which White_Space left out in Unicode
// 6.3) the pattern is rewritten before compiling so the Oniguruma meaning is kept. Private to the text
// layer.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe::text::detail {

struct regex_match {
  std::size_t start = 0;
  std::size_t end = 0;
};

class regex {
 public:
  // On failure, PCRE2's message with the offset it points at.
  static result<regex, std::string> compile(std::string_view pattern);

  // Appends every match in `text` (valid UTF-8), leftmost first; an empty match moves the search on by
  // one character, as Oniguruma's iterator does.
  void find_all(std::string_view text, std::vector<regex_match>& out) const;
  // The pattern as given, before the rewrite.
  const std::string& pattern() const;

 private:
  struct impl;
  explicit regex(std::shared_ptr<const impl> i) : impl_(std::move(i)) {}
  std::shared_ptr<const impl> impl_;
};

// `pattern` with \s and \S replaced by the White_Space set Oniguruma means by them.
std::string oniguruma_compatible(std::string_view pattern);

}  // namespace troupe::text::detail

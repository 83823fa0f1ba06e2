#pragma once
// A normalizer rewrites a piece of input text before it is split into words: a Unicode normalization
// form, literal or regex replacement, a prefix, lowercasing, whitespace stripping, accent stripping, and
// BERT's normalizer.
// tokenizer.json nests them in Sequences; here they are one flat list applied in order, which is what
// a Sequence means. It works on whole strings: troupe needs ids, not offsets into the input.
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/text/text_pattern.hpp"

namespace troupe::text {

enum class normalization_form { nfc, nfd, nfkc, nfkd };

struct unicode_normalizer {
  normalization_form form = normalization_form::nfc;
};
struct replace_normalizer {
  text_pattern pattern;
  std::string content;
};
struct prepend_normalizer {
  std::string prefix;  // added in front of a non-empty piece
};
struct lowercase_normalizer {};
struct strip_normalizer {
  bool left = true;
  bool right = true;
};
// Removes combining marks (categories Mn, Mc and Me, as Hugging Face's StripAccents does); meaningful
// after an NFD or NFKD step.
struct strip_accents_normalizer {};

// BERT's normalizer, its steps in this order: clean_text drops NUL, U+FFFD and control characters
// (categories Cc, Cf, Co but tab, newline and carriage return) and turns White_Space into ' ';
// handle_chinese_chars puts a space on each side of a CJK ideograph; strip_accents is NFD then dropping
// Mn (unset: whatever lowercase is); lowercase as Lowercase.
struct bert_normalizer {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents;
  bool lowercase = true;
};

using normalizer_step = std::variant<unicode_normalizer, replace_normalizer, prepend_normalizer,
                                     lowercase_normalizer, strip_normalizer, strip_accents_normalizer,
                                     bert_normalizer>;

class normalizer {
 public:
  void add(normalizer_step step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // `text` is valid UTF-8 and stays so.
  std::string apply(std::string_view text) const;

 private:
  std::vector<normalizer_step> steps_;
};

}  // namespace troupe::text

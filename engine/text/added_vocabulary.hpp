#pragma once
// Added tokens: strings (special tokens such as <|im_start|>, or user tokens) that are cut out of the
// input whole before the model sees it, as Hugging Face's AddedVocabulary does: leftmost-longest
// matching, with each token's single_word, lstrip and rstrip rules; tokens marked `normalized` are
// matched in the normalized text, the others in the raw input. Special tokens are skipped by decode
// when asked, and matched only while split_special_tokens is off.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/token_id.hpp"

namespace troupe::text {

struct added_token {
  token_id id = 0;
  std::string content;
  bool single_word = false;  // matches only where it is not part of a longer word
  bool lstrip = false;       // swallows the White_Space before it
  bool rstrip = false;       // swallows the White_Space after it
  bool normalized = false;   // matched in the normalized text (its content normalized likewise)
  bool special = false;      // a control token: skipped by decode(skip_special)
};

// A cut of a text: [start, end) and the added token found there, if any.
struct added_split {
  std::size_t start = 0;
  std::size_t end = 0;
  std::optional<token_id> id;
};

class added_vocabulary {
 public:
  added_vocabulary();
  // `patterns[i]` is what tokens[i] is matched as: its content, normalized when the token is.
  void set_tokens(std::vector<added_token> tokens, const std::vector<std::string>& patterns);
  // When set, special tokens are not matched: their text is tokenized like any other.
  void set_split_special_tokens(bool split) { split_special_ = split; }

  const std::vector<added_token>& tokens() const;
  const added_token* find(token_id id) const;
  std::optional<token_id> find(std::string_view content) const;
  bool is_special(token_id id) const;

  // Cuts `text` at the tokens matched in the raw input (normalized = false) or in normalized text. The
  // splits cover `text` in order; a token's split includes the White_Space its lstrip/rstrip swallows.
  void split_raw(std::string_view text, std::vector<added_split>& out) const;
  void split_normalized(std::string_view text, std::vector<added_split>& out) const;

 private:
  struct state;
  void split(bool normalized, std::string_view text, std::vector<added_split>& out) const;

  std::shared_ptr<const state> state_;
  bool split_special_ = false;
};

}  // namespace troupe::text

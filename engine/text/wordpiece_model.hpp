#pragma once
// WordPiece, BERT's model: each word is cut greedily into the longest vocabulary entries from the left,
// every piece after the first looked up with a continuing-subword prefix ("##"). A word with a stretch
// no entry covers, or longer than max_input_chars_per_word characters, becomes the one unknown token.
// Unlike BPE there are no merges and no byte fallback. A model is immutable and safe to share.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/token_id.hpp"

namespace troupe::text {

// Hugging Face's defaults, which bert-base-uncased / -cased and multilingual BERT also spell out.
struct wordpiece_options {
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  std::size_t max_input_chars_per_word = 100;
};

// Where the vocabulary came from, for errors.
struct wordpiece_source {
  std::string file;
  std::string vocab_field;
};

class wordpiece_model {
 public:
  // `vocab` pairs each token with its id; of a token given twice the first pair counts. The unknown
  // token must be in the vocabulary (Hugging Face fails at encode time instead): an unknown_token error.
  static result<wordpiece_model, text_error> from_vocab(std::vector<std::pair<std::string, token_id>> vocab,
                                                        wordpiece_options options, const wordpiece_source& source);

  // Appends the ids of `word` (valid UTF-8).
  void tokenize(std::string_view word, std::vector<token_id>& out) const;

  std::optional<token_id> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(token_id id) const;
  // One past the largest id.
  std::size_t id_limit() const;
  const wordpiece_options& options() const;

 private:
  struct impl;
  explicit wordpiece_model(std::shared_ptr<const impl> i) : impl_(std::move(i)) {}
  std::shared_ptr<const impl> impl_;
};

}  // namespace troupe::text

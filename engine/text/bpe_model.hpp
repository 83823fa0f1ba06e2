#pragma once
// Byte-pair encoding, the model of every tokenizer but BERT's: a word is split into characters (each
// looked up in the vocabulary, with byte fallback to <0xXX> tokens or an unknown token), then adjacent
// pairs are merged, the pair of lowest rank first and the leftmost among equals, until no pair merges.
// Ranks come from a merges list (tokenizer.json, GGUF "gpt2") or from SentencePiece scores (GGUF
// "llama": any two pieces whose concatenation is in the vocabulary merge, higher score first). Words
// already seen are answered from a cache; a model is safe to use from several threads.
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/token_id.hpp"

namespace troupe::text {

struct bpe_options {
  std::optional<std::string> unk_token;  // the token for a character the vocabulary lacks
  std::string continuing_subword_prefix; // added to every character but the first before lookup
  std::string end_of_word_suffix;        // added to the last character before lookup
  bool fuse_unk = false;                 // consecutive unknown characters become one unknown token
  bool byte_fallback = false;            // an unknown character becomes its bytes' <0xXX> tokens
  bool ignore_merges = false;            // a word that is itself in the vocabulary is one token
};

struct bpe_merge {
  std::string left;
  std::string right;
};

// Where a model's definition came from, for errors: the file and the fields holding vocab and merges.
struct bpe_source {
  std::string file;
  std::string vocab_field;
  std::string merges_field;
};

class bpe_model {
 public:
  // `vocab` pairs each token with its id (ids need not be dense). Merges are in rank order; a merge
  // naming a token the vocabulary lacks, or whose result it lacks, is an unknown_token error naming
  // the merge.
  static result<bpe_model, text_error> from_merges(std::vector<std::pair<std::string, token_id>> vocab,
                                                   std::span<const bpe_merge> merges, bpe_options options,
                                                   const bpe_source& source);
  // SentencePiece's ranking: token i has id i and score scores[i]; only tokens with mergeable[i] set
  // may be formed by a merge.
  static result<bpe_model, text_error> from_scores(std::vector<std::string> tokens, std::span<const float> scores,
                                                   const std::vector<bool>& mergeable, bpe_options options,
                                                   const bpe_source& source);

  // Appends the ids of `word`.
  void tokenize(std::string_view word, std::vector<token_id>& out) const;
  // Whether tokenize_bytes may be used: the vocabulary holds all 256 characters of the byte-level
  // alphabet and no affixes apply.
  bool reads_raw_bytes() const;
  // The ids tokenize() gives for the byte-level form of `bytes`, without building that form: each byte
  // starts as its alphabet character's id. Only when reads_raw_bytes().
  void tokenize_bytes(std::string_view bytes, std::vector<token_id>& out) const;

  std::optional<token_id> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(token_id id) const;
  // One past the largest id.
  std::size_t id_limit() const;
  const bpe_options& options() const;

 private:
  struct impl;
  explicit bpe_model(std::shared_ptr<impl> i) : impl_(std::move(i)) {}
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::text

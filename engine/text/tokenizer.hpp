#pragma once
// A tokenizer: Hugging Face's pipeline (added tokens cut out first, then normalizer, pre-tokenizer, model
// (BPE or WordPiece), post-processor; decoder for the way back), built from tokenizer.json or from a GGUF's
// tokenizer keys. Encoding gives the same ids as Hugging Face's tokenizers for the files troupe reads.
// A tokenizer is an immutable value (copies share state) and safe to use from several threads.
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/added_vocabulary.hpp"
#include "engine/text/decoder.hpp"
#include "engine/text/normalizer.hpp"
#include "engine/text/post_processor.hpp"
#include "engine/text/pre_tokenizer.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/token_id.hpp"
#include "engine/text/token_model.hpp"

namespace troupe::text {

struct tokenizer_parts {
  token_model model;
  normalizer norm;
  pre_tokenizer pre;
  added_vocabulary added;
  post_processor post;
  decoder dec;
};

class tokenizer {
 public:
  explicit tokenizer(tokenizer_parts parts);

  // `add_special` applies the post-processor (a bos, say); special-token text in `text` is matched
  // either way, as Hugging Face does. Fails only on text that is not valid UTF-8.
  result<std::vector<token_id>, text_error> encode(std::string_view text, bool add_special) const;
  // Ids the tokenizer does not know are skipped, as Hugging Face does.
  std::string decode(std::span<const token_id> ids, bool skip_special) const;

  std::optional<std::string_view> id_to_token(token_id id) const;
  std::optional<token_id> token_to_id(std::string_view token) const;
  // One past the largest id of the model or the added tokens.
  std::size_t vocab_size() const;
  bool is_special(token_id id) const;

  // For streaming: the bytes `id` contributes as the `index`-th decoded token (see decoder::stream_piece);
  // nullopt for an id decode would skip.
  std::optional<std::string> stream_piece(token_id id, std::size_t index, bool skip_special) const;

  const tokenizer_parts& parts() const;

 private:
  std::shared_ptr<const tokenizer_parts> parts_;
  // The pre-tokenizer ends in the byte-level mapping and the model can start from raw bytes instead, which
  // saves building the mapped text (same ids, see bpe_model::tokenize_bytes).
  bool raw_bytes_ = false;
};

}  // namespace troupe::text

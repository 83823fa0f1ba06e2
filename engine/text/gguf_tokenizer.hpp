#pragma once
// The tokenizer a GGUF file carries in its tokenizer.* keys, built into the same pipeline tokenizer.json
// gives: "gpt2" is byte-level BPE over tokenizer.ggml.merges with the pre-tokenizer regexes of the
// tokenizer.ggml.pre value; "llama" is SentencePiece BPE over tokenizer.ggml.scores with byte fallback.
// Token types mark control and user-defined tokens, which become added tokens.
#include <string>

#include "engine/core/result.hpp"
#include "engine/load/gguf.hpp"
#include "engine/text/special_ids.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/tokenizer.hpp"

namespace troupe::text {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class gguf_token_type : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct gguf_text {
  tokenizer tok;
  special_ids ids;
  std::string chat_template;  // tokenizer.chat_template; empty when absent
};

result<gguf_text, text_error> read_gguf_tokenizer(const load::gguf_file& file);

}  // namespace troupe::text

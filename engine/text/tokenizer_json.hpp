#pragma once
// Reading Hugging Face's tokenizer.json into a tokenizer. Every component type the supported models
// use is read (docs/text.md lists them); another type is an `unsupported` error naming its field, and a
// malformed file (not JSON, no vocab, a merge naming an unknown token, a regex PCRE2 refuses) is a
// typed error naming file and field, never an exception or a crash.
#include <filesystem>
#include <string>
#include <string_view>

#include "engine/core/result.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/tokenizer.hpp"

namespace troupe::text {

struct tokenizer_json_options {
  // Tokenize special-token text like any other text (tokenizer_config.json's split_special_tokens).
  bool split_special_tokens = false;
};

result<tokenizer, text_error> load_tokenizer_json(const std::filesystem::path& path,
                                                  tokenizer_json_options options = {});
// `name` stands for the file in errors.
result<tokenizer, text_error> parse_tokenizer_json(std::string_view json_text, std::string name = "tokenizer.json",
                                                   tokenizer_json_options options = {});

}  // namespace troupe::text

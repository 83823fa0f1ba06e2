#pragma once
// text_codec: one model's text interface. Text to ids (encode, with or without the model's bos/eos),
// ids to text (decode, optionally skipping special tokens), token strings, and the ids with special roles
// (bos, eos, pad, unk and every id that ends a generation), plus the chat template text the model ships.
// Made from a model directory (tokenizer.json, with tokenizer_config.json and generation_config.json
// where present), a tokenizer.json file, or a GGUF file. A value: copies share the tokenizer.
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/load/gguf.hpp"
#include "engine/text/special_ids.hpp"
#include "engine/text/text_error.hpp"
#include "engine/text/token_id.hpp"
#include "engine/text/tokenizer.hpp"

namespace troupe::text {

class text_codec {
 public:
  text_codec(tokenizer tok, special_ids ids, std::string chat_template);

  // A .gguf file, a tokenizer.json file, or a directory holding tokenizer.json.
  static result<text_codec, text_error> open(const std::filesystem::path& path);
  // tokenizer.json plus, from the same directory when present, tokenizer_config.json (special token
  // names, chat template, split_special_tokens) and generation_config.json (eos ids).
  static result<text_codec, text_error> from_tokenizer_json(const std::filesystem::path& tokenizer_json);
  static result<text_codec, text_error> from_gguf(const load::gguf_file& file);

  // `add_special`: the ids Hugging Face's add_special_tokens adds (tokenizer.json's post-processor, or
  // a GGUF's add_bos_token / add_eos_token).
  result<std::vector<token_id>, text_error> encode(std::string_view text, bool add_special = true) const;
  std::string decode(std::span<const token_id> ids, bool skip_special = false) const;

  std::optional<std::string_view> token_string(token_id id) const;
  std::optional<token_id> token_to_id(std::string_view token) const;
  std::size_t vocab_size() const;
  bool is_special(token_id id) const;
  const special_ids& specials() const { return ids_; }
  // Empty when the model ships none.
  const std::string& chat_template() const { return chat_template_; }
  const tokenizer& tokens() const { return tok_; }

 private:
  tokenizer tok_;
  special_ids ids_;
  std::string chat_template_;
};

}  // namespace troupe::text

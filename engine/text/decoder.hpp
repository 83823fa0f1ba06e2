#pragma once
// A decoder turns token strings back into text: the byte-level alphabet back into bytes, SentencePiece's
// metaspace back into spaces, <0xXX> byte tokens back into bytes, WordPiece's "##" pieces back onto their
// words, literal or regex replacements, joining (Fuse) and stripping. Steps run in order over the list
// of token strings, as Hugging Face's decode_chain does. For streaming, a token's piece can be decoded
// on its own (stream_piece), with the rules that only hold at the start of the whole text reported
// separately.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/text/pre_tokenizer.hpp"
#include "engine/text/text_pattern.hpp"

namespace troupe::text {

struct byte_level_decoder {};
struct metaspace_decoder {
  std::string replacement = "\xE2\x96\x81";
  prepend_scheme scheme = prepend_scheme::always;  // anything but never drops the first token's spaces
};
struct byte_fallback_decoder {};
struct fuse_decoder {};
struct strip_decoder {
  std::string content = " ";  // one character
  std::size_t start = 0;      // at most this many leading `content` characters are removed
  std::size_t stop = 0;       // and trailing ones
};
struct replace_decoder {
  text_pattern pattern;
  std::string content;
};
// Every token but the first: one starting with `prefix` loses it and joins the token before, any other
// gets a space in front. With `cleanup`, each token then has Hugging Face's tokenization cleanup applied
// (" ." -> ".", " n't" -> "n't", " do not" -> " don't", ...).
struct wordpiece_decoder {
  std::string prefix = "##";
  bool cleanup = true;
};

using decoder_step =
    std::variant<byte_level_decoder, metaspace_decoder, byte_fallback_decoder, fuse_decoder, strip_decoder,
                 replace_decoder, wordpiece_decoder>;

// What a stream loses at its very start: up to `count` leading `content` characters (a Strip that runs
// after the tokens are joined).
struct stream_start_rule {
  std::string content;
  std::size_t count = 0;
};

class decoder {
 public:
  void add(decoder_step step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }

  // Valid UTF-8 always: invalid byte sequences become U+FFFD as Hugging Face's decoders make them.
  std::string decode(std::vector<std::string> tokens) const;

  // The bytes `token` contributes as the `index`-th decoded token (0: the first), before any rule of
  // the whole text applies; byte tokens give raw bytes, which may be part of a longer UTF-8 sequence.
  std::string stream_piece(std::string_view token, std::size_t index) const;
  stream_start_rule stream_start() const;

 private:
  std::vector<decoder_step> steps_;
};

// The byte of a "<0xXX>" token.
std::optional<unsigned char> byte_token_value(std::string_view token);

}  // namespace troupe::text

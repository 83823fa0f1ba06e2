#pragma once
// A streaming detokenizer: ids go in one at a time as a model produces them, text comes out as soon as
// it is final. It emits only complete UTF-8 (a character whose bytes are spread over several tokens,
// byte-fallback <0xXX> tokens included, is held until its last byte arrives), applies the decoder's
// rules for the start of a text (Metaspace's and Strip's leading space), and watches for stop strings
// across token boundaries: text that could be the start of a stop string is held back, so no part of a
// stop string is ever emitted; on a match it reports which stop string matched and the text before it.
// The concatenated output equals the tokenizer's decode of the same ids wherever the ids spell valid
// UTF-8; an invalid byte sequence becomes U+FFFD per ill-formed part, as a byte-level decode makes it,
// which may differ in count from a batch decode's ByteFallback rule.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "engine/text/text_codec.hpp"
#include "engine/text/token_id.hpp"

namespace troupe::text {

struct detokenizer_options {
  bool skip_special = true;        // special tokens (eos, <|im_end|>) add no text
  std::vector<std::string> stop;   // stop strings; empty strings are ignored
};

struct detokenizer_output {
  std::string text;                 // new final text, to show now
  std::optional<std::size_t> stop;  // set once: the index in options.stop of the stop string found
};

class detokenizer {
 public:
  explicit detokenizer(const text_codec& codec, detokenizer_options options = {});

  // After a stop, further ids give nothing.
  detokenizer_output push(token_id id);
  // The end of the stream: held text is released (an unfinished UTF-8 sequence as U+FFFD).
  detokenizer_output finish();
  bool stopped() const { return stopped_; }

 private:
  // Moves complete text from bytes_ to the output, through the start rule and the stop matcher.
  detokenizer_output release(bool final);

  tokenizer tok_;
  detokenizer_options options_;
  stream_start_rule start_rule_;
  std::size_t index_ = 0;     // tokens decoded so far
  std::string bytes_;         // bytes that do not yet form complete UTF-8
  std::string held_;          // complete text that may be the start of a stop string
  bool stopped_ = false;
};

}  // namespace troupe::text

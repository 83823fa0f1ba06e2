#pragma once
// A pre-tokenizer cuts a normalized piece of text into the words the model tokenizes one by one:
// regex or literal splits with Hugging Face's delimiter behaviours, the byte-level mapping (GPT-2's
// alphabet, optionally with its own word regex), SentencePiece's metaspace, digit, punctuation and
// whitespace splits. Like the normalizer, a tokenizer.json Sequence becomes one flat list of steps,
// each applied to every word the previous step produced.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "engine/text/text_pattern.hpp"

namespace troupe::text {

// What happens to the text a split pattern matches.
enum class split_behavior {
  removed,              // dropped
  isolated,             // a word of its own
  merged_with_previous, // appended to the word before it
  merged_with_next,     // prepended to the word after it
  contiguous,           // runs of matches (and runs of non-matches) become one word
};

struct split_pre_tokenizer {
  text_pattern pattern;
  split_behavior behavior = split_behavior::isolated;
  bool invert = false;  // the text between matches counts as matched, and the matches as the rest
};
struct byte_level_pre_tokenizer {
  bool add_prefix_space = false;
  bool use_regex = true;  // first split with GPT-2's word regex
};
enum class prepend_scheme { always, first, never };
struct metaspace_pre_tokenizer {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  prepend_scheme scheme = prepend_scheme::always;
  bool split = true;
};
struct digits_pre_tokenizer {
  bool individual = false;
};
struct punctuation_pre_tokenizer {
  split_behavior behavior = split_behavior::isolated;
};
struct whitespace_pre_tokenizer {};        // words are \w+ and [^\w\s]+ runs
struct whitespace_split_pre_tokenizer {};  // words are what lies between White_Space

using pre_tokenizer_step =
    std::variant<split_pre_tokenizer, byte_level_pre_tokenizer, metaspace_pre_tokenizer, digits_pre_tokenizer,
                 punctuation_pre_tokenizer, whitespace_pre_tokenizer, whitespace_split_pre_tokenizer>;

// The words of a text: spans of one buffer, so splitting copies nothing.
class word_list {
 public:
  void clear() {
    buffer_.clear();
    spans_.clear();
  }
  std::size_t size() const { return spans_.size(); }
  std::string_view operator[](std::size_t i) const {
    return std::string_view(buffer_).substr(spans_[i].first, spans_[i].second);
  }

 private:
  friend class pre_tokenizer;
  std::string buffer_;
  std::vector<std::pair<std::size_t, std::size_t>> spans_;  // (start, length)
};

class pre_tokenizer {
 public:
  void add(pre_tokenizer_step step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // Whether the last step is a byte-level mapping, which apply() can leave out for a model that reads
  // raw bytes (bpe_model::tokenize_bytes).
  bool ends_with_byte_level() const;

  // Replaces `out` with the non-empty words of `text`. `at_origin` says whether `text` starts at the
  // start of the whole input (Metaspace's "first" scheme prepends only there). With `raw_bytes`, a final
  // byte-level step splits (prefix space, word regex) but leaves the bytes unmapped.
  void apply(std::string_view text, bool at_origin, word_list& out, bool raw_bytes = false) const;

 private:
  std::vector<pre_tokenizer_step> steps_;
};

// GPT-2's word regex, which the byte-level pre-tokenizer uses when use_regex is set.
inline constexpr std::string_view gpt2_word_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace troupe::text

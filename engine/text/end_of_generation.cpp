#include "engine/text/end_of_generation.hpp"

#include <algorithm>
#include <string_view>

namespace troupe::text {

namespace {

constexpr std::string_view end_names[] = {
    "</s>",
    "<eos>",
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek's <｜end▁of▁sentence｜>
};

}  // namespace

void collect_end_ids(const tokenizer& tok, special_ids& ids) {
  if (ids.eos) ids.end_ids.push_back(*ids.eos);
  for (const auto name : end_names)
    if (const auto id = tok.parts().added.find(name); id && tok.is_special(*id)) ids.end_ids.push_back(*id);
  std::sort(ids.end_ids.begin(), ids.end_ids.end());
  ids.end_ids.erase(std::unique(ids.end_ids.begin(), ids.end_ids.end()), ids.end_ids.end());
}

}  // namespace troupe::text

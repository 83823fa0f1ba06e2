#pragma once
// Which ids end a generation: the declared eos, the ids a config lists, and the end-of-turn and
// end-of-message tokens of the model families troupe serves, where the vocabulary has them as special
// tokens (so a base model's <|endoftext|> and a chat model's <|im_end|> both stop a stream).
#include "engine/text/special_ids.hpp"
#include "engine/text/tokenizer.hpp"

namespace troupe::text {

// Adds eos and the known end tokens of `tok` to ids.end_ids, then sorts it and drops duplicates.
void collect_end_ids(const tokenizer& tok, special_ids& ids);

}  // namespace troupe::text

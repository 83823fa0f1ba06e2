#pragma once
// The ids a model gives special roles: beginning and end of sequence, padding, unknown, and every id
// that ends a generation (eos itself, end-of-turn and end-of-message tokens), which a driver stops on.
#include <algorithm>
#include <optional>
#include <vector>

#include "engine/text/token_id.hpp"

namespace troupe::text {

struct special_ids {
  std::optional<token_id> bos;
  std::optional<token_id> eos;
  std::optional<token_id> pad;
  std::optional<token_id> unk;
  std::vector<token_id> end_ids;  // sorted, no duplicates; holds eos when there is one

  bool is_end(token_id id) const { return std::binary_search(end_ids.begin(), end_ids.end(), id); }
};

}  // namespace troupe::text

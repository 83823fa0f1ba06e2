#pragma once
// A token id: an index into a model's vocabulary (added tokens included). Ids are the int32 the graph's
// token_ids slot holds, so encode output feeds a step without conversion.
#include <cstdint>

namespace troupe::text {

using token_id = std::int32_t;

}  // namespace troupe::text

#pragma once
// The configuration every dense decoder shares, read once from either checkpoint form and validated
// (positive sizes, heads divisible by KV heads, an even rotary width, a known rope scaling rule), so
// tracing cannot fail on it. Families add what is their own on top.
#include "engine/load/weight_store.hpp"
#include "families/components/config_reader.hpp"
#include "families/components/dense_decoder.hpp"

namespace troupe::families {

struct decoder_basics {
  std::int64_t vocab = 0, hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, max_positions = 0;
  double norm_eps = 1e-6;
  bool tied = false;
  rope_config rope;
};

result<decoder_basics, config_error> read_decoder_basics(const config_reader& r, const load::weight_store& store);

// A spec with every layer's attention alike (full attention, the basics' rope, scale 1/sqrt(head_dim)).
dense_decoder_spec uniform_spec(const std::string& family, const decoder_basics& d, const config_reader& r);

}  // namespace troupe::families

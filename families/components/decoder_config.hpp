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

// A hybrid's layers: each the recurrent `kind` or attention_ffn, and the attention layers' shared KV
// heads (0: none attends). From GGUF, llama.cpp's per-layer head_count_kv (`kv`, 0 on a recurrent
// layer); from HF, `layer_types` naming each layer `recurrent` or `attention`. Refusals name the key.
struct hybrid_layers {
  std::vector<dense_decoder_spec::layer_kind> kinds;
  std::int64_t kv_heads = 0;
};
result<hybrid_layers, config_error> hybrid_layers_from_kv(const config_reader& r, std::span<const std::int64_t> kv, std::int64_t layers,
                                                          dense_decoder_spec::layer_kind kind);
result<hybrid_layers, config_error> hybrid_layers_from_types(const config_reader& r, std::int64_t layers, dense_decoder_spec::layer_kind kind,
                                                             const std::string& recurrent, const std::string& attention);

// A spec with every layer's attention alike (full attention, the basics' rope, scale 1/sqrt(head_dim)).
dense_decoder_spec uniform_spec(const std::string& family, const decoder_basics& d, const config_reader& r);

}  // namespace troupe::families

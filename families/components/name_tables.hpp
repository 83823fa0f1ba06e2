#pragma once
// The checkpoint spellings of the roles `decoder.hpp` reads, in the two naming schemes every dense
// decoder here uses: Hugging Face's (model.layers.N.self_attn.q_proj.weight) and llama.cpp's GGUF
// names (blk.N.attn_q.weight). A family picks the options that describe its checkpoints; the table
// is data, and model code never spells a checkpoint string.
#include <vector>

#include "families/weight_map.hpp"

namespace troupe::families {

struct name_table_options {
  bool gguf = false;
  bool qk_rope_interleaved = false;  // GGUF arch llama: the converter permuted Q/K rows
  bool qk_norm = false;              // Qwen 3, Gemma 3: q_norm, k_norm
  bool sandwich_norms = false;       // Gemma 2/3: four norms per layer
  bool norms_minus_one = false;      // Gemma HF: norm weights stored as w - 1
  bool fused = false;                // Phi-3: qkv_proj and gate_up_proj
  bool qkv_bias_required = false;    // Qwen 2: q/k/v biases always present
};

std::vector<name_rule> decoder_name_table(const name_table_options& o);

}  // namespace troupe::families

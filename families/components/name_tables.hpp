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
  // A routed model: its experts (stacked from HF's per-expert tensors), how HF names them, and
  // whether it has shared experts. Both feed-forwards become optional; each layer's is checked by the
  // decoder against its routing.
  std::int64_t experts = 0;
  enum class hf_experts : std::uint8_t { qwen, mixtral } hf_moe = hf_experts::qwen;
  bool shared_expert = false;  // Qwen2-MoE: mlp.shared_expert.* and mlp.shared_expert_gate
  bool shared_experts = false; // DeepSeek: mlp.shared_experts.* (no gate), and the router's selection bias
  // Multi-head latent attention (DeepSeek) in place of q/k/v: attn_q or attn_q_a/attn_q_a_norm/attn_q_b,
  // attn_kv_a_mqa, attn_kv_a_norm, and attn_k_b/attn_v_b (GGUF) or attn_kv_b (HF kv_b_proj).
  bool mla = false;
  // gpt-oss: attention sinks, the feed-forward's norm stored as post_attention_norm (GGUF), the router
  // and expert biases, HF's mlp.router and fused expert tensors (mlp.experts.gate_up_proj, split at load).
  bool gpt_oss = false;
  // A multi-token-prediction layer after the stack (components/mtp.hpp): DeepSeek-V3's nextn layer, HF
  // model.layers.{L}.eh_proj / enorm / hnorm / shared_head.norm / shared_head.head / embed_tokens,
  // GGUF blk.{L}.nextn.<name> as llama.cpp names GLM-4.5's. Optional at every layer; the decoder
  // checks the MTP layer has them.
  bool mtp = false;
  // Norm placement and kind: no pre-norms (OLMo 2: post_attention_layernorm and
  // post_feedforward_layernorm after the blocks only, as post_attention_norm / post_ffw_norm);
  // LayerNorm biases on every norm (StarCoder 2: attn_norm_bias, ffn_norm_bias, output_norm_bias).
  bool pre_norms = true;
  bool norm_bias = false;
  // A plain (ungated) feed-forward: no ffn_gate; HF's mlp.c_fc / mlp.c_proj (StarCoder 2) when
  // hf_c_fc, with their biases.
  bool gated_ffn = true;
  bool hf_c_fc = false;
};

std::vector<name_rule> decoder_name_table(const name_table_options& o);

}  // namespace troupe::families

#pragma once
// The weight roles of every family, as one enum with one name table (llama.cpp's llm_tensor and
// LLM_TENSOR_NAMES): a family's name rules, its trace and its sharding rules name roles by value, so
// a misspelled role is a compile error rather than a tensor reported missing at load. A role's name
// is its GGUF base name where GGUF has one ("attn_q" for blk.N.attn_q.weight).
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::graph {

// X(name): one entry per role, in the order of the enum.
#define TROUPE_WEIGHT_ROLES(X)                                                                             \
  /* whole-model */                                                                                        \
  X(token_embd) X(token_embd_norm) X(token_embd_norm_bias) X(token_types) X(position_embd) X(rope_freqs)    \
  X(output) X(output_norm) X(output_norm_bias)                                                             \
  /* attention */                                                                                          \
  X(attn_norm) X(attn_norm_bias) X(attn_q) X(attn_k) X(attn_v) X(attn_qkv) X(attn_q_bias) X(attn_k_bias) X(attn_v_bias)       \
  X(attn_qkv_bias) X(attn_q_norm) X(attn_k_norm) X(attn_output) X(attn_output_bias) X(attn_output_norm)    \
  X(attn_output_norm_bias) X(attn_sinks) X(post_attention_norm)                                            \
  /* latent attention (MLA) */                                                                             \
  X(attn_q_a) X(attn_q_a_norm) X(attn_q_b) X(attn_kv_a_mqa) X(attn_kv_a_norm) X(attn_kv_b) X(attn_k_b)     \
  X(attn_v_b)                                                                                              \
  /* feed-forward */                                                                                       \
  X(ffn_norm) X(ffn_norm_bias) X(ffn_gate) X(ffn_up) X(ffn_down) X(ffn_gate_up) X(ffn_gate_up_bias) X(ffn_gate_bias) X(ffn_up_bias)              \
  X(ffn_down_bias) X(post_ffw_norm) X(layer_output_norm) X(layer_output_norm_bias)                         \
  /* routed experts */                                                                                     \
  X(ffn_gate_inp) X(ffn_gate_inp_bias) X(exp_probs_b) X(ffn_gate_exps) X(ffn_up_exps) X(ffn_down_exps)      \
  X(ffn_gate_exps_bias) X(ffn_up_exps_bias) X(ffn_down_exps_bias) X(hf_gate_up_exps) X(hf_gate_up_exps_bias) \
  X(hf_down_exps) X(ffn_gate_shexp) X(ffn_up_shexp) X(ffn_down_shexp) X(ffn_gate_inp_shexp)               \
  /* multi-token prediction (a nextn layer: DeepSeek-V3, GLM-4.5; GGUF blk.N.nextn.<name after nextn_>) */ \
  X(nextn_eh_proj) X(nextn_embed_tokens) X(nextn_enorm) X(nextn_hnorm) X(nextn_shared_head_head)           \
  X(nextn_shared_head_norm)                                                                                \
  /* Mamba2 (GGUF blk.N.ssm_a and ssm_d carry no .weight suffix; ssm_a_log is HF's A_log) */              \
  X(ssm_in) X(ssm_conv1d) X(ssm_conv1d_bias) X(ssm_dt_bias) X(ssm_a) X(ssm_a_log) X(ssm_d) X(ssm_norm) X(ssm_out) \
  /* Gated DeltaNet (Qwen3-Next): the output gate's projection (z) and the fused beta/alpha projection */ \
  X(attn_gate) X(ssm_ba)                                                                                   \
  /* LoRA adapter pools of the targets (the driver's, not the checkpoint's): A [slots, rank, K] and      \
     B [slots, N, rank] per target linear, slot s holding a resident adapter's matrices (zero-padded) */  \
  X(attn_q_lora_a) X(attn_q_lora_b) X(attn_k_lora_a) X(attn_k_lora_b) X(attn_v_lora_a) X(attn_v_lora_b)     \
  X(attn_output_lora_a) X(attn_output_lora_b) X(ffn_gate_lora_a) X(ffn_gate_lora_b) X(ffn_up_lora_a)        \
  X(ffn_up_lora_b) X(ffn_down_lora_a) X(ffn_down_lora_b)                                                   \
  /* vision towers (an mmproj's v.* and mm.* tensors): the patch embedding (a stride-patch convolution,   \
     [D, 3, p, p]) and Gemma 3's projector (its RMSNorm and input projection) */                            \
  X(patch_embd) X(patch_embd_bias) X(mm_soft_emb_norm) X(mm_input_proj)

enum class tensor_role : std::uint8_t {
  none,  // no role: a weight binding without one is refused by the builder and by validate
#define TROUPE_ROLE_ENUM(n) n,
  TROUPE_WEIGHT_ROLES(TROUPE_ROLE_ENUM)
#undef TROUPE_ROLE_ENUM
};

// "attn_q"; "none" for tensor_role::none.
std::string_view role_name(tensor_role r);
// The role spelled `name`, or nullopt.
std::optional<tensor_role> role_from_name(std::string_view name);
// The bias beside `r` (the role named r's name + "_bias": attn_q -> attn_q_bias), or none.
tensor_role bias_of(tensor_role r);
// Routed-expert tensors: [experts, ...] stacks that expert parallelism splits by expert.
bool is_expert_stack(tensor_role r);
// The LoRA pools (A, B) of a linear an adapter may target (attn_q, attn_k, attn_v, attn_output,
// ffn_gate, ffn_up, ffn_down), or nullopt.
struct lora_pools {
  tensor_role a, b;
};
std::optional<lora_pools> lora_pools_of(tensor_role target);

}  // namespace troupe::graph

#pragma once
// Multi-head latent attention (DeepSeek-V2/V3), absorbed: each token's keys and values are one latent
// vector c = RMSNorm(x W_kv_a)[:kv_lora_rank] and one shared rotary key k_pe, so the cache holds
// kv_lora_rank + rope floats of keys and kv_lora_rank of values per token and layer (one KV head),
// not heads x (nope + rope + v). Per head h the query's non-rotary part is absorbed into the latent
// space (q_nope W_k_b[h]^T), attention runs as MQA over [c, k_pe], and W_v_b[h] maps its output back
// to the head's value width before the output projection; this equals the decompressed attention of
// the HF model exactly in real arithmetic.
//
// Weight roles, per layer: attn_q [H (nope + rope), D] or attn_q_a [q_lora, D] + attn_q_a_norm +
// attn_q_b [H (nope + rope), q_lora]; attn_kv_a_mqa [kv_lora + rope, D]; attn_kv_a_norm [kv_lora];
// attn_k_b [H, kv_lora, nope] and attn_v_b [H, v, kv_lora] (llama.cpp's split of kv_b_proj; an HF
// checkpoint's kv_b_proj [H (nope + v), kv_lora] is split so at load, `absorb_kv_b`); attn_output.
#include <optional>

#include "families/components/decoder.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

graph::value_id mla_attention(decoder_trace& d, graph::value_id x, std::int32_t layer, const attention_params& p);

// The expected shape of an MLA role of a layer with `p` (hidden size H), or nullopt for others.
std::optional<troupe::shape> mla_shape(role r, const attention_params& p, std::int64_t H);

// The map with every layer's attn_kv_b replaced by attn_k_b (transposed per head, as f32) and attn_v_b
// (its value rows per head, as stored); a map without attn_kv_b comes back as it is.
result<weight_map, weight_error> absorb_kv_b(const weight_map& m, const std::vector<attention_params>& layers);

}  // namespace troupe::families

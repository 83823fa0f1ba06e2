#include "families/components/name_tables.hpp"

namespace troupe::families {

std::vector<name_rule> decoder_name_table(const name_table_options& o) {
  std::vector<name_rule> t;
  const stored_as norm = o.norms_minus_one ? stored_as::minus_one : stored_as::as_is;
  const stored_as qk = o.qk_rope_interleaved ? stored_as::rope_interleaved : stored_as::as_is;
  const presence qkv_bias = o.qkv_bias_required ? presence::required : presence::optional;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none, stored_as s = stored_as::as_is) {
    t.push_back({r, false, key, p, tied, s});
  };
  auto layer = [&](role r, const char* key, presence p = presence::required, stored_as s = stored_as::as_is) {
    t.push_back({r, true, key, p, role::none, s});
  };

  if (o.gguf) {
    global(role::token_embd, "token_embd.weight");
    global(role::output, "output.weight", presence::tied, role::token_embd);
    global(role::output_norm, "output_norm.weight");
    if (o.norm_bias) global(role::output_norm_bias, "output_norm.bias");
    global(role::rope_freqs, "rope_freqs.weight", presence::optional);
    if (o.pre_norms) layer(role::attn_norm, "blk.{L}.attn_norm.weight");
    if (o.pre_norms && o.norm_bias) layer(role::attn_norm_bias, "blk.{L}.attn_norm.bias");
    if (o.mla) {
      layer(role::attn_q, "blk.{L}.attn_q.weight", presence::optional);
      layer(role::attn_q_a, "blk.{L}.attn_q_a.weight", presence::optional);
      layer(role::attn_q_a_norm, "blk.{L}.attn_q_a_norm.weight", presence::optional);
      layer(role::attn_q_b, "blk.{L}.attn_q_b.weight", presence::optional);
      layer(role::attn_kv_a_mqa, "blk.{L}.attn_kv_a_mqa.weight");
      layer(role::attn_kv_a_norm, "blk.{L}.attn_kv_a_norm.weight");
      layer(role::attn_k_b, "blk.{L}.attn_k_b.weight", presence::optional);
      layer(role::attn_v_b, "blk.{L}.attn_v_b.weight", presence::optional);
      layer(role::attn_kv_b, "blk.{L}.attn_kv_b.weight", presence::optional);
    } else if (o.fused) {
      layer(role::attn_qkv, "blk.{L}.attn_qkv.weight");
      layer(role::attn_qkv_bias, "blk.{L}.attn_qkv.bias", presence::optional);
    } else {
      layer(role::attn_q, "blk.{L}.attn_q.weight", presence::required, qk);
      layer(role::attn_k, "blk.{L}.attn_k.weight", presence::required, qk);
      layer(role::attn_v, "blk.{L}.attn_v.weight");
      layer(role::attn_q_bias, "blk.{L}.attn_q.bias", qkv_bias, qk);
      layer(role::attn_k_bias, "blk.{L}.attn_k.bias", qkv_bias, qk);
      layer(role::attn_v_bias, "blk.{L}.attn_v.bias", qkv_bias);
    }
    layer(role::attn_output, "blk.{L}.attn_output.weight");
    layer(role::attn_output_bias, "blk.{L}.attn_output.bias", presence::optional);
    if (o.qk_norm) {
      layer(role::attn_q_norm, "blk.{L}.attn_q_norm.weight");
      layer(role::attn_k_norm, "blk.{L}.attn_k_norm.weight");
    }
    if (o.pre_norms) layer(role::ffn_norm, o.gpt_oss ? "blk.{L}.post_attention_norm.weight" : "blk.{L}.ffn_norm.weight");
    if (o.pre_norms && o.norm_bias) layer(role::ffn_norm_bias, "blk.{L}.ffn_norm.bias");
    if (o.gpt_oss) layer(role::attn_sinks, "blk.{L}.attn_sinks.weight");
    if (o.sandwich_norms) {
      layer(role::post_attention_norm, "blk.{L}.post_attention_norm.weight");
      layer(role::post_ffw_norm, "blk.{L}.post_ffw_norm.weight");
    }
    const presence dense = o.experts > 0 ? presence::optional : presence::required;
    if (o.fused) {
      layer(role::ffn_gate_up, "blk.{L}.ffn_up.weight", dense);  // llama.cpp keeps Phi-3's fused gate_up as ffn_up
    } else {
      if (o.gated_ffn) layer(role::ffn_gate, "blk.{L}.ffn_gate.weight", dense);
      layer(role::ffn_up, "blk.{L}.ffn_up.weight", dense);
    }
    layer(role::ffn_down, "blk.{L}.ffn_down.weight", dense);
    if (!o.gated_ffn) {
      layer(role::ffn_up_bias, "blk.{L}.ffn_up.bias", presence::optional);
      layer(role::ffn_down_bias, "blk.{L}.ffn_down.bias", presence::optional);
    }
    if (o.experts > 0) {
      layer(role::ffn_gate_inp, "blk.{L}.ffn_gate_inp.weight", presence::optional);
      layer(role::ffn_gate_exps, "blk.{L}.ffn_gate_exps.weight", presence::optional);
      layer(role::ffn_up_exps, "blk.{L}.ffn_up_exps.weight", presence::optional);
      layer(role::ffn_down_exps, "blk.{L}.ffn_down_exps.weight", presence::optional);
      // Older GGUF files (Mixtral before llama.cpp merged the experts) keep one tensor per expert.
      for (auto [r, key] : {std::pair{role::ffn_gate_exps, "blk.{L}.ffn_gate.{E}.weight"}, {role::ffn_up_exps, "blk.{L}.ffn_up.{E}.weight"},
                            {role::ffn_down_exps, "blk.{L}.ffn_down.{E}.weight"}})
        t.push_back({r, true, key, presence::optional, role::none, stored_as::as_is, o.experts});
      if (o.shared_experts) layer(role::exp_probs_b, "blk.{L}.exp_probs_b.bias", presence::optional);
      if (o.gpt_oss)
        for (const role r : {role::ffn_gate_inp, role::ffn_gate_exps, role::ffn_up_exps, role::ffn_down_exps})
          t.push_back({bias_of(r), true, "blk.{L}." + std::string(role_name(r)) + ".bias", presence::optional, role::none, stored_as::as_is});
      if (o.shared_expert || o.shared_experts) {
        layer(role::ffn_gate_shexp, "blk.{L}.ffn_gate_shexp.weight", presence::optional);
        layer(role::ffn_up_shexp, "blk.{L}.ffn_up_shexp.weight", presence::optional);
        layer(role::ffn_down_shexp, "blk.{L}.ffn_down_shexp.weight", presence::optional);
        layer(role::ffn_gate_inp_shexp, "blk.{L}.ffn_gate_inp_shexp.weight", presence::optional);
      }
    }
    if (o.mtp)
      for (const role r : {role::nextn_eh_proj, role::nextn_embed_tokens, role::nextn_enorm, role::nextn_hnorm, role::nextn_shared_head_head,
                           role::nextn_shared_head_norm})
        t.push_back({r, true, "blk.{L}.nextn." + std::string(role_name(r).substr(6)) + ".weight", presence::optional, role::none, stored_as::as_is});
    return t;
  }

  global(role::token_embd, "model.embed_tokens.weight");
  global(role::output, "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, "model.norm.weight", presence::required, role::none, norm);
  if (o.norm_bias) global(role::output_norm_bias, "model.norm.bias");
  if (o.pre_norms) layer(role::attn_norm, "model.layers.{L}.input_layernorm.weight", presence::required, norm);
  if (o.pre_norms && o.norm_bias) layer(role::attn_norm_bias, "model.layers.{L}.input_layernorm.bias");
  if (o.mla) {
    layer(role::attn_q, "model.layers.{L}.self_attn.q_proj.weight", presence::optional);
    layer(role::attn_q_a, "model.layers.{L}.self_attn.q_a_proj.weight", presence::optional);
    layer(role::attn_q_a_norm, "model.layers.{L}.self_attn.q_a_layernorm.weight", presence::optional);
    layer(role::attn_q_b, "model.layers.{L}.self_attn.q_b_proj.weight", presence::optional);
    layer(role::attn_kv_a_mqa, "model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight");
    layer(role::attn_kv_a_norm, "model.layers.{L}.self_attn.kv_a_layernorm.weight");
    layer(role::attn_kv_b, "model.layers.{L}.self_attn.kv_b_proj.weight");
  } else if (o.fused) {
    layer(role::attn_qkv, "model.layers.{L}.self_attn.qkv_proj.weight");
    layer(role::attn_qkv_bias, "model.layers.{L}.self_attn.qkv_proj.bias", presence::optional);
  } else {
    layer(role::attn_q, "model.layers.{L}.self_attn.q_proj.weight");
    layer(role::attn_k, "model.layers.{L}.self_attn.k_proj.weight");
    layer(role::attn_v, "model.layers.{L}.self_attn.v_proj.weight");
    layer(role::attn_q_bias, "model.layers.{L}.self_attn.q_proj.bias", qkv_bias);
    layer(role::attn_k_bias, "model.layers.{L}.self_attn.k_proj.bias", qkv_bias);
    layer(role::attn_v_bias, "model.layers.{L}.self_attn.v_proj.bias", qkv_bias);
  }
  layer(role::attn_output, "model.layers.{L}.self_attn.o_proj.weight");
  layer(role::attn_output_bias, "model.layers.{L}.self_attn.o_proj.bias", presence::optional);
  if (o.qk_norm) {
    layer(role::attn_q_norm, "model.layers.{L}.self_attn.q_norm.weight", presence::required, norm);
    layer(role::attn_k_norm, "model.layers.{L}.self_attn.k_norm.weight", presence::required, norm);
  }
  if (o.sandwich_norms) {
    layer(role::post_attention_norm, "model.layers.{L}.post_attention_layernorm.weight", presence::required, norm);
    if (o.pre_norms) layer(role::ffn_norm, "model.layers.{L}.pre_feedforward_layernorm.weight", presence::required, norm);
    layer(role::post_ffw_norm, "model.layers.{L}.post_feedforward_layernorm.weight", presence::required, norm);
  } else if (o.pre_norms) {
    layer(role::ffn_norm, "model.layers.{L}.post_attention_layernorm.weight", presence::required, norm);
    if (o.norm_bias) layer(role::ffn_norm_bias, "model.layers.{L}.post_attention_layernorm.bias");
  }
  const presence dense = o.experts > 0 ? presence::optional : presence::required;
  if (o.fused) {
    layer(role::ffn_gate_up, "model.layers.{L}.mlp.gate_up_proj.weight", dense);
  } else if (o.hf_c_fc) {
    layer(role::ffn_up, "model.layers.{L}.mlp.c_fc.weight", dense);
    layer(role::ffn_up_bias, "model.layers.{L}.mlp.c_fc.bias", presence::optional);
    layer(role::ffn_down_bias, "model.layers.{L}.mlp.c_proj.bias", presence::optional);
  } else {
    if (o.gated_ffn) layer(role::ffn_gate, "model.layers.{L}.mlp.gate_proj.weight", dense);
    layer(role::ffn_up, "model.layers.{L}.mlp.up_proj.weight", dense);
  }
  layer(role::ffn_down, o.hf_c_fc ? "model.layers.{L}.mlp.c_proj.weight" : "model.layers.{L}.mlp.down_proj.weight", dense);
  if (o.gpt_oss) layer(role::attn_sinks, "model.layers.{L}.self_attn.sinks");
  if (o.experts > 0 && o.gpt_oss) {
    // Fused and transposed as HF keeps them: gate_up [E, H, 2F] (gate and up interleaved), down [E, F, H].
    layer(role::ffn_gate_inp, "model.layers.{L}.mlp.router.weight");
    layer(role::ffn_gate_inp_bias, "model.layers.{L}.mlp.router.bias");
    layer(role::hf_gate_up_exps, "model.layers.{L}.mlp.experts.gate_up_proj");
    layer(role::hf_gate_up_exps_bias, "model.layers.{L}.mlp.experts.gate_up_proj_bias");
    layer(role::hf_down_exps, "model.layers.{L}.mlp.experts.down_proj");
    layer(role::ffn_down_exps_bias, "model.layers.{L}.mlp.experts.down_proj_bias");
  } else if (o.experts > 0) {
    auto experts = [&](role r, const char* key) { t.push_back({r, true, key, presence::optional, role::none, stored_as::as_is, o.experts}); };
    if (o.hf_moe == name_table_options::hf_experts::mixtral) {
      layer(role::ffn_gate_inp, "model.layers.{L}.block_sparse_moe.gate.weight", presence::optional);
      experts(role::ffn_gate_exps, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight");
      experts(role::ffn_up_exps, "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight");
      experts(role::ffn_down_exps, "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight");
    } else {
      layer(role::ffn_gate_inp, "model.layers.{L}.mlp.gate.weight", presence::optional);
      experts(role::ffn_gate_exps, "model.layers.{L}.mlp.experts.{E}.gate_proj.weight");
      experts(role::ffn_up_exps, "model.layers.{L}.mlp.experts.{E}.up_proj.weight");
      experts(role::ffn_down_exps, "model.layers.{L}.mlp.experts.{E}.down_proj.weight");
    }
    if (o.shared_experts) {
      layer(role::exp_probs_b, "model.layers.{L}.mlp.gate.e_score_correction_bias", presence::optional);
      layer(role::ffn_gate_shexp, "model.layers.{L}.mlp.shared_experts.gate_proj.weight", presence::optional);
      layer(role::ffn_up_shexp, "model.layers.{L}.mlp.shared_experts.up_proj.weight", presence::optional);
      layer(role::ffn_down_shexp, "model.layers.{L}.mlp.shared_experts.down_proj.weight", presence::optional);
    }
    if (o.shared_expert) {
      layer(role::ffn_gate_shexp, "model.layers.{L}.mlp.shared_expert.gate_proj.weight", presence::optional);
      layer(role::ffn_up_shexp, "model.layers.{L}.mlp.shared_expert.up_proj.weight", presence::optional);
      layer(role::ffn_down_shexp, "model.layers.{L}.mlp.shared_expert.down_proj.weight", presence::optional);
      layer(role::ffn_gate_inp_shexp, "model.layers.{L}.mlp.shared_expert_gate.weight", presence::optional);
    }
  }
  layer(role::ffn_gate_bias, "model.layers.{L}.mlp.gate_proj.bias", presence::optional);
  if (!o.hf_c_fc) {
    layer(role::ffn_up_bias, "model.layers.{L}.mlp.up_proj.bias", presence::optional);
    layer(role::ffn_down_bias, "model.layers.{L}.mlp.down_proj.bias", presence::optional);
  }
  if (o.mtp) {
    layer(role::nextn_eh_proj, "model.layers.{L}.eh_proj.weight", presence::optional);
    layer(role::nextn_embed_tokens, "model.layers.{L}.embed_tokens.weight", presence::optional);
    layer(role::nextn_enorm, "model.layers.{L}.enorm.weight", presence::optional, norm);
    layer(role::nextn_hnorm, "model.layers.{L}.hnorm.weight", presence::optional, norm);
    layer(role::nextn_shared_head_head, "model.layers.{L}.shared_head.head.weight", presence::optional);
    layer(role::nextn_shared_head_norm, "model.layers.{L}.shared_head.norm.weight", presence::optional, norm);
  }
  return t;
}

}  // namespace troupe::families

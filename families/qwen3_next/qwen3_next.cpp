// Qwen3-Next (HF model_type qwen3_next, GGUF architecture qwen3next): a hybrid whose layers are three
// Gated DeltaNet (linear attention) layers to one gated full-attention layer (full_attention_interval,
// or HF's layer_types), each followed by a routed feed-forward with a sigmoid-gated shared expert
// (Qwen 2 MoE's, its top k renormalized). The full attention has q/k RMSNorm per head, a partial NEOX
// rope and an output gate (q_proj yields [q | gate] per head). HF's norms scale by 1 + w (stored as w;
// llama.cpp's converter adds the 1), except the gated norm of the linear attention. The multi-token-
// prediction layer the released checkpoints carry (HF mtp_num_hidden_layers: mtp.fc, the two pre-fc
// norms, mtp.layers.0 as a full-attention routed layer, mtp.norm; GGUF nextn_predict_layers counted in
// block_count, its block blk.N with blk.N.nextn.* as llama.cpp names GLM-4.5's) is the model's draft
// program (components/mtp.hpp, with vLLM's Qwen3NextMTP conventions) when its tensors are there.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

// The MTP layer at index `mtp_layer` (HF: mtp.layers.0.* for every per-layer key, and its own
// fc / norms; -1: none).
std::vector<name_rule> names(bool gguf, std::int64_t experts, std::int32_t mtp_layer) {
  name_table_options o;
  o.gguf = gguf;
  o.qk_norm = true;
  o.norms_minus_one = !gguf;
  o.experts = experts;
  o.shared_expert = true;
  o.mtp = gguf && mtp_layer >= 0;  // blk.{L}.nextn.*
  auto t = decoder_name_table(o);
  // Attention roles exist on the full-attention layers only: checked per layer below.
  for (auto& rule : t) {
    if (!rule.per_layer) continue;
    switch (rule.role) {
      case role::attn_q: case role::attn_k: case role::attn_v: case role::attn_output: case role::attn_q_norm: case role::attn_k_norm:
        rule.presence = presence::optional;
        break;
      case role::ffn_norm:  // llama.cpp names the feed-forward's pre-norm after HF's post_attention_layernorm
        if (gguf) rule.key = "blk.{L}.post_attention_norm.weight";
        break;
      default: break;
    }
  }
  auto layer = [&](role r, std::string key) { t.push_back({r, true, std::move(key), presence::optional}); };
  if (gguf) {
    for (auto [r, key] : {std::pair{role::attn_qkv, "attn_qkv.weight"}, {role::attn_gate, "attn_gate.weight"}, {role::ssm_in, "ssm_in.weight"},
                          {role::ssm_ba, "ssm_ba.weight"}, {role::ssm_conv1d, "ssm_conv1d.weight"}, {role::ssm_dt_bias, "ssm_dt.bias"},
                          {role::ssm_a, "ssm_a"}, {role::ssm_norm, "ssm_norm.weight"}, {role::ssm_out, "ssm_out.weight"}})
      layer(r, std::string("blk.{L}.") + key);
  } else {
    for (auto [r, key] : {std::pair{role::ssm_in, "in_proj_qkvz.weight"}, {role::ssm_ba, "in_proj_ba.weight"}, {role::ssm_conv1d, "conv1d.weight"},
                          {role::ssm_dt_bias, "dt_bias"}, {role::ssm_a_log, "A_log"}, {role::ssm_norm, "norm.weight"},
                          {role::ssm_out, "out_proj.weight"}})
      layer(r, std::string("model.layers.{L}.linear_attn.") + key);
    if (mtp_layer >= 0) {
      const std::string from = "model.layers.{L}.";
      std::vector<name_rule> moved;
      for (const auto& rule : t)
        if (rule.per_layer && rule.key.starts_with(from)) {
          auto m = rule;
          m.key = "mtp.layers.0." + rule.key.substr(from.size());
          m.layer_only = mtp_layer;
          moved.push_back(std::move(m));
        }
      t.insert(t.end(), moved.begin(), moved.end());
      for (auto [r, key] : {std::pair{role::nextn_eh_proj, "mtp.fc.weight"}, {role::nextn_enorm, "mtp.pre_fc_norm_embedding.weight"},
                            {role::nextn_hnorm, "mtp.pre_fc_norm_hidden.weight"}, {role::nextn_shared_head_norm, "mtp.norm.weight"}}) {
        name_rule n{r, true, key, presence::required, role::none, r == role::nextn_eh_proj ? stored_as::as_is : stored_as::minus_one};
        n.layer_only = mtp_layer;
        t.push_back(std::move(n));
      }
    }
  }
  return t;
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "qwen3_next");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto basics = read_decoder_basics(r, store);
  if (!basics) return fail(basics.error());
  // Multi-token prediction: GGUF counts the nextn block in block_count, HF does not.
  auto nextn = r.count_or(r.raw().has("mtp_num_hidden_layers") ? "mtp_num_hidden_layers" : "num_nextn_predict_layers", "nextn_predict_layers", 0);
  if (!nextn) return fail(nextn.error());
  if (r.gguf() && *nextn > 0) {
    if (*nextn >= basics->layers) return fail(r.error(r.key("", "nextn_predict_layers"), "leaves no layer for the model"));
    basics->layers -= *nextn;
  }
  const std::int64_t L = basics->layers;
  const std::string fc = r.gguf() ? "blk." + std::to_string(L) + ".nextn.eh_proj.weight" : "mtp.fc.weight";
  const std::int64_t mtp = *nextn > 0 && store.find(fc) ? 1 : 0;  // the first; a checkpoint may drop them

  // Which layers are linear attention.
  std::vector<kind> kinds(static_cast<std::size_t>(L), kind::gated_delta);
  if (!r.gguf() && r.raw().has("layer_types")) {
    auto types = r.raw().get_string_array("layer_types");
    if (!types || static_cast<std::int64_t>(types->size()) != L)
      return fail(r.error("layer_types", "must name each of the " + std::to_string(L) + " layers"));
    for (std::int64_t l = 0; l < L; ++l) {
      const auto& t = (*types)[static_cast<std::size_t>(l)];
      if (t != "linear_attention" && t != "full_attention") return fail(r.error("layer_types", "unknown layer type '" + t + "'"));
      kinds[static_cast<std::size_t>(l)] = t == "full_attention" ? kind::attention_ffn : kind::gated_delta;
    }
  } else {
    auto interval = r.positive_or("full_attention_interval", "full_attention_interval", 4);
    if (!interval) return fail(interval.error());
    for (std::int64_t l = 0; l < L; ++l)
      if ((l + 1) % *interval == 0) kinds[static_cast<std::size_t>(l)] = kind::attention_ffn;
  }

  // The linear attention's sizes (llama.cpp: state_size Dk, group_count Hk, time_step_rank H, inner_size H Dv).
  gated_delta_params g;
  auto conv = r.positive_or("linear_conv_kernel_dim", "ssm.conv_kernel", 4);
  auto dk = r.positive("linear_key_head_dim", "ssm.state_size");
  auto hk = r.positive("linear_num_key_heads", "ssm.group_count");
  auto hv = r.positive("linear_num_value_heads", "ssm.time_step_rank");
  if (auto e = first_error(conv, dk, hk, hv)) return fail(*e);
  std::int64_t dv = 0;
  if (r.gguf()) {
    auto inner = r.positive("", "ssm.inner_size");
    if (!inner) return fail(inner.error());
    if (*inner % *hv != 0) return fail(r.error("ssm.inner_size", "must be a multiple of the value heads (time_step_rank)"));
    dv = *inner / *hv;
  } else {
    auto v = r.positive("linear_value_head_dim", "");
    if (!v) return fail(v.error());
    dv = *v;
  }
  constexpr std::int64_t bound = std::int64_t{1} << 16;
  for (auto [v, what] : {std::pair{*dk, "linear_key_head_dim"}, {dv, "linear_value_head_dim"}, {*hk, "linear_num_key_heads"},
                         {*hv, "linear_num_value_heads"}})
    if (v > bound) return fail(r.error(what, std::to_string(v) + " is past the bound of " + std::to_string(bound)));
  if (*hv % *hk != 0) return fail(r.error(r.key("linear_num_value_heads", "ssm.time_step_rank"), "value heads must be a multiple of key heads"));
  if (*conv < 2 || *conv > 64) return fail(r.error(r.key("linear_conv_kernel_dim", "ssm.conv_kernel"), "the kernel must lie in [2, 64]"));
  g = gated_delta_params{*hk, *dk, *hv, dv, *conv, basics->norm_eps};

  moe_keys keys;
  keys.norm_default = true;  // llama.cpp renormalizes Qwen3-Next's top k
  keys.shared_width_hf = "shared_expert_intermediate_size";
  keys.sparse_step_hf = "decoder_sparse_step";
  keys.dense_layers_hf = "mlp_only_layers";
  auto moe = read_moe(r, keys, L + mtp, basics->ffn);
  if (!moe) return fail(moe.error());

  auto spec = uniform_spec("qwen3_next", *basics, r);
  for (auto& a : spec.attention) {
    a.qk_norm = true;
    a.output_gate = true;
  }
  spec.moe = std::move(*moe);
  spec.kinds = kinds;  // the MTP layer, past them, is a full-attention layer
  spec.gated_delta = g;
  if (mtp > 0) spec.attention.push_back(spec.attention.back());
  spec.mtp_layers = mtp;
  spec.mtp = {.zero_first_embedding = false, .hidden_after_norm = true};
  const auto experts = routed_experts(spec.moe);
  auto m = make_dense_decoder(std::move(spec), store, names(r.gguf(), experts, mtp > 0 ? static_cast<std::int32_t>(L) : -1));
  if (!m) return m;
  for (std::int64_t l = 0; l < L + mtp; ++l) {
    if (l < L && kinds[static_cast<std::size_t>(l)] != kind::attention_ffn) continue;  // linear attention: checked by the decoder
    for (const auto rr : {role::attn_q, role::attn_k, role::attn_v, role::attn_output, role::attn_q_norm, role::attn_k_norm})
      if (!(*m)->weights().has({rr, static_cast<std::int32_t>(l)}))
        return unexpected(model_error{weight_error{weight_error_code::missing, {rr, static_cast<std::int32_t>(l)}, "(layer " + std::to_string(l) + ")", "", ""}});
  }
  return m;
}

constexpr family_key keys[] = {{load::config_source::hf_json, "qwen3_next"}, {load::config_source::gguf, "qwen3next"}};

}  // namespace

const family_entry qwen3_next_entry{"qwen3_next", keys, build};

}  // namespace troupe::families

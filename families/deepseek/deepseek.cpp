// DeepSeek-V2 and V3 (GGUF arch deepseek2 for both): multi-head latent attention (components/mla.hpp)
// over routed feed-forwards with shared experts, the first `first_k_dense_replace` layers dense.
// V2 scores experts with a softmax (group_limited_greedy: the best `topk_group` of `n_group` groups by
// their best expert); V3 with a sigmoid plus a selection bias (e_score_correction_bias), groups scored
// by their best two (noaux_tc), weights renormalized and scaled by routed_scaling_factor. V3's
// multi-token-prediction layer (num_nextn_predict_layers; HF layer num_hidden_layers, GGUF the last
// nextn_predict_layers blocks of block_count, named blk.N.nextn.* as llama.cpp names GLM-4.5's) is
// the model's draft program (components/mtp.hpp) when the checkpoint keeps its tensors.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build_as(const load::raw_config& cfg, const load::weight_store& store, const char* family) {
  const config_reader r(cfg, family);
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  // Multi-token prediction: GGUF counts the nextn blocks in block_count, HF does not.
  auto nextn = r.count_or("num_nextn_predict_layers", "nextn_predict_layers", 0);
  if (!nextn) return fail(nextn.error());
  if (r.gguf() && *nextn > 0) {
    if (*nextn >= basics->layers) return fail(r.error(r.key("", "nextn_predict_layers"), "leaves no layer for the model"));
    basics->layers -= *nextn;
  }
  const std::string eh = r.gguf() ? "blk." + std::to_string(basics->layers) + ".nextn.eh_proj.weight"
                                  : "model.layers." + std::to_string(basics->layers) + ".eh_proj.weight";
  const std::int64_t mtp = *nextn > 0 && store.find(eh) ? 1 : 0;  // the first; a checkpoint may drop them
  attention_params::latent mla;
  auto q_lora = r.count_or("q_lora_rank", "attention.q_lora_rank", 0);
  auto kv_lora = r.positive("kv_lora_rank", "attention.kv_lora_rank");
  auto rope = r.positive("qk_rope_head_dim", "rope.dimension_count");
  if (auto e = first_error(q_lora, kv_lora, rope)) return fail(*e);
  std::int64_t nope = 0, v = 0;
  if (r.gguf()) {
    // Files converted for MLA (llama.cpp since mid-2025) keep the per-head sizes under *_mla and split
    // kv_b into attn_k_b / attn_v_b; older ones have them as key_length / value_length and one attn_kv_b.
    const bool mla_keys = r.raw().has(r.key("", "attention.key_length_mla"));
    auto k_mla = r.positive("", mla_keys ? "attention.key_length_mla" : "attention.key_length");
    auto v_mla = r.positive("", mla_keys ? "attention.value_length_mla" : "attention.value_length");
    if (auto e = first_error(k_mla, v_mla)) return fail(*e);
    if (*k_mla <= *rope) return fail(r.error(r.key("", mla_keys ? "attention.key_length_mla" : "attention.key_length"), "must exceed the rotary width"));
    nope = *k_mla - *rope;
    v = *v_mla;
  } else {
    auto n = r.positive("qk_nope_head_dim", "");
    auto vv = r.positive("v_head_dim", "");
    if (auto e = first_error(n, vv)) return fail(*e);
    nope = *n;
    v = *vv;
  }
  mla.q_lora_rank = *q_lora;
  mla.kv_lora_rank = *kv_lora;
  mla.nope = nope;
  mla.v_dim = v;
  constexpr std::int64_t bound = 1 << 16;
  for (auto [value, what] : {std::pair{*kv_lora, "kv_lora_rank"}, {*q_lora, "q_lora_rank"}, {nope, "qk_nope_head_dim"}, {v, "v_head_dim"},
                             {*rope, "qk_rope_head_dim"}})
    if (value > bound) return fail(r.error(what, std::to_string(value) + " is past the bound of " + std::to_string(bound)));
  if (*rope % 2 != 0) return fail(r.error(r.key("qk_rope_head_dim", "rope.dimension_count"), "the rotary width must be even"));

  // Routing.
  moe_keys keys;
  keys.experts_hf = "n_routed_experts";
  keys.shared_width_hf = "";
  keys.norm_default = false;
  auto moe = read_moe(r, keys, basics->layers + mtp, basics->ffn);
  if (!moe) return fail(moe.error());
  auto shared = r.count_or("n_shared_experts", "expert_shared_count", 0);
  auto first_dense = r.count_or("first_k_dense_replace", "leading_dense_block_count", 0);
  auto freq = r.positive_or("moe_layer_freq", "", 1);
  if (auto e = first_error(shared, first_dense, freq)) return fail(*e);
  bool norm = false;
  gating gate = gating::softmax;
  std::int64_t groups = 0, groups_used = 0;
  auto rule = moe_params::group_score::top2_sum;
  if (r.gguf()) {
    auto n = r.flag_or("", "expert_weights_norm", false);
    auto g = r.count_or("", "expert_gating_func", 1);
    auto gc = r.count_or("", "expert_group_count", 0);
    auto gu = r.count_or("", "expert_group_used_count", 0);
    if (auto e = first_error(n, g, gc, gu)) return fail(*e);
    if (*g == 0) *g = 1;  // unset: softmax, as llama.cpp reads DeepSeek-V2 files without the key
    if (*g != 1 && *g != 2) return fail(r.error(r.key("", "expert_gating_func"), "only softmax (1) and sigmoid (2) gating are supported"));
    norm = *n;
    gate = *g == 2 ? gating::sigmoid : gating::softmax;
    groups = *gc;
    groups_used = *gu;
  } else {
    auto n = r.flag_or("norm_topk_prob", "", false);
    if (!n) return fail(n.error());
    norm = *n;
    const auto scoring = r.text("scoring_func", "").value_or("softmax");
    if (scoring != "softmax" && scoring != "sigmoid") return fail(r.error("scoring_func", "unsupported scoring '" + scoring + "'"));
    gate = scoring == "sigmoid" ? gating::sigmoid : gating::softmax;
    const auto method = r.text("topk_method", "").value_or("greedy");
    if (method == "group_limited_greedy" || method == "noaux_tc") {
      auto gc = r.positive("n_group", "");
      auto gu = r.positive("topk_group", "");
      if (auto e = first_error(gc, gu)) return fail(*e);
      groups = *gc;
      groups_used = *gu;
      rule = method == "noaux_tc" ? moe_params::group_score::top2_sum : moe_params::group_score::max;
    } else if (method != "greedy") {
      return fail(r.error("topk_method", "unsupported expert selection '" + method + "'"));
    }
  }
  for (std::int64_t l = 0; l < basics->layers + mtp; ++l) {
    auto& m = (*moe)[static_cast<std::size_t>(l)];
    if (l < *first_dense || l % *freq != 0) {
      m = moe_params{};
      continue;
    }
    if (groups > 1) {
      if (m.experts % groups != 0 || groups_used < 1 || groups_used > groups)
        return fail(r.error(r.key("n_group", "expert_group_count"), std::to_string(m.experts) + " experts do not make " + std::to_string(groups) +
                                                                         " groups of which " + std::to_string(groups_used) + " are used"));
      // DeepSeek-V3's group score sums each group's best two experts: a group of one has no second
      // (Hugging Face's topk(2) fails on it and llama.cpp asserts n_expert_groups < n_expert).
      if (rule == moe_params::group_score::top2_sum && m.experts / groups < 2)
        return fail(r.error(r.key("n_group", "expert_group_count"), std::to_string(groups) + " groups of " + std::to_string(m.experts) +
                                                                         " experts leave one expert per group; the top-2 group score needs two"));
      m.groups = groups;
      m.groups_used = groups_used;
      m.group_rule = rule;
    }
    m.norm_topk = norm;
    m.gate = gate;
    m.shared_width = *shared * m.width;
    m.shared_gated = false;
  }

  auto spec = uniform_spec(family, *basics, r);
  if (mtp > 0) spec.attention.push_back(spec.attention.back());
  spec.mtp_layers = mtp;
  double mscale = 1.0;
  if (spec.attention[0].rope.kind == rope_kind::yarn) {
    // DeepSeek's yarn scales the attention by mscale(factor, mscale_all_dim)^2 (HF softmax_scale; the
    // GGUF keeps 0.1 mscale_all_dim as rope.scaling.yarn_log_multiplier).
    auto all = r.number_or("rope_scaling.mscale_all_dim", "rope.scaling.yarn_log_multiplier", 0.0);
    if (!all) return fail(all.error());
    const double m_all = r.gguf() ? *all / 0.1 : *all;
    if (m_all > 0) mscale = 0.1 * m_all * std::log(spec.attention[0].rope.factor) + 1.0;
    for (auto& a : spec.attention) a.rope.attention_factor = 1.0;  // mscale / mscale_all_dim, equal in every release
  }
  for (auto& a : spec.attention) {
    a.head_dim = *rope;
    a.rope.dims = *rope;
    a.kv_heads = 1;
    a.mla = mla;
    a.scale = mscale * mscale / std::sqrt(static_cast<double>(nope + *rope));
  }
  spec.config.kv_elems_per_token_per_layer = *kv_lora + *rope;  // [c, k_pe] once: c is the value too
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.mla = true;
  names.experts = routed_experts(spec.moe);
  names.shared_experts = true;
  names.mtp = mtp > 0;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

result<std::unique_ptr<model>, model_error> build_v2(const load::raw_config& cfg, const load::weight_store& store) {
  return build_as(cfg, store, "deepseek_v2");
}
result<std::unique_ptr<model>, model_error> build_v3(const load::raw_config& cfg, const load::weight_store& store) {
  return build_as(cfg, store, "deepseek_v3");
}

constexpr family_key v2_keys[] = {{load::config_source::hf_json, "deepseek_v2"}, {load::config_source::gguf, "deepseek2"}};
constexpr family_key v3_keys[] = {{load::config_source::hf_json, "deepseek_v3"}};

}  // namespace

const family_entry deepseek_v2_entry{"deepseek_v2", v2_keys, build_v2};
const family_entry deepseek_v3_entry{"deepseek_v3", v3_keys, build_v3};

}  // namespace troupe::families

// Qwen 3 MoE: Qwen 3's attention (per-head q/k RMSNorm, no biases) over routed feed-forwards: softmax
// scores over `num_experts`, the top `num_experts_per_tok`, renormalized (`norm_topk_prob`; llama.cpp
// always renormalizes its qwen3moe), experts of `moe_intermediate_size`; `mlp_only_layers` and
// `decoder_sparse_step` keep some layers dense (HF form).
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "qwen3_moe");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto bias = r.flag_or("attention_bias", "", false);
  if (!bias) return unexpected(model_error{bias.error()});
  if (*bias) return unexpected(model_error{r.error("attention_bias", "Qwen 3 MoE checkpoints have no attention biases")});
  moe_keys keys;
  keys.norm_default = !r.gguf() ? false : true;  // HF's default is false; released checkpoints say true
  keys.sparse_step_hf = "decoder_sparse_step";
  keys.dense_layers_hf = "mlp_only_layers";
  auto moe = read_moe(r, keys, basics->layers, basics->ffn);
  if (!moe) return unexpected(model_error{moe.error()});
  auto spec = uniform_spec("qwen3_moe", *basics, r);
  for (auto& a : spec.attention) a.qk_norm = true;
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_norm = true;
  names.experts = routed_experts(spec.moe);
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "qwen3_moe"}, {load::config_source::gguf, "qwen3moe"}};

}  // namespace

const family_entry qwen3_moe_entry{"qwen3_moe", keys, build};

}  // namespace troupe::families

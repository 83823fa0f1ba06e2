// Qwen 2 MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen 2's attention (q/k/v biases) over routed
// feed-forwards with a shared expert every token runs, scaled by sigmoid(x . shared_expert_gate);
// the routed weights are not renormalized unless `norm_topk_prob` says so (llama.cpp never does).
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "qwen2_moe");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto sliding = r.flag_or("use_sliding_window", "", false);
  if (!sliding) return unexpected(model_error{sliding.error()});
  if (*sliding) return unexpected(model_error{r.error("use_sliding_window", "Qwen 2 sliding-window attention is not supported")});
  moe_keys keys;
  keys.norm_default = false;
  keys.shared_width_hf = "shared_expert_intermediate_size";
  keys.sparse_step_hf = "decoder_sparse_step";
  keys.dense_layers_hf = "mlp_only_layers";
  auto moe = read_moe(r, keys, basics->layers, basics->ffn);
  if (!moe) return unexpected(model_error{moe.error()});
  auto spec = uniform_spec("qwen2_moe", *basics, r);
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.qkv_bias_required = true;
  names.experts = routed_experts(spec.moe);
  names.shared_expert = true;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "qwen2_moe"}, {load::config_source::gguf, "qwen2moe"}};

}  // namespace

const family_entry qwen2_moe_entry{"qwen2_moe", keys, build};

}  // namespace troupe::families

// OLMoE: a routed decoder whose q and k are RMS-normed over their whole width (all heads together,
// before the split into heads), NeoX rotary, softmax routing over `num_experts`, the top
// `num_experts_per_tok` not renormalized (`norm_topk_prob`, false in the released checkpoints and in
// llama.cpp's olmoe).
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "olmoe");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto clip = r.number_or("clip_qkv", "", 0.0);
  if (!clip) return unexpected(model_error{clip.error()});
  if (*clip != 0.0) return unexpected(model_error{r.error("clip_qkv", "clamping q, k and v is not supported")});
  moe_keys keys;
  keys.width_hf = "";
  keys.norm_default = false;
  auto moe = read_moe(r, keys, basics->layers, basics->ffn);
  if (!moe) return unexpected(model_error{moe.error()});
  auto spec = uniform_spec("olmoe", *basics, r);
  for (auto& a : spec.attention) a.qk_norm = a.qk_norm_full = true;
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_norm = true;
  names.experts = routed_experts(spec.moe);
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "olmoe"}, {load::config_source::gguf, "olmoe"}};

}  // namespace

const family_entry olmoe_entry{"olmoe", keys, build};

}  // namespace troupe::families

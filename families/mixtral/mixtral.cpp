// Mixtral: a Mistral decoder whose feed-forwards are routed: softmax over `num_local_experts`, the top
// `num_experts_per_tok` renormalized, experts of `intermediate_size` (HF block_sparse_moe.experts.N.w1,
// w3, w2). Its GGUF form is architecture `llama` with expert tensors: the registry picks this family
// when `llama.expert_count` is present.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "mixtral");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  moe_keys keys;
  keys.experts_hf = "num_local_experts";
  keys.width_hf = "";
  keys.norm_hf = "";
  auto moe = read_moe(r, keys, basics->layers, basics->ffn);
  if (!moe) return unexpected(model_error{moe.error()});
  auto spec = uniform_spec("mixtral", *basics, r);
  auto window = r.positive_or("sliding_window", "", 0);
  if (!window) return unexpected(model_error{window.error()});
  for (auto& a : spec.attention) a.sliding_window = *window;
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_rope_interleaved = r.gguf();
  names.experts = routed_experts(spec.moe);
  names.hf_moe = name_table_options::hf_experts::mixtral;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "mixtral"}, {load::config_source::gguf, "llama", "llama.expert_count"}};

}  // namespace

const family_entry mixtral_entry{"mixtral", keys, build};

}  // namespace troupe::families

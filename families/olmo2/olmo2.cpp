// OLMo 2: norms after the blocks instead of before them (x + norm(attn(x)), then h + norm(mlp(h)):
// post_attention_layernorm and post_feedforward_layernorm, no input norms), RMSNorm over all of q and
// all of k before RoPE (q_norm over heads x head_dim), NeoX rotary, SwiGLU, no biases. OLMo 3's
// sliding-window layers are refused by name until a fixture covers them.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "olmo2");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto bias = r.flag_or("attention_bias", "", false);
  if (!bias) return unexpected(model_error{bias.error()});
  if (*bias) return unexpected(model_error{r.error("attention_bias", "OLMo 2 checkpoints have no attention biases")});
  if (r.raw().has(r.key("sliding_window", "attention.sliding_window")))
    return unexpected(model_error{r.error(r.key("sliding_window", "attention.sliding_window"), "OLMo 3's sliding-window layers are not supported")});
  auto spec = uniform_spec("olmo2", *basics, r);
  spec.stack.pre_norms = false;
  spec.stack.sandwich_norms = true;
  for (auto& a : spec.attention) {
    a.qk_norm = true;
    a.qk_norm_full = true;
  }
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_norm = true;
  names.sandwich_norms = true;
  names.pre_norms = false;
  return make_dense_decoder(std::move(spec), store, decoder_name_table(names));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "olmo2"}, {load::config_source::gguf, "olmo2"}};

}  // namespace

const family_entry olmo2_entry{"olmo2", keys, build};

}  // namespace troupe::families

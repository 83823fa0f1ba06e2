// Granite (3.x dense): Llama's decoder with four multipliers: the embeddings scaled by
// embedding_multiplier, each block's output by residual_multiplier before its residual add, attention
// scores by attention_multiplier (in place of 1/sqrt(head_dim)), and the logits divided by
// logits_scaling. GGUF keeps them as embedding_scale, residual_scale, attention.scale and logit_scale
// (llama.cpp requires the last); its Q/K rows are permuted as arch llama's are.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "granite");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto embed = r.number_or("embedding_multiplier", "embedding_scale", 1.0);
  auto residual = r.number_or("residual_multiplier", "residual_scale", 1.0);
  auto attention = r.number_or("attention_multiplier", "attention.scale", 0.0);
  auto logits = r.number_or("logits_scaling", "logit_scale", 1.0);
  if (auto e = first_error(embed, residual, attention, logits)) return unexpected(model_error{*e});
  for (auto [v, hf, gguf] : {std::tuple{*embed, "embedding_multiplier", "embedding_scale"}, {*residual, "residual_multiplier", "residual_scale"},
                             {*logits, "logits_scaling", "logit_scale"}})
    if (!(std::isfinite(v) && v > 0)) return unexpected(model_error{r.error(r.key(hf, gguf), "must be a positive number")});
  if (!(std::isfinite(*attention) && *attention >= 0))
    return unexpected(model_error{r.error(r.key("attention_multiplier", "attention.scale"), "must be a non-negative number")});
  auto spec = uniform_spec("granite", *basics, r);
  spec.stack.embed_scale = *embed;
  spec.stack.residual_scale = *residual;
  spec.stack.logit_scale = *logits;
  if (*attention > 0)
    for (auto& a : spec.attention) a.scale = *attention;  // 0 (unset): llama.cpp's 1/sqrt(head_dim)
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_rope_interleaved = r.gguf();
  return make_dense_decoder(std::move(spec), store, decoder_name_table(names));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "granite"}, {load::config_source::gguf, "granite"}};

}  // namespace

const family_entry granite_entry{"granite", keys, build};

}  // namespace troupe::families

// Gemma 2: sandwich norms (a norm after attention and after the feed-forward as well as before),
// norms that scale by 1 + w (stored as w - 1 in HF checkpoints, as w + 1 by llama.cpp's converter),
// embeddings scaled by sqrt(hidden), GeGLU (tanh GELU) feed-forwards, soft-capped attention logits and
// final logits, and a sliding window on every even layer. The query scale is 1/sqrt(query_pre_attn_scalar);
// GGUF omits that value and llama.cpp derives it (hidden / heads for the 46-layer 27B, head_dim otherwise),
// as this family does.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "gemma2");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  const auto& d = *basics;
  auto window = r.positive_or("sliding_window", "attention.sliding_window", 4096);
  auto attn_cap = r.number_or("attn_logit_softcapping", "attn_logit_softcapping", 50.0);
  auto final_cap = r.number_or("final_logit_softcapping", "final_logit_softcapping", 30.0);
  const std::int64_t derived = d.layers == 46 ? d.hidden / d.heads : d.head_dim;
  auto scalar = r.number_or("query_pre_attn_scalar", "", static_cast<double>(derived));
  if (auto e = first_error(window, attn_cap, final_cap, scalar)) return unexpected(model_error{*e});
  if (!(*scalar > 0)) return unexpected(model_error{r.error("query_pre_attn_scalar", "must be positive")});

  auto spec = uniform_spec("gemma2", d, r);
  spec.stack.embed_scale = std::sqrt(static_cast<double>(d.hidden));
  spec.stack.final_softcap = *final_cap;
  spec.stack.sandwich_norms = true;
  spec.ffn.act = activation::gelu_tanh;
  for (std::size_t l = 0; l < spec.attention.size(); ++l) {
    auto& a = spec.attention[l];
    a.scale = 1.0 / std::sqrt(*scalar);
    a.softcap = *attn_cap;
    a.sliding_window = l % 2 == 0 ? *window : 0;
  }
  name_table_options names;
  names.gguf = r.gguf();
  names.sandwich_norms = true;
  names.norms_minus_one = !r.gguf();
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "gemma2"}, {load::config_source::gguf, "gemma2"}};

}  // namespace

const family_entry gemma2_entry{"gemma2", keys, build};

}  // namespace troupe::families

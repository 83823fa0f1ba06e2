// Gemma 3 (text): Gemma 2's sandwich norms, 1 + w norms, scaled embeddings and GeGLU, plus RMSNorm
// over each head of Q and K, and five sliding-window layers for every global one. Local layers use
// their own rotary base (rope_local_base_freq, 10000, which llama.cpp fixes) without scaling; global
// layers use rope_theta and the configured scaling. Softcaps are off unless configured.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

// The text model of a Gemma 3 checkpoint: a text-only one (Gemma3ForCausalLM, a GGUF), or the
// language model of Gemma3ForConditionalGeneration (config.json's text_config; its tensors under
// language_model.model. or model.language_model.), whose vision tower families/vision reads.
result<std::unique_ptr<model>, model_error> build_text(const load::raw_config& cfg, const load::weight_store& store, std::string_view prefix,
                                                       std::string_view head) {
  const config_reader r(cfg, "gemma3");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  const auto& d = *basics;
  auto window = r.positive_or("sliding_window", "attention.sliding_window", 4096);
  auto pattern = r.positive_or("sliding_window_pattern", "", 6);
  auto local_base = r.number_or("rope_local_base_freq", "", 10000.0);
  auto attn_cap = r.number_or("attn_logit_softcapping", "", 0.0);
  auto final_cap = r.number_or("final_logit_softcapping", "final_logit_softcapping", 0.0);
  const std::int64_t derived = d.layers == 62 ? d.hidden / d.heads : d.head_dim;
  auto scalar = r.number_or("query_pre_attn_scalar", "", static_cast<double>(derived));
  if (auto e = first_error(window, pattern, local_base, attn_cap, final_cap, scalar)) return unexpected(model_error{*e});
  // Newer configs list each layer's kind; older ones give the pattern.
  std::vector<bool> sliding(static_cast<std::size_t>(d.layers));
  auto types = cfg.get_string_array("layer_types");
  if (!r.gguf() && types) {
    if (static_cast<std::int64_t>(types->size()) != d.layers)
      return unexpected(model_error{r.error("layer_types", "lists " + std::to_string(types->size()) + " layers, not " + std::to_string(d.layers))});
    for (std::size_t l = 0; l < types->size(); ++l) sliding[l] = (*types)[l] == "sliding_attention";
  } else {
    for (std::size_t l = 0; l < sliding.size(); ++l) sliding[l] = (static_cast<std::int64_t>(l) + 1) % *pattern != 0;
  }

  auto spec = uniform_spec("gemma3", d, r);
  spec.stack.embed_scale = std::sqrt(static_cast<double>(d.hidden));
  spec.stack.final_softcap = *final_cap;
  spec.stack.sandwich_norms = true;
  // Image rows: embeddings given per position, attending to each other both ways (llama.cpp's
  // non-causal image batches; transformers' bidirectional image mask).
  spec.stack.embeds_input = true;
  spec.stack.span_input = true;
  spec.ffn.act = activation::gelu_tanh;
  for (std::size_t l = 0; l < spec.attention.size(); ++l) {
    auto& a = spec.attention[l];
    a.scale = 1.0 / std::sqrt(*scalar);
    a.softcap = *attn_cap;
    a.qk_norm = true;
    if (sliding[l]) {
      a.sliding_window = *window;
      a.rope.theta = *local_base;
      a.rope.kind = rope_kind::none;
      a.rope.factor = 1.0;
    }
  }
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_norm = true;
  names.sandwich_norms = true;
  names.norms_minus_one = !r.gguf();
  auto table = decoder_name_table(names);
  if (!prefix.empty())
    for (auto& rule : table) {
      if (rule.key.starts_with("model.")) rule.key = std::string(prefix) + rule.key.substr(6);
      else if (rule.key == "lm_head.weight") rule.key = std::string(head);
    }
  return make_dense_decoder(std::move(spec), store, table);
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  if (auto text = cfg.section("text_config")) {
    const bool nested = store.find("model.language_model.embed_tokens.weight").has_value();
    return build_text(*text, store, nested ? "model.language_model." : "language_model.model.",
                      nested ? "lm_head.weight" : "language_model.lm_head.weight");
  }
  return build_text(cfg, store, "", "");
}

constexpr family_key keys[] = {
    {load::config_source::hf_json, "gemma3_text"}, {load::config_source::hf_json, "gemma3"}, {load::config_source::gguf, "gemma3"}};

}  // namespace

const family_entry gemma3_entry{"gemma3", keys, build};

}  // namespace troupe::families

#include "families/components/decoder_config.hpp"

#include <cmath>
#include <cstring>

namespace troupe::families {

namespace {

// LongRoPE's divisors: dims / 2 finite positive values (HF's long_factor / short_factor lists, or
// llama.cpp's rope_factors_long / rope_factors_short f32 tensors).
result<void, config_error> check_rope_factors(const config_reader& r, const std::string& field, const std::vector<double>& f, std::int64_t dims) {
  if (static_cast<std::int64_t>(f.size()) != dims / 2)
    return unexpected(r.error(field, std::to_string(f.size()) + " values for a rotary width of " + std::to_string(dims) + " (one per pair)"));
  for (const double v : f)
    if (!(std::isfinite(v) && v > 0)) return unexpected(r.error(field, "every divisor must be finite and positive"));
  return {};
}

result<std::vector<double>, config_error> gguf_rope_factors(const config_reader& r, const load::weight_store& store, const char* name, std::int64_t dims) {
  const auto t = store.find(name);
  if (!t) return unexpected(r.error(name, "missing: llama.cpp's LongRoPE stores rope_factors_long and rope_factors_short together"));
  if (t->type() != dtype::f32 || t->shape().rank() != 1)
    return unexpected(r.error(name, "expected an f32 vector, found " + std::string(troupe::name(t->type())) + " " + t->shape().str()));
  if (t->numel() != dims / 2)
    return unexpected(r.error(name, std::to_string(t->numel()) + " values for a rotary width of " + std::to_string(dims) + " (one per pair)"));
  std::vector<double> out(static_cast<std::size_t>(t->numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    float v;
    std::memcpy(&v, t->data() + 4 * i, 4);
    out[i] = v;
  }
  if (auto ok = check_rope_factors(r, name, out, dims); !ok) return unexpected(ok.error());
  return out;
}

result<void, config_error> read_rope_scaling(const config_reader& r, decoder_basics& d, const load::weight_store& store) {
  rope_config& rope = d.rope;
  if (r.gguf()) {
    // LongRoPE (llama.cpp's phi3 converter): no rope.scaling.type, but the two factor tensors, the
    // trained context as original_context_length and the cos/sin factor as rope.scaling.attn_factor
    // (absent: 1, as llama.cpp reads it).
    if (store.find("rope_factors_long.weight") || store.find("rope_factors_short.weight")) {
      auto lf = gguf_rope_factors(r, store, "rope_factors_long.weight", rope.dims);
      if (!lf) return unexpected(lf.error());
      auto sf = gguf_rope_factors(r, store, "rope_factors_short.weight", rope.dims);
      if (!sf) return unexpected(sf.error());
      auto orig = r.positive_or("", "rope.scaling.original_context_length", d.max_positions);
      if (!orig) return unexpected(orig.error());
      auto attn = r.number_or("", "rope.scaling.attn_factor", 1.0);
      if (!attn) return unexpected(attn.error());
      if (!(*attn > 0)) return unexpected(r.error(r.key("", "rope.scaling.attn_factor"), "must be positive"));
      rope.kind = rope_kind::longrope;
      rope.long_factor = std::move(*lf);
      rope.short_factor = std::move(*sf);
      rope.original_max_positions = *orig;
      rope.factor = static_cast<double>(d.max_positions) / static_cast<double>(*orig);
      rope.attention_factor = *attn;
      return {};
    }
    const auto type = r.text("", "rope.scaling.type").value_or("none");
    auto factor = r.number_or("", "rope.scaling.factor", 1.0);
    if (!factor) return unexpected(factor.error());
    auto orig = r.positive_or("", "rope.scaling.original_context_length", d.max_positions);
    if (!orig) return unexpected(orig.error());
    rope.factor = *factor;
    rope.original_max_positions = *orig;
    if (type == "none" || *factor == 1.0) rope.kind = rope_kind::none;
    else if (type == "linear") rope.kind = rope_kind::linear;
    else if (type == "yarn") rope.kind = rope_kind::yarn;
    else return unexpected(r.error(r.key("", "rope.scaling.type"), "unsupported rope scaling '" + type + "'"));
    return {};
  }
  if (!r.raw().has("rope_scaling")) return {};
  auto type = r.text("rope_scaling.rope_type", "");
  if (!type) type = r.text("rope_scaling.type", "");
  const std::string t = type.value_or("default");
  auto num = [&](const char* k, double fallback) { return r.number_or(std::string("rope_scaling.") + k, "", fallback); };
  auto factor = num("factor", 1.0);
  if (!factor) return unexpected(factor.error());
  rope.factor = *factor;
  auto orig = r.positive_or("rope_scaling.original_max_position_embeddings", "", d.max_positions);
  if (!orig) return unexpected(orig.error());
  rope.original_max_positions = *orig;
  if (t == "default") {
    rope.kind = rope_kind::none;
  } else if (t == "linear") {
    rope.kind = rope_kind::linear;
  } else if (t == "dynamic") {
    rope.kind = rope_kind::dynamic;
  } else if (t == "yarn") {
    rope.kind = rope_kind::yarn;
    for (auto [key, field] : {std::pair{"beta_fast", &rope.beta_fast}, {"beta_slow", &rope.beta_slow}, {"attention_factor", &rope.attention_factor}}) {
      auto v = num(key, *field);
      if (!v) return unexpected(v.error());
      *field = *v;
    }
  } else if (t == "llama3") {
    rope.kind = rope_kind::llama3;
    auto lo = num("low_freq_factor", 1.0), hi = num("high_freq_factor", 4.0);
    if (!lo) return unexpected(lo.error());
    if (!hi) return unexpected(hi.error());
    if (*hi <= *lo) return unexpected(r.error("rope_scaling.high_freq_factor", "must exceed low_freq_factor"));
    rope.low_freq_factor = *lo;
    rope.high_freq_factor = *hi;
  } else if (t == "longrope" || t == "su") {
    // transformers' _compute_longrope_parameters: a trained context given beside max_position_embeddings
    // (Phi-3 keeps original_max_position_embeddings at the top level) makes the factor their ratio;
    // without one, the trained context is max_position_embeddings and the factor rope_scaling's.
    rope.kind = rope_kind::longrope;
    for (auto [key, field] : {std::pair{"long_factor", &rope.long_factor}, {"short_factor", &rope.short_factor}}) {
      const std::string k = std::string("rope_scaling.") + key;
      if (!r.raw().has(k)) return unexpected(r.error(k, "missing: LongRoPE needs long_factor and short_factor"));
      auto v = r.raw().get_float_array(k);
      if (!v) return unexpected(r.error(k, "expected a list of numbers"));
      if (auto ok = check_rope_factors(r, k, *v, rope.dims); !ok) return unexpected(ok.error());
      *field = std::move(*v);
    }
    const bool top = r.raw().has("original_max_position_embeddings"), inner = r.raw().has("rope_scaling.original_max_position_embeddings");
    if (top || inner) {
      auto o = top ? r.positive_or("original_max_position_embeddings", "", d.max_positions) : orig;
      if (!o) return unexpected(o.error());
      rope.original_max_positions = *o;
      rope.factor = static_cast<double>(d.max_positions) / static_cast<double>(*o);
    } else {
      rope.original_max_positions = d.max_positions;
    }
    auto attn = num("attention_factor", 0.0);
    if (!attn) return unexpected(attn.error());
    if (*attn < 0) return unexpected(r.error("rope_scaling.attention_factor", "must be positive"));
    rope.attention_factor = *attn;
  } else {
    return unexpected(r.error("rope_scaling.rope_type", "unsupported rope scaling '" + t + "'"));
  }
  if (rope.kind != rope_kind::none && !(rope.factor > 0)) return unexpected(r.error("rope_scaling.factor", "must be positive"));
  return {};
}

}  // namespace

result<decoder_basics, config_error> read_decoder_basics(const config_reader& r, const load::weight_store& store) {
  decoder_basics d;
#define TROUPE_READ(dst, expr)                  \
  do {                                          \
    auto v_ = (expr);                           \
    if (!v_) return unexpected(v_.error());     \
    dst = *v_;                                  \
  } while (0)
  TROUPE_READ(d.hidden, r.positive("hidden_size", "embedding_length"));
  TROUPE_READ(d.ffn, r.positive("intermediate_size", "feed_forward_length"));
  TROUPE_READ(d.layers, r.positive("num_hidden_layers", "block_count"));
  TROUPE_READ(d.heads, r.positive("num_attention_heads", "attention.head_count"));
  TROUPE_READ(d.kv_heads, r.positive_or("num_key_value_heads", "attention.head_count_kv", d.heads));
  TROUPE_READ(d.head_dim, r.positive_or("head_dim", "attention.key_length", d.hidden / d.heads));
  TROUPE_READ(d.max_positions, r.positive_or("max_position_embeddings", "context_length", 4096));
  TROUPE_READ(d.norm_eps, r.number_or("rms_norm_eps", "attention.layer_norm_rms_epsilon", 1e-6));
  TROUPE_READ(d.rope.theta, r.number_or("rope_theta", "rope.freq_base", 10000.0));
  if (r.gguf()) {
    // GGUF keeps the vocabulary size in the embedding's shape (vocab_size is optional).
    const auto embd = store.find("token_embd.weight");
    if (!embd || embd->shape().rank() != 2) return unexpected(r.error("token_embd.weight", "missing: it gives the vocabulary size"));
    d.vocab = embd->shape()[0];
    d.tied = !store.find("output.weight");
    TROUPE_READ(d.rope.dims, r.positive_or("", "rope.dimension_count", d.head_dim));
  } else {
    TROUPE_READ(d.vocab, r.positive("vocab_size", ""));
    TROUPE_READ(d.tied, r.flag_or("tie_word_embeddings", "", false));
    double partial = 1.0;
    TROUPE_READ(partial, r.number_or("partial_rotary_factor", "", 1.0));
    if (!(partial > 0 && partial <= 1)) return unexpected(r.error("partial_rotary_factor", "must be in (0, 1]"));
    d.rope.dims = static_cast<std::int64_t>(static_cast<double>(d.head_dim) * partial);
  }
#undef TROUPE_READ
  // Sizes are checked against what the checkpoint can hold before anything is sized from them: every
  // layer has its own tensors, and no dimension is past what an int32 index (and the graph's shapes)
  // can carry (block_count 2^31 would otherwise reach an allocation first).
  constexpr std::int64_t max_dim = std::int64_t{1} << 24, max_heads = 1 << 16;
  if (d.layers > static_cast<std::int64_t>(store.size()) || d.layers > max_dim)
    return unexpected(r.error(r.key("num_hidden_layers", "block_count"), std::to_string(d.layers) + " layers, but the checkpoint holds " +
                                                                            std::to_string(store.size()) + " tensors"));
  for (const auto& [value, hf, gguf, bound] :
       {std::tuple{d.hidden, "hidden_size", "embedding_length", max_dim}, std::tuple{d.ffn, "intermediate_size", "feed_forward_length", max_dim},
        std::tuple{d.heads, "num_attention_heads", "attention.head_count", std::int64_t{max_heads}},
        std::tuple{d.kv_heads, "num_key_value_heads", "attention.head_count_kv", std::int64_t{max_heads}},
        std::tuple{d.head_dim, "head_dim", "attention.key_length", std::int64_t{max_heads}}, std::tuple{d.vocab, "vocab_size", "", max_dim}})
    if (value > bound) return unexpected(r.error(r.key(hf, gguf), std::to_string(value) + " is past the bound of " + std::to_string(bound)));
  if (d.heads % d.kv_heads != 0)
    return unexpected(r.error(r.key("num_key_value_heads", "attention.head_count_kv"),
                              std::to_string(d.heads) + " attention heads are not a multiple of " + std::to_string(d.kv_heads) + " KV heads"));
  if (d.rope.dims % 2 != 0 || d.rope.dims > d.head_dim)
    return unexpected(r.error(r.key("partial_rotary_factor", "rope.dimension_count"), "the rotary width must be even and at most head_dim"));
  if (!(d.norm_eps >= 0)) return unexpected(r.error(r.key("rms_norm_eps", "attention.layer_norm_rms_epsilon"), "must be non-negative"));
  if (!(d.rope.theta > 0)) return unexpected(r.error(r.key("rope_theta", "rope.freq_base"), "must be positive"));
  if (auto s = read_rope_scaling(r, d, store); !s) return unexpected(s.error());
  return d;
}

result<hybrid_layers, config_error> hybrid_layers_from_kv(const config_reader& r, std::span<const std::int64_t> kv, std::int64_t layers,
                                                          dense_decoder_spec::layer_kind kind) {
  const auto key = r.key("", "attention.head_count_kv");
  if (static_cast<std::int64_t>(kv.size()) != layers) return unexpected(r.error(key, "must hold one value per layer"));
  hybrid_layers h{std::vector<dense_decoder_spec::layer_kind>(kv.size(), dense_decoder_spec::layer_kind::attention_ffn), 0};
  for (std::size_t l = 0; l < kv.size(); ++l) {
    if (kv[l] < 0) return unexpected(r.error(key, "negative"));
    if (kv[l] == 0) h.kinds[l] = kind;
    else if (h.kv_heads != 0 && h.kv_heads != kv[l]) return unexpected(r.error(key, "attention layers must share their KV heads"));
    else h.kv_heads = kv[l];
  }
  return h;
}

result<hybrid_layers, config_error> hybrid_layers_from_types(const config_reader& r, std::int64_t layers, dense_decoder_spec::layer_kind kind,
                                                             const std::string& recurrent, const std::string& attention) {
  const auto types = r.raw().get_string_array("layer_types");
  if (!types || static_cast<std::int64_t>(types->size()) != layers)
    return unexpected(r.error("layer_types", "must name each of the " + std::to_string(layers) + " layers (" + recurrent + " or " + attention + ")"));
  hybrid_layers h{std::vector<dense_decoder_spec::layer_kind>(types->size(), dense_decoder_spec::layer_kind::attention_ffn), 0};
  for (std::size_t l = 0; l < types->size(); ++l) {
    const auto& t = (*types)[l];
    if (t != recurrent && t != attention) return unexpected(r.error("layer_types", "unknown layer type '" + t + "'"));
    if (t == recurrent) h.kinds[l] = kind;
  }
  return h;
}

dense_decoder_spec uniform_spec(const std::string& family, const decoder_basics& d, const config_reader& r) {
  dense_decoder_spec s;
  s.config.family = family;
  s.config.vocab = d.vocab;
  s.config.hidden = d.hidden;
  s.config.layers = d.layers;
  s.config.max_positions = d.max_positions;
  s.config.bos_id = r.bos_id();
  s.config.eos_ids = r.eos_ids();
  s.config.kv_elems_per_token_per_layer = 2 * d.kv_heads * d.head_dim;
  s.stack.vocab = d.vocab;
  s.stack.hidden = d.hidden;
  s.stack.layers = d.layers;
  s.stack.norm_eps = d.norm_eps;
  attention_params a;
  a.heads = d.heads;
  a.kv_heads = d.kv_heads;
  a.head_dim = d.head_dim;
  a.scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  a.rope = d.rope;
  a.norm_eps = d.norm_eps;
  s.attention.assign(static_cast<std::size_t>(d.layers), a);
  s.ffn.width = d.ffn;
  return s;
}

}  // namespace troupe::families

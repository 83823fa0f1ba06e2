#include "families/components/dense_decoder.hpp"

namespace troupe::families {

dense_decoder::dense_decoder(dense_decoder_spec spec, families::weight_map weights)
    : spec_(std::move(spec)), weights_(std::move(weights)) {
  std::vector<state_decl> kv;
  for (std::int64_t l = 0; l < spec_.stack.layers; ++l) {
    const auto& a = spec_.attention[l];
    kv.push_back({"kv.k." + std::to_string(l), dtype::f32, {a.kv_heads, a.head_dim}});
    kv.push_back({"kv.v." + std::to_string(l), dtype::f32, {a.kv_heads, a.head_dim}});
  }
  schema_.add_program(program::step, std::move(kv));
  schema_.add_program(program::encode, {});
}

void dense_decoder::trace_into(const step_spec& spec, graph::builder& b) const {
  trace_context ctx(b, weights_, spec);
  decoder_trace t(ctx);
  t.standard_stack(
      spec_.stack, [this](decoder_trace& d, graph::value_id x, std::int32_t l) { return d.attention(x, l, spec_.attention[l]); },
      [this](decoder_trace& d, graph::value_id x, std::int32_t l) { return d.feed_forward(x, l, spec_.ffn); });
}

expected_shape_fn dense_decoder_shapes(const dense_decoder_spec& s) {
  return [s](const std::string& role, std::int32_t layer) -> std::optional<troupe::shape> {
    const std::int64_t H = s.stack.hidden, V = s.stack.vocab;
    if (role == "token_embd" || role == "output") return troupe::shape{V, H};
    if (role == "output_norm") return troupe::shape{H};
    if (role == "rope_freqs") return troupe::shape{s.attention.empty() ? 0 : s.attention[0].rope.dims / 2};
    if (layer < 0 || layer >= static_cast<std::int32_t>(s.attention.size())) return std::nullopt;
    const auto& a = s.attention[layer];
    const std::int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
    if (role == "attn_norm" || role == "ffn_norm" || role == "post_attention_norm" || role == "post_ffw_norm") return troupe::shape{H};
    if (role == "attn_q") return troupe::shape{q, H};
    if (role == "attn_k" || role == "attn_v") return troupe::shape{kv, H};
    if (role == "attn_qkv") return troupe::shape{q + 2 * kv, H};
    if (role == "attn_q_bias") return troupe::shape{q};
    if (role == "attn_k_bias" || role == "attn_v_bias") return troupe::shape{kv};
    if (role == "attn_qkv_bias") return troupe::shape{q + 2 * kv};
    if (role == "attn_output") return troupe::shape{H, q};
    if (role == "attn_output_bias") return troupe::shape{H};
    if (role == "attn_q_norm" || role == "attn_k_norm") return troupe::shape{a.head_dim};
    return std::nullopt;  // feed-forward roles: checked by the family (their width is its config)
  };
}

result<std::unique_ptr<model>, model_error> make_dense_decoder(dense_decoder_spec spec, const load::weight_store& store,
                                                               std::span<const name_rule> rules) {
  const auto base = dense_decoder_shapes(spec);
  const std::int64_t H = spec.stack.hidden;
  const std::int64_t F = spec.ffn.width;
  auto shapes = [&](const std::string& role, std::int32_t layer) -> std::optional<troupe::shape> {
    if (role == "ffn_gate" || role == "ffn_up") return troupe::shape{F, H};
    if (role == "ffn_gate_up") return troupe::shape{2 * F, H};
    if (role == "ffn_down") return troupe::shape{H, F};
    if (role == "ffn_gate_bias" || role == "ffn_up_bias") return troupe::shape{F};
    if (role == "ffn_down_bias") return troupe::shape{H};
    return base(role, layer);
  };
  auto map = weight_map::build(store, rules, static_cast<std::int32_t>(spec.stack.layers), shapes);
  if (!map) return unexpected(model_error{map.error()});
  return std::unique_ptr<model>(new dense_decoder(std::move(spec), std::move(*map)));
}

}  // namespace troupe::families

#include "families/components/encoder.hpp"

namespace troupe::families {

encoder_model::encoder_model(encoder_spec spec, families::weight_map weights) : spec_(std::move(spec)), weights_(std::move(weights)) {
  schema_.add_program(program::encode, {});
}

void encoder_model::trace_into(const step_spec& spec, graph::builder& b) const {
  if (spec.program != program::encode) {
    b.fail(graph::bad_declaration{spec_.config.family + " is an encoder: it offers the encode program only"});
    return;
  }
  trace_context ctx(b, weights_, spec);
  decoder_trace t(ctx);
  const double eps = spec_.norm_eps;
  auto norm = [&](graph::value_id x, const std::string& role, std::int32_t layer) {
    return b.layer_norm(x, ctx.vector_f32(role, layer), ctx.vector_f32(role + "_bias", layer), eps);
  };
  auto x = b.gather_rows(ctx.weight("token_embd"), ctx.token_ids());
  if (ctx.has("token_types")) {
    // Every token is of segment 0 (one text per input), as llama.cpp and sentence-transformers embed.
    tensor zero(dtype::i32, {1});
    zero.as<std::int32_t>()[0] = 0;
    x = b.add(x, b.gather_rows(ctx.weight("token_types"), b.literal(std::move(zero), "segment0")));
  }
  if (spec_.absolute_positions) x = b.add(x, b.gather_rows(ctx.weight("position_embd"), ctx.positions()));
  x = norm(x, "token_embd_norm", -1);
  b.label(x, "embed");
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec_.layers) && b.ok(); ++l) {
    b.push_scope("layers." + std::to_string(l));
    const auto a = t.attention(x, l, spec_.attention);
    x = norm(b.add(x, a), "attn_output_norm", l);
    const auto f = t.feed_forward(x, l, spec_.ffn);
    x = norm(b.add(x, f), "layer_output_norm", l);
    b.label(x, "out");
    b.pop_scope();
  }
  b.output("hidden", x);
}

result<std::unique_ptr<model>, model_error> make_encoder(encoder_spec spec, const load::weight_store& store, std::span<const name_rule> rules) {
  const std::int64_t H = spec.hidden, F = spec.ffn.width, V = spec.config.vocab;
  const auto& a = spec.attention;
  const std::int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  auto shapes = [&](const std::string& role, std::int32_t layer) -> std::optional<troupe::shape> {
    if (role == "token_embd") return troupe::shape{V, H};
    if (role == "position_embd") return troupe::shape{spec.max_positions, H};
    if (role == "token_types") return std::nullopt;  // [types, H]: any count of segments
    if (role.ends_with("norm") || role.ends_with("norm_bias")) return troupe::shape{H};
    if (layer < 0) return std::nullopt;
    if (role == "attn_q") return troupe::shape{q, H};
    if (role == "attn_k" || role == "attn_v") return troupe::shape{kv, H};
    if (role == "attn_qkv") return troupe::shape{q + 2 * kv, H};
    if (role == "attn_q_bias") return troupe::shape{q};
    if (role == "attn_k_bias" || role == "attn_v_bias") return troupe::shape{kv};
    if (role == "attn_qkv_bias") return troupe::shape{q + 2 * kv};
    if (role == "attn_output") return troupe::shape{H, q};
    if (role == "attn_output_bias" || role == "ffn_down_bias") return troupe::shape{H};
    if (role == "ffn_up" || role == "ffn_gate") return troupe::shape{F, H};
    if (role == "ffn_up_bias" || role == "ffn_gate_bias") return troupe::shape{F};
    if (role == "ffn_down") return troupe::shape{H, F};
    return std::nullopt;
  };
  auto refuse = [](weight_error_code code, const std::string& role, std::int32_t layer, std::string key, std::string want, std::string got) {
    weight_error e{code, {}, std::move(key), std::move(want), std::move(got)};
    e.role.name = role;
    e.role.layer = layer;
    return unexpected(model_error{std::move(e)});
  };
  auto map = weight_map::build(store, rules, static_cast<std::int32_t>(spec.layers), shapes);
  if (!map) return unexpected(model_error{map.error()});
  if (const auto* types = map->find({"token_types", -1}); types && (types->view.shape().rank() != 2 || types->view.shape()[1] != H))
    return refuse(weight_error_code::shape_mismatch, "token_types", -1, types->key, "[types, " + std::to_string(H) + "]", types->view.shape().str());
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec.layers); ++l) {
    if (!map->has({"attn_qkv", l}) && !map->has({"attn_q", l}))
      return refuse(weight_error_code::missing, "attn_q", l, "(or attn_qkv)", troupe::shape{q, H}.str(), "");
    if (spec.ffn.gated && !map->has({"ffn_gate", l}))
      return refuse(weight_error_code::missing, "ffn_gate", l, "(a gated feed-forward)", troupe::shape{F, H}.str(), "");
  }
  return std::unique_ptr<model>(new encoder_model(std::move(spec), std::move(*map)));
}

}  // namespace troupe::families

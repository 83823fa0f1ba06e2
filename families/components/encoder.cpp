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
  auto norm = [&](graph::value_id x, role r, std::int32_t layer) {
    return b.layer_norm(x, ctx.vector_f32(r, layer), ctx.vector_f32(bias_of(r), layer), eps);
  };
  auto x = b.gather_rows(ctx.weight(role::token_embd), ctx.token_ids());
  if (ctx.has(role::token_types)) {
    // Every token is of segment 0 (one text per input), as llama.cpp and sentence-transformers embed.
    tensor zero(dtype::i32, {1});
    zero.as<std::int32_t>()[0] = 0;
    x = b.add(x, b.gather_rows(ctx.weight(role::token_types), b.literal(std::move(zero), "segment0")));
  }
  if (spec_.absolute_positions) x = b.add(x, b.gather_rows(ctx.weight(role::position_embd), ctx.positions()));
  x = norm(x, role::token_embd_norm, -1);
  b.label(x, "embed");
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec_.layers) && b.ok(); ++l) {
    b.push_scope("layers." + std::to_string(l));
    const auto a = t.attention(x, l, spec_.attention);
    x = norm(b.add(x, a), role::attn_output_norm, l);
    const auto f = t.feed_forward(x, l, spec_.ffn);
    x = norm(b.add(x, f), role::layer_output_norm, l);
    b.label(x, "out");
    b.pop_scope();
  }
  b.output("hidden", x);
}

result<std::unique_ptr<model>, model_error> make_encoder(encoder_spec spec, const load::weight_store& store, std::span<const name_rule> rules) {
  const std::int64_t H = spec.hidden, F = spec.ffn.width, V = spec.config.vocab;
  const auto& a = spec.attention;
  const std::int64_t q = a.heads * a.head_dim;
  auto shapes = [&](role r, std::int32_t layer) -> std::optional<troupe::shape> {
    if (r == role::token_embd) return troupe::shape{V, H};
    if (r == role::position_embd) return troupe::shape{spec.max_positions, H};
    if (r == role::token_types) return std::nullopt;  // [types, H]: any count of segments
    if (role_name(r).ends_with("norm") || role_name(r).ends_with("norm_bias")) return troupe::shape{H};
    if (layer < 0) return std::nullopt;
    if (auto s = attention_shape(r, a, H)) return s;
    return ffn_shape(r, F, H);
  };
  auto refuse = [](weight_error_code code, role r, std::int32_t layer, std::string key, std::string want, std::string got) {
    weight_error e{code, {}, std::move(key), std::move(want), std::move(got)};
    e.role.kind = r;
    e.role.layer = layer;
    return unexpected(model_error{std::move(e)});
  };
  auto map = weight_map::build(store, rules, static_cast<std::int32_t>(spec.layers), shapes);
  if (!map) return unexpected(model_error{map.error()});
  if (const auto* types = map->find({role::token_types, -1}); types && (types->view.shape().rank() != 2 || types->view.shape()[1] != H))
    return refuse(weight_error_code::shape_mismatch, role::token_types, -1, types->key, "[types, " + std::to_string(H) + "]", types->view.shape().str());
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec.layers); ++l) {
    if (!map->has({role::attn_qkv, l}) && !map->has({role::attn_q, l}))
      return refuse(weight_error_code::missing, role::attn_q, l, "(or attn_qkv)", troupe::shape{q, H}.str(), "");
    if (spec.ffn.gated && !map->has({role::ffn_gate, l}))
      return refuse(weight_error_code::missing, role::ffn_gate, l, "(a gated feed-forward)", troupe::shape{F, H}.str(), "");
  }
  return std::unique_ptr<model>(new encoder_model(std::move(spec), std::move(*map)));
}

}  // namespace troupe::families

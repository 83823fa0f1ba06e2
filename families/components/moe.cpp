#include "families/components/moe.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace troupe::families {

using graph::op;
using graph::value_id;

result<std::vector<moe_params>, config_error> read_moe(const config_reader& r, const moe_keys& k, std::int64_t layers,
                                                       std::int64_t dense_ffn) {
  moe_params p;
  auto experts = r.positive(k.experts_hf, "expert_count");
  if (!experts) return unexpected(experts.error());
  auto used = r.positive(k.used_hf, "expert_used_count");
  if (!used) return unexpected(used.error());
  p.experts = *experts;
  p.used = *used;
  constexpr std::int64_t max_experts = 1 << 12;
  if (p.experts > max_experts)
    return unexpected(r.error(r.key(k.experts_hf, "expert_count"), std::to_string(p.experts) + " experts is past the bound of " +
                                                                      std::to_string(max_experts)));
  if (p.used > p.experts)
    return unexpected(r.error(r.key(k.used_hf, "expert_used_count"), std::to_string(p.used) + " experts per token of " +
                                                                        std::to_string(p.experts)));
  if (*k.width_hf) {
    auto w = r.positive_or(k.width_hf, "expert_feed_forward_length", dense_ffn);
    if (!w) return unexpected(w.error());
    p.width = *w;
  } else {
    p.width = dense_ffn;
  }
  if (p.width > (std::int64_t{1} << 24)) return unexpected(r.error(r.key(k.width_hf, "expert_feed_forward_length"), "past the bound of 2^24"));
  if (*k.norm_hf && !r.gguf()) {
    auto n = r.flag_or(k.norm_hf, "", k.norm_default);
    if (!n) return unexpected(n.error());
    p.norm_topk = *n;
  } else {
    p.norm_topk = k.norm_default;  // GGUF: llama.cpp fixes it per architecture
  }
  auto scale = r.number_or("routed_scaling_factor", "expert_weights_scale", 1.0);
  if (!scale) return unexpected(scale.error());
  p.routed_scale = *scale == 0.0 ? 1.0 : *scale;  // llama.cpp: 0 means unscaled
  if (*k.shared_width_hf) {
    auto s = r.positive_or(k.shared_width_hf, "expert_shared_feed_forward_length", 0);
    if (!s) return unexpected(s.error());
    p.shared_width = *s;
    p.shared_gated = p.shared_width > 0;
  }
  std::int64_t step = 1;
  if (*k.sparse_step_hf && !r.gguf()) {
    auto s = r.positive_or(k.sparse_step_hf, "", 1);
    if (!s) return unexpected(s.error());
    step = *s;
  }
  std::set<std::int64_t> dense;
  if (*k.dense_layers_hf && !r.gguf() && r.raw().has(k.dense_layers_hf)) {
    auto d = r.raw().get_int_array(k.dense_layers_hf);
    if (!d) return unexpected(r.error(k.dense_layers_hf, "must be a list of layer numbers"));
    dense.insert(d->begin(), d->end());
  }
  std::vector<moe_params> out(static_cast<std::size_t>(layers), p);
  for (std::int64_t l = 0; l < layers; ++l)
    if (dense.contains(l) || (l + 1) % step != 0) out[static_cast<std::size_t>(l)] = moe_params{};
  return out;
}

namespace {

// The selection scores with every expert outside the best `groups_used` groups at -inf.
value_id limit_to_groups(graph::builder& b, value_id select, std::int64_t N, std::int64_t E, const moe_params& p) {
  const std::int64_t G = p.groups, per = E / G;
  const auto grouped = b.reshape(select, {N, G, per});
  const auto score = p.group_rule == moe_params::group_score::max
                         ? b.reduce(op::reduce_max, grouped, -1)
                         : b.reduce(op::reduce_sum, b.take_along(grouped, b.top_k(grouped, std::min<std::int64_t>(2, per))), -1);
  const auto best = b.top_k(score, p.groups_used);  // [N, gu]
  tensor iota(dtype::i32, {G});
  for (std::int64_t g = 0; g < G; ++g) iota.as<std::int32_t>()[g] = static_cast<std::int32_t>(g);
  const auto hit = b.cast(b.binary(op::equal, b.reshape(best, {N, p.groups_used, 1}), b.literal(std::move(iota), "moe.groups")), dtype::f32);
  const auto keep = b.binary(op::greater, b.reduce(op::reduce_max, hit, 1), b.scalar(0.0));  // [N, G]
  const auto masked = b.where(b.reshape(keep, {N, G, 1}), grouped, b.scalar(-INFINITY));
  return b.reshape(masked, {N, E});
}

}  // namespace

std::int64_t routed_experts(const std::vector<moe_params>& layers) {
  std::int64_t e = 0;
  for (const auto& m : layers) e = std::max(e, m.experts);
  return e;
}

value_id moe_feed_forward(decoder_trace& d, value_id x, std::int32_t layer, const moe_params& p) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const std::int64_t N = b.type_of(x).dims[0], E = p.experts, k = p.used;

  // The router: scores over the experts, the k best, their weights.
  auto logits = ctx.linear(x, role::ffn_gate_inp, layer);
  if (ctx.has(role::ffn_gate_inp_bias, layer)) logits = b.add(logits, ctx.vector_f32(role::ffn_gate_inp_bias, layer));
  const auto scores = p.gate == gating::softmax    ? b.softmax(logits, -1)
                      : p.gate == gating::sigmoid ? b.unary(op::sigmoid, logits)
                                                  : logits;
  auto select = scores;
  if (ctx.has(role::exp_probs_b, layer)) select = b.add(scores, ctx.vector_f32(role::exp_probs_b, layer));
  if (p.groups > 1) select = limit_to_groups(b, select, N, E, p);
  const auto ids = b.top_k(select, k);
  auto w = b.take_along(scores, ids);
  if (p.gate == gating::softmax_selected) w = b.softmax(w, -1);
  if (p.norm_topk) w = b.div(w, b.reduce(op::reduce_sum, w, -1, true));
  if (p.routed_scale != 1.0) w = b.mul(w, b.scalar(p.routed_scale));
  const std::string at = std::to_string(layer);
  b.witness("witness.router_ids." + at, ids, graph::witness_check::index_range, E);
  b.witness("witness.router_weights." + at, w, graph::witness_check::finite);

  // An expert-parallel shard computes the picks of its own experts; the others' rows are zero here and
  // come from their ranks through the all_reduce.
  auto mine = ids;
  value_id here;  // which picks are this rank's (expert parallel only)
  if (p.local_experts > 0 && p.local_experts < E) {
    const auto lo = b.scalar(static_cast<double>(p.expert_offset), dtype::i32);
    const auto hi = b.scalar(static_cast<double>(p.expert_offset + p.local_experts), dtype::i32);
    here = b.binary(op::minimum, b.binary(op::less_equal, lo, ids), b.binary(op::less, ids, hi));
    mine = b.where(here, b.sub(ids, lo), b.scalar(-1, dtype::i32));
  }
  // Each pick's row of an expert bias table [E, C] as [N, k, C] (zeros for another rank's expert).
  value_id gather_ids, keep;  // the bias rows' ids (others' picks read row 0) and the mask that zeros them
  auto expert_bias = [&](value_id prod, role r) {
    if (!ctx.has(r, layer)) return prod;
    const auto table = ctx.vector_f32(r, layer);
    if (!here.valid()) return b.add(prod, b.gather_rows(table, ids));
    if (!keep.valid()) {
      gather_ids = b.where(here, mine, b.scalar(0, dtype::i32));
      keep = b.reshape(b.cast(here, dtype::f32), {N, k, 1});
    }
    return b.add(prod, b.mul(b.gather_rows(table, gather_ids), keep));
  };
  // The selected experts only: [N, k, F] then [N, k, H], weighted and summed over the k picks.
  const auto up = expert_bias(b.linear_id(x, ctx.weight(role::ffn_up_exps, layer), mine), role::ffn_up_exps_bias);
  value_id h;
  if (ctx.has(role::ffn_gate_exps, layer)) {
    const auto g = expert_bias(b.linear_id(x, ctx.weight(role::ffn_gate_exps, layer), mine), role::ffn_gate_exps_bias);
    if (p.act == activation::swiglu_oai) {
      const auto limit = b.scalar(7.0);
      const auto gc = b.binary(op::minimum, g, limit);
      const auto uc = b.binary(op::maximum, b.binary(op::minimum, up, limit), b.scalar(-7.0));
      h = b.mul(b.mul(gc, b.unary(op::sigmoid, b.mul(gc, b.scalar(1.702)))), b.add(uc, b.scalar(1.0)));
    } else {
      h = b.mul(d.activate(g, p.act), up);
    }
  } else {
    h = d.activate(up, p.act);  // experts without a gate projection (Nemotron-H's squared ReLU)
  }
  const auto down = expert_bias(b.linear_id(h, ctx.weight(role::ffn_down_exps, layer), mine), role::ffn_down_exps_bias);
  const std::int64_t H = b.type_of(down).dims[2];
  auto out = b.reduce(op::reduce_sum, b.mul(down, b.reshape(w, {N, k, 1})), 1);
  b.label(out, "moe_out");

  if (p.shared_width > 0) {
    const auto su = ctx.linear(x, role::ffn_up_shexp, layer);
    auto sh = ctx.has(role::ffn_gate_shexp, layer) ? b.mul(d.activate(ctx.linear(x, role::ffn_gate_shexp, layer), p.act), su) : d.activate(su, p.act);
    sh = ctx.linear(sh, role::ffn_down_shexp, layer);
    if (p.shared_gated && ctx.has(role::ffn_gate_inp_shexp, layer)) {
      const auto g = b.linear(x, b.reshape(ctx.vector_f32(role::ffn_gate_inp_shexp, layer), {1, H}));  // [N, 1]
      sh = b.mul(sh, b.unary(op::sigmoid, g));
    }
    out = b.add(out, sh);
  }
  if (p.reduce_output) out = b.all_reduce(out);  // a tensor-parallel shard: every expert's partial sums
  b.label(out, "ffn_out");
  return out;
}

std::optional<troupe::shape> moe_shape(role r, const moe_params& p, std::int64_t H) {
  const std::int64_t E = p.experts, F = p.width, S = p.shared_width;
  if (E == 0) return std::nullopt;
  if (r == role::ffn_gate_inp) return troupe::shape{E, H};
  if (r == role::exp_probs_b || r == role::ffn_gate_inp_bias) return troupe::shape{E};
  if (r == role::ffn_gate_exps_bias || r == role::ffn_up_exps_bias) return troupe::shape{E, F};
  if (r == role::ffn_down_exps_bias) return troupe::shape{E, H};
  if (r == role::ffn_gate_exps || r == role::ffn_up_exps) return troupe::shape{E, F, H};
  if (r == role::ffn_down_exps) return troupe::shape{E, H, F};
  if (S > 0) {
    if (r == role::ffn_gate_shexp || r == role::ffn_up_shexp) return troupe::shape{S, H};
    if (r == role::ffn_down_shexp) return troupe::shape{H, S};
    // ffn_gate_inp_shexp: [H] in GGUF, [1, H] in HF; not checked here (the trace reads it as [1, H]).
  }
  return std::nullopt;
}

}  // namespace troupe::families

#include "families/components/gated_delta.hpp"

#include <cmath>

namespace troupe::families {

using graph::op;
using graph::value_id;

void add_gated_delta_states(std::vector<state_decl>& states, const gated_delta_params& p, std::int64_t layer) {
  const auto l = std::to_string(layer);
  states.push_back({"ssm.conv." + l, dtype::f32, {(p.conv - 1) * p.conv_channels()}, true});
  states.push_back({"ssm.state." + l, dtype::f32, {p.value_heads * p.value_dim * p.key_dim}, true});
}

namespace {

// A literal [n] of one value.
value_id filled(graph::builder& b, std::int64_t n, float v, const char* label) {
  tensor t(dtype::f32, {n});
  for (std::int64_t i = 0; i < n; ++i) t.as<float>()[i] = v;
  return b.literal(std::move(t), label);
}

// log(1 + e^x) as max(x, 0) + log(1 + e^-|x|): no overflow for large x.
value_id softplus(graph::builder& b, value_id x) {
  const auto tail = b.unary(op::log, b.add(b.scalar(1.0), b.unary(op::exp, b.unary(op::neg, b.unary(op::abs, x)))));
  return b.add(b.binary(op::maximum, x, b.scalar(0.0)), tail);
}

// x / sqrt(sum(x^2) + eps) over the last axis (width n), times `scale`: RMSNorm with eps / n, its
// weight scale / sqrt(n).
value_id l2_normed(graph::builder& b, value_id x, std::int64_t n, double eps, double scale) {
  const auto w = filled(b, n, static_cast<float>(scale / std::sqrt(static_cast<double>(n))), "l2_scale");
  return b.rms_norm(x, w, eps / static_cast<double>(n));
}

}  // namespace

value_id gated_delta_mixer(decoder_trace& d, value_id x, std::int32_t layer, const gated_delta_params& p) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const auto& s = ctx.shape();
  const std::int64_t R = s.rows(), T = s.tokens(), N = R * T, S = s.state_rows();
  const std::int64_t Hk = p.key_heads, Dk = p.key_dim, H = p.value_heads, Dv = p.value_dim, r = p.ratio();
  const std::int64_t kw = p.key_width(), vw = p.value_width(), C = p.conv_channels(), K = p.conv;
  const auto l = std::to_string(layer);

  value_id qkv, z;
  if (ctx.has(role::attn_qkv, layer)) {
    qkv = ctx.linear(x, role::attn_qkv, layer);
    z = ctx.linear(x, role::attn_gate, layer);
  } else {  // per key head [q | k | v | z]: gathered into [q... | k... | v...] and z
    const std::int64_t per = 2 * Dk + 2 * r * Dv;
    const auto m = b.reshape(ctx.linear(x, role::ssm_in, layer), {N, Hk, per});
    const auto q = b.reshape(b.slice(m, 2, 0, Dk), {N, kw});
    const auto k = b.reshape(b.slice(m, 2, Dk, 2 * Dk), {N, kw});
    const auto v = b.reshape(b.slice(m, 2, 2 * Dk, 2 * Dk + r * Dv), {N, vw});
    z = b.reshape(b.slice(m, 2, 2 * Dk + r * Dv, per), {N, vw});
    qkv = b.concat({q, k, v}, 1);
  }
  const auto ba = b.reshape(ctx.linear(x, role::ssm_ba, layer), {N, Hk, 2 * r});
  const auto beta = b.unary(op::sigmoid, b.reshape(b.slice(ba, 2, 0, r), {R, T, H}));
  const auto alpha = b.reshape(b.slice(ba, 2, r, 2 * r), {N, H});
  const auto A = ctx.has(role::ssm_a, layer) ? b.reshape(ctx.vector_f32(role::ssm_a, layer), {H})
                                              : b.unary(op::neg, b.unary(op::exp, b.reshape(ctx.vector_f32(role::ssm_a_log, layer), {H})));
  const auto g = b.reshape(b.mul(softplus(b, b.add(alpha, ctx.vector_f32(role::ssm_dt_bias, layer))), A), {R, T, H});

  // The convolution over the carried window; its new window goes back to the sequence's row.
  const auto rows = ctx.state_rows(), pos = ctx.positions(), write = ctx.write_map();
  const auto conv_in = b.state_input("ssm.conv." + l, {dtype::f32, {S, (K - 1) * C}});
  const auto w = b.reshape(ctx.vector_f32(role::ssm_conv1d, layer), {C, K});
  const auto conv = b.ssm_conv(b.reshape(qkv, {R, T, C}), conv_in, rows, pos, write, w);
  b.state_output("ssm.conv." + l, b.scatter_rows(conv_in, rows, b.slice(conv, 1, T * C, T * C + (K - 1) * C)));
  const auto xc = b.unary(op::silu, b.reshape(b.slice(conv, 1, 0, T * C), {N, C}));
  b.label(xc, "ssm_conv");

  // The gated delta rule over unit-norm q and k.
  const auto q = l2_normed(b, b.reshape(b.slice(xc, 1, 0, kw), {R, T, Hk, Dk}), Dk, p.norm_eps, 1.0 / std::sqrt(static_cast<double>(Dk)));
  const auto k = l2_normed(b, b.reshape(b.slice(xc, 1, kw, 2 * kw), {R, T, Hk, Dk}), Dk, p.norm_eps, 1.0);
  const auto v = b.reshape(b.slice(xc, 1, 2 * kw, C), {R, T, H, Dv});
  const auto state_in = b.state_input("ssm.state." + l, {dtype::f32, {S, H * Dv * Dk}});
  const auto rule = b.delta_rule(q, k, v, g, beta, state_in, rows, pos, write);
  b.state_output("ssm.state." + l, b.scatter_rows(state_in, rows, b.slice(rule, 1, T * H * Dv, T * H * Dv + H * Dv * Dk)));
  auto o = b.reshape(b.slice(rule, 1, 0, T * H * Dv), {N, H, Dv});
  b.label(o, "delta_rule");

  // RMSNorm per head, times silu(z), then the output projection.
  o = b.rms_norm(o, ctx.vector_f32(role::ssm_norm, layer), p.norm_eps);
  o = b.mul(o, b.unary(op::silu, b.reshape(z, {N, H, Dv})));
  const auto out = d.projection(b.reshape(o, {N, vw}), role::ssm_out, layer, p.reduce_output);
  b.label(out, "linear_attn_out");
  return out;
}

std::optional<troupe::shape> gated_delta_shape(role r, const gated_delta_params& p, std::int64_t H) {
  switch (r) {
    case role::ssm_in: return troupe::shape{2 * p.key_width() + 2 * p.value_width(), H};
    case role::attn_qkv: return troupe::shape{p.conv_channels(), H};
    case role::attn_gate: return troupe::shape{p.value_width(), H};
    case role::ssm_ba: return troupe::shape{2 * p.value_heads, H};
    case role::ssm_dt_bias:
    case role::ssm_a_log: return troupe::shape{p.value_heads};
    case role::ssm_norm: return troupe::shape{p.value_dim};
    case role::ssm_out: return troupe::shape{H, p.value_width()};
    default: return std::nullopt;
  }
}

std::optional<std::int64_t> gated_delta_numel(role r, const gated_delta_params& p) {
  switch (r) {
    case role::ssm_conv1d: return p.conv_channels() * p.conv;
    case role::ssm_a: return p.value_heads;
    default: return std::nullopt;
  }
}

}  // namespace troupe::families

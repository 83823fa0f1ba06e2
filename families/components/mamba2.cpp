#include "families/components/mamba2.hpp"

namespace troupe::families {

using graph::op;
using graph::value_id;

void add_mamba2_names(std::vector<name_rule>& t, bool gguf, const std::string& hf_prefix, presence p) {
  for (auto [r, g, h] : {std::tuple{role::ssm_in, "ssm_in.weight", "in_proj.weight"}, {role::ssm_conv1d, "ssm_conv1d.weight", "conv1d.weight"},
                         {role::ssm_conv1d_bias, "ssm_conv1d.bias", "conv1d.bias"}, {role::ssm_dt_bias, "ssm_dt.bias", "dt_bias"},
                         {role::ssm_d, "ssm_d", "D"}, {role::ssm_norm, "ssm_norm.weight", "norm.weight"}, {role::ssm_out, "ssm_out.weight", "out_proj.weight"}})
    t.push_back({r, true, gguf ? std::string("blk.{L}.") + g : hf_prefix + h, r == role::ssm_conv1d_bias ? presence::optional : p});
  // GGUF keeps A = -exp(A_log) itself; HF keeps A_log.
  t.push_back({gguf ? role::ssm_a : role::ssm_a_log, true, gguf ? std::string("blk.{L}.ssm_a") : hf_prefix + "A_log", p});
}

bool is_mamba2_role(role r) {
  switch (r) {
    case role::ssm_in:
    case role::ssm_conv1d:
    case role::ssm_conv1d_bias:
    case role::ssm_dt_bias:
    case role::ssm_a:
    case role::ssm_a_log:
    case role::ssm_d:
    case role::ssm_norm:
    case role::ssm_out: return true;
    default: return false;
  }
}

void add_mamba2_states(std::vector<state_decl>& states, const mamba2_params& p, std::int64_t layer) {
  const auto l = std::to_string(layer);
  states.push_back({"ssm.conv." + l, dtype::f32, {(p.conv - 1) * p.conv_channels()}, true});
  states.push_back({"ssm.state." + l, dtype::f32, {p.heads * p.head_dim() * p.state}, true});
}

value_id mamba2_mixer(decoder_trace& d, value_id x, std::int32_t layer, const mamba2_params& p) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const auto& s = ctx.shape();
  const std::int64_t R = s.rows(), T = s.tokens(), N = R * T, S = s.state_rows();
  const std::int64_t D = p.inner, G = p.groups, NS = p.state, H = p.heads, P = p.head_dim(), Cc = p.conv_channels(), K = p.conv;
  const auto l = std::to_string(layer);
  auto zxbcdt = ctx.linear(x, role::ssm_in, layer);
  if (p.in_scale != std::array<double, 5>{1.0, 1.0, 1.0, 1.0, 1.0}) {  // per segment: z, x, B, C, dt (this rank's widths)
    tensor mup(dtype::f32, {2 * D + 2 * G * NS + H});
    const std::int64_t ends[5] = {D, 2 * D, 2 * D + G * NS, 2 * D + 2 * G * NS, 2 * D + 2 * G * NS + H};
    for (std::int64_t i = 0, seg = 0; i < ends[4]; ++i) {
      while (i >= ends[seg]) ++seg;
      mup.as<float>()[i] = static_cast<float>(p.in_scale[static_cast<std::size_t>(seg)]);
    }
    zxbcdt = b.mul(zxbcdt, b.literal(std::move(mup), "mamba.in_scale"));
  }
  const auto z = b.slice(zxbcdt, 1, 0, D);
  const auto xbc = b.slice(zxbcdt, 1, D, D + Cc);
  auto dt = b.slice(zxbcdt, 1, D + Cc, D + Cc + H);
  const auto rows = ctx.state_rows(), pos = ctx.positions(), write = ctx.write_map();

  // The convolution over the carried window; its new window goes back to the sequence's row.
  const auto conv_in = b.state_input("ssm.conv." + l, {dtype::f32, {S, (K - 1) * Cc}});
  const auto w = b.reshape(ctx.vector_f32(role::ssm_conv1d, layer), {Cc, K});
  const auto conv = b.ssm_conv(b.reshape(xbc, {R, T, Cc}), conv_in, rows, pos, write, w);
  b.state_output("ssm.conv." + l, b.scatter_rows(conv_in, rows, b.slice(conv, 1, T * Cc, T * Cc + (K - 1) * Cc)));
  auto xc = b.reshape(b.slice(conv, 1, 0, T * Cc), {N, Cc});
  if (ctx.has(role::ssm_conv1d_bias, layer)) xc = b.add(xc, ctx.vector_f32(role::ssm_conv1d_bias, layer));
  xc = b.unary(op::silu, xc);
  b.label(xc, "ssm_conv");

  // The selective scan.
  const auto xs = b.reshape(b.slice(xc, 1, 0, D), {R, T, H, P});
  const auto B = b.reshape(b.slice(xc, 1, D, D + G * NS), {R, T, G, NS});
  const auto C = b.reshape(b.slice(xc, 1, D + G * NS, D + 2 * G * NS), {R, T, G, NS});
  dt = b.reshape(b.add(dt, ctx.vector_f32(role::ssm_dt_bias, layer)), {R, T, H});
  const auto A = ctx.has(role::ssm_a, layer) ? b.reshape(ctx.vector_f32(role::ssm_a, layer), {H})
                                              : b.unary(op::neg, b.unary(op::exp, b.reshape(ctx.vector_f32(role::ssm_a_log, layer), {H})));
  const auto state_in = b.state_input("ssm.state." + l, {dtype::f32, {S, H * P * NS}});
  const auto scan = b.ssm_scan(xs, dt, A, B, C, state_in, rows, pos, write);
  b.state_output("ssm.state." + l, b.scatter_rows(state_in, rows, b.slice(scan, 1, T * H * P, T * H * P + H * P * NS)));
  auto y = b.reshape(b.slice(scan, 1, 0, T * H * P), {N, H, P});
  y = b.add(y, b.mul(b.reshape(xs, {N, H, P}), b.reshape(ctx.vector_f32(role::ssm_d, layer), {H, 1})));
  b.label(y, "ssm_scan");

  // Gate, then RMSNorm per norm group (norm_before_gate false) when the layer has the norm (Falcon-H1's
  // mamba_rms_norm false: none, as llama.cpp without ssm_norm), then the output projection.
  y = b.mul(b.reshape(y, {N, D}), b.unary(op::silu, z));
  if (p.gated_norm && p.norm_ranks > 1) {  // one norm group over every rank: its sum of squares all-reduced
    const auto ss = b.all_reduce(b.reduce(op::reduce_sum, b.mul(y, y), -1, true));  // [N, 1]
    const auto mean = b.mul(ss, b.scalar(1.0 / static_cast<double>(D * p.norm_ranks)));
    y = b.mul(b.mul(y, b.unary(op::rsqrt, b.add(mean, b.scalar(p.norm_eps)))), ctx.vector_f32(role::ssm_norm, layer));
  } else if (p.gated_norm) {
    const std::int64_t NG = p.gated_norm_groups();
    tensor ones(dtype::f32, {D / NG});
    for (std::int64_t i = 0; i < D / NG; ++i) ones.as<float>()[i] = 1.0f;
    y = b.rms_norm(b.reshape(y, {N, NG, D / NG}), b.literal(std::move(ones), "ones"), p.norm_eps);
    y = b.mul(y, b.reshape(ctx.vector_f32(role::ssm_norm, layer), {NG, D / NG}));
  }
  auto out = d.projection(b.reshape(y, {N, D}), role::ssm_out, layer, p.reduce_output);
  if (p.out_scale != 1.0) out = b.mul(out, b.scalar(p.out_scale));
  b.label(out, "mamba_out");
  return out;
}

std::optional<troupe::shape> mamba2_shape(role r, const mamba2_params& p, std::int64_t H) {
  switch (r) {
    case role::ssm_in: return troupe::shape{2 * p.inner + 2 * p.groups * p.state + p.heads, H};
    case role::ssm_conv1d_bias: return troupe::shape{p.conv_channels()};
    case role::ssm_dt_bias:
    case role::ssm_a_log: return troupe::shape{p.heads};
    case role::ssm_out: return troupe::shape{H, p.inner};
    default: return std::nullopt;
  }
}

std::optional<std::int64_t> mamba2_numel(role r, const mamba2_params& p) {
  switch (r) {
    case role::ssm_conv1d: return p.conv_channels() * p.conv;
    case role::ssm_a:
    case role::ssm_d: return p.heads;
    case role::ssm_norm: return p.inner;
    default: return std::nullopt;
  }
}

}  // namespace troupe::families

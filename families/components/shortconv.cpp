#include "families/components/shortconv.hpp"

namespace troupe::families {

using graph::value_id;

void add_shortconv_states(std::vector<state_decl>& states, const shortconv_params& p, std::int64_t layer) {
  states.push_back({"conv." + std::to_string(layer), dtype::f32, {(p.conv - 1) * p.channels}, true});
}

value_id shortconv_mixer(decoder_trace& d, value_id x, std::int32_t layer, const shortconv_params& p) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const auto& s = ctx.shape();
  const std::int64_t R = s.rows(), T = s.tokens(), N = R * T, S = s.state_rows(), C = p.channels, K = p.conv;
  const auto l = std::to_string(layer);
  const auto bcx = ctx.linear(x, role::ssm_in, layer);  // [N, 3C]: B, C, x
  const auto bx = b.mul(b.slice(bcx, 1, 0, C), b.slice(bcx, 1, 2 * C, 3 * C));
  const auto rows = ctx.state_rows();
  const auto conv_in = b.state_input("conv." + l, {dtype::f32, {S, (K - 1) * C}});
  const auto w = b.reshape(ctx.vector_f32(role::ssm_conv1d, layer), {C, K});
  const auto conv = b.ssm_conv(b.reshape(bx, {R, T, C}), conv_in, rows, ctx.positions(), ctx.write_map(), w);
  b.state_output("conv." + l, b.scatter_rows(conv_in, rows, b.slice(conv, 1, T * C, T * C + (K - 1) * C)));
  const auto y = b.mul(b.slice(bcx, 1, C, 2 * C), b.reshape(b.slice(conv, 1, 0, T * C), {N, C}));
  const auto out = d.projection(y, role::ssm_out, layer);
  b.label(out, "shortconv_out");
  return out;
}

std::optional<troupe::shape> shortconv_shape(role r, const shortconv_params& p, std::int64_t H) {
  if (r == role::ssm_in) return troupe::shape{3 * p.channels, H};
  if (r == role::ssm_out) return troupe::shape{H, p.channels};
  return std::nullopt;
}

std::int64_t shortconv_numel(const shortconv_params& p) { return p.channels * p.conv; }

}  // namespace troupe::families

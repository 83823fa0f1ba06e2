// Elementwise: unary and binary arithmetic, comparisons, where, cast (the fused residual and gated epilogues of a linear start here).
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_elementwise(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::neg: case op::abs: case op::exp: case op::log: case op::sqrt: case op::rsqrt: case op::recip: case op::tanh:
    case op::erf: case op::sigmoid: case op::silu: case op::gelu_tanh: {
      const auto* x = P(e.inputs[0]);
      const auto k = to_ew(e.code);
      if (ot.type == dtype::f32)
        return device([=] { launch_unary_f32(k, reinterpret_cast<const float*>(x), n, reinterpret_cast<float*>(out), st); });
      auto m = map_of(ot.dims, {dense_strides(ot.dims)});
      if (!m) return too_deep();
      const auto t = ot.type;
      return device([=, m = *m] { launch_elementwise_nd(k, t, t, x, nullptr, nullptr, m, out, flag, eqn, st); });
    }
    case op::add: case op::sub: case op::mul: case op::div: case op::maximum: case op::minimum: case op::pow:
    case op::equal: case op::less: case op::less_equal: case op::greater: {
      const auto& at = T(e.inputs[0]);
      const auto& bt = T(e.inputs[1]);
      if (residual_of[i] >= 0) {
        const auto side = static_cast<std::size_t>(residual_of[i]);
        const auto& le = g.equations()[static_cast<std::size_t>(en.tp.residual_linear[i])];
        return lower_linear(en, le, reinterpret_cast<float*>(out), reinterpret_cast<const float*>(P(e.inputs[1 - side])), where);
      }
      if (gated_of[i] >= 0) {
        const auto& ae = g.equations()[static_cast<std::size_t>(gated_of[i])];
        const auto* gp = reinterpret_cast<const float*>(P(ae.inputs[0]));
        const auto* up = reinterpret_cast<const float*>(P(e.inputs[0] == ae.out ? e.inputs[1] : e.inputs[0]));
        const auto k = to_ew(ae.code);
        return device([=] { launch_gated_f32(k, gp, up, n, reinterpret_cast<float*>(out), st); });
      }
      const auto* a = P(e.inputs[0]);
      const auto* b = P(e.inputs[1]);
      const auto k = to_ew(e.code);
      if (at.type == dtype::f32 && ot.type == dtype::f32 && e.code != op::pow && at.dims == ot.dims) {
        const std::int64_t row = ot.dims.rank() ? ot.dims.back() : 1;
        std::int64_t b_len = -1;
        if (bt.dims == ot.dims) b_len = n;
        else if (bt.dims.numel() == 1) b_len = 1;
        else if (ot.dims.rank() >= 1 && bt.dims.rank() >= 1 && bt.dims.numel() == row && bt.dims.back() == row) b_len = row;
        if (b_len > 0)
          return device([=] {
            launch_binary_f32(k, reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b), n, b_len, reinterpret_cast<float*>(out), st);
          });
      }
      auto m = map_of(ot.dims, {broadcast_strides(at.dims, ot.dims), broadcast_strides(bt.dims, ot.dims)});
      if (!m) return too_deep();
      const auto ta = at.type, tout = ot.type;
      return device([=, m = *m] { launch_elementwise_nd(k, ta, tout, a, b, nullptr, m, out, flag, eqn, st); });
    }
    case op::where: {
      auto m = map_of(ot.dims, {broadcast_strides(T(e.inputs[0]).dims, ot.dims), broadcast_strides(T(e.inputs[1]).dims, ot.dims),
                                broadcast_strides(T(e.inputs[2]).dims, ot.dims)});
      if (!m) return too_deep();
      const auto *c = P(e.inputs[0]), *a = P(e.inputs[1]), *b = P(e.inputs[2]);
      const auto t = ot.type;
      return device([=, m = *m] { launch_elementwise_nd(ew::where, t, t, c, a, b, m, out, flag, eqn, st); });
    }
    case op::cast: {
      if (ot.type == dtype::q8_0) {  // f32 rows to q8_0 blocks (a q8_0 KV cache's write)
        const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
        const std::int64_t blocks = n / 32;
        return device([=] { launch_quantize_q8_0(x, blocks, out, st); });
      }
      auto m = map_of(ot.dims, {dense_strides(ot.dims)});
      if (!m) return too_deep();
      const auto* x = P(e.inputs[0]);
      const auto from = T(e.inputs[0]).type, to = ot.type;
      return device([=, m = *m] { launch_elementwise_nd(ew::cast, from, to, x, nullptr, nullptr, m, out, flag, eqn, st); });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

// The recurrent mixers: the causal depthwise convolution, Mamba2's selective scan and the gated delta
// rule over carried state rows (recurrent_kernels.cu; meanings engine/graph/recurrent_math.hpp).
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_recurrent(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  auto unsupported = [&](std::string why) { return exec_error{exec_error_code::unsupported, where, std::move(why)}; };
  // Each op's float inputs, then the state pool, its rows, the positions and the write slots.
  const std::size_t n_in = e.code == op::ssm_conv ? 6 : 9, pool = e.code == op::ssm_conv ? 1 : 5;
  if (e.inputs.size() != n_in) return unsupported("expected " + std::to_string(n_in) + " inputs");
  for (std::size_t k = 0; k < n_in; ++k) {
    const auto t = T(e.inputs[k]).type;
    if ((k <= pool || k > pool + 3) && t != dtype::f32)
      return unsupported("input " + std::to_string(k) + " of type " + std::string(troupe::name(t)) + " (f32 only)");
  }
  recurrent_rows rr;
  rr.rows = P(e.inputs[pool + 1]);
  rr.rows_type = T(e.inputs[pool + 1]).type;
  if (rr.rows_type != dtype::i32 && rr.rows_type != dtype::i64) return unsupported("state rows of type " + std::string(troupe::name(rr.rows_type)));
  if (T(e.inputs[pool + 2]).type != dtype::i32 || T(e.inputs[pool + 3]).type != dtype::i32)
    return unsupported("positions and write slots must be i32");
  rr.pos = reinterpret_cast<const std::int32_t*>(P(e.inputs[pool + 2]));
  rr.write = reinterpret_cast<const std::int32_t*>(P(e.inputs[pool + 3]));
  rr.S = T(e.inputs[pool]).dims[0];
  const auto& d0 = T(e.inputs[0]).dims;
  rr.R = d0[0];
  rr.T = d0[1];
  auto f = [&](std::size_t k) { return reinterpret_cast<const float*>(P(e.inputs[k])); };
  auto* y = reinterpret_cast<float*>(out);
  const float* state = f(pool);
  switch (e.code) {
    case op::ssm_conv: {
      const std::int64_t C = d0[2], K = T(e.inputs[5]).dims[1];
      if (K < 1 || K > max_conv_kernel)
        return unsupported("a convolution of " + std::to_string(K) + " taps (at most " + std::to_string(max_conv_kernel) + ")");
      const float *x = f(0), *w = f(5);
      return device([=] { launch_ssm_conv(rr, x, state, w, C, K, y, flag, eqn, st); });
    }
    case op::ssm_scan: {
      const auto& bd = T(e.inputs[3]).dims;
      const std::int64_t H = d0[2], Pd = d0[3], G = bd[2], N = bd[3];
      if (N > 32 * max_recurrent_lanes) return unsupported("a state of " + std::to_string(N) + " (at most " + std::to_string(32 * max_recurrent_lanes) + ")");
      if (G < 1 || H % G != 0) return unsupported("heads not a multiple of the groups");
      const float *x = f(0), *dt = f(1), *A = f(2), *B = f(3), *Cm = f(4);
      return device([=] { launch_ssm_scan(rr, x, dt, A, B, Cm, state, H, Pd, G, N, y, flag, eqn, st); });
    }
    case op::delta_rule: {
      const auto& vd = T(e.inputs[2]).dims;
      const std::int64_t Hk = d0[2], Dk = d0[3], H = vd[2], Dv = vd[3];
      if (Dk > 32 * max_recurrent_lanes) return unsupported("a key width of " + std::to_string(Dk) + " (at most " + std::to_string(32 * max_recurrent_lanes) + ")");
      if (Hk < 1 || H % Hk != 0) return unsupported("value heads not a multiple of the key heads");
      const float *q = f(0), *k = f(1), *v = f(2), *gate = f(3), *beta = f(4);
      return device([=] { launch_delta_rule(rr, q, k, v, gate, beta, state, Hk, Dk, H, Dv, y, flag, eqn, st); });
    }
    default: break;
  }
  return unsupported("no CUDA lowering");
}

}  // namespace troupe::exec::cuda

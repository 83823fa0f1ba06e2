// Recurrent mixers: the causal depthwise convolution, Mamba2's selective scan and the gated delta rule over carried state
// rows (engine/graph/recurrent_math.hpp; the scan and the delta rule in the vector kernels of the step's
// isa level, kernels.hpp), their heads spread over the pool's threads.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>

#include "engine/graph/recurrent_math.hpp"

namespace troupe::exec::cpu::lowering {

namespace {
std::vector<std::int64_t> state_rows(const std::byte* p, dtype t, std::int64_t R) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(R));
  for (std::int64_t r = 0; r < R; ++r) rows[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(load_any(t, p, r));
  return rows;
}
// Runs `heads(r, s0, h0, h1)` for every row r of a step whose state is used: s0 is the row's carried
// state (null for a fresh row), the heads spread over the pool's threads. The kernels write every float
// of a row they run (padding tokens as zeros); a padding row's part of y [R, per] is zeroed here.
template <class F>
std::optional<exec_error> per_row_heads(const std::vector<std::int64_t>& rows, std::int64_t S, std::int64_t state_width, const float* st,
                                        const std::int32_t* wr, const std::int32_t* pos, std::int64_t Tn, std::int64_t H, float* y,
                                        std::int64_t per, thread_pool* pool, const std::string& where, F&& heads) {
  const auto R = static_cast<std::int64_t>(rows.size());
  for (std::int64_t r = 0; r < R; ++r) {
    const auto row = rows[static_cast<std::size_t>(r)];
    const auto use = graph::recurrent::use_of_row(row, S, wr, pos, r, Tn);
    if (use.bad) return exec_error{exec_error_code::index_out_of_range, where, "state row " + std::to_string(row) + " outside [0, " + std::to_string(S) + ")"};
    if (use.skip) {
      std::fill(y + r * per, y + (r + 1) * per, 0.0f);
      continue;
    }
    const float* s0 = use.fresh ? nullptr : st + row * state_width;
    if (pool && H > 1) pool->parallel_for(H, [&](std::int64_t h, int) { heads(r, s0, h, h + 1); });
    else heads(r, s0, 0, H);
  }
  return std::nullopt;
}

}  // namespace

instr lower_recurrent(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  const auto out_of_range = [where](std::int64_t row, std::int64_t S) {
    return fail(exec_error_code::index_out_of_range, where, "state row " + std::to_string(row) + " outside [0, " + std::to_string(S) + ")");
  };
  switch (e.code) {
    case op::ssm_conv: {
      const auto& xd = T(e.inputs[0]).dims;
      const std::int64_t R = xd[0], Tn = xd[1], C = xd[2], K = T(e.inputs[5]).dims[1], S = T(e.inputs[1]).dims[0];
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* st = reinterpret_cast<const float*>(P(e.inputs[1]));
      const auto* rp = P(e.inputs[2]);
      const auto rt = T(e.inputs[2]).type;
      const auto* pos = reinterpret_cast<const std::int32_t*>(P(e.inputs[3]));
      const auto* wr = reinterpret_cast<const std::int32_t*>(P(e.inputs[4]));
      const auto* w = reinterpret_cast<const float*>(P(e.inputs[5]));
      auto* y = reinterpret_cast<float*>(out);
      // The weights as [K, C] (channels are the vector lanes): transposed here when they are a weight,
      // whose bytes are fixed once lowered, else at every step.
      std::vector<float> w_t(static_cast<std::size_t>(K * C));
      const auto transpose = [w, C, K](float* dst) {
        for (std::int64_t ch = 0; ch < C; ++ch)
          for (std::int64_t k = 0; k < K; ++k) dst[k * C + ch] = w[ch * K + k];
      };
      const bool fixed = std::any_of(g.weights().begin(), g.weights().end(), [&](const auto& wt) { return wt.value == e.inputs[5]; });
      if (fixed) transpose(w_t.data());
      return [=]() mutable -> std::optional<exec_error> {
        const std::int64_t per = Tn * C + (K - 1) * C;
        const auto rows = state_rows(rp, rt, R);
        if (!fixed) transpose(w_t.data());
        for (std::int64_t r = 0; r < R; ++r) {
          const auto row = rows[static_cast<std::size_t>(r)];
          const auto use = graph::recurrent::use_of_row(row, S, wr, pos, r, Tn);
          if (use.bad) return out_of_range(row, S);
          if (use.skip) {
            std::fill(y + r * per, y + (r + 1) * per, 0.0f);
            continue;
          }
          for (std::int64_t t = 0; t < Tn; ++t)  // the kernel writes real tokens' outputs and the window
            if (wr[r * Tn + t] < 0) std::fill(y + r * per + t * C, y + r * per + (t + 1) * C, 0.0f);
          const ssm_conv_args ca{x + r * Tn * C, use.fresh ? nullptr : st + row * (K - 1) * C, w_t.data(), wr + r * Tn, Tn, C, K, y + r * per};
          // Channels in runs of 64 (whole vectors at every level) spread over the pool once a row has
          // enough tokens to pay for it.
          const std::int64_t grain = std::max<std::int64_t>(64, 65536 / std::max<std::int64_t>(Tn * K, 1) / 64 * 64);
          split_range(*pool_ptr, C, grain, 64, [&](std::int64_t c0, std::int64_t c1) { ssm_conv_channels(ca, c0, c1, lv); });
        }
        return std::nullopt;
      };
    }
    case op::ssm_scan: {
      const auto& xd = T(e.inputs[0]).dims;
      const auto& bd = T(e.inputs[3]).dims;
      const std::int64_t R = xd[0], Tn = xd[1], H = xd[2], Pd = xd[3], G = bd[2], N = bd[3], S = T(e.inputs[5]).dims[0];
      auto f = [&](int k) { return reinterpret_cast<const float*>(P(e.inputs[static_cast<std::size_t>(k)])); };
      const float *x = f(0), *dt = f(1), *A = f(2), *B = f(3), *Cm = f(4), *st = f(5);
      const auto* rp = P(e.inputs[6]);
      const auto rt = T(e.inputs[6]).type;
      const auto* pos = reinterpret_cast<const std::int32_t*>(P(e.inputs[7]));
      const auto* wr = reinterpret_cast<const std::int32_t*>(P(e.inputs[8]));
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        return per_row_heads(state_rows(rp, rt, R), S, H * Pd * N, st, wr, pos, Tn, H, y, Tn * H * Pd + H * Pd * N, pool_ptr, where,
                             [&](std::int64_t r, const float* s0, std::int64_t h0, std::int64_t h1) {
                               const ssm_scan_args sa{x + r * Tn * H * Pd, dt + r * Tn * H, A, B + r * Tn * G * N, Cm + r * Tn * G * N, s0,
                                                      wr + r * Tn, Tn, H, Pd, G, N, y + r * (Tn * H * Pd + H * Pd * N)};
                               ssm_scan_heads(sa, h0, h1, lv);
                             });
      };
    }
    case op::delta_rule: {
      const auto& qd = T(e.inputs[0]).dims;
      const auto& vd = T(e.inputs[2]).dims;
      const std::int64_t R = qd[0], Tn = qd[1], Hk = qd[2], Dk = qd[3], H = vd[2], Dv = vd[3], S = T(e.inputs[5]).dims[0];
      auto f = [&](int k) { return reinterpret_cast<const float*>(P(e.inputs[static_cast<std::size_t>(k)])); };
      const float *q = f(0), *k = f(1), *v = f(2), *g = f(3), *be = f(4), *st = f(5);
      const auto* rp = P(e.inputs[6]);
      const auto rt = T(e.inputs[6]).type;
      const auto* pos = reinterpret_cast<const std::int32_t*>(P(e.inputs[7]));
      const auto* wr = reinterpret_cast<const std::int32_t*>(P(e.inputs[8]));
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        const std::int64_t per = Tn * H * Dv + H * Dv * Dk;
        return per_row_heads(state_rows(rp, rt, R), S, H * Dv * Dk, st, wr, pos, Tn, H, y, per, pool_ptr, where,
                             [&](std::int64_t r, const float* s0, std::int64_t h0, std::int64_t h1) {
                               const delta_rule_args da{q + r * Tn * Hk * Dk, k + r * Tn * Hk * Dk, v + r * Tn * H * Dv, g + r * Tn * H,
                                                        be + r * Tn * H, s0, wr + r * Tn, Tn, Hk, Dk, H, Dv, y + r * per};
                               delta_rule_heads(da, h0, h1, lv);
                             });
      };
    }
    default:
      err = exec_error{exec_error_code::unsupported, where, "not a recurrent op"};
      return nullptr;
  }
}

}  // namespace troupe::exec::cpu::lowering

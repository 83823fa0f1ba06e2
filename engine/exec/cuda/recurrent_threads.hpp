#pragma once
// What each thread of the recurrent mixers' kernels does (recurrent_kernels.cu; meanings
// engine/graph/recurrent_math.hpp), written over an execution context `X` so that both compilers
// build the very same code: on the device X reads blockIdx/threadIdx and sums a warp with shuffles;
// the host test (tests/engine/exec/cuda/recurrent_threads_test.cpp) runs every thread of a block as
// a host thread, a warp's sums through a barrier, and compares with the double recurrence.
//
// X provides: block_x(), block_y(), thread_x(), block_dim_x() (std::int64_t), warp_sum(float) (the sum
// over the calling thread's warp, returned to every lane) and raise(step_flag*, code, eqn, value,
// bound) (the step's first refusal wins).
//
// Every state row of the scan ([h, p, :]) and of the delta rule ([h, i, :]) updates from itself and
// the token's inputs alone, so a warp owns one such row for the whole step (lanes over its N or Dk
// floats, warp sums for the dot products) and walks the row's tokens in order with the state in
// registers: read once and written once per step, no block-wide synchronization.
#include <cmath>
#include <cstdint>

#include "engine/exec/cuda/hd.hpp"
#include "engine/exec/cuda/kernels.hpp"


namespace troupe::exec::cuda::recurrent_threads {

// Loops over a thread's registers run to these constants (guarded inside), so the compiler unrolls
// them and keeps the arrays in registers.
inline constexpr int lanes = static_cast<int>(max_recurrent_lanes);
inline constexpr int conv_taps = static_cast<int>(max_conv_kernel);

// What row r of the step does with its state (recurrent_math.hpp's use_of_row); `bad`: a row past
// the pool, flagged and written as padding.
struct row_use {
  std::int64_t row = 0;
  bool skip = false, fresh = false, bad = false;
};
TROUPE_HD row_use use_of_row(const recurrent_rows& w, std::int64_t r) {
  row_use u;
  u.row = w.rows_type == dtype::i64 ? static_cast<const std::int64_t*>(w.rows)[r]
                                    : static_cast<std::int64_t>(static_cast<const std::int32_t*>(w.rows)[r]);
  if (u.row < 0 || u.row >= w.S) {
    u.skip = true;
    u.bad = u.row >= w.S;
    return u;
  }
  std::int64_t t0 = 0;
  while (t0 < w.T && w.write[r * w.T + t0] < 0) ++t0;
  u.fresh = t0 < w.T && w.pos[r * w.T + t0] == 0;
  return u;
}

// log(1 + e^x), x past 20: x (torch's and ggml's softplus).
TROUPE_HD float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// ssm_conv: a thread per (row = block y, channel), the window of K - 1 inputs in registers.
template <class X>
TROUPE_HD void ssm_conv(X& cx, const recurrent_rows& rr, const float* x, const float* state, const float* w, std::int64_t C, std::int64_t K,
                        float* y, step_flag* flag, std::int32_t eqn) {
  const std::int64_t r = cx.block_y(), c = cx.block_x() * cx.block_dim_x() + cx.thread_x();
  const auto u = use_of_row(rr, r);
  if (u.bad && c == 0) cx.raise(flag, flag_state_row, eqn, u.row, rr.S);
  if (c >= C) return;
  const std::int64_t T = rr.T, Km1 = K - 1;
  float* yr = y + r * (T * C + Km1 * C);
  if (u.skip) {
    for (std::int64_t t = 0; t < T; ++t) yr[t * C + c] = 0.0f;
    for (std::int64_t k = 0; k < Km1; ++k) yr[T * C + k * C + c] = 0.0f;
    return;
  }
  float win[conv_taps], wk[conv_taps];
  for (int k = 0; k < conv_taps; ++k) {
    wk[k] = k < K ? w[c * K + k] : 0.0f;
    win[k] = k < Km1 && !u.fresh ? state[u.row * Km1 * C + k * C + c] : 0.0f;
  }
  for (std::int64_t t = 0; t < T; ++t) {
    if (rr.write[r * T + t] < 0) {
      yr[t * C + c] = 0.0f;
      continue;
    }
    // win[0, K - 1) holds the K - 1 inputs before this token; this token's input is tap K - 1.
    const float xt = x[(r * T + t) * C + c];
    float s = 0.0f;
      for (int k = 0; k < conv_taps; ++k) {
      if (k < Km1) s += wk[k] * win[k];
      else if (k == Km1) s += wk[k] * xt;
    }
    yr[t * C + c] = s;
      for (int k = 0; k + 1 < conv_taps; ++k)
      if (k < Km1) win[k] = k + 1 < Km1 ? win[k + 1] : xt;
  }
  for (int k = 0; k < conv_taps; ++k)
    if (k < Km1) yr[T * C + k * C + c] = win[k];
}

// Lane `lane`'s share (entries lane, lane + 32, ...) of a state row of `width` floats: loaded (zeros
// for a fresh row) and stored.
TROUPE_HD void load_lanes(float (&s)[lanes], const float* src, std::int64_t width, int lane, bool fresh) {
  for (int i = 0; i < lanes; ++i) {
    const std::int64_t j = lane + 32 * i;
    s[i] = j < width && !fresh ? src[j] : 0.0f;
  }
}
TROUPE_HD void store_lanes(float* dst, const float (&s)[lanes], std::int64_t width, int lane) {
  for (int i = 0; i < lanes; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < width) dst[j] = s[i];
  }
}
// A padding (or flagged) row's share of a warp: its T outputs, `stride` apart, and its state row zeros.
TROUPE_HD void zero_warp_row(float* y0, std::int64_t T, std::int64_t stride, float* s_out, std::int64_t width, int lane) {
  if (lane == 0)
    for (std::int64_t t = 0; t < T; ++t) y0[t * stride] = 0.0f;
  for (std::int64_t j = lane; j < width; j += 32) s_out[j] = 0.0f;
}

// ssm_scan: a warp per (row = block y, head h, p), lane l holding entries l, l + 32, ... of [h, p, :].
template <class X>
TROUPE_HD void ssm_scan(X& cx, const recurrent_rows& rr, const float* x, const float* dt, const float* A, const float* B, const float* Cm,
                        const float* state, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N, float* y, step_flag* flag,
                        std::int32_t eqn) {
  const int lane = static_cast<int>(cx.thread_x() % 32);
  const std::int64_t hp = cx.block_x() * (cx.block_dim_x() / 32) + cx.thread_x() / 32, r = cx.block_y();
  const auto u = use_of_row(rr, r);
  if (u.bad && hp == 0 && lane == 0) cx.raise(flag, flag_state_row, eqn, u.row, rr.S);
  if (hp >= H * P) return;  // whole warps leave together
  const std::int64_t h = hp / P, p = hp % P, T = rr.T;
  float* yr = y + r * (T * H * P + H * P * N);
  float* s_out = yr + T * H * P + hp * N;
  if (u.skip) return zero_warp_row(yr + h * P + p, T, H * P, s_out, N, lane);
  float s[lanes];
  load_lanes(s, state + u.row * H * P * N + hp * N, N, lane, u.fresh);
  const std::int64_t g = h / (H / G);
  const float a = A[h];
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t n = r * T + t;
    if (rr.write[n] < 0) {
      if (lane == 0) yr[(t * H + h) * P + p] = 0.0f;
      continue;
    }
    const float d = softplus(dt[n * H + h]);
    const float dA = expf(d * a);
    const float xd = x[(n * H + h) * P + p] * d;
    const float* b = B + (n * G + g) * N;
    const float* c = Cm + (n * G + g) * N;
    float acc = 0.0f;
      for (int i = 0; i < lanes; ++i) {
      const std::int64_t k = lane + 32 * i;
      if (k < N) {
        s[i] = s[i] * dA + b[k] * xd;
        acc += s[i] * c[k];
      }
    }
    acc = cx.warp_sum(acc);
    if (lane == 0) yr[(t * H + h) * P + p] = acc;
  }
  store_lanes(s_out, s, N, lane);
}

// delta_rule: a warp per (row = block y, head h, i < Dv), lane l holding entries l, l + 32, ... of
// S[h][i, :].
template <class X>
TROUPE_HD void delta_rule(X& cx, const recurrent_rows& rr, const float* q, const float* k, const float* v, const float* g, const float* beta,
                          const float* state, std::int64_t Hk, std::int64_t Dk, std::int64_t H, std::int64_t Dv, float* y, step_flag* flag,
                          std::int32_t eqn) {
  const int lane = static_cast<int>(cx.thread_x() % 32);
  const std::int64_t hi = cx.block_x() * (cx.block_dim_x() / 32) + cx.thread_x() / 32, r = cx.block_y();
  const auto u = use_of_row(rr, r);
  if (u.bad && hi == 0 && lane == 0) cx.raise(flag, flag_state_row, eqn, u.row, rr.S);
  if (hi >= H * Dv) return;  // whole warps leave together
  const std::int64_t h = hi / Dv, i = hi % Dv, T = rr.T;
  float* yr = y + r * (T * H * Dv + H * Dv * Dk);
  float* s_out = yr + T * H * Dv + hi * Dk;
  if (u.skip) return zero_warp_row(yr + h * Dv + i, T, H * Dv, s_out, Dk, lane);
  float s[lanes];
  load_lanes(s, state + u.row * H * Dv * Dk + hi * Dk, Dk, lane, u.fresh);
  const std::int64_t kh = h / (H / Hk);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t n = r * T + t;
    if (rr.write[n] < 0) {
      if (lane == 0) yr[(t * H + h) * Dv + i] = 0.0f;
      continue;
    }
    const float decay = expf(g[n * H + h]), b = beta[n * H + h];
    const float* kt = k + (n * Hk + kh) * Dk;
    const float* qt = q + (n * Hk + kh) * Dk;
    float sk = 0.0f;
      for (int m = 0; m < lanes; ++m) {
      const std::int64_t j = lane + 32 * m;
      if (j < Dk) {
        s[m] *= decay;
        sk += s[m] * kt[j];
      }
    }
    const float du = b * (v[(n * H + h) * Dv + i] - cx.warp_sum(sk));
    float acc = 0.0f;
      for (int m = 0; m < lanes; ++m) {
      const std::int64_t j = lane + 32 * m;
      if (j < Dk) {
        s[m] += du * kt[j];
        acc += s[m] * qt[j];
      }
    }
    acc = cx.warp_sum(acc);
    if (lane == 0) yr[(t * H + h) * Dv + i] = acc;
  }
  store_lanes(s_out, s, Dk, lane);
}

// The launch geometry both sides use: blocks of `per` units along x, the step's rows along y.
inline constexpr int warps_per_block = 4;
inline constexpr int conv_threads = 128;
TROUPE_HD std::int64_t blocks_of(std::int64_t units, std::int64_t per) {
  const std::int64_t b = (units + per - 1) / per;
  return b < 1 ? 1 : b;
}

}  // namespace troupe::exec::cuda::recurrent_threads

#pragma once
// The meaning of the recurrent ops (ops.hpp: ssm_conv, ssm_scan, delta_rule), written once over any float type:
// the oracle runs it in double, the CPU executor in float. Each row r of a step is one sequence:
// its real tokens are those with write[r T + t] >= 0 (padding writes nothing), taken in order; its
// carried state is row rows[r] of the state pool, or zeros when its first real token is at position 0
// (a sequence that starts in this step). A row with rows[r] < 0 is padding: zeros out, no state.
//
// Outputs are packed per row, as ggml's ssm_scan packs them: first every token's output, then the
// row's new state (its old state when it has no real token), which the graph scatters into the pool.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace troupe::graph::recurrent {

// log(1 + e^x), as torch's and ggml's softplus (x past 20: x).
template <class F>
F softplus(F x) {
  return x > F(20) ? x : std::log1p(std::exp(x));
}

// The first real token of row r, or T when it has none.
inline std::int64_t first_real(const std::int32_t* write, std::int64_t r, std::int64_t T) {
  for (std::int64_t t = 0; t < T; ++t)
    if (write[r * T + t] >= 0) return t;
  return T;
}

// What row r of a step does with its state: nothing (a padding row, rows[r] < 0), start from zeros
// (fresh: its first real token is at position 0), or continue from its row; `bad` when the row index
// is past the pool's S rows (an error of the step).
struct row_use {
  bool skip = false, fresh = false, bad = false;
};
inline row_use use_of_row(std::int64_t row, std::int64_t S, const std::int32_t* write, const std::int32_t* pos, std::int64_t r, std::int64_t T) {
  if (row < 0) return {.skip = true};
  if (row >= S) return {.bad = true};
  const auto t0 = first_real(write, r, T);
  return {.fresh = t0 < T && pos[r * T + t0] == 0};
}

// ssm_conv over row r: x [T, C] of the row, its carried window state_row [K-1, C] (or null for zeros),
// w [C, K]; out [T C + (K-1) C]. Depthwise and causal: y[t, c] = sum_k w[c, k] in[t - (K-1) + k, c]
// over the row's input sequence (the window, then its real tokens).
template <class F, class X, class S, class W>
void ssm_conv_row(const X* x, const S* state_row, const W* w, const std::int32_t* write_row, std::int64_t T, std::int64_t C,
                  std::int64_t K, F* out, F* window /* [K-1+1, C] scratch */) {
  const std::int64_t Km1 = K - 1;
  for (std::int64_t j = 0; j < Km1 * C; ++j) window[j] = state_row ? F(state_row[j]) : F(0);
  F* y = out;
  std::fill(y, y + T * C, F(0));
  for (std::int64_t t = 0; t < T; ++t) {
    if (write_row[t] < 0) continue;
    // window holds the K-1 inputs before this token; this token's input is row K-1.
    for (std::int64_t c = 0; c < C; ++c) window[Km1 * C + c] = F(x[t * C + c]);
    for (std::int64_t c = 0; c < C; ++c) {
      F s = 0;
      for (std::int64_t k = 0; k < K; ++k) s += F(w[c * K + k]) * window[k * C + c];
      y[t * C + c] = s;
    }
    for (std::int64_t k = 0; k < Km1; ++k)
      for (std::int64_t c = 0; c < C; ++c) window[k * C + c] = window[(k + 1) * C + c];
  }
  std::copy(window, window + Km1 * C, out + T * C);
}

// ssm_scan over row r (Mamba2's selective scan, one head at a time): x [T, H, P], dt [T, H] (before
// softplus), A [H], B and C [T, G, N] (head h reads group h / (H / G)), the carried state [H, P, N]
// (or null for zeros); out [T H P + H P N]. Per real token: d = softplus(dt), s = e^(d A) s + d x B,
// y = s . C.
template <class F, class V, class S>
void ssm_scan_row(const V* x, const V* dt, const V* A, const V* B, const V* Cm, const S* state_row, const std::int32_t* write_row,
                  std::int64_t T, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N, F* out, std::int64_t h0, std::int64_t h1) {
  F* st = out + T * H * P;
  for (std::int64_t h = h0; h < h1; ++h) {
    F* sh = st + h * P * N;
    for (std::int64_t j = 0; j < P * N; ++j) sh[j] = state_row ? F(state_row[h * P * N + j]) : F(0);
    const std::int64_t g = h / (H / G);
    for (std::int64_t t = 0; t < T; ++t) {
      F* y = out + (t * H + h) * P;
      if (write_row[t] < 0) {
        std::fill(y, y + P, F(0));
        continue;
      }
      const F d = softplus(F(dt[t * H + h]));
      const F dA = std::exp(d * F(A[h]));
      const V* b = B + (t * G + g) * N;
      const V* c = Cm + (t * G + g) * N;
      for (std::int64_t p = 0; p < P; ++p) {
        const F xd = F(x[(t * H + h) * P + p]) * d;
        F* s = sh + p * N;
        F acc = 0;
        for (std::int64_t k = 0; k < N; ++k) {
          s[k] = s[k] * dA + F(b[k]) * xd;
          acc += s[k] * F(c[k]);
        }
        y[p] = acc;
      }
    }
  }
}

// delta_rule over row r (the gated delta rule of Gated DeltaNet), heads [h0, h1): q and k [T, Hk, Dk],
// v [T, H, Dv], g and beta [T, H], the carried state [H, Dv, Dk] (or null for zeros); out
// [T H Dv + H Dv Dk]. Head h reads key head h / (H / Hk). Per real token, with S the head's [Dv, Dk]:
// S = e^g S; u = beta (v - S k); S += u k^T; o = S q.
template <class F, class V, class S>
void delta_rule_row(const V* q, const V* k, const V* v, const V* g, const V* beta, const S* state_row, const std::int32_t* write_row,
                    std::int64_t T, std::int64_t Hk, std::int64_t Dk, std::int64_t H, std::int64_t Dv, F* out, std::int64_t h0,
                    std::int64_t h1) {
  F* st = out + T * H * Dv;
  for (std::int64_t h = h0; h < h1; ++h) {
    F* sh = st + h * Dv * Dk;
    for (std::int64_t j = 0; j < Dv * Dk; ++j) sh[j] = state_row ? F(state_row[h * Dv * Dk + j]) : F(0);
    const std::int64_t kh = h / (H / Hk);
    for (std::int64_t t = 0; t < T; ++t) {
      F* o = out + (t * H + h) * Dv;
      if (write_row[t] < 0) {
        std::fill(o, o + Dv, F(0));
        continue;
      }
      const F decay = std::exp(F(g[t * H + h])), b = F(beta[t * H + h]);
      const V* kt = k + (t * Hk + kh) * Dk;
      const V* qt = q + (t * Hk + kh) * Dk;
      const V* vt = v + (t * H + h) * Dv;
      for (std::int64_t i = 0; i < Dv; ++i) {
        F* srow = sh + i * Dk;
        F sk = 0;
        for (std::int64_t j = 0; j < Dk; ++j) {
          srow[j] *= decay;
          sk += srow[j] * F(kt[j]);
        }
        const F u = b * (F(vt[i]) - sk);
        F acc = 0;
        for (std::int64_t j = 0; j < Dk; ++j) {
          srow[j] += u * F(kt[j]);
          acc += srow[j] * F(qt[j]);
        }
        o[i] = acc;
      }
    }
  }
}

}  // namespace troupe::graph::recurrent

#pragma once
// The kernels of kernels.hpp as templates over a vector type of kernels_simd.hpp, instantiated once per
// isa level by `make_kernel_table<V>()`. Every function here is a template on V, so each level's code
// is its own symbol: no inline function compiled for AVX-512 can be picked by the linker for a caller
// on a lesser CPU. For the same reason these templates use no std:: function templates, only
// intrinsics, libm's C functions and each other.
//
// Accuracy of the vector elementary functions (the scalar level uses libm instead):
//   exp: Cephes expf, <= 2 ulp relative; underflows gradually below -87.3, overflows to inf above 88.7.
//   log: Cephes logf, <= 2 ulp relative (absolute near 1).
//   tanh: Cephes tanhf, odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1): <= 4 ulp relative.
//   erf: the rational approximation of Eigen and XLA, absolute error < 2e-7 (a few ulp relative).
// sigmoid, silu and gelu_tanh are written through exp(-z) as x / (1 + exp(-z)), which keeps the
// relative error small on the negative side where 1 + tanh(z) would cancel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/exec/cpu/detail/kernels_simd.hpp"
#include "engine/exec/cpu/detail/kernels_table.hpp"

namespace troupe::exec::cpu::kernels_detail {

// ---- Elementary functions -------------------------------------------------------------------------

template <class V>
typename V::reg v_exp(typename V::reg x) {
  if constexpr (V::width == 1) {
    return expf(x);
  } else {
    using R = typename V::reg;
    // The clamp keeps 2^n a product of two normal powers of two; NaN passes through max and min.
    x = V::min(V::set1(89.0f), V::max(V::set1(-104.0f), x));
    const R n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    R r = V::fnma(n, V::set1(0.693359375f), x);
    r = V::fnma(n, V::set1(-2.12194440e-4f), r);
    R p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    p = V::fma(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
    // n spans [-150, 128]: split so that underflow is gradual and overflow gives inf.
    const R n1 = V::floor(V::mul(n, V::set1(0.5f)));
    return V::mul(V::mul(p, V::pow2i(n1)), V::pow2i(V::sub(n, n1)));
  }
}

template <class V>
typename V::reg v_log(typename V::reg x) {
  if constexpr (V::width == 1) {
    return logf(x);
  } else {
    using R = typename V::reg;
    const auto subnormal = V::lt(x, V::set1(1.17549435e-38f));
    const R xs = V::select(subnormal, V::mul(x, V::set1(8388608.0f)), x);
    R e;
    const R m = V::frexp(xs, e);
    e = V::select(subnormal, V::sub(e, V::set1(23.0f)), e);
    const auto low = V::lt(m, V::set1(0.707106781186547524f));
    e = V::select(low, V::sub(e, V::set1(1.0f)), e);
    const R f = V::sub(V::select(low, V::add(m, m), m), V::set1(1.0f));
    const R z = V::mul(f, f);
    R p = V::set1(7.0376836292e-2f);
    p = V::fma(p, f, V::set1(-1.1514610310e-1f));
    p = V::fma(p, f, V::set1(1.1676998740e-1f));
    p = V::fma(p, f, V::set1(-1.2420140846e-1f));
    p = V::fma(p, f, V::set1(1.4249322787e-1f));
    p = V::fma(p, f, V::set1(-1.6668057665e-1f));
    p = V::fma(p, f, V::set1(2.0000714765e-1f));
    p = V::fma(p, f, V::set1(-2.4999993993e-1f));
    p = V::fma(p, f, V::set1(3.3333331174e-1f));
    R y = V::mul(V::mul(p, f), z);
    y = V::fma(e, V::set1(-2.12194440e-4f), y);
    y = V::fnma(z, V::set1(0.5f), y);
    R r = V::fma(e, V::set1(0.693359375f), V::add(f, y));
    const R inf = V::set1(INFINITY);
    r = V::select(V::eq(x, inf), inf, r);
    r = V::select(V::eq(x, V::zero()), V::neg(inf), r);
    r = V::select(V::lt(x, V::zero()), V::set1(NAN), r);
    return V::select(V::unordered(x, x), x, r);
  }
}

template <class V>
typename V::reg v_tanh(typename V::reg x) {
  if constexpr (V::width == 1) {
    return tanhf(x);
  } else {
    using R = typename V::reg;
    const R ax = V::abs(x);
    const R z = V::mul(x, x);
    R p = V::set1(-5.70498872745e-3f);
    p = V::fma(p, z, V::set1(2.06390887954e-2f));
    p = V::fma(p, z, V::set1(-5.37397155531e-2f));
    p = V::fma(p, z, V::set1(1.33314422036e-1f));
    p = V::fma(p, z, V::set1(-3.33332819422e-1f));
    const R small = V::fma(V::mul(p, z), x, x);
    const R e = v_exp<V>(V::add(ax, ax));
    const R big = V::copysign(V::sub(V::set1(1.0f), V::div(V::set1(2.0f), V::add(e, V::set1(1.0f)))), x);
    return V::select(V::lt(ax, V::set1(0.625f)), small, big);
  }
}

template <class V>
typename V::reg v_erf(typename V::reg x) {
  if constexpr (V::width == 1) {
    return erff(x);
  } else {
    using R = typename V::reg;
    x = V::min(V::set1(4.0f), V::max(V::set1(-4.0f), x));  // erf is +-1 in f32 beyond
    const R x2 = V::mul(x, x);
    R p = V::set1(-2.72614225801306e-10f);
    p = V::fma(p, x2, V::set1(2.77068142495902e-08f));
    p = V::fma(p, x2, V::set1(-2.10102402082508e-06f));
    p = V::fma(p, x2, V::set1(-5.69250639462346e-05f));
    p = V::fma(p, x2, V::set1(-7.34990630326855e-04f));
    p = V::fma(p, x2, V::set1(-2.95459980854025e-03f));
    p = V::fma(p, x2, V::set1(-1.60960333262415e-02f));
    R q = V::set1(-1.45660718464996e-05f);
    q = V::fma(q, x2, V::set1(-2.13374055278905e-04f));
    q = V::fma(q, x2, V::set1(-1.68282697438203e-03f));
    q = V::fma(q, x2, V::set1(-7.37332916720468e-03f));
    q = V::fma(q, x2, V::set1(-1.42647390514189e-02f));
    return V::div(V::mul(x, p), q);
  }
}

// x / (1 + exp(-z)): sigmoid (x = 1, z = x), silu (z = x) and gelu_tanh (z = 2 sqrt(2/pi) (x + 0.044715 x^3)).
template <class V>
typename V::reg v_over_one_plus_exp_neg(typename V::reg x, typename V::reg z) {
  return V::div(x, V::add(V::set1(1.0f), v_exp<V>(V::neg(z))));
}

template <class V>
typename V::reg v_gelu_tanh(typename V::reg x) {
  constexpr float k0 = static_cast<float>(2.0 * 0.79788456080286535588);
  constexpr float k1 = static_cast<float>(2.0 * 0.79788456080286535588 * 0.044715);
  const auto z = V::mul(x, V::fma(V::set1(k1), V::mul(x, x), V::set1(k0)));
  return v_over_one_plus_exp_neg<V>(x, z);
}

template <class V>
typename V::reg v_unary(unary_kind k, typename V::reg x) {
  switch (k) {
    case unary_kind::neg: return V::neg(x);
    case unary_kind::abs: return V::abs(x);
    case unary_kind::exp: return v_exp<V>(x);
    case unary_kind::log: return v_log<V>(x);
    case unary_kind::sqrt: return V::sqrt(x);
    case unary_kind::rsqrt: return V::div(V::set1(1.0f), V::sqrt(x));
    case unary_kind::recip: return V::div(V::set1(1.0f), x);
    case unary_kind::tanh: return v_tanh<V>(x);
    case unary_kind::erf: return v_erf<V>(x);
    case unary_kind::sigmoid: return v_over_one_plus_exp_neg<V>(V::set1(1.0f), x);
    case unary_kind::silu: return v_over_one_plus_exp_neg<V>(x, x);
    case unary_kind::gelu_tanh: return v_gelu_tanh<V>(x);
  }
  return x;
}

// ---- Elementwise ----------------------------------------------------------------------------------

// The switch on the kind sits outside the loop: one loop per kind.
template <class V, unary_kind K>
void unary_loop(const float* x, std::int64_t n, float* y) {
  constexpr int W = V::width;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) V::store(y + i, v_unary<V>(K, V::load(x + i)));
  if (i < n) V::store_n(y + i, v_unary<V>(K, V::load_n(x + i, n - i)), n - i);
}

template <class V>
void unary(unary_kind k, const float* x, std::int64_t n, float* y) {
  switch (k) {
    case unary_kind::neg: return unary_loop<V, unary_kind::neg>(x, n, y);
    case unary_kind::abs: return unary_loop<V, unary_kind::abs>(x, n, y);
    case unary_kind::exp: return unary_loop<V, unary_kind::exp>(x, n, y);
    case unary_kind::log: return unary_loop<V, unary_kind::log>(x, n, y);
    case unary_kind::sqrt: return unary_loop<V, unary_kind::sqrt>(x, n, y);
    case unary_kind::rsqrt: return unary_loop<V, unary_kind::rsqrt>(x, n, y);
    case unary_kind::recip: return unary_loop<V, unary_kind::recip>(x, n, y);
    case unary_kind::tanh: return unary_loop<V, unary_kind::tanh>(x, n, y);
    case unary_kind::erf: return unary_loop<V, unary_kind::erf>(x, n, y);
    case unary_kind::sigmoid: return unary_loop<V, unary_kind::sigmoid>(x, n, y);
    case unary_kind::silu: return unary_loop<V, unary_kind::silu>(x, n, y);
    case unary_kind::gelu_tanh: return unary_loop<V, unary_kind::gelu_tanh>(x, n, y);
  }
}

template <class V, unary_kind K>
void gated_loop(const float* g, const float* u, std::int64_t n, float* y) {
  constexpr int W = V::width;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) V::store(y + i, V::mul(v_unary<V>(K, V::load(g + i)), V::load(u + i)));
  if (i < n) V::store_n(y + i, V::mul(v_unary<V>(K, V::load_n(g + i, n - i)), V::load_n(u + i, n - i)), n - i);
}

template <class V>
void gated(unary_kind act, const float* g, const float* u, std::int64_t n, float* y) {
  if (act == unary_kind::gelu_tanh) return gated_loop<V, unary_kind::gelu_tanh>(g, u, n, y);
  if (act == unary_kind::silu) return gated_loop<V, unary_kind::silu>(g, u, n, y);
  // Any other activation: the unary op in place, then the product.
  unary<V>(act, g, n, y);
  constexpr int W = V::width;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) V::store(y + i, V::mul(V::load(y + i), V::load(u + i)));
  if (i < n) V::store_n(y + i, V::mul(V::load_n(y + i, n - i), V::load_n(u + i, n - i)), n - i);
}

// a op b, one loop per kind and per broadcast side (the switch sits outside the loops). An operand
// marked scalar is one value for the whole run.
template <class V, binary_kind K>
typename V::reg v_binary(typename V::reg a, typename V::reg b) {
  if constexpr (K == binary_kind::add) return V::add(a, b);
  else if constexpr (K == binary_kind::sub) return V::sub(a, b);
  else if constexpr (K == binary_kind::mul) return V::mul(a, b);
  else if constexpr (K == binary_kind::div) return V::div(a, b);
  else if constexpr (K == binary_kind::maximum) return V::select(V::unordered(a, b), V::add(a, b), V::max(a, b));  // NaN in: NaN out
  else return V::select(V::unordered(a, b), V::add(a, b), V::min(a, b));
}

template <class V, binary_kind K, bool SA, bool SB>
void binary_loop(const float* a, const float* b, std::int64_t n, float* y) {
  constexpr int W = V::width;
  const auto ra = [&](std::int64_t i) { return SA ? V::set1(a[0]) : V::load(a + i); };
  const auto rb = [&](std::int64_t i) { return SB ? V::set1(b[0]) : V::load(b + i); };
  std::int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const auto y0 = v_binary<V, K>(ra(i), rb(i)), y1 = v_binary<V, K>(ra(i + W), rb(i + W));
    V::store(y + i, y0);
    V::store(y + i + W, y1);
  }
  for (; i + W <= n; i += W) V::store(y + i, v_binary<V, K>(ra(i), rb(i)));
  if (i < n) {
    const auto ta = SA ? V::set1(a[0]) : V::load_n(a + i, n - i), tb = SB ? V::set1(b[0]) : V::load_n(b + i, n - i);
    V::store_n(y + i, v_binary<V, K>(ta, tb), n - i);
  }
}

template <class V, binary_kind K>
void binary_sides(const float* a, bool sa, const float* b, bool sb, std::int64_t n, float* y) {
  if (sa && sb) {
    const float v = v_binary<simd_scalar, K>(a[0], b[0]);
    for (std::int64_t i = 0; i < n; ++i) y[i] = v;
  } else if (sa) {
    binary_loop<V, K, true, false>(a, b, n, y);
  } else if (sb) {
    binary_loop<V, K, false, true>(a, b, n, y);
  } else {
    binary_loop<V, K, false, false>(a, b, n, y);
  }
}

template <class V>
void binary(binary_kind k, const float* a, bool sa, const float* b, bool sb, std::int64_t n, float* y) {
  switch (k) {
    case binary_kind::add: return binary_sides<V, binary_kind::add>(a, sa, b, sb, n, y);
    case binary_kind::sub: return binary_sides<V, binary_kind::sub>(a, sa, b, sb, n, y);
    case binary_kind::mul: return binary_sides<V, binary_kind::mul>(a, sa, b, sb, n, y);
    case binary_kind::div: return binary_sides<V, binary_kind::div>(a, sa, b, sb, n, y);
    case binary_kind::maximum: return binary_sides<V, binary_kind::maximum>(a, sa, b, sb, n, y);
    case binary_kind::minimum: return binary_sides<V, binary_kind::minimum>(a, sa, b, sb, n, y);
  }
}

// ---- Norms and softmax ----------------------------------------------------------------------------

// Sum of f(x[i]) over a row, in four vector accumulators (f(0) must be 0 for the tail).
template <class V, class F>
float row_sum(const float* x, std::int64_t n, F f) {
  constexpr int W = V::width;
  typename V::reg a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = V::add(a0, f(V::load(x + i)));
    a1 = V::add(a1, f(V::load(x + i + W)));
    a2 = V::add(a2, f(V::load(x + i + 2 * W)));
    a3 = V::add(a3, f(V::load(x + i + 3 * W)));
  }
  for (; i + W <= n; i += W) a0 = V::add(a0, f(V::load(x + i)));
  if (i < n) a1 = V::add(a1, V::select(V::first(n - i), f(V::load_n(x + i, n - i)), V::zero()));
  return V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
}

template <class V>
void rms_norm(const float* x, const float* w, std::int64_t rows, std::int64_t n, float eps, float* y) {
  constexpr int W = V::width;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float ss = row_sum<V>(xr, n, [](typename V::reg v) { return V::mul(v, v); });
    const auto inv = V::set1(static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(n) + eps)));
    std::int64_t i = 0;
    for (; i + W <= n; i += W) V::store(yr + i, V::mul(V::mul(V::load(xr + i), inv), V::load(w + i)));
    if (i < n) V::store_n(yr + i, V::mul(V::mul(V::load_n(xr + i, n - i), inv), V::load_n(w + i, n - i)), n - i);
  }
}

template <class V>
void layer_norm(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps, float* y) {
  constexpr int W = V::width;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float mean = row_sum<V>(xr, n, [](typename V::reg v) { return v; }) / static_cast<float>(n);
    // Two passes: the variance of the centred row does not cancel as E[x^2] - mean^2 would.
    const auto mv = V::set1(mean);
    const float ss = row_sum<V>(xr, n, [mv](typename V::reg v) {
      const auto d = V::sub(v, mv);
      return V::mul(d, d);
    });
    const auto inv = V::set1(static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(n) + eps)));
    std::int64_t i = 0;
    for (; i + W <= n; i += W)
      V::store(yr + i, V::fma(V::mul(V::sub(V::load(xr + i), mv), inv), V::load(w + i), V::load(b + i)));
    if (i < n) {
      const std::int64_t k = n - i;
      V::store_n(yr + i, V::fma(V::mul(V::sub(V::load_n(xr + i, k), mv), inv), V::load_n(w + i, k), V::load_n(b + i, k)), k);
    }
  }
}

template <class V>
void softmax_rows(const float* x, std::int64_t rows, std::int64_t n, bool log, float* y) {
  constexpr int W = V::width;
  using R = typename V::reg;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const std::int64_t tail = n % W, body = n - tail;
    R mx = V::set1(-INFINITY);
    for (std::int64_t i = 0; i < body; i += W) mx = V::max(V::load(xr + i), mx);
    if (tail) mx = V::max(V::select(V::first(tail), V::load_n(xr + body, tail), V::set1(-INFINITY)), mx);
    const float m = V::reduce_max(mx);
    const R mv = V::set1(m);
    R sum = V::zero();
    for (std::int64_t i = 0; i < body; i += W) {
      const R e = v_exp<V>(V::sub(V::load(xr + i), mv));
      if (!log) V::store(yr + i, e);
      sum = V::add(sum, e);
    }
    if (tail) {
      const R e = V::select(V::first(tail), v_exp<V>(V::sub(V::load_n(xr + body, tail), mv)), V::zero());
      if (!log) V::store_n(yr + body, e, tail);
      sum = V::add(sum, e);
    }
    const double s = V::reduce_add(sum);
    if (log) {
      const R shift = V::set1(static_cast<float>(static_cast<double>(m) + ::log(s)));
      for (std::int64_t i = 0; i < body; i += W) V::store(yr + i, V::sub(V::load(xr + i), shift));
      if (tail) V::store_n(yr + body, V::sub(V::load_n(xr + body, tail), shift), tail);
    } else {
      const R inv = V::set1(static_cast<float>(1.0 / s));
      for (std::int64_t i = 0; i < body; i += W) V::store(yr + i, V::mul(V::load(yr + i), inv));
      if (tail) V::store_n(yr + body, V::mul(V::load_n(yr + body, tail), inv), tail);
    }
  }
}

// ---- Rotary embedding -----------------------------------------------------------------------------

// cos and sin of pos * f, correctly rounded to f32 in practice: the angle is formed exactly in double,
// reduced by pi/2 (Cody-Waite, exact for angles below 2^20 rad), and the series on [-pi/4, pi/4] are
// carried to 1e-11. A f32 angle would lose 2^-24 of pos * f, i.e. 2e-3 rad at position 32768.
template <class V>
void rope_angle(std::int32_t pos, float f, float& c, float& s) {
  const double th = static_cast<double>(pos) * static_cast<double>(f);
  const double k = floor(th * 0.63661977236758134308 + 0.5);
  const double r = (th - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
  const double r2 = r * r;
  const double sn =
      r + r * r2 * (-1.0 / 6 + r2 * (1.0 / 120 + r2 * (-1.0 / 5040 + r2 * (1.0 / 362880 + r2 * (-1.0 / 39916800)))));
  const double cs =
      1.0 - 0.5 * r2 +
      r2 * r2 * (1.0 / 24 + r2 * (-1.0 / 720 + r2 * (1.0 / 40320 + r2 * (-1.0 / 3628800 + r2 * (1.0 / 479001600)))));
  const auto q = static_cast<std::int64_t>(k) & 3;  // the quadrant: rotate (cos, sin) by q * pi/2
  const double cq = (q & 1) ? sn : cs, sq = (q & 1) ? cs : sn;
  c = static_cast<float>(((q + 1) & 2) ? -cq : cq);
  s = static_cast<float>((q & 2) ? -sq : sq);
}

template <class V>
void rope(float* x, std::int64_t T, std::int64_t H, std::int64_t D, const std::int32_t* pos, const float* inv_freq,
          std::int64_t half, bool neox, float scale) {
  constexpr int W = V::width;
  constexpr std::int64_t block = 256;  // pairs per table block
  using R = typename V::reg;
  alignas(64) float ct[2 * block];
  alignas(64) float st[2 * block];
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i0 = 0; i0 < half; i0 += block) {
      const std::int64_t nb = half - i0 < block ? half - i0 : block;
      // The table for this token and block of pairs, shared by every head. Interleaved pairs get
      // (c, c) and (-s, s), so that y = x * c + swap_pairs(x) * s.
      for (std::int64_t j = 0; j < nb; ++j) {
        float c, s;
        rope_angle<V>(pos[t], inv_freq[i0 + j], c, s);
        c *= scale;
        s *= scale;
        if (neox) {
          ct[j] = c;
          st[j] = s;
        } else {
          ct[2 * j] = ct[2 * j + 1] = c;
          st[2 * j] = -s;
          st[2 * j + 1] = s;
        }
      }
      for (std::int64_t h = 0; h < H; ++h) {
        float* v = x + (t * H + h) * D;
        if (neox) {
          float* x0 = v + i0;
          float* x1 = v + half + i0;
          std::int64_t j = 0;
          for (; j + W <= nb; j += W) {
            const R a = V::load(x0 + j), b = V::load(x1 + j), c = V::load(ct + j), s = V::load(st + j);
            V::store(x0 + j, V::fnma(b, s, V::mul(a, c)));
            V::store(x1 + j, V::fma(a, s, V::mul(b, c)));
          }
          if (j < nb) {
            const std::int64_t k = nb - j;
            const R a = V::load_n(x0 + j, k), b = V::load_n(x1 + j, k), c = V::load_n(ct + j, k), s = V::load_n(st + j, k);
            V::store_n(x0 + j, V::fnma(b, s, V::mul(a, c)), k);
            V::store_n(x1 + j, V::fma(a, s, V::mul(b, c)), k);
          }
        } else if constexpr (W == 1) {
          float* p = v + 2 * i0;
          for (std::int64_t j = 0; j < nb; ++j) {
            const float a = p[2 * j], b = p[2 * j + 1], c = ct[2 * j], s = st[2 * j + 1];
            p[2 * j] = a * c - b * s;
            p[2 * j + 1] = a * s + b * c;
          }
        } else {
          float* p = v + 2 * i0;
          const std::int64_t m = 2 * nb;
          std::int64_t j = 0;
          for (; j + W <= m; j += W) {
            const R a = V::load(p + j);
            V::store(p + j, V::fma(a, V::load(ct + j), V::mul(V::swap_pairs(a), V::load(st + j))));
          }
          if (j < m) {
            const std::int64_t k = m - j;
            const R a = V::load_n(p + j, k);
            V::store_n(p + j, V::fma(a, V::load_n(ct + j, k), V::mul(V::swap_pairs(a), V::load_n(st + j, k))), k);
          }
        }
      }
    }
  }
}

// ---- Attention ------------------------------------------------------------------------------------

// How a kernel reads a KV cache's rows of element type E: `bytes(n)` of n elements (n a multiple of the
// block for q8_0), and `load` / `load_n` of W (or the first n of W) values from element d of a row, as
// f32 lanes. For q8_0, d is a multiple of W and W divides 32, so a load stays inside one block.
template <class V, kv_elem E>
struct kv_rows;

template <class V>
struct kv_rows<V, kv_elem::f32> {
  using R = typename V::reg;
  static constexpr std::int64_t bytes(std::int64_t n) { return n * 4; }
  static R load(const unsigned char* row, std::int64_t d) { return V::load(reinterpret_cast<const float*>(row) + d); }
  static R load_n(const unsigned char* row, std::int64_t d, std::int64_t n) {
    return V::load_n(reinterpret_cast<const float*>(row) + d, n);
  }
};

template <class V, kv_elem E>
  requires(E == kv_elem::f16 || E == kv_elem::bf16)
struct kv_rows<V, E> {
  using R = typename V::reg;
  static constexpr std::int64_t bytes(std::int64_t n) { return n * 2; }
  static R load(const unsigned char* row, std::int64_t d) {
    const auto* p = reinterpret_cast<const std::uint16_t*>(row) + d;
    if constexpr (E == kv_elem::f16) return V::load_f16(p);
    else return V::load_bf16(p);
  }
  static R load_n(const unsigned char* row, std::int64_t d, std::int64_t n) {
    const auto* p = reinterpret_cast<const std::uint16_t*>(row) + d;
    if constexpr (E == kv_elem::f16) return V::load_f16_n(p, n);
    else return V::load_bf16_n(p, n);
  }
};

template <class V>
struct kv_rows<V, kv_elem::q8_0> {
  using R = typename V::reg;
  static constexpr std::int64_t bytes(std::int64_t n) { return n / 32 * 34; }
  static R load(const unsigned char* row, std::int64_t d) {
    const unsigned char* blk = row + d / 32 * 34;
    const auto h = static_cast<std::uint16_t>(blk[0] | (blk[1] << 8));
    return V::mul(V::set1(V::half(h)), V::load_i8(reinterpret_cast<const std::int8_t*>(blk + 2) + d % 32));
  }
  static R load_n(const unsigned char* row, std::int64_t d, std::int64_t n) {
    return V::select(V::first(n), load(row, d), V::zero());
  }
};

// Scores of one query against `width` keys (rows kp[j] + off) as one vector: one accumulator per key
// over the head dimension, reduced together by sum_lanes.
template <class V, class K>
[[gnu::always_inline]] inline typename V::reg score_block(const float* q, const unsigned char* const* kp, std::int64_t off,
                                                          std::int64_t D) {
  constexpr int W = V::width;
  typename V::reg acc[W];
  const unsigned char* k[W];
  for (int j = 0; j < W; ++j) {
    acc[j] = V::zero();
    k[j] = kp[j] + K::bytes(off);
  }
  std::int64_t d = 0;
  for (; d + W <= D; d += W) {
    const auto qv = V::load(q + d);
#pragma GCC unroll 16
    for (int j = 0; j < W; ++j) acc[j] = V::fma(qv, K::load(k[j], d), acc[j]);
  }
  if (d < D) {
    const std::int64_t rem = D - d;
    const auto qv = V::load_n(q + d, rem);
#pragma GCC unroll 16
    for (int j = 0; j < W; ++j) acc[j] = V::fma(qv, K::load_n(k[j], d, rem), acc[j]);
  }
  return V::sum_lanes(acc);
}

// The raw scores of Q queries (rows q, q + D, ...) against the W keys kp[0..W) (rows + off), stored at
// out + r * ostride, each exactly score_block's: the same FMA chain over the head dimension and the same
// lane sums (V::sum_quad, four keys at a time). The Q queries (one kv head's, which read the same keys)
// share each loaded key vector, so a step of d loads Q + 4 vectors for 4 Q FMAs where score_block loads
// 9 for 8; on AVX2 a query's eight keys otherwise cost more loads than its FMAs could issue
// (troupe_kernels_bench decode_attention_hot). Needs V::sum_quad (W = 8) and D a multiple of 8: with a
// masked last step in the same function GCC 12 kept the twelve sums in memory, storing them every step.
template <class V, class K, int Q>
[[gnu::always_inline]] inline void score_queries(const float* q, const unsigned char* const* kp, std::int64_t off, std::int64_t D,
                                                 float* out, std::int64_t ostride) {
  using R = typename V::reg;
  static_assert(V::width == 8);
  for (int h = 0; h < 2; ++h) {
    const unsigned char* k[4];
    for (int j = 0; j < 4; ++j) k[j] = kp[4 * h + j] + K::bytes(off);
    R acc[Q][4];
#pragma GCC unroll 4
    for (int r = 0; r < Q; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = V::zero();
    for (std::int64_t d = 0; d < D; d += 8) {
      R x[Q];
#pragma GCC unroll 4
      for (int r = 0; r < Q; ++r) x[r] = V::load(q + r * D + d);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const R kv = K::load(k[j], d);
#pragma GCC unroll 4
        for (int r = 0; r < Q; ++r) acc[r][j] = V::fma(x[r], kv, acc[r][j]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < Q; ++r) V::store_quad(out + r * ostride + 4 * h, V::sum_quad(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  }
}

// acc[d0, d0 + width) (or its first `part` lanes) += sum_j p[j] * (vp[j] + off)[d0...], in four
// interleaved accumulators so the FMA latency does not serialize the keys.
template <class V, class K, bool Partial>
void pv_chunk(float* acc, const float* p, const unsigned char* const* vp, std::int64_t off, std::int64_t n, std::int64_t d0,
              std::int64_t part) {
  using R = typename V::reg;
  const std::int64_t o = K::bytes(off);
  auto ld = [&](const unsigned char* row) { return Partial ? K::load_n(row + o, d0, part) : K::load(row + o, d0); };
  R a0 = Partial ? V::load_n(acc + d0, part) : V::load(acc + d0), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    a0 = V::fma(V::set1(p[j]), ld(vp[j]), a0);
    a1 = V::fma(V::set1(p[j + 1]), ld(vp[j + 1]), a1);
    a2 = V::fma(V::set1(p[j + 2]), ld(vp[j + 2]), a2);
    a3 = V::fma(V::set1(p[j + 3]), ld(vp[j + 3]), a3);
  }
  for (; j < n; ++j) a0 = V::fma(V::set1(p[j]), ld(vp[j]), a0);
  const R s = V::add(V::add(a0, a1), V::add(a2, a3));
  if (Partial) V::store_n(acc + d0, s, part);
  else V::store(acc + d0, s);
}

// acc[0, Dv) += sum_j p[j] * (vp[j] + off)[0, Dv): blocks of acc_chunks vectors held in registers
// across the keys, then single vectors, then the partial one.
template <class V, class K>
void accumulate_pv(float* acc, const float* p, const unsigned char* const* vp, std::int64_t off, std::int64_t n, std::int64_t Dv) {
  constexpr int W = V::width, B = V::acc_chunks;
  const std::int64_t o = K::bytes(off);
  std::int64_t d = 0;
  for (; d + B * W <= Dv; d += B * W) {
    typename V::reg a[B];
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) a[b] = V::load(acc + d + b * W);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto pj = V::set1(p[j]);
      const unsigned char* v = vp[j] + o;
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) a[b] = V::fma(pj, K::load(v, d + b * W), a[b]);
    }
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) V::store(acc + d + b * W, a[b]);
  }
  for (; d + W <= Dv; d += W) pv_chunk<V, K, false>(acc, p, vp, off, n, d, W);
  if (d < Dv) pv_chunk<V, K, true>(acc, p, vp, off, n, d, Dv - d);
}

// Each of the task's nq queries done: its partial softmax state [max, sum, acc] for the merge of split
// key ranges (tk.part), else its output row (out_row(i) of out) normalized by its sum.
template <class V, class OutRow>
void finish_queries(const attention_args& a, const attention_task& tk, std::int64_t nq, const float* acc, const float* mx,
                    const float* sum, OutRow out_row) {
  constexpr int W = V::width;
  const std::int64_t Dv = a.Dv;
  for (std::int64_t i = 0; i < nq; ++i) {
    const float* ai = acc + i * Dv;
    if (tk.part) {
      float* dst = tk.part + i * (Dv + 2);
      dst[0] = mx[i];
      dst[1] = sum[i];
      for (std::int64_t d = 0; d < Dv; ++d) dst[2 + d] = ai[d];
      continue;
    }
    float* o = a.out + out_row(i) * Dv;
    const auto inv = V::set1(sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f);  // no allowed key: zeros
    std::int64_t d = 0;
    for (; d + W <= Dv; d += W) V::store(o + d, V::mul(V::load(ai + d), inv));
    if (d < Dv) V::store_n(o + d, V::mul(V::load_n(ai + d, Dv - d), inv), Dv - d);
  }
}

// The keys some token of the task may read, in order, into tk.keys (branch-free compaction); returns
// their count.
inline std::int64_t compact_keys(const attention_args& a, const attention_task& tk, std::int64_t tokens, const std::uint8_t* allow0) {
  std::int32_t* keys = tk.keys;
  std::int64_t nk = 0;
  if (tokens == 1) {
    for (std::int64_t c = tk.c0; c < tk.c1; ++c) {
      keys[nk] = static_cast<std::int32_t>(c);
      nk += allow0[c] != 0;
    }
    return nk;
  }
  const std::int64_t len = tk.c1 - tk.c0;
  std::uint8_t* any = tk.any;
  for (std::int64_t c = 0; c < len; ++c) any[c] = allow0[tk.c0 + c];
  for (std::int64_t t = 1; t < tokens; ++t) {
    const std::uint8_t* row = allow0 + t * a.C + tk.c0;
    for (std::int64_t c = 0; c < len; ++c) any[c] |= row[c];
  }
  for (std::int64_t c = 0; c < len; ++c) {
    keys[nk] = static_cast<std::int32_t>(tk.c0 + c);
    nk += any[c] != 0;
  }
  return nk;
}

// The most tokens a per-query task takes together (a verify window of 16 drafts and its pending token).
inline constexpr std::int64_t per_query_tokens = 32;

// A decode task (one token; see attention_task): flash attention over tiles of the compacted keys, the
// token's queries of every kv head of the task against each tile's K and V rows, which are read from
// memory once (all heads of a key are adjacent). Every compacted key is allowed: no mask.
//
// A verify window's tokens (attention_args::per_token) come as one task over their row's keys, each
// token computed exactly as a decode task of its own would compute it: token t reads the first
// reach[t] of the window's keys (each token's keys a prefix of the next one's, as a causal mask makes
// them), so its tiles are the decode task's tiles, cut short where its keys end; its padding lanes are
// dropped as decode's are, and its P.V blocks stop where decode's would. What the tokens share is the
// reading: each tile's K and V rows come from memory once for the whole window, where tasks of one token
// each read them once per token. Tokens whose keys are not prefixes of each other (a sliding window
// that moves within the window) run one after the other.
template <class V, kv_elem E>
void attention_task_typed(const attention_args& a, const attention_task& tk) {
  using K = kv_rows<V, E>;
  constexpr int W = V::width;
  constexpr std::int64_t tile = attention_tile;
  using R = typename V::reg;
  const std::int64_t G = a.Hq / a.Hkv, heads = tk.kh1 - tk.kh0, gq = heads * G, tokens = tk.t1 - tk.t0, nq = tokens * gq;
  const std::int64_t D = a.D, Dv = a.Dv, C = a.C, Vw = a.Vw > 0 ? a.Vw : a.Dv;
  const std::int32_t* index = a.index + tk.r * C;
  const std::uint8_t* allow0 = a.allow + (tk.r * a.T + tk.t0) * C;
  // Query i is token t0 + i / gq's query head kh0 G + i % gq, of kv head kh0 + i % gq / G.
  auto q_row = [&](std::int64_t i) { return (tk.r * a.T + tk.t0 + i / gq) * a.Hq + tk.kh0 * G + i % gq; };

  // The keys some token of the task may read, in order, and how many of them each token reads.
  const std::int32_t* keys = tk.keys;
  const std::int64_t nk = compact_keys(a, tk, tokens, allow0);
  std::int64_t reach[per_query_tokens];
  bool prefixes = tokens <= per_query_tokens;
  if (tokens == 1) {
    reach[0] = nk;
  } else {
    for (std::int64_t t = 0; t < tokens && prefixes; ++t) {
      const std::uint8_t* row = allow0 + t * C;
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < nk; ++j) {
        if (row[keys[j]] == 0) continue;
        prefixes = prefixes && n == j;
        ++n;
      }
      reach[t] = n;
    }
  }
  if (!prefixes) {
    for (std::int64_t t = tk.t0; t < tk.t1; ++t) {
      attention_task one = tk;
      one.t0 = t;
      one.t1 = t + 1;
      one.ahead = nullptr;
      if (tk.part) one.part = tk.part + (t - tk.t0) * gq * (Dv + 2);
      attention_task_typed<V, E>(a, one);
    }
    return;
  }

  // Scratch (layout in kernels_table.hpp): queries pre-scaled (by scale / softcap under a softcap,
  // whose tanh then takes the dot product as is), output accumulators, running max and sum, and the
  // tile's scores (then weights) per query.
  float* qs = tk.scratch;
  float* acc = qs + nq * D;
  float* mx = acc + nq * Dv;
  float* sum = mx + nq;
  float* sp = sum + nq;
  const bool capped = a.softcap > 0.0f;
  const R qmul = V::set1(capped ? a.scale / a.softcap : a.scale);
  for (std::int64_t i = 0; i < nq; ++i) {
    const float* src = a.q + q_row(i) * D;
    float* dst = qs + i * D;
    std::int64_t d = 0;
    for (; d + W <= D; d += W) V::store(dst + d, V::mul(V::load(src + d), qmul));
    if (d < D) V::store_n(dst + d, V::mul(V::load_n(src + d, D - d), qmul), D - d);
    for (std::int64_t e = 0; e < Dv; ++e) acc[i * Dv + e] = 0.0f;
    mx[i] = -INFINITY;
    sum[i] = 0.0f;
  }

  const unsigned char* rows[2][2][tile];  // [current / next tile][K / V]: the task's first kv head in each row
  const R cap = V::set1(a.softcap);
  // Lines of one key's K (and V) rows over the task's kv heads, which are adjacent in memory.
  const std::int64_t k_lines = (K::bytes(heads * D) + 63) / 64, v_lines = (K::bytes(heads * Vw) + 63) / 64;
  // Keys per step of the P.V loop: their V rows (8 KiB) stay in L1 while every query of the task
  // reads them, whatever the row stride (a stride of 512 bytes maps a whole tile onto few L1 sets).
  const std::int64_t pv_block = Dv * 4 * 32 <= 8192 ? 32 : Dv * 4 * 16 <= 8192 ? 16 : 8;
  const auto* kbase = static_cast<const unsigned char*>(a.k);
  const auto* vbase = static_cast<const unsigned char*>(a.v);
  auto locate = [&](std::int64_t from, const unsigned char** kr, const unsigned char** vr) {
    const std::int64_t n = nk - from < tile ? nk - from : tile;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t row = index[keys[from + j]];
      kr[j] = kbase + K::bytes((row * a.Hkv + tk.kh0) * D);
      vr[j] = vbase + K::bytes((row * a.Hkv + tk.kh0) * Vw);
    }
    return n;
  };
  // The first tile's rows of the task this thread runs next (a decode task over the same kv heads).
  auto locate_ahead = [&](const attention_task& nx, const unsigned char** kr, const unsigned char** vr) {
    const std::int32_t* nindex = a.index + nx.r * C;
    const std::uint8_t* nallow = a.allow + (nx.r * a.T + nx.t0) * C;
    std::int64_t n = 0;
    for (std::int64_t c = nx.c0; c < nx.c1 && n < tile; ++c) {
      if (!nallow[c]) continue;
      const std::int64_t row = nindex[c];
      kr[n] = kbase + K::bytes((row * a.Hkv + nx.kh0) * D);
      vr[n] = vbase + K::bytes((row * a.Hkv + nx.kh0) * Vw);
      ++n;
    }
    return n;
  };
  // The rows of the next tile are fetched while this one is computed, a block at a time alongside
  // the loops that read the same block of this tile: the rows are scattered (paged KV), so the
  // hardware prefetcher cannot guess them, and all at once would overflow the miss queues.
  auto prefetch = [](const unsigned char* const* r, std::int64_t from, std::int64_t to, std::int64_t lines) {
    for (std::int64_t j = from; j < to; ++j)
      for (std::int64_t l = 0; l < lines; ++l) __builtin_prefetch(r[j] + l * 64, 0, 2);
  };
  if (nk > 0) {
    // The first tile's rows are fetched here, all at once: nothing fetched them ahead, and a decode
    // row's short context is often a task's only tile. (One at a time in the loops, a batch of short
    // rows ran at memory latency: 16 rows of 60 keys, caches past the last level, read 11 GB/s.)
    const std::int64_t n0 = locate(0, rows[0][0], rows[0][1]);
    prefetch(rows[0][0], 0, n0, k_lines);
    prefetch(rows[0][1], 0, n0, v_lines);
  }
  for (std::int64_t base = 0, cur = 0; base < nk; base += tile, cur ^= 1) {
    const unsigned char** kp = rows[cur][0];
    const unsigned char** vp = rows[cur][1];
    const std::int64_t n = nk - base < tile ? nk - base : tile;
    const std::int64_t nw = (n + W - 1) / W * W;
    const std::int64_t next = base + tile < nk ? locate(base + tile, rows[cur ^ 1][0], rows[cur ^ 1][1])
                              : tk.ahead ? locate_ahead(*tk.ahead, rows[cur ^ 1][0], rows[cur ^ 1][1]) : 0;
    for (std::int64_t j = n; j < nw; ++j) kp[j] = kp[0];  // padding lanes read a real row, then are dropped

    // Token t's keys in this tile: its first n_of(t) (none once its keys are done).
    auto n_of = [&](std::int64_t t) { return reach[t] - base < n ? (reach[t] > base ? reach[t] - base : 0) : n; };

    // Scores, key block outer: the block's rows of K stay in L1 for every query. On AVX2 (V::sum_quad)
    // the queries of one kv head go three (or two) at a time over the block's keys: a token's query
    // heads of a kv head, and in a verify window (one kv head a task) the query heads of every token
    // still reading keys here; each score is the one score_block gives. Then the softcap and ALiBi on
    // what they stored.
    bool grouped = false;
    if constexpr (requires { V::sum_quad; }) grouped = D % W == 0;
    for (std::int64_t jb = 0; jb < nw; jb += W) {
      prefetch(rows[cur ^ 1][0], jb < next ? jb : next, jb + W < next ? jb + W : next, k_lines);
      // Queries [i, end), all reading kv head off / D.
      auto score_run = [&](std::int64_t i, std::int64_t end, std::int64_t off) {
        if constexpr (requires { V::sum_quad; }) {
          while (grouped && end - i >= 2) {
            if (end - i == 2 || end - i == 4) {
              score_queries<V, K, 2>(qs + i * D, kp + jb, off, D, sp + i * tile + jb, tile);
              i += 2;
            } else {
              score_queries<V, K, 3>(qs + i * D, kp + jb, off, D, sp + i * tile + jb, tile);
              i += 3;
            }
          }
        }
        for (; i < end; ++i) V::store(sp + i * tile + jb, score_block<V, K>(qs + i * D, kp + jb, off, D));
      };
      for (std::int64_t t = 0; t < tokens;) {
        if (jb >= n_of(t)) {  // past the token's keys (its padding lanes are dropped below)
          ++t;
          continue;
        }
        if (heads == 1) {  // the run of tokens reading this block: their queries are consecutive
          std::int64_t te = t + 1;
          while (te < tokens && jb < n_of(te)) ++te;
          score_run(t * gq, te * gq, 0);
          t = te;
        } else {
          for (std::int64_t h = 0; h < heads; ++h) score_run(t * gq + h * G, t * gq + h * G + G, h * D);
          ++t;
        }
      }
      if (!capped && !a.alibi_slopes) continue;
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int64_t nt = n_of(t);
        if (jb >= nt) continue;
        const float* drow = a.alibi_slopes ? a.alibi_dist + (tk.r * a.T + tk.t0 + t) * C : nullptr;
        // ALiBi: the block's key-minus-query distances (padding lanes 0, dropped later).
        alignas(64) float dist[W] = {};
        if (drow)
          for (std::int64_t l = 0; l < W; ++l) dist[l] = jb + l < nt ? drow[keys[base + jb + l]] : 0.0f;
        for (std::int64_t i = t * gq; i < (t + 1) * gq; ++i) {
          R sc = V::load(sp + i * tile + jb);
          if (capped) sc = V::mul(cap, v_tanh<V>(sc));
          if (drow) sc = V::add(sc, V::mul(V::set1(a.alibi_slopes[tk.kh0 * G + i % gq]), V::load(dist)));
          V::store(sp + i * tile + jb, sc);
        }
      }
    }

    // The online-softmax update of each query: new max, rescale of what was accumulated, weights.
    for (std::int64_t i = 0; i < nq; ++i) {
      const std::int64_t n = n_of(i / gq), nw = (n + W - 1) / W * W;
      if (n == 0) continue;
      float* si = sp + i * tile;
      for (std::int64_t j = n; j < nw; ++j) si[j] = -INFINITY;
      R mv = V::set1(-INFINITY);
      for (std::int64_t jb = 0; jb < nw; jb += W) mv = V::max(V::load(si + jb), mv);
      const float tile_max = V::reduce_max(mv);
      const float m_new = tile_max > mx[i] ? tile_max : mx[i];
      if (m_new == -INFINITY) {  // every score -inf: no weight anywhere
        for (std::int64_t jb = 0; jb < nw; jb += W) V::store(si + jb, V::zero());
        continue;
      }
      const float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m_new);
      const R mn = V::set1(m_new);
      R ps = V::zero();
      for (std::int64_t jb = 0; jb < nw; jb += W) {
        const R e = v_exp<V>(V::sub(V::load(si + jb), mn));
        V::store(si + jb, e);
        ps = V::add(ps, e);
      }
      sum[i] = sum[i] * corr + V::reduce_add(ps);
      mx[i] = m_new;
      if (corr != 1.0f) {
        float* ai = acc + i * Dv;
        const R cv = V::set1(corr);
        std::int64_t d = 0;
        for (; d + W <= Dv; d += W) V::store(ai + d, V::mul(V::load(ai + d), cv));
        if (d < Dv) V::store_n(ai + d, V::mul(V::load_n(ai + d, Dv - d), cv), Dv - d);
      }
    }

    // P.V, key block outer, every query per block (each token's blocks cut where its keys end).
    for (std::int64_t jb = 0; jb < n; jb += pv_block) {
      const std::int64_t kb = n - jb < pv_block ? n - jb : pv_block;
      prefetch(rows[cur ^ 1][1], jb < next ? jb : next, jb + kb < next ? jb + kb : next, v_lines);
      for (std::int64_t i = 0; i < nq; ++i) {
        const std::int64_t nt = n_of(i / gq);
        if (jb >= nt) continue;
        accumulate_pv<V, K>(acc + i * Dv, sp + i * tile + jb, vp + jb, i % gq / G * Vw, nt - jb < kb ? nt - jb : kb, Dv);
      }
    }
  }

  finish_queries<V>(a, tk, nq, acc, mx, sum, q_row);
}

// A row's first n values of a KV cache as f32 (a typed cache's tile decoded once for every query).
template <class V, class K>
void decode_kv_row(const unsigned char* src, std::int64_t n, float* dst) {
  constexpr int W = V::width;
  std::int64_t d = 0;
  for (; d + W <= n; d += W) V::store(dst + d, K::load(src, d));
  if (d < n) V::store_n(dst + d, K::load_n(src, d, n - d), n - d);
}

// A task of several tokens over one kv head (prefill and verify windows), as a small GEMM: the task's
// queries are transposed once ([D][nqp], nqp the query count rounded up to 16), so each key's scores
// against every query come out as vectors over queries (no horizontal sums), the online softmax runs
// down those vectors, and P.V accumulates four queries at a time against each value vector. A typed
// cache's tile is decoded to f32 once for all the queries. Layout of the scratch: qt [D][nqp], scores
// [tile][nqp], max, sum and correction [nqp], accumulators [nq4][Dv] (nq4: nq rounded up to 4), the
// decoded tile [tile][D] and [tile][Dv] (attention_block_scratch_floats).
template <class V, kv_elem E>
void attention_task_block(const attention_args& a, const attention_task& tk) {
  using K = kv_rows<V, E>;
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr std::int64_t tile = attention_tile;
  const std::int64_t G = a.Hq / a.Hkv, tokens = tk.t1 - tk.t0, nq = tokens * G;
  const std::int64_t nqp = (nq + 15) / 16 * 16, nq4 = (nq + 3) / 4 * 4;
  const std::int64_t D = a.D, Dv = a.Dv, C = a.C, Vw = a.Vw > 0 ? a.Vw : a.Dv;
  const std::int32_t* index = a.index + tk.r * C;
  const std::uint8_t* allow0 = a.allow + (tk.r * a.T + tk.t0) * C;
  const std::int64_t nk = compact_keys(a, tk, tokens, allow0);
  const std::int32_t* keys = tk.keys;

  float* qt = tk.scratch;
  float* st = qt + D * nqp;
  float* mx = st + tile * nqp;
  float* sum = mx + nqp;
  float* corr = sum + nqp;
  float* acc = corr + nqp;
  float* kf = acc + (nq4 * Dv + 15) / 16 * 16;
  float* vf = kf + tile * D;
  const bool capped = a.softcap > 0.0f;
  const float qmul = capped ? a.scale / a.softcap : a.scale;
  // Query i is token i / G and query head kh0 G + i % G.
  for (std::int64_t i = 0; i < nqp; ++i) {
    const float* q = i < nq ? a.q + ((tk.r * a.T + tk.t0 + i / G) * a.Hq + tk.kh0 * G + i % G) * D : nullptr;
    for (std::int64_t d = 0; d < D; ++d) qt[d * nqp + i] = q ? q[d] * qmul : 0.0f;
    mx[i] = -INFINITY;
    sum[i] = 0.0f;
  }
  for (std::int64_t e = 0; e < nq4 * Dv; ++e) acc[e] = 0.0f;

  const auto* kbase = static_cast<const unsigned char*>(a.k);
  const auto* vbase = static_cast<const unsigned char*>(a.v);
  const R cap = V::set1(a.softcap), ninf = V::set1(-INFINITY);
  const float* kr[tile];
  const float* vr[tile];
  for (std::int64_t base = 0; base < nk; base += tile) {
    const std::int64_t n = nk - base < tile ? nk - base : tile;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t row = index[keys[base + j]];
      const unsigned char* kb = kbase + K::bytes((row * a.Hkv + tk.kh0) * D);
      const unsigned char* vb = vbase + K::bytes((row * a.Hkv + tk.kh0) * Vw);
      if constexpr (E == kv_elem::f32) {
        kr[j] = reinterpret_cast<const float*>(kb);
        vr[j] = reinterpret_cast<const float*>(vb);
      } else {
        decode_kv_row<V, K>(kb, D, kf + j * D);
        decode_kv_row<V, K>(vb, Dv, vf + j * Dv);
        kr[j] = kf + j * D;
        vr[j] = vf + j * Dv;
      }
    }

    // Scores: key j against every query. Two query vectors by NK keys in registers (AVX2: 12 chains
    // from 2 loads and 6 broadcasts a step of d; the one-vector form below needed 9 loads for 8 FMAs and
    // ran at the load ports' rate); each score is the same FMA chain over d either way.
    constexpr int NK = W >= 16 ? 12 : 6;
    std::int64_t qb = 0;
    for (; qb + 2 * W <= nqp; qb += 2 * W) {
      auto keys_block = [&]<int U>(std::int64_t j) {  // keys j .. j + U - 1 against the two query vectors
        R s0[U], s1[U];
        const float* kj[U];
#pragma GCC unroll 12
        for (int u = 0; u < U; ++u) s0[u] = V::zero(), s1[u] = V::zero(), kj[u] = kr[j + u];
        for (std::int64_t d = 0; d < D; ++d) {
          const R q0 = V::load(qt + d * nqp + qb), q1 = V::load(qt + d * nqp + qb + W);
#pragma GCC unroll 12
          for (int u = 0; u < U; ++u) {
            const R kv = V::set1(kj[u][d]);
            s0[u] = V::fma(q0, kv, s0[u]);
            s1[u] = V::fma(q1, kv, s1[u]);
          }
        }
#pragma GCC unroll 12
        for (int u = 0; u < U; ++u) {
          V::store(st + (j + u) * nqp + qb, capped ? V::mul(cap, v_tanh<V>(s0[u])) : s0[u]);
          V::store(st + (j + u) * nqp + qb + W, capped ? V::mul(cap, v_tanh<V>(s1[u])) : s1[u]);
        }
      };
      std::int64_t j = 0;
      for (; j + NK <= n; j += NK) keys_block.template operator()<NK>(j);
      for (; j + 4 <= n; j += 4) keys_block.template operator()<4>(j);  // a tile's last keys (64 = 10 x 6 + 4 on AVX2)
      for (; j < n; ++j) keys_block.template operator()<1>(j);
    }
    for (; qb < nqp; qb += W) {
      std::int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        R s[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) s[u] = V::zero();
        for (std::int64_t d = 0; d < D; ++d) {
          const R qv = V::load(qt + d * nqp + qb);
#pragma GCC unroll 8
          for (int u = 0; u < 8; ++u) s[u] = V::fma(qv, V::set1(kr[j + u][d]), s[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) V::store(st + (j + u) * nqp + qb, capped ? V::mul(cap, v_tanh<V>(s[u])) : s[u]);
      }
      for (; j < n; ++j) {
        R s0 = V::zero();
        for (std::int64_t d = 0; d < D; ++d) s0 = V::fma(V::load(qt + d * nqp + qb), V::set1(kr[j][d]), s0);
        V::store(st + j * nqp + qb, capped ? V::mul(cap, v_tanh<V>(s0)) : s0);
      }
    }
    // ALiBi's slope times each key's distance from the token, then the masked (token, key) pairs (a
    // causal diagonal, a window's edge, a verify window's own future). A token that may read every key
    // of the tile (below a causal diagonal: most tiles of a long prefill) has nothing to mask; where the
    // tile's keys are consecutive, its mask row is one contiguous run to check.
    const bool consecutive = n > 0 && keys[base + n - 1] - keys[base] == n - 1;
    for (std::int64_t tt = 0; tt < tokens; ++tt) {
      const std::uint8_t* at = allow0 + tt * C;
      const float* drow = a.alibi_slopes ? a.alibi_dist + (tk.r * a.T + tk.t0 + tt) * C : nullptr;
      if (!drow && consecutive && std::memchr(at + keys[base], 0, static_cast<std::size_t>(n)) == nullptr) continue;
      for (std::int64_t j = 0; j < n; ++j) {
        float* sj = st + j * nqp + tt * G;
        if (at[keys[base + j]] == 0) {
          for (std::int64_t g = 0; g < G; ++g) sj[g] = -INFINITY;
        } else if (drow) {
          const float dist = drow[keys[base + j]];
          for (std::int64_t g = 0; g < G; ++g) sj[g] += a.alibi_slopes[tk.kh0 * G + g] * dist;
        }
      }
    }

    // The online softmax, down each column of queries: new max, weights, sum, correction.
    for (std::int64_t qb = 0; qb < nqp; qb += W) {
      R m = ninf;
      for (std::int64_t j = 0; j < n; ++j) m = V::max(V::load(st + j * nqp + qb), m);
      const R old = V::load(mx + qb);
      const R m_new = V::max(m, old);
      const R m_use = V::select(V::eq(m_new, ninf), V::zero(), m_new);  // nothing allowed yet: weights 0
      const R c = V::select(V::eq(old, ninf), V::zero(), v_exp<V>(V::sub(old, m_use)));
      R ps = V::zero();
      for (std::int64_t j = 0; j < n; ++j) {
        const R x = V::load(st + j * nqp + qb);
        const R e = V::select(V::eq(x, ninf), V::zero(), v_exp<V>(V::sub(x, m_use)));
        V::store(st + j * nqp + qb, e);
        ps = V::add(ps, e);
      }
      V::store(sum + qb, V::fma(V::load(sum + qb), c, ps));
      V::store(mx + qb, m_new);
      V::store(corr + qb, c);
    }

    // P.V: four queries by two value vectors in registers across the tile's keys.
    for (std::int64_t i0 = 0; i0 < nq4; i0 += 4) {
      for (std::int64_t i = i0; i < i0 + 4; ++i) {
        const float c = corr[i];
        if (c == 1.0f) continue;
        for (std::int64_t e = 0; e < Dv; ++e) acc[i * Dv + e] *= c;
      }
      std::int64_t d = 0;
      // Four queries by NV value vectors in registers (AVX2 three: 12 chains from 3 loads and 4
      // broadcasts a key; AVX-512 four), then two, then the rest; each output the same chain over keys.
      auto block = [&]<int NV>(std::int64_t d0) {
        R r[4][NV];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
          for (int b = 0; b < NV; ++b) r[q][b] = V::load(acc + (i0 + q) * Dv + d0 + b * W);
        for (std::int64_t j = 0; j < n; ++j) {
          R v[NV];
#pragma GCC unroll 4
          for (int b = 0; b < NV; ++b) v[b] = V::load(vr[j] + d0 + b * W);
          const float* pj = st + j * nqp + i0;
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const R p = V::set1(pj[q]);
#pragma GCC unroll 4
            for (int b = 0; b < NV; ++b) r[q][b] = V::fma(p, v[b], r[q][b]);
          }
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
          for (int b = 0; b < NV; ++b) V::store(acc + (i0 + q) * Dv + d0 + b * W, r[q][b]);
      };
      constexpr int NVmax = W >= 16 ? 4 : 3;
      for (; d + NVmax * W <= Dv; d += NVmax * W) block.template operator()<NVmax>(d);
      for (; d + 2 * W <= Dv; d += 2 * W) {
        R r[4][2];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) r[q][0] = V::load(acc + (i0 + q) * Dv + d), r[q][1] = V::load(acc + (i0 + q) * Dv + d + W);
        for (std::int64_t j = 0; j < n; ++j) {
          const R v0 = V::load(vr[j] + d), v1 = V::load(vr[j] + d + W);
          const float* pj = st + j * nqp + i0;
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const R p = V::set1(pj[q]);
            r[q][0] = V::fma(p, v0, r[q][0]);
            r[q][1] = V::fma(p, v1, r[q][1]);
          }
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) V::store(acc + (i0 + q) * Dv + d, r[q][0]), V::store(acc + (i0 + q) * Dv + d + W, r[q][1]);
      }
      for (; d < Dv; d += W) {
        const std::int64_t part = Dv - d < W ? Dv - d : W;
        R r[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) r[q] = V::load_n(acc + (i0 + q) * Dv + d, part);
        for (std::int64_t j = 0; j < n; ++j) {
          const R v0 = V::load_n(vr[j] + d, part);
          const float* pj = st + j * nqp + i0;
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) r[q] = V::fma(V::set1(pj[q]), v0, r[q]);
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) V::store_n(acc + (i0 + q) * Dv + d, r[q], part);
      }
    }
  }

  finish_queries<V>(a, tk, nq, acc, mx, sum, [&](std::int64_t i) { return (tk.r * a.T + tk.t0 + i / G) * a.Hq + tk.kh0 * G + i % G; });
}

// The task over keys and values of the args' element type: several tokens (over one kv head: the plan
// gives a multi-token task one) as the block form, a decode token as the per-query form.
template <class V>
void attention_task_run(const attention_args& a, const attention_task& tk) {
  if (tk.t1 - tk.t0 > 1 && !a.per_token) {
    switch (a.kv) {
      case kv_elem::f32: return attention_task_block<V, kv_elem::f32>(a, tk);
      case kv_elem::f16: return attention_task_block<V, kv_elem::f16>(a, tk);
      case kv_elem::bf16: return attention_task_block<V, kv_elem::bf16>(a, tk);
      case kv_elem::q8_0: return attention_task_block<V, kv_elem::q8_0>(a, tk);
    }
  }
  switch (a.kv) {
    case kv_elem::f32: return attention_task_typed<V, kv_elem::f32>(a, tk);
    case kv_elem::f16: return attention_task_typed<V, kv_elem::f16>(a, tk);
    case kv_elem::bf16: return attention_task_typed<V, kv_elem::bf16>(a, tk);
    case kv_elem::q8_0: return attention_task_typed<V, kv_elem::q8_0>(a, tk);
  }
}

// Mamba2's selective scan over heads [h0, h1) of one row, the state's N lanes in vectors:
// s = e^(d A) s + d x B, y = s . C per real token (recurrent_math.hpp: ssm_scan_row). Four state rows
// (p) at a time share each vector of B and C and keep four independent sums, so a vector of state costs
// one load, one store and three arithmetic ops.
template <class V>
void ssm_scan_heads(const ssm_scan_args& a, std::int64_t h0, std::int64_t h1) {
  constexpr int W = V::width;
  using R = typename V::reg;
  const std::int64_t T = a.T, H = a.H, P = a.P, G = a.G, N = a.N;
  const std::int64_t Nw = N / W * W;
  float* st = a.out + T * H * P;
  for (std::int64_t h = h0; h < h1; ++h) {
    float* sh = st + h * P * N;
    if (a.state) std::memcpy(sh, a.state + h * P * N, static_cast<std::size_t>(P * N) * sizeof(float));
    else std::fill(sh, sh + P * N, 0.0f);
    const std::int64_t g = h / (H / G);
    for (std::int64_t t = 0; t < T; ++t) {
      float* y = a.out + (t * H + h) * P;
      if (a.write[t] < 0) {
        for (std::int64_t p = 0; p < P; ++p) y[p] = 0.0f;
        continue;
      }
      const float dv = a.dt[t * H + h];
      const float d = dv > 20.0f ? dv : log1pf(expf(dv));
      const R dA = V::set1(expf(d * a.A[h]));
      const float* b = a.B + (t * G + g) * N;
      const float* c = a.C + (t * G + g) * N;
      const float* x = a.x + (t * H + h) * P;
      std::int64_t p = 0;
      for (; p + 4 <= P; p += 4) {
        const R xd0 = V::set1(x[p] * d), xd1 = V::set1(x[p + 1] * d), xd2 = V::set1(x[p + 2] * d), xd3 = V::set1(x[p + 3] * d);
        float* s0 = sh + p * N;
        float *s1 = s0 + N, *s2 = s1 + N, *s3 = s2 + N;
        R acc0 = V::zero(), acc1 = V::zero(), acc2 = V::zero(), acc3 = V::zero();
        const auto lane = [&](std::int64_t k, std::int64_t n, R bv, R cv) {
          const auto ld = [&](const float* q) { return n == W ? V::load(q + k) : V::load_n(q + k, n); };
          const auto sto = [&](float* q, R v) { n == W ? V::store(q + k, v) : V::store_n(q + k, v, n); };
          const R v0 = V::fma(bv, xd0, V::mul(ld(s0), dA)), v1 = V::fma(bv, xd1, V::mul(ld(s1), dA));
          const R v2 = V::fma(bv, xd2, V::mul(ld(s2), dA)), v3 = V::fma(bv, xd3, V::mul(ld(s3), dA));
          sto(s0, v0);
          sto(s1, v1);
          sto(s2, v2);
          sto(s3, v3);
          acc0 = V::fma(v0, cv, acc0);
          acc1 = V::fma(v1, cv, acc1);
          acc2 = V::fma(v2, cv, acc2);
          acc3 = V::fma(v3, cv, acc3);
        };
        std::int64_t k = 0;
        for (; k < Nw; k += W) lane(k, W, V::load(b + k), V::load(c + k));
        if (k < N) lane(k, N - k, V::load_n(b + k, N - k), V::load_n(c + k, N - k));
        y[p] = V::reduce_add(acc0);
        y[p + 1] = V::reduce_add(acc1);
        y[p + 2] = V::reduce_add(acc2);
        y[p + 3] = V::reduce_add(acc3);
      }
      for (; p < P; ++p) {
        const R xd = V::set1(x[p] * d);
        float* sp = sh + p * N;
        R acc = V::zero();
        std::int64_t k = 0;
        for (; k < Nw; k += W) {
          const R sv = V::fma(V::load(b + k), xd, V::mul(V::load(sp + k), dA));
          V::store(sp + k, sv);
          acc = V::fma(sv, V::load(c + k), acc);
        }
        if (k < N) {
          const R sv = V::fma(V::load_n(b + k, N - k), xd, V::mul(V::load_n(sp + k, N - k), dA));
          V::store_n(sp + k, sv, N - k);
          acc = V::fma(sv, V::load_n(c + k, N - k), acc);
        }
        y[p] = V::reduce_add(acc);
      }
    }
  }
}

// The causal depthwise convolution over channels [c0, c1) of one row, W channels to a vector: each
// real token's output is the K weights against the window of the K-1 inputs before it and its own, the
// window carried in a small ring of vectors (recurrent_math.hpp: ssm_conv_row).
template <class V>
void ssm_conv_channels(const ssm_conv_args& a, std::int64_t c0, std::int64_t c1) {
  constexpr int W = V::width;
  constexpr std::int64_t max_k = 8;
  using R = typename V::reg;
  const std::int64_t T = a.T, C = a.C, K = a.K, Km1 = K - 1;
  float* st = a.out + T * C;
  for (std::int64_t c = c0; c < c1; c += W) {
    const std::int64_t lanes = std::min<std::int64_t>(W, c1 - c);
    const auto ld = [&](const float* p) { return lanes == W ? V::load(p) : V::load_n(p, lanes); };
    const auto sto = [&](float* p, R v) { lanes == W ? V::store(p, v) : V::store_n(p, v, lanes); };
    if (K > max_k) {  // a kernel wider than the ring: the window from memory, as the meaning reads it
      for (std::int64_t j = 0; j < Km1; ++j) sto(st + j * C + c, a.state ? ld(a.state + j * C + c) : V::zero());
      for (std::int64_t t = 0; t < T; ++t) {
        if (a.write[t] < 0) continue;
        const R xin = ld(a.x + t * C + c);
        R acc = V::mul(ld(a.w_t + Km1 * C + c), xin);
        for (std::int64_t k = 0; k < Km1; ++k) acc = V::fma(ld(a.w_t + k * C + c), ld(st + k * C + c), acc);
        sto(a.out + t * C + c, acc);
        for (std::int64_t k = 0; k + 1 < Km1; ++k) sto(st + k * C + c, ld(st + (k + 1) * C + c));
        if (Km1 > 0) sto(st + (Km1 - 1) * C + c, xin);
      }
      continue;
    }
    R w[max_k], win[max_k];
    for (std::int64_t k = 0; k < K; ++k) w[k] = ld(a.w_t + k * C + c);
    for (std::int64_t j = 0; j < Km1; ++j) win[j] = a.state ? ld(a.state + j * C + c) : V::zero();
    std::int64_t head = 0;  // win[(head + j) % Km1] is the j-th oldest input of the window
    for (std::int64_t t = 0; t < T; ++t) {
      if (a.write[t] < 0) continue;
      const R xin = ld(a.x + t * C + c);
      R acc = V::mul(w[Km1], xin);
      for (std::int64_t j = 0, s = head; j < Km1; ++j, s = s + 1 == Km1 ? 0 : s + 1) acc = V::fma(w[j], win[s], acc);
      sto(a.out + t * C + c, acc);
      if (Km1 > 0) {
        win[head] = xin;  // the oldest input leaves, this one enters as the newest
        head = head + 1 == Km1 ? 0 : head + 1;
      }
    }
    for (std::int64_t j = 0, s = head; j < Km1; ++j, s = s + 1 == Km1 ? 0 : s + 1) sto(st + j * C + c, win[s]);
  }
}

// The gated delta rule over heads [h0, h1) of one row, each state row's Dk lanes in vectors:
// S = e^g S; u = beta (v - S k); S += u k^T; o = S q (recurrent_math.hpp: delta_rule_row). Up to four
// state rows at a time share each vector of k and q; S k is taken on the state before its decay and
// scaled after (one pass reads the rows, the second decays, updates and stores them).
template <class V>
void delta_rule_heads(const delta_rule_args& a, std::int64_t h0, std::int64_t h1) {
  constexpr int W = V::width;
  constexpr int rows_at_once = 4;
  using R = typename V::reg;
  const std::int64_t T = a.T, Hk = a.Hk, Dk = a.Dk, H = a.H, Dv = a.Dv;
  float* st = a.out + T * H * Dv;
  std::vector<float> spare(static_cast<std::size_t>(Dv % rows_at_once ? Dk : 0));  // the rows past Dv of a last block of four
  std::vector<float> decays(static_cast<std::size_t>(T));
  for (std::int64_t h = h0; h < h1; ++h) {
    float* sh = st + h * Dv * Dk;
    if (a.state) std::memcpy(sh, a.state + h * Dv * Dk, static_cast<std::size_t>(Dv * Dk) * sizeof(float));
    else std::fill(sh, sh + Dv * Dk, 0.0f);
    const std::int64_t kh = h / (H / Hk);
    for (std::int64_t t = 0; t < T; ++t) {
      decays[static_cast<std::size_t>(t)] = expf(a.g[t * H + h]);
      if (a.write[t] < 0)
        for (std::int64_t i = 0; i < Dv; ++i) a.out[(t * H + h) * Dv + i] = 0.0f;
    }
    // Each state row evolves on its own (its update reads only itself, k, q, v and the gates), so a
    // block of four rows walks every token while it stays in L1: the head's state (64 KiB at 128 x
    // 128) is not streamed through L2 once per token.
    for (std::int64_t i0 = 0; i0 < Dv; i0 += rows_at_once) {
      const int m = static_cast<int>(std::min<std::int64_t>(rows_at_once, Dv - i0));
      // The block's rows; past m, a scratch row whose results are never read.
      const auto row = [&](int r) { return r < m ? sh + (i0 + r) * Dk : spare.data(); };
      float *const s0 = row(0), *const s1 = row(1), *const s2 = row(2), *const s3 = row(3);
      for (std::int64_t t = 0; t < T; ++t) {
        if (a.write[t] < 0) continue;
        float* o = a.out + (t * H + h) * Dv;
        const float decay_f = decays[static_cast<std::size_t>(t)];
        const R decay = V::set1(decay_f);
        const float beta = a.beta[t * H + h];
        const float* kt = a.k + (t * Hk + kh) * Dk;
        const float* qt = a.q + (t * Hk + kh) * Dk;
        const float* vt = a.v + (t * H + h) * Dv;
        // Four named sums, not an array: an array of vectors is kept on the stack, and its sums then
        // wait on store-to-load forwarding every iteration.
        R k0 = V::zero(), k1 = V::zero(), k2 = V::zero(), k3 = V::zero();
        std::int64_t j = 0;
        for (; j + W <= Dk; j += W) {
          const R kv = V::load(kt + j);
          k0 = V::fma(V::load(s0 + j), kv, k0);
          k1 = V::fma(V::load(s1 + j), kv, k1);
          k2 = V::fma(V::load(s2 + j), kv, k2);
          k3 = V::fma(V::load(s3 + j), kv, k3);
        }
        if (j < Dk) {
          const std::int64_t n = Dk - j;
          const R kv = V::load_n(kt + j, n);
          k0 = V::fma(V::load_n(s0 + j, n), kv, k0);
          k1 = V::fma(V::load_n(s1 + j, n), kv, k1);
          k2 = V::fma(V::load_n(s2 + j, n), kv, k2);
          k3 = V::fma(V::load_n(s3 + j, n), kv, k3);
        }
        const auto u_of = [&](int r, R sk) { return V::set1(beta * (vt[i0 + std::min(r, m - 1)] - decay_f * V::reduce_add(sk))); };
        const R u0 = u_of(0, k0), u1 = u_of(1, k1), u2 = u_of(2, k2), u3 = u_of(3, k3);
        R a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
        for (j = 0; j + W <= Dk; j += W) {
          const R kv = V::load(kt + j), qv = V::load(qt + j);
          const R v0 = V::fma(u0, kv, V::mul(V::load(s0 + j), decay)), v1 = V::fma(u1, kv, V::mul(V::load(s1 + j), decay));
          const R v2 = V::fma(u2, kv, V::mul(V::load(s2 + j), decay)), v3 = V::fma(u3, kv, V::mul(V::load(s3 + j), decay));
          V::store(s0 + j, v0);
          V::store(s1 + j, v1);
          V::store(s2 + j, v2);
          V::store(s3 + j, v3);
          a0 = V::fma(v0, qv, a0);
          a1 = V::fma(v1, qv, a1);
          a2 = V::fma(v2, qv, a2);
          a3 = V::fma(v3, qv, a3);
        }
        if (j < Dk) {
          const std::int64_t n = Dk - j;
          const R kv = V::load_n(kt + j, n), qv = V::load_n(qt + j, n);
          const R v0 = V::fma(u0, kv, V::mul(V::load_n(s0 + j, n), decay)), v1 = V::fma(u1, kv, V::mul(V::load_n(s1 + j, n), decay));
          const R v2 = V::fma(u2, kv, V::mul(V::load_n(s2 + j, n), decay)), v3 = V::fma(u3, kv, V::mul(V::load_n(s3 + j, n), decay));
          V::store_n(s0 + j, v0, n);
          V::store_n(s1 + j, v1, n);
          V::store_n(s2 + j, v2, n);
          V::store_n(s3 + j, v3, n);
          a0 = V::fma(v0, qv, a0);
          a1 = V::fma(v1, qv, a1);
          a2 = V::fma(v2, qv, a2);
          a3 = V::fma(v3, qv, a3);
        }
        const R acc[rows_at_once] = {a0, a1, a2, a3};
        for (int r = 0; r < m; ++r) o[i0 + r] = V::reduce_add(acc[r]);
      }
    }
  }
}

// y = x rounded to f16 (to nearest even), the whole vectors in registers and the tail one at a time.
template <class V>
void to_f16(const float* x, std::int64_t n, std::uint16_t* y) {
  constexpr int W = V::width;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) V::store_f16(y + i, V::load(x + i));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

template <class V>
constexpr kernel_table make_kernel_table() {
  return kernel_table{
      &attention_task_run<V>, &rms_norm<V>, &layer_norm<V>, &rope<V>, &softmax_rows<V>, &unary<V>, &gated<V>,
      &ssm_scan_heads<V>, &delta_rule_heads<V>, &ssm_conv_channels<V>, &binary<V>, &to_f16<V>,
  };
}

}  // namespace troupe::exec::cpu::kernels_detail

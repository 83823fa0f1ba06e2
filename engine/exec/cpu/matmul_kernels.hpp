#pragma once
// The vectorized matrix kernels, written once over a vector traits type `V` and instantiated by
// matmul_avx2.cpp (8 lanes) and matmul_avx512.cpp (16 lanes). A vector holds one lane per row of W,
// so a panel of 16 rows is 16 / V::lanes vectors ("halves" on AVX2) and results need no horizontal
// sums. Quantized formats take int8 activations and multiply 4 bytes per lane at a time (VNNI's
// vpdpbusd, or maddubs + madd on AVX2), applying each block's scales once per block.
//
// Everything here has internal linkage: each isa's file compiles it with its own -m flags, and a
// shared inline definition could let the linker hand AVX-512 code to a caller on a lesser CPU.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/exec/cpu/matmul_detail.hpp"

namespace troupe::exec::cpu::detail {
namespace {

// Calls f.operator()<R>(m) over [m0, m1) in tiles of MR rows, the remainder as one smaller tile.
template <int R, class F>
void tail_tile(std::int64_t m, std::int64_t n, F& f) {
  if constexpr (R >= 1) {
    if (n == R) {
      f.template operator()<R>(m);
    } else {
      tail_tile<R - 1>(m, n, f);
    }
  }
}

template <int MR, class F>
void each_tile(std::int64_t m0, std::int64_t m1, F&& f) {
  std::int64_t m = m0;
  for (; m + MR <= m1; m += MR) f.template operator()<MR>(m);
  if (m < m1) tail_tile<MR - 1>(m, m1 - m, f);
}

template <class T>
const T* at(const std::byte* p, std::size_t offset) {
  return reinterpret_cast<const T*>(p + offset);
}

// ---------------------------------------------------------------------------------------------
// Activation preparation.

// Symmetric int8 quantization of n (a multiple of V::lanes) floats against their largest magnitude,
// rounding to nearest even: bit-identical to the scalar level's. Returns the scale.
// With `sum`, also the sum of the codes, taken from the rounded 32-bit lanes (the codes are within
// +-127, so narrowing them keeps them).
template <class V>
float quantize_block(const float* x, int n, std::int8_t* q, int* sum = nullptr) {
  typename V::vf amax = V::zero_f();
  for (int i = 0; i < n; i += V::lanes) amax = V::max_f(amax, V::abs_f(V::loadu_f(x + i)));
  const float m = V::reduce_max(amax);
  const float id = m > 0.0f ? 127.0f / m : 0.0f;
  const typename V::vf vid = V::set1_f(id);
  typename V::vi total = V::zero_i();
  for (int i = 0; i < n; i += V::lanes) {
    const typename V::vi c = V::round_i32(V::mul_f(V::loadu_f(x + i), vid));
    V::store_i8(q + i, c);
    if (sum) total = V::add_i32(total, c);
  }
  if (sum) *sum = V::reduce_add_i32(total);
  return m / 127.0f;
}

int sum_i8(const std::int8_t* q, int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += q[i];
  return s;
}

// Block-major (act32_unit): block b of the row at out + b * block_stride.
template <class V, int Offset>
void prepare_q8_32(const float* x, std::int64_t k, std::byte* out, std::size_t block_stride) {
  for (std::int64_t b = 0; b < k / 32; ++b) {
    std::byte* u = out + static_cast<std::size_t>(b) * block_stride;
    auto* q = reinterpret_cast<std::int8_t*>(u);
    int codes = 0;
    const float d = quantize_block<V>(x + 32 * b, 32, q, Offset == 0 ? nullptr : &codes);
    const std::int32_t s = Offset * codes;
    std::memcpy(u + 32, &d, 4);
    std::memcpy(u + 36, &s, 4);
  }
}

template <class V>
void prepare_q4_k(const float* x, std::int64_t k, std::byte* out) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + act256_d(k));
  auto* s = reinterpret_cast<std::int32_t*>(out + act256_s(k));
  auto* hl = reinterpret_cast<std::int8_t*>(out + act256_hl(k));
  for (std::int64_t b = 0; b < k / 256; ++b) {
    d[b] = quantize_block<V>(x + 256 * b, 256, q + 256 * b);
    for (int j = 0; j < 8; ++j) {
      const int sum = sum_i8(q + 256 * b + 32 * j, 32);
      s[8 * b + j] = sum;
      // sum = 128 h + l with l in [0, 127]: both fit an int8 since |sum| <= 32 * 127.
      const int h = (sum >= 0 ? sum : sum - 127) / 128;
      hl[16 * b + j] = static_cast<std::int8_t>(h);
      hl[16 * b + 8 + j] = static_cast<std::int8_t>(sum - 128 * h);
    }
  }
}

template <class V, int Offset = 32>
void prepare_q6_k(const float* x, std::int64_t k, std::byte* out) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + act256_d(k));
  auto* s = reinterpret_cast<std::int32_t*>(out + act256_s(k));
  for (std::int64_t b = 0; b < k / 256; ++b) {
    d[b] = quantize_block<V>(x + 256 * b, 256, q + 256 * b);
    // The 6-bit codes are stored biased by 32 (q3_k's 3-bit ones by 4); each 16-group's correction is
    // that times its sum.
    for (int j = 0; j < 16; ++j) s[16 * b + j] = Offset * sum_i8(q + 256 * b + 16 * j, 16);
  }
}

std::size_t bytes32(std::int64_t k) { return act32_group_bytes(k); }  // a group of rows
std::size_t bytes256(std::int64_t k) { return act256_bytes(k); }

// ---------------------------------------------------------------------------------------------
// Shared pieces of the tiles.

// How far ahead of use the quantized weight streams are prefetched (into L2). Decode reads each
// weight once, straight from memory. On one core the hardware prefetcher alone kept a q4_0 panel walk
// at 12 GB/s against 30 for an f32 one (the quantized kernels issue more instructions per byte, so
// fewer misses fit their out-of-order window); prefetching 8 KiB ahead (measured against 2 to 16 KiB)
// raised it to 22. Past a panel's end it fetches the next panel, which a task usually reads next.
// Float panels stream well without it (it cost them 10%). Only a task's first row tile of each panel
// prefetches: it is the one that reads the panel from memory, and later ones find it in cache. (With
// 16 rows, batched decode, the first tile of 8 rows without prefetch ran at the pace of memory
// latency: the kernel ran 30-40% faster with it.)
constexpr std::size_t prefetch_distance = 8192;
// Both are always inlined: GCC 12 judges a function that only prefetches to have no effects and
// deletes the calls it has not inlined (as a plain function taking `on`, every prefetch vanished).
[[gnu::always_inline]] inline void prefetch(const std::byte* p) { __builtin_prefetch(p, 0, 2); }
// Prefetches the `bytes` following `p`, `distance` ahead, when `on`.
[[gnu::always_inline]] inline void prefetch_ahead(bool on, const std::byte* p, std::size_t bytes,
                                                  std::size_t distance = prefetch_distance) {
  if (on) {
    for (std::size_t o = 0; o < bytes; o += 64) prefetch(p + distance + o);
  }
}

constexpr int halves_of(int lanes) { return panel_rows / lanes; }

// How a tile walks the halves of a panel (AVX2: two halves of 8 rows). A one-row tile (decode) walks
// both in one pass over K, so each cache line of codes is used whole as it arrives from memory
// (troupe_matmul_bench at M = 1 on Zen 3, seven shapes each: q8_0 from about 70% to 77% of the read
// bandwidth, q4_0 from 65% to 80%; Qwen2.5-shape decode +8%, Qwen3-MoE-shape q8_0 decode from 67% to
// 79% of its active-bytes bound); larger tiles walk the halves one after the other, each with its own
// registers. Outer passes x halves per pass = H. The q8_0, q8_a32, nibble, IQ4 and q4_k / q5_k tiles
// take it (q4_k at M = 1: 0.54-0.64 -> 0.70-0.77 of the bandwidth on 896x4864); q6_k and the q2_k /
// q3_k forms of its tile, whose decode is bound by their unpacking rather than by memory here, showed
// no gain and keep two walks.
template <int H, int MR>
inline constexpr int halves_per_pass = MR == 1 ? H : 1;

// Rows of y a half of panel p covers.
int valid_rows(const gemm_args& a, std::int64_t p, int half, int lanes) {
  const std::int64_t first = p * panel_rows + half * lanes;
  const std::int64_t left = a.w->rows - first;
  return left >= lanes ? lanes : (left > 0 ? static_cast<int>(left) : 0);
}

template <class V>
void store_rows(const gemm_args& a, std::int64_t m, std::int64_t p, int half, typename V::vf v) {
  const int n = valid_rows(a, p, half, V::lanes);
  if (n == 0) return;
  const std::int64_t col = p * panel_rows + half * V::lanes;
  float* y = a.y + m * a.ldy + col;
  if (a.r) {
    // y = acc + r, elementwise; r may be y itself, so each lane reads r before it writes y.
    const float* r = a.r + m * a.ldr + col;
    if (n == V::lanes) {
      V::storeu_f(y, V::fmadd(V::set1_f(1.0f), V::loadu_f(r), v));
    } else {
      alignas(64) float t[V::lanes];
      V::storeu_f(t, v);
      for (int j = 0; j < n; ++j) y[j] = t[j] + r[j];
    }
    return;
  }
  if (n == V::lanes) {
    V::storeu_f(y, v);
  } else {
    V::store_partial(y, v, n);
  }
}

// A pass's sums over its halves (halves_per_pass): zeroed, and stored as rows m.. of halves h0...
template <class V, int HP, int MR>
void zero_halves(typename V::vf (&fs)[HP][MR]) {
  for (int e = 0; e < HP; ++e)
    for (int i = 0; i < MR; ++i) fs[e][i] = V::zero_f();
}
template <class V, int HP, int MR>
void store_halves(const gemm_args& a, std::int64_t m, std::int64_t p, int h0, typename V::vf (&fs)[HP][MR]) {
  for (int e = 0; e < HP; ++e)
    for (int i = 0; i < MR; ++i) store_rows<V>(a, m + i, p, h0 + e, fs[e][i]);
}

struct row_acts {
  const std::int8_t* q;
  const float* d;
  const std::int32_t* s;
  const std::int8_t* hl;
};

// A row tile's block-major 32-element activations (act32_unit): row m + i's codes, scale and sum term
// of block b. The tile must not cross a group of act32_group rows.
struct tile32 {
  static constexpr std::size_t blk = act32_unit * act32_group;  // bytes between a row's blocks
  const std::byte* base;  // row m's unit of block 0
  tile32(const gemm_args& a, std::int64_t m)
      : base(a.acts + static_cast<std::size_t>(m / act32_group) * a.act_stride + static_cast<std::size_t>(m % act32_group) * act32_unit) {}
  const std::int8_t* q(int i, std::int64_t b) const { return at<std::int8_t>(base, static_cast<std::size_t>(b) * blk + i * act32_unit); }
  float d(int i, std::int64_t b) const { return *at<float>(base, static_cast<std::size_t>(b) * blk + i * act32_unit + 32); }
  std::int32_t s(int i, std::int64_t b) const { return *at<std::int32_t>(base, static_cast<std::size_t>(b) * blk + i * act32_unit + 36); }
};

row_acts acts256(const gemm_args& a, std::int64_t m) {
  const std::byte* r = a.acts + static_cast<std::size_t>(m) * a.act_stride;
  const std::int64_t k = a.w->cols;
  return {at<std::int8_t>(r, 0), at<float>(r, act256_d(k)), at<std::int32_t>(r, act256_s(k)),
          at<std::int8_t>(r, act256_hl(k))};
}

// ---------------------------------------------------------------------------------------------
// Plain floats: MR rows of x against NV column vectors at once (vector c is half c % H of panel
// p + c / H), one FMA per lane and column. x is broadcast from its rows; W streams through the
// panels' columns.

template <class V, class Load, int MR, int NV>
void float_tile(const gemm_args& a, std::int64_t p, std::int64_t m, std::size_t col_bytes) {
  constexpr int H = halves_of(V::lanes);
  const std::int64_t k = a.w->cols;
  const std::byte* w[NV];
  for (int c = 0; c < NV; ++c) {
    w[c] = a.w->panel(p + c / H) + static_cast<std::size_t>(c % H) * V::lanes * (col_bytes / panel_rows);
  }
  const float* x[MR];
  for (int i = 0; i < MR; ++i) x[i] = at<float>(a.acts, static_cast<std::size_t>(m + i) * a.act_stride);
  typename V::vf acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) acc[i][c] = V::zero_f();
  }
  for (std::int64_t kk = 0; kk < k; ++kk) {
    typename V::vf wv[NV];
    for (int c = 0; c < NV; ++c) wv[c] = Load::load(w[c] + static_cast<std::size_t>(kk) * col_bytes);
    for (int i = 0; i < MR; ++i) {
      const typename V::vf xb = V::set1_f(x[i][kk]);
      for (int c = 0; c < NV; ++c) acc[i][c] = V::fmadd(wv[c], xb, acc[i][c]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) store_rows<V>(a, m + i, p + c / H, c % H, acc[i][c]);
  }
}

template <class V>
struct load_f32 {
  static typename V::vf load(const std::byte* p) { return V::load_f(reinterpret_cast<const float*>(p)); }
};

template <class V>
struct load_f16 {
  static typename V::vf load(const std::byte* p) { return V::load_f16(p); }
};

// The `left` (< NP) panels from p as one tile of left x H column vectors (tried from NP down).
template <int H, int MR, int NP, class Tile>
void last_panels(const gemm_args& a, std::int64_t p, std::int64_t left, Tile& tile) {
  if constexpr (NP >= 1) {
    if (left == NP) {
      each_tile<MR>(a.m0, a.m1, [&]<int R>(std::int64_t m) { tile.template operator()<R, NP * H>(p, m); });
    } else {
      last_panels<H, MR, NP - 1>(a, p, left, tile);
    }
  }
}

// Runs a tile function, tile<R, N>(p, m) over N column vectors from panel p and R rows from m, over the
// task's panels NV column vectors at a time and its rows MR at a time. The panels left over (fewer than
// a tile's) make one narrower tile, not a tile each: a one-row tile of one panel has two FMA chains on
// AVX2, and decode's small tasks (the last shares of a split, a small model's products) are mostly
// such leftovers: on troupe-kjv a third of the product time ran in one-panel tiles.
template <class V, int MR, int NV, class Tile>
void float_compute(const gemm_args& a, Tile&& tile) {
  constexpr int H = halves_of(V::lanes);
  constexpr int per = NV / H;  // panels per tile
  std::int64_t p = a.p0;
  for (; p + per <= a.p1; p += per) {
    each_tile<MR>(a.m0, a.m1, [&]<int R>(std::int64_t m) { tile.template operator()<R, NV>(p, m); });
  }
  if (p < a.p1) last_panels<H, MR, per - 1>(a, p, a.p1 - p, tile);
}

// float_compute, except that a task of one or two rows takes eight column vectors a tile (AVX2: four
// panels), so that eight FMA chains are in flight: a one-row tile over one panel had two, and ran at
// the FMA latency, a quarter of the units' rate, wherever its weights were in cache (a small model's
// decode: troupe_matmul_bench cached/f16/768x256 at M = 1). Each output is the same chain over K in
// any tile, so the bits do not depend on the width (a verify window's rows equal decode's).
template <class V, int MR, int NV, class Tile>
void float_compute_wide(const gemm_args& a, Tile&& tile) {
  const std::int64_t rows = a.m1 - a.m0;
  if (rows == 1 && NV < 8) return float_compute<V, 1, 8>(a, tile);
  if (rows == 2 && NV < 4) return float_compute<V, 2, 4>(a, tile);
  float_compute<V, MR, NV>(a, tile);
}

template <class V, int MR, int NV>
void compute_f32(const gemm_args& a) {
  float_compute_wide<V, MR, NV>(a, [&]<int R, int N>(std::int64_t p, std::int64_t m) { float_tile<V, load_f32<V>, R, N>(a, p, m, panel_rows * 4); });
}

template <class V, int MR, int NV>
void compute_f16(const gemm_args& a) {
  float_compute_wide<V, MR, NV>(a, [&]<int R, int N>(std::int64_t p, std::int64_t m) { float_tile<V, load_f16<V>, R, N>(a, p, m, panel_rows * 2); });
}

// bf16 without a bf16 dot product: a column pair is one vector of (even, odd) bf16 per lane, widened
// exactly to two f32 vectors.
template <class V, int MR, int NV>
void bf16_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  constexpr int H = halves_of(V::lanes);
  const std::int64_t k = a.w->cols;
  const std::byte* w[NV];
  for (int c = 0; c < NV; ++c) {
    w[c] = a.w->panel(p + c / H) + static_cast<std::size_t>(c % H) * V::lanes * 4;
  }
  const float* x[MR];
  for (int i = 0; i < MR; ++i) x[i] = at<float>(a.acts, static_cast<std::size_t>(m + i) * a.act_stride);
  typename V::vf acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) acc[i][c] = V::zero_f();
  }
  const std::int64_t pairs = k / 2;
  for (std::int64_t kp = 0; kp < pairs; ++kp) {
    typename V::vf even[NV], odd[NV];
    for (int c = 0; c < NV; ++c) {
      const typename V::vi v = V::load_i(w[c] + static_cast<std::size_t>(kp) * panel_rows * 4);
      even[c] = V::bf16_even(v);
      odd[c] = V::bf16_odd(v);
    }
    for (int i = 0; i < MR; ++i) {
      const typename V::vf x0 = V::set1_f(x[i][2 * kp]);
      const typename V::vf x1 = V::set1_f(x[i][2 * kp + 1]);
      for (int c = 0; c < NV; ++c) acc[i][c] = V::fmadd(odd[c], x1, V::fmadd(even[c], x0, acc[i][c]));
    }
  }
  if (k % 2 != 0) {
    for (int c = 0; c < NV; ++c) {
      const typename V::vf even = V::bf16_even(V::load_i(w[c] + static_cast<std::size_t>(pairs) * panel_rows * 4));
      for (int i = 0; i < MR; ++i) acc[i][c] = V::fmadd(even, V::set1_f(x[i][k - 1]), acc[i][c]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) store_rows<V>(a, m + i, p + c / H, c % H, acc[i][c]);
  }
}

template <class V, int MR, int NV>
void compute_bf16(const gemm_args& a) {
  float_compute_wide<V, MR, NV>(a, [&]<int R, int N>(std::int64_t p, std::int64_t m) { bf16_tile<V, R, N>(a, p, m); });
}

// ---------------------------------------------------------------------------------------------
// 32-block formats. Per block and panel half: the weight scales (f16), then per activation row an
// integer dot over the block, corrected for the weights' bias, scaled once.

// MXFP4's E2M1 codes as ggml keeps them (doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), plus
// 12 so that every value is an unsigned byte for the u8 x s8 dot; the activations' sums carry 12 times
// the block's sum to take it back, as q4_0's carry 8.
inline constexpr std::int8_t e2m1_doubled_plus_12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
inline constexpr int mxfp4_offset = 12;

// The nibble formats q4_0's tile walks: q4_0 (codes biased by 8), MXFP4 (the same layout; codes through
// a table, power-of-two scales), q4_a32 (unsigned codes with each row's own zero point, in groups of
// blocks under one header: the block's dot less zero x the activations' plain sum), q4_1 (unsigned codes, a
// block minimum m: m x the activations' sum as a second term), and q5_0 / q5_1 (q4_0 / q4_1 with a
// fifth bit per code, or'ed in from the word after the block's nibbles).
enum class nibbles : std::uint8_t { q4_0, mxfp4, affine, q4_1, q5_0, q5_1 };

template <nibbles Kind>
constexpr pair_layout nibble_layout() {
  if constexpr (Kind == nibbles::q4_1) return q4_1_pairs;
  else if constexpr (Kind == nibbles::q5_0) return q5_0_pairs;
  else if constexpr (Kind == nibbles::q5_1) return q5_1_pairs;
  else return pair_layout{q4_0_unit, 64, 2, 0, 0};  // block_scales / block_codes (affine: unused)
}

template <class V, int MR, nibbles Kind = nibbles::q4_0>
void q4_0_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  constexpr bool Fp4 = Kind == nibbles::mxfp4;
  constexpr bool Affine = Kind == nibbles::affine;
  constexpr bool Min = Kind == nibbles::q4_1 || Kind == nibbles::q5_1;
  constexpr bool Fifth = Kind == nibbles::q5_0 || Kind == nibbles::q5_1;
  constexpr pair_layout L = nibble_layout<Kind>();
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* panel = a.w->panel(p);
  // q4_a32: groups of 2^shift blocks after one header (q4_a32_groups).
  constexpr group_layout G = q4_a32_groups;
  const int shift = Affine ? a.w->group_shift : 0;
  const std::int64_t in_group = (std::int64_t{1} << shift) - 1;
  const tile32 x(a, m);
  const typename V::vi low4 = V::set1_i8(0x0f);
  const typename V::vi high4 = V::set1_i8(0xf0);
  [[maybe_unused]] const typename V::vi bit4 = V::set1_i8(0x10);
  [[maybe_unused]] const typename V::vi lut = V::bcast16(e2m1_doubled_plus_12);
  constexpr int HP = halves_per_pass<H, MR>;
  for (int h0 = 0; h0 < H; h0 += HP) {
    typename V::vf fs[HP][MR];
    zero_halves<V>(fs);
    for (std::int64_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 2
      for (int e = 0; e < HP; ++e) {
        const int h = h0 + e;
        typename V::vf* f = fs[e];
        std::size_t scales, codes;
        if constexpr (Affine) {
          scales = G.head(b, shift);
          codes = G.codes(b, shift);
          // The block's bytes, with its group's header before the first.
          const std::size_t from = (b & in_group) == 0 ? scales : codes;
          if (h == 0) prefetch_ahead(stream, panel + from, codes + G.unit - from);
        } else {
          scales = L.scales(b);
          codes = L.codes(b);
          if (h == 0 && b % 2 == 0) prefetch_ahead(stream, panel + scales, L.pair());
        }
        const std::byte* u = panel + codes + h * V::lanes * 4;
        // MXFP4: 2^(e - 127) from the exponent byte's bits (e = 0, 2^-127, reads as 0); the table's
        // doubling is undone with the activation scale below.
        typename V::vf dw;
        if constexpr (Fp4) dw = V::as_f(V::template slli32<23>(V::cvt_u8_i32(panel + scales + h * V::lanes)));
        else dw = V::load_f16(panel + scales + h * V::lanes * 2);
        [[maybe_unused]] typename V::vi z;
        if constexpr (Affine) z = V::cvt_u8_i32(panel + scales + G.zeros_at + h * V::lanes);
        [[maybe_unused]] typename V::vf mw;
        if constexpr (Min) mw = V::load_f16(panel + L.zeros(b) + h * V::lanes * 2);
        // The fifth bits of group g sit in bits g and 4 + g of each byte (q5's word layout); shifted
        // down by one per group, they are always bits 0 and 4.
        [[maybe_unused]] typename V::vi fifth;
        if constexpr (Fifth) fifth = V::load_i(u + q4_0_unit);
        // Small row tiles are latency-bound: they run low and high nibbles as two chains of dot
        // products, and where byte dots take the full u8 range the high nibbles stay in place (16 times
        // their value) with their sum shifted back at the end. Large tiles have parallelism to spare and
        // spend one shift per weight vector instead of two operations per row.
        constexpr bool split = MR <= 2;
        constexpr bool in_place = split && V::full_u8_dot && !Fp4 && !Fifth;
        typename V::vi acc[MR], acc_hi[MR];
        for (int i = 0; i < MR; ++i) acc[i] = acc_hi[i] = V::zero_i();
        for (int g = 0; g < 4; ++g) {
          const typename V::vi v = V::load_i(u + g * 64);
          typename V::vi lo = V::and_i(v, low4);
          typename V::vi hi = in_place ? V::and_i(v, high4) : V::and_i(V::template srli16<4>(v), low4);
          if constexpr (Fp4) lo = V::shuffle_i8(lut, lo), hi = V::shuffle_i8(lut, hi);
          if constexpr (Fifth) {
            lo = V::or_i(lo, V::and_i(V::template slli16<4>(fifth), bit4));
            hi = V::or_i(hi, V::and_i(fifth, bit4));
            fifth = V::template srli16<1>(fifth);
          }
          for (int i = 0; i < MR; ++i) {
            acc[i] = V::dot_u8s8(acc[i], lo, V::bcast4(x.q(i, b) + 4 * g));
            typename V::vi& target = split ? acc_hi[i] : acc[i];
            target = V::dot_u8s8(target, hi, V::bcast4(x.q(i, b) + 16 + 4 * g));
          }
        }
        for (int i = 0; i < MR; ++i) {
          typename V::vi dot = acc[i];
          if constexpr (in_place) {
            dot = V::add_i32(dot, V::template srai32<4>(acc_hi[i]));
          } else if constexpr (split) {
            dot = V::add_i32(dot, acc_hi[i]);
          }
          typename V::vi c;
          if constexpr (Affine) c = V::sub_i32(dot, V::mullo_i32(z, V::set1_i32(x.s(i, b))));
          else if constexpr (Min) c = dot;
          else c = V::sub_i32(dot, V::set1_i32(x.s(i, b)));
          f[i] = V::fmadd(V::cvt_f(c), V::mul_f(dw, V::set1_f(Fp4 ? 0.5f * x.d(i, b) : x.d(i, b))), f[i]);
          if constexpr (Min) f[i] = V::fmadd(mw, V::set1_f(x.d(i, b) * static_cast<float>(x.s(i, b))), f[i]);
        }
      }
    }
    store_halves<V>(a, m, p, h0, fs);
  }
}

// IQ4_NL's levels: the codes index them through a byte shuffle, giving signed int8 weights for q8_0's
// dot (whose activation sums take back the level's offset where the level needs one).
inline constexpr std::int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL (q4_0's layout, f16 scales) and IQ4_XS (iq4_xs_layout: d per superblock times each block's
// int8 scale, exact in f32 as ggml's d (ls - 32)).
template <class V, int MR, bool Xs>
void iq4_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* panel = a.w->panel(p);
  const tile32 x(a, m);
  const typename V::vi low4 = V::set1_i8(0x0f);
  const typename V::vi lut = V::bcast16(iq4nl_levels);
  constexpr int HP = halves_per_pass<H, MR>;
  for (int h0 = 0; h0 < H; h0 += HP) {
    typename V::vf fs[HP][MR];
    zero_halves<V>(fs);
    [[maybe_unused]] typename V::vf dsb[HP];  // iq4_xs: the superblock's d, per half
    for (int e = 0; e < HP; ++e) dsb[e] = V::zero_f();
    for (std::int64_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 2
      for (int e = 0; e < HP; ++e) {
        const int h = h0 + e;
        typename V::vf* f = fs[e];
        typename V::vf dw;
        const std::byte* u;
        if constexpr (Xs) {
          constexpr iq4_xs_layout L = iq4_xs_blocks;
          if (b % 8 == 0) dsb[e] = V::loadu_f(at<float>(panel, L.d(b)) + h * V::lanes);
          dw = V::mul_f(dsb[e], V::cvt_f(V::cvt_i8_i32(panel + L.scales(b) + h * V::lanes)));
          u = panel + L.codes(b) + h * V::lanes * 4;
          if (h == 0) {
            const std::size_t from = b % 8 == 0 ? L.d(b) : L.codes(b);
            prefetch_ahead(stream, panel + from, L.codes(b) + q4_0_unit - from);
          }
        } else {
          dw = V::load_f16(panel + block_scales(b, q4_0_unit) + h * V::lanes * 2);
          u = panel + block_codes(b, q4_0_unit) + h * V::lanes * 4;
          if (h == 0 && b % 2 == 0) prefetch_ahead(stream, panel + block_scales(b, q4_0_unit), pair_bytes(q4_0_unit));
        }
        typename V::vi acc[MR];
        for (int i = 0; i < MR; ++i) acc[i] = V::zero_i();
        for (int g = 0; g < 4; ++g) {
          const typename V::vi v = V::load_i(u + g * 64);
          const typename V::vi lo = V::shuffle_i8(lut, V::and_i(v, low4));
          const typename V::vi hi = V::shuffle_i8(lut, V::and_i(V::template srli16<4>(v), low4));
          const typename V::vi lop = V::q8_weights(lo), hip = V::q8_weights(hi);
          for (int i = 0; i < MR; ++i) {
            acc[i] = V::dot_q8(acc[i], lop, lo, V::bcast4(x.q(i, b) + 4 * g));
            acc[i] = V::dot_q8(acc[i], hip, hi, V::bcast4(x.q(i, b) + 16 + 4 * g));
          }
        }
        for (int i = 0; i < MR; ++i) {
          const typename V::vi c = V::q8_offset == 0 ? acc[i] : V::sub_i32(acc[i], V::set1_i32(x.s(i, b)));
          f[i] = V::fmadd(V::cvt_f(c), V::mul_f(dw, V::set1_f(x.d(i, b))), f[i]);
        }
      }
    }
    store_halves<V>(a, m, p, h0, fs);
  }
}

// q8_a32: q8_0's dot over the codes less 128, then each row's zero point (less 128) times the
// activations' plain sum taken back, with the offset q8_0's dot adds where it adds one.
template <class V, int MR>
void q8_a_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  constexpr group_layout G = q8_a32_groups;
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* panel = a.w->panel(p);
  const int shift = a.w->group_shift;
  const std::int64_t in_group = (std::int64_t{1} << shift) - 1;
  const tile32 x(a, m);
  constexpr int HP = halves_per_pass<H, MR>;
  for (int h0 = 0; h0 < H; h0 += HP) {
    typename V::vf fs[HP][MR];
    zero_halves<V>(fs);
    for (std::int64_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 2
      for (int e = 0; e < HP; ++e) {
        const int h = h0 + e;
        typename V::vf* f = fs[e];
        const std::size_t head = G.head(b, shift), codes = G.codes(b, shift);
        const typename V::vf dw = V::loadu_f(at<float>(panel, head) + h * V::lanes);
        const typename V::vi z = V::add_i32(V::set1_i32(V::q8_offset), V::cvt_i8_i32(panel + head + G.zeros_at + h * V::lanes));
        const std::byte* u = panel + codes + h * V::lanes * 4;
        if (h == 0) {
          const std::size_t from = (b & in_group) == 0 ? head : codes;
          prefetch_ahead(stream, panel + from, codes + G.unit - from);
        }
        typename V::vi acc[MR];
        for (int i = 0; i < MR; ++i) acc[i] = V::zero_i();
        for (int g = 0; g < 8; ++g) {
          const typename V::vi w = V::load_i(u + g * 64);
          const typename V::vi wp = V::q8_weights(w);
          for (int i = 0; i < MR; ++i) acc[i] = V::dot_q8(acc[i], wp, w, V::bcast4(x.q(i, b) + 4 * g));
        }
        for (int i = 0; i < MR; ++i) {
          const typename V::vi c = V::sub_i32(acc[i], V::mullo_i32(z, V::set1_i32(x.s(i, b))));
          f[i] = V::fmadd(V::cvt_f(c), V::mul_f(dw, V::set1_f(x.d(i, b))), f[i]);
        }
      }
    }
    store_halves<V>(a, m, p, h0, fs);
  }
}

// fp8_s32: f32 activations against E4M3 codes widened in registers (as f16 of the value / 256, exact)
// and scaled by the block's s x 256, so each weight is s x e4m3 rounded once, as the reference rounds it.
template <class V, int MR>
void fp8_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* panel = a.w->panel(p);
  const float* x[MR];
  for (int i = 0; i < MR; ++i) x[i] = at<float>(a.acts, static_cast<std::size_t>(m + i) * a.act_stride);
  for (int h = 0; h < H; ++h) {
    typename V::vf f[MR];
    for (int i = 0; i < MR; ++i) f[i] = V::zero_f();
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::byte* u = panel + static_cast<std::size_t>(b) * fp8_s32_unit;
      if (h == 0) prefetch_ahead(stream, u, fp8_s32_unit);
      const typename V::vf sv = V::mul_f(V::loadu_f(at<float>(u, 0) + h * V::lanes), V::set1_f(256.0f));
      for (int j = 0; j < 32; ++j) {
        const typename V::vf w = V::mul_f(V::e4m3_f(u + 64 + j * panel_rows + h * V::lanes), sv);
        for (int i = 0; i < MR; ++i) f[i] = V::fmadd(w, V::set1_f(x[i][32 * b + j]), f[i]);
      }
    }
    for (int i = 0; i < MR; ++i) store_rows<V>(a, m + i, p, h, f[i]);
  }
}

// fp8_s32, one row over NP panels at once (decode): every half of every panel its own FMA chain. The
// one-row fp8_tile walked one half at a time, one chain waiting out the FMA latency at each of a
// block's 32 steps (44% of the read bandwidth on a Zen 3). Each sum is fp8_tile's chain (the same
// weights, rounded once, the same order), so the bits are its bits.
template <class V, int NP>
void fp8_row(const gemm_args& a, std::int64_t p, std::int64_t m) {
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const float* x = at<float>(a.acts, static_cast<std::size_t>(m) * a.act_stride);
  const std::byte* panels[NP];
  for (int q = 0; q < NP; ++q) panels[q] = a.w->panel(p + q);
  typename V::vf f[NP][H];
  for (int q = 0; q < NP; ++q)
    for (int h = 0; h < H; ++h) f[q][h] = V::zero_f();
  for (std::int64_t b = 0; b < blocks; ++b) {
    typename V::vf sv[NP][H];
    const std::byte* u[NP];
    for (int q = 0; q < NP; ++q) {
      u[q] = panels[q] + static_cast<std::size_t>(b) * fp8_s32_unit;
      prefetch_ahead(true, u[q], fp8_s32_unit);
      for (int h = 0; h < H; ++h) sv[q][h] = V::mul_f(V::loadu_f(at<float>(u[q], 0) + h * V::lanes), V::set1_f(256.0f));
    }
    for (int j = 0; j < 32; ++j) {
      const typename V::vf xb = V::set1_f(x[32 * b + j]);
#pragma GCC unroll 8
      for (int q = 0; q < NP; ++q) {
        const std::byte* codes = u[q] + 64 + j * panel_rows;
        if constexpr (H == 2) {  // AVX2: both halves' 16 codes widened together
          typename V::vf w0, w1;
          V::e4m3_f2(codes, w0, w1);
          f[q][0] = V::fmadd(V::mul_f(w0, sv[q][0]), xb, f[q][0]);
          f[q][1] = V::fmadd(V::mul_f(w1, sv[q][1]), xb, f[q][1]);
        } else {
#pragma GCC unroll 2
          for (int h = 0; h < H; ++h) f[q][h] = V::fmadd(V::mul_f(V::e4m3_f(codes + h * V::lanes), sv[q][h]), xb, f[q][h]);
        }
      }
    }
  }
  for (int q = 0; q < NP; ++q)
    for (int h = 0; h < H; ++h) store_rows<V>(a, m, p + q, h, f[q][h]);
}

// Blocks [b0, b1) of a row tile. With carry, the tile's sums pass between K ranges through it (f32,
// [halves][MR][lanes]): a range that does not start at block 0 reads them, one that does not end at
// the last block leaves them there instead of storing its rows.
template <class V, int MR>
void q8_0_tile(const gemm_args& a, std::int64_t p, std::int64_t m, std::int64_t b0, std::int64_t b1, float* carry) {
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* panel = a.w->panel(p);
  const tile32 x(a, m);
  constexpr int HP = halves_per_pass<H, MR>;
  for (int h0 = 0; h0 < H; h0 += HP) {
    typename V::vf fs[HP][MR];
    for (int e = 0; e < HP; ++e) {
      [[maybe_unused]] const int h = h0 + e;
      typename V::vf* f = fs[e];
      for (int i = 0; i < MR; ++i) f[i] = carry && b0 > 0 ? V::loadu_f(carry + (h * MR + i) * V::lanes) : V::zero_f();
    }
    for (std::int64_t b = b0; b < b1; ++b) {
#pragma GCC unroll 2
      for (int e = 0; e < HP; ++e) {
        const int h = h0 + e;
        typename V::vf* f = fs[e];
        const typename V::vf dw = V::load_f16(panel + block_scales(b, q8_0_unit) + h * V::lanes * 2);
        const std::byte* u = panel + block_codes(b, q8_0_unit) + h * V::lanes * 4;
        if (h == 0 && b % 2 == 0) prefetch_ahead(stream, panel + block_scales(b, q8_0_unit), pair_bytes(q8_0_unit));
        typename V::vi acc[MR];
        for (int i = 0; i < MR; ++i) acc[i] = V::zero_i();
        for (int g = 0; g < 8; ++g) {
          const typename V::vi w = V::load_i(u + g * 64);
          const typename V::vi wp = V::q8_weights(w);
          for (int i = 0; i < MR; ++i) acc[i] = V::dot_q8(acc[i], wp, w, V::bcast4(x.q(i, b) + 4 * g));
        }
        for (int i = 0; i < MR; ++i) {
          const typename V::vi c = V::q8_offset == 0 ? acc[i] : V::sub_i32(acc[i], V::set1_i32(x.s(i, b)));
          f[i] = V::fmadd(V::cvt_f(c), V::mul_f(dw, V::set1_f(x.d(i, b))), f[i]);
        }
      }
    }
    for (int e = 0; e < HP; ++e) {
      const int h = h0 + e;
      typename V::vf* f = fs[e];
      if (b1 == blocks) {
        for (int i = 0; i < MR; ++i) store_rows<V>(a, m + i, p, h, f[i]);
      } else {
        for (int i = 0; i < MR; ++i) V::storeu_f(carry + (h * MR + i) * V::lanes, f[i]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// k-quants against 256-element int8 activations (ggml's q8_K): integer dots per sub-block, times the
// sub-block's integer scale, summed in int32 over the superblock, then scaled once.

// q4_k, and q5_k (Five) whose codes take their fifth bit from the word layout after the unit's nibbles,
// as q5_0's do: group g's bits are bit g % 4 (low nibbles) and 4 + g % 4 (high) of word g / 4.
template <class V, int MR, bool Five = false>
void q4_k_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr std::size_t unit = Five ? q5_k_unit : q4_k_unit;
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 256;
  row_acts x[MR];
  for (int i = 0; i < MR; ++i) x[i] = acts256(a, m + i);
  const typename V::vi low4 = V::set1_i8(0x0f);
  alignas(64) std::int32_t sc[8][V::lanes];
  constexpr int HP = halves_per_pass<H, MR>;
  for (int h0 = 0; h0 < H; h0 += HP) {
    typename V::vf fs[HP][MR];
    zero_halves<V>(fs);
    for (std::int64_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 2
      for (int e = 0; e < HP; ++e) {
        const int h = h0 + e;
        typename V::vf* f = fs[e];
        const std::byte* u = a.w->panel(p) + static_cast<std::size_t>(b) * unit;
        if (h == 0) prefetch_ahead(stream, u, unit);
        for (int j = 0; j < 8; ++j) V::store_i(sc[j], V::cvt_u8_i32(u + q4_k_scale + j * panel_rows + h * V::lanes));
        typename V::vi isum[MR];
        for (int i = 0; i < MR; ++i) isum[i] = V::zero_i();
        for (int sub = 0; sub < 8; ++sub) {
          const std::byte* qv = u + q4_k_q + (sub / 2) * 8 * 64 + h * V::lanes * 4;
          typename V::vi acc[MR];
          for (int i = 0; i < MR; ++i) acc[i] = V::zero_i();
          [[maybe_unused]] typename V::vi fifth = V::zero_i();
          for (int g = 0; g < 8; ++g) {
            const typename V::vi v = V::load_i(qv + g * 64);
            typename V::vi w = V::and_i(sub % 2 == 0 ? v : V::template srli16<4>(v), low4);
            if constexpr (Five) {
              if (g % 4 == 0) fifth = V::load_i(u + q5_k_h + ((sub / 2) * 2 + g / 4) * 64 + h * V::lanes * 4);
              w = V::or_i(w, V::and_i(sub % 2 == 0 ? V::template slli16<4>(fifth) : fifth, V::set1_i8(0x10)));
              fifth = V::template srli16<1>(fifth);
            }
            for (int i = 0; i < MR; ++i) acc[i] = V::dot_u8s8(acc[i], w, V::bcast4(x[i].q + 256 * b + 32 * sub + 4 * g));
          }
          const typename V::vi s = V::load_i(sc[sub]);
          for (int i = 0; i < MR; ++i) isum[i] = V::add_i32(isum[i], V::mullo_i32(acc[i], s));
        }
        const typename V::vf dw = V::load_f16(u + h * V::lanes * 2);
        const typename V::vf dm = V::load_f16(u + q4_k_dmin + h * V::lanes * 2);
        const typename V::vi mn0 = V::load_i(u + q4_k_min + h * V::lanes * 4);
        const typename V::vi mn1 = V::load_i(u + q4_k_min + 64 + h * V::lanes * 4);
        for (int i = 0; i < MR; ++i) {
          // sum over sub-blocks of min * (128 h + l): two byte dots per half of the split.
          const std::int8_t* hl = x[i].hl + 16 * b;
          typename V::vi mh = V::dot_u8s8(V::zero_i(), mn0, V::bcast4(hl));
          mh = V::dot_u8s8(mh, mn1, V::bcast4(hl + 4));
          typename V::vi ml = V::dot_u8s8(V::zero_i(), mn0, V::bcast4(hl + 8));
          ml = V::dot_u8s8(ml, mn1, V::bcast4(hl + 12));
          const typename V::vi msum = V::add_i32(V::template slli32<7>(mh), ml);
          const typename V::vf t = V::fmsub(dw, V::cvt_f(isum[i]), V::mul_f(dm, V::cvt_f(msum)));
          f[i] = V::fmadd(t, V::set1_f(x[i].d[b]), f[i]);
        }
      }
    }
    store_halves<V>(a, m, p, h0, fs);
  }
}

// One 4-element group of q6_k codes (0..63, biased by 32) for group j (0..31) of half `hf` of a
// superblock: the low nibble from ql, the high 2 bits from qh moved to bits 4 and 5.
template <class V>
typename V::vi q6_group(const std::byte* u, int hf, int j, int h) {
  const int quarter = j / 8;
  const int w = j % 8;
  const std::size_t lane_off = static_cast<std::size_t>(h) * V::lanes * 4;
  const typename V::vi ql = V::load_i(u + ((hf * 16 + w + (quarter % 2) * 8) * 64) + lane_off);
  const typename V::vi qh = V::load_i(u + q6_k_qh + (hf * 8 + w) * 64 + lane_off);
  const typename V::vi lo = V::and_i(quarter >= 2 ? V::template srli16<4>(ql) : ql, V::set1_i8(0x0f));
  typename V::vi hi;
  switch (quarter) {
    case 0: hi = V::template slli16<4>(qh); break;
    case 1: hi = V::template slli16<2>(qh); break;
    case 2: hi = qh; break;
    default: hi = V::template srli16<2>(qh); break;
  }
  return V::or_i(lo, V::and_i(hi, V::set1_i8(0x30)));
}

// The same for q3_k (0..7, biased by 4): the low 2 bits of ggml's qs byte l of half hf at bits 2 (j / 8),
// the third from hmask byte l at bit 4 hf + j / 8, where l = 16 (j / 4 % 2) + 4 (j % 4) is the byte offset
// of group j's elements within their 32-element run.
template <class V>
typename V::vi q3_group(const std::byte* u, int hf, int j, int h) {
  const int run = j / 8, v = 4 * ((j / 4) % 2) + j % 4;
  const std::size_t lane_off = static_cast<std::size_t>(h) * V::lanes * 4;
  const typename V::vi ql = V::load_i(u + (hf * 8 + v) * 64 + lane_off);
  const typename V::vi hm = V::load_i(u + q3_k_hm + v * 64 + lane_off);
  const typename V::vi lo = V::and_i(V::srl16(ql, 2 * run), V::set1_i8(3));
  const typename V::vi hb = V::and_i(V::srl16(hm, 4 * hf + run), V::set1_i8(1));
  return V::or_i(lo, V::template slli16<2>(hb));
}

// q2_k's 2-bit codes (0..3): q3_k's low bits alone.
template <class V>
typename V::vi q2_group(const std::byte* u, int hf, int j, int h) {
  const int run = j / 8, v = 4 * ((j / 4) % 2) + j % 4;
  const typename V::vi ql = V::load_i(u + (hf * 8 + v) * 64 + static_cast<std::size_t>(h) * V::lanes * 4);
  return V::and_i(V::srl16(ql, 2 * run), V::set1_i8(3));
}

// q6_k, q3_k and q2_k in one walk: 16-element sub-blocks with int8 scales (q6_k, q3_k: signed, the codes
// biased; q2_k: unsigned, with a min per sub-block times the 16-group's plain sum taken off).
enum class k16 : std::uint8_t { q6, q3, q2 };

template <class V, int MR, k16 Kind = k16::q6>
void q6_k_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  constexpr bool Two = Kind == k16::q2;
  constexpr std::size_t unit = Kind == k16::q6 ? q6_k_unit : Kind == k16::q3 ? q3_k_unit : q2_k_unit;
  constexpr std::size_t scale_at = Kind == k16::q6 ? q6_k_scale : Kind == k16::q3 ? q3_k_scale : q2_k_scale;
  const bool stream = m == a.m0;  // see prefetch_ahead
  constexpr int H = halves_of(V::lanes);
  const std::int64_t blocks = a.w->cols / 256;
  const std::byte* scales = a.w->panel(p);
  const std::byte* body = scales + scale_run(blocks);
  row_acts x[MR];
  for (int i = 0; i < MR; ++i) x[i] = acts256(a, m + i);
  alignas(64) std::int32_t sc[16][V::lanes];
  for (int h = 0; h < H; ++h) {
    typename V::vf f[MR];
    for (int i = 0; i < MR; ++i) f[i] = V::zero_f();
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::byte* u = body + static_cast<std::size_t>(b) * unit;
      if (h == 0) prefetch_ahead(stream, u, unit);
      for (int j = 0; j < 16; ++j)
        V::store_i(sc[j], Two ? V::and_i(V::cvt_u8_i32(u + scale_at + j * panel_rows + h * V::lanes), V::set1_i32(0x0f))
                              : V::cvt_i8_i32(u + scale_at + j * panel_rows + h * V::lanes));
      typename V::vi isum[MR], msum[MR];
      for (int i = 0; i < MR; ++i) isum[i] = msum[i] = V::zero_i();
      // The sub-block and group loops are unrolled on request: GCC 12 kept them, so every group
      // computed its addresses and switched on its quarter at run time (scalar work that cost q6_k
      // decode a third of its speed on Zen 3). Unrolling the halves as well made the 4-row tile slower.
#pragma GCC unroll 1
      for (int hf = 0; hf < 2; ++hf) {
#pragma GCC unroll 8
        for (int sub = 0; sub < 8; ++sub) {
          typename V::vi acc[MR];
          for (int i = 0; i < MR; ++i) acc[i] = V::zero_i();
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) {
            typename V::vi w;
            if constexpr (Kind == k16::q6) w = q6_group<V>(u, hf, 4 * sub + t, h);
            else if constexpr (Kind == k16::q3) w = q3_group<V>(u, hf, 4 * sub + t, h);
            else w = q2_group<V>(u, hf, 4 * sub + t, h);
            for (int i = 0; i < MR; ++i) {
              acc[i] = V::dot_u8s8(acc[i], w, V::bcast4(x[i].q + 256 * b + 128 * hf + 16 * sub + 4 * t));
            }
          }
          const typename V::vi s = V::load_i(sc[8 * hf + sub]);
          if constexpr (Two) {
            const typename V::vi mn = V::template srai32<4>(V::cvt_u8_i32(u + q2_k_scale + (8 * hf + sub) * panel_rows + h * V::lanes));
            for (int i = 0; i < MR; ++i) {
              isum[i] = V::add_i32(isum[i], V::mullo_i32(acc[i], s));
              msum[i] = V::add_i32(msum[i], V::mullo_i32(mn, V::set1_i32(x[i].s[16 * b + 8 * hf + sub])));
            }
          } else {
            for (int i = 0; i < MR; ++i) {
              const typename V::vi c = V::sub_i32(acc[i], V::set1_i32(x[i].s[16 * b + 8 * hf + sub]));
              isum[i] = V::pin(V::add_i32(isum[i], V::mullo_i32(c, s)));
            }
          }
        }
      }
      const typename V::vf dw = V::load_f16(scales + (b * panel_rows + h * V::lanes) * 2);
      if constexpr (Two) {
        const typename V::vf dm = V::load_f16(u + q2_k_dmin + h * V::lanes * 2);
        for (int i = 0; i < MR; ++i) {
          const typename V::vf t = V::fmsub(dw, V::cvt_f(isum[i]), V::mul_f(dm, V::cvt_f(msum[i])));
          f[i] = V::fmadd(t, V::set1_f(x[i].d[b]), f[i]);
        }
      } else {
        for (int i = 0; i < MR; ++i) f[i] = V::fmadd(V::cvt_f(isum[i]), V::mul_f(dw, V::set1_f(x[i].d[b])), f[i]);
      }
    }
    for (int i = 0; i < MR; ++i) store_rows<V>(a, m + i, p, h, f[i]);
  }
}

// Walks the task's panels, each against its rows MR at a time.
template <int MR, class Tile>
void quant_compute(const gemm_args& a, Tile&& tile) {
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    each_tile<MR>(a.m0, a.m1, [&]<int R>(std::int64_t m) { tile.template operator()<R>(p, m); });
  }
}

template <class V, int MR>
void compute_q4_0(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q4_0_tile<V, R>(a, p, m); });
}
template <class V, int MR>
void compute_mxfp4(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q4_0_tile<V, R, nibbles::mxfp4>(a, p, m); });
}
template <class V, int MR>
void compute_q4_a32(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q4_0_tile<V, R, nibbles::affine>(a, p, m); });
}
template <class V, int MR, nibbles Kind>
void compute_nibbles(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q4_0_tile<V, R, Kind>(a, p, m); });
}
template <class V, int MR>
void compute_iq4_nl(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { iq4_tile<V, R, false>(a, p, m); });
}
template <class V, int MR>
void compute_iq4_xs(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { iq4_tile<V, R, true>(a, p, m); });
}
template <class V, int MR>
void compute_q8_a32(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q8_a_tile<V, R>(a, p, m); });
}
template <class V, int MR>
void compute_fp8_s32(const gemm_args& a) {
  if (a.m1 - a.m0 == 1) {  // decode: eight chains (AVX2: two panels of two halves; AVX-512: four panels)
    constexpr int H = halves_of(V::lanes), NP = H == 1 ? 4 : 2;
    return float_compute<V, 1, NP * H>(a, [&]<int R, int N>(std::int64_t p, std::int64_t m) { fp8_row<V, N / H>(a, p, m); });
  }
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { fp8_tile<V, R>(a, p, m); });
}
// Several row tiles over a long K walk it in ranges of about k_range_blocks, every tile through a range
// before the next range: the range's weights and activations stay in L1 for the second tile and on,
// where whole rows of K (16 rows of K = 1536: 30 KiB of activations, 26 KiB of panel) did not.
inline constexpr std::int64_t k_range_blocks = 16;
inline constexpr std::int64_t k_range_max_tiles = 16;

template <class V, int MR>
void compute_q8_0(const gemm_args& a) {
  const std::int64_t blocks = a.w->cols / 32;
  const std::int64_t tiles = (a.m1 - a.m0 + MR - 1) / MR;
  if (tiles < 2 || tiles > k_range_max_tiles || blocks <= k_range_blocks * 3 / 2) {
    quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q8_0_tile<V, R>(a, p, m, 0, blocks, nullptr); });
    return;
  }
  const std::int64_t ranges = (blocks + k_range_blocks - 1) / k_range_blocks;
  const std::int64_t per = (blocks + ranges - 1) / ranges;
  alignas(64) float carry[k_range_max_tiles * MR * panel_rows];
  for (std::int64_t p = a.p0; p < a.p1; ++p)
    for (std::int64_t b0 = 0; b0 < blocks; b0 += per) {
      const std::int64_t b1 = b0 + per < blocks ? b0 + per : blocks;
      each_tile<MR>(a.m0, a.m1, [&]<int R>(std::int64_t m) {
        q8_0_tile<V, R>(a, p, m, b0, b1, carry + (m - a.m0) / MR * MR * panel_rows);
      });
    }
}
template <class V, int MR, bool Five = false>
void compute_q4_k(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q4_k_tile<V, R, Five>(a, p, m); });
}
template <class V, int MR, k16 Kind = k16::q6>
void compute_q6_k(const gemm_args& a) {
  quant_compute<MR>(a, [&]<int R>(std::int64_t p, std::int64_t m) { q6_k_tile<V, R, Kind>(a, p, m); });
}

}  // namespace
}  // namespace troupe::exec::cpu::detail

#pragma once
// The weight formats of the CUDA target, written once for both compilers: linear_kernels.cu runs this
// code on the device and the host tests run it against troupe::dequantize_row (engine/core/quant.cpp,
// ggml's reference layouts) and the narrow-float converters of engine/core/half.hpp.
//
// A format is read in pieces. A piece is two runs of eight consecutive weights of one block, and a run
// is eight small integer codes with the scale and offset of their sub-block: w = scale * code - offset
// (plain formats keep the weights themselves as the codes). Decoding computes exactly the reference's
// expression (q4_k: (d * sc) * q - dmin * m; q6_k: (d * sc) * q; q8_0, q4_0: q * d), each operation
// rounded on its own, so weights match bit for bit. Dot products factor the scale out instead:
// scale * sum(code * x) - offset * sum(x), every step one fused multiply-add.
//
// Bytes are read through a loader (see byte_loader): the call sites state the alignment they can
// promise (that of the block, given as a template argument, and of the offset inside it), and a
// loader may use wider loads where that allows. Blocks of one row start every block_bytes bytes, so
// a block is as aligned as the row base and block_bytes allow (max_align).
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "engine/core/dtype.hpp"
#include "engine/exec/cuda/hd.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#if defined(__CUDA_ARCH__)
#define TROUPE_QUANT_UNROLL _Pragma("unroll")
#else
#define TROUPE_QUANT_UNROLL
#endif

namespace troupe::exec::cuda::quant {

// ---- bits and once-rounded arithmetic ------------------------------------------------------------
// The _rn intrinsics keep nvcc from contracting a * b - c into one FMA, which would change a decoded
// weight's last bit; g++ in ISO mode does not contract.

using cuda::bits_of;
using cuda::float_of;
TROUPE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TROUPE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TROUPE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The exact float of v - Bias for 0 <= v < 2^23: 2^23 + v is a float with v in its mantissa, and
// subtracting 2^23 + Bias (exact) is exact. Two ALU operations, no int-to-float conversion.
template <int Bias>
TROUPE_HD float code_to_float(std::uint32_t v) {
  return float_of(0x4b000000u | v) - static_cast<float>(8388608 + Bias);
}

// ---- f16 and bf16 ----------------------------------------------------------------------------------
// The bit-level forms are half.hpp's rules (NaN payloads kept on the way up; on the way down a NaN
// keeps its top mantissa bits and is made quiet). On the device the hardware conversions are used: the
// same values (widening is exact, narrowing rounds to nearest even) except that a NaN comes out as
// the canonical NaN.

TROUPE_HD float f16_bits_to_float_soft(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
  const std::uint32_t mant = static_cast<std::uint32_t>(h) & 0x3ffu;
  if (exp == 0x1fu) return float_of(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

TROUPE_HD std::uint16_t float_to_f16_bits_soft(float f) {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant != 0 ? 0x200u | (mant >> 13) : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u) != 0)) ++half;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | half);
}

TROUPE_HD float bf16_bits_to_float(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

TROUPE_HD std::uint16_t float_to_bf16_bits_soft(float f) {
  std::uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

TROUPE_HD float f16_bits_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return f16_bits_to_float_soft(h);
#endif
}
TROUPE_HD std::uint16_t float_to_f16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return float_to_f16_bits_soft(f);
#endif
}
TROUPE_HD std::uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  return float_to_bf16_bits_soft(f);
#endif
}

// ---- KV cache elements ------------------------------------------------------------------------------
// A KV cache row is f32, f16, bf16 or q8_0 (op::attention). Element i of the cache counted from `base`
// (for q8_0, blocks of 34 bytes: an f16 d, then 32 int8 codes).
TROUPE_HD float kv_element(const void* base, dtype t, std::int64_t i) {
  switch (t) {
    case dtype::f16: return f16_bits_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case dtype::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case dtype::q8_0: {
      const auto* blk = static_cast<const std::uint8_t*>(base) + i / 32 * 34;
      const float d = f16_bits_to_float(static_cast<std::uint16_t>(blk[0] | (blk[1] << 8)));
      return d * static_cast<float>(static_cast<std::int8_t>(blk[2 + i % 32]));
    }
    default: return static_cast<const float*>(base)[i];
  }
}

// One 32-value block of x as q8_0, ggml's quantize_row_q8_0_ref (core's quantize_row): d = amax / 127
// stored as f16, codes round(x / d) half away from zero (NaN: 0).
TROUPE_HD void quantize_block_q8_0(const float* x, std::uint8_t* blk) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = x[j] < 0.0f ? -x[j] : x[j];
    amax = amax > a ? amax : a;
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t h = float_to_f16_bits(d);
  blk[0] = static_cast<std::uint8_t>(h & 0xff);
  blk[1] = static_cast<std::uint8_t>(h >> 8);
  for (int j = 0; j < 32; ++j) {
    float v = x[j] * id;
    int q = 0;
    if (v == v) {
      v = v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v;
      q = static_cast<int>(roundf(v));
    }
    blk[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
  }
}

// ---- loading bytes ---------------------------------------------------------------------------------
// A loader reads little-endian weight bytes and f32 activations:
//   u8(p), u16<Align>(p)           one byte, one 16-bit value
//   words<Align, N>(p, w)           N 32-bit words from p (4 * N bytes)
//   x8(p, v)                        eight floats from p (may be vectorized when the loader knows p is)
// Align is what the caller promises of p (a power of two, at most 16). byte_loader ignores it: it
// reads byte by byte, right for any address; the kernels' loader uses the widest load it allows.

TROUPE_HD constexpr int align_min(int a, int b) { return a < b ? a : b; }

struct byte_loader {
  TROUPE_HD std::uint32_t u8(const std::uint8_t* p) const { return p[0]; }
  template <int Align>
  TROUPE_HD std::uint32_t u16(const std::uint8_t* p) const {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8);
  }
  template <int Align, int N>
  TROUPE_HD void words(const std::uint8_t* p, std::uint32_t (&w)[N]) const {
    TROUPE_QUANT_UNROLL
    for (int j = 0; j < N; ++j) {
      const std::uint8_t* q = p + 4 * j;
      w[j] = static_cast<std::uint32_t>(q[0]) | (static_cast<std::uint32_t>(q[1]) << 8) |
             (static_cast<std::uint32_t>(q[2]) << 16) | (static_cast<std::uint32_t>(q[3]) << 24);
    }
  }
  TROUPE_HD void x8(const float* p, float (&v)[8]) const {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) v[i] = p[i];
  }
};

// Byte k (0..11) of the 12-byte q4_k scale field held as three words, k not known at compile time
// (selects, not an indexed local array, so the device keeps it in registers).
TROUPE_HD std::uint32_t byte_of3(std::uint32_t s0, std::uint32_t s1, std::uint32_t s2, int k) {
  const std::uint32_t w = k < 4 ? s0 : (k < 8 ? s1 : s2);
  return (w >> (8 * (k & 3))) & 0xffu;
}

// ---- runs and the formats --------------------------------------------------------------------------

// Eight consecutive weights: w[i] = scale * code[i] - offset. How much of that applies is the format's
// `affine`: 0 (w = code), 1 (w = scale * code), 2 (the whole expression).
struct run8 {
  float code[8];
  float scale;
  float offset;
};

// The two runs of a piece of q4_0-ordered nibbles held in two little-endian words: run h the low (h = 0)
// or high (h = 1) nibble of each of the 8 bytes, each code through `level`, with one scale and offset.
template <class Level>
TROUPE_HD void nibble_runs(const std::uint32_t (&q)[2], float scale, float offset, Level level, run8 (&out)[2]) {
  TROUPE_QUANT_UNROLL
  for (int h = 0; h < 2; ++h) {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) out[h].code[i] = level((q[i / 4] >> (8 * (i & 3) + 4 * h)) & 0xfu);
    out[h].scale = scale;
    out[h].offset = offset;
  }
}

// Each format: block_elems weights in block_bytes bytes, read as `pieces` pieces; run_elem(p, h) is
// the first element (within the block) of run h of piece p; load_piece<A> fills a piece's two runs
// from a block aligned to A. Plain formats (f32, f16, bf16) have no blocks; they are read in pieces
// of 16 elements, and a row whose length is not a multiple of 16 ends in single elements (element<A>,
// from a row aligned to A). max_align is the largest alignment every block can have; mid_align the
// one the kernels use when 16 is not there.

struct fmt_f32 {
  static constexpr dtype type = dtype::f32;
  static constexpr bool plain = true;
  static constexpr int elem_bytes = 4, block_elems = 16, block_bytes = 64, pieces = 1, affine = 0;
  static constexpr int max_align = 16, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int, int h) { return 8 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int, run8 (&out)[2]) {
    std::uint32_t w[16];
    ld.template words<A, 16>(blk, w);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = float_of(w[8 * h + i]);
      out[h].scale = 1.0f;
      out[h].offset = 0.0f;
    }
  }
  template <int A, class Ld>
  TROUPE_HD static float element(const Ld& ld, const std::uint8_t* row, std::int64_t k) {
    std::uint32_t w[1];
    ld.template words<align_min(A, 4), 1>(row + 4 * k, w);
    return float_of(w[0]);
  }
};

template <dtype T>
struct fmt_half_like {  // f16 and bf16: 16-bit elements, two to a word, the first in the low half
  static constexpr dtype type = T;
  static constexpr bool plain = true;
  static constexpr int elem_bytes = 2, block_elems = 16, block_bytes = 32, pieces = 1, affine = 0;
  static constexpr int max_align = 16, mid_align = 2;
  TROUPE_HD static float widen(std::uint32_t h) {
    if constexpr (T == dtype::f16) return f16_bits_to_float(static_cast<std::uint16_t>(h));
    else return bf16_bits_to_float(static_cast<std::uint16_t>(h));
  }
  TROUPE_HD static constexpr int run_elem(int, int h) { return 8 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int, run8 (&out)[2]) {
    std::uint32_t w[8];
    ld.template words<A, 8>(blk, w);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = widen((w[4 * h + i / 2] >> (16 * (i & 1))) & 0xffffu);
      out[h].scale = 1.0f;
      out[h].offset = 0.0f;
    }
  }
  template <int A, class Ld>
  TROUPE_HD static float element(const Ld& ld, const std::uint8_t* row, std::int64_t k) {
    return widen(ld.template u16<align_min(A, 2)>(row + 2 * k));
  }
};
using fmt_f16 = fmt_half_like<dtype::f16>;
using fmt_bf16 = fmt_half_like<dtype::bf16>;

// q8_0: f16 d at 0, int8 qs[32] at 2; w[j] = qs[j] * d. Piece p: qs[16p .. 16p + 16).
struct fmt_q8_0 {
  static constexpr dtype type = dtype::q8_0;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 34, pieces = 2, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 16 * p + 8 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<A>(blk)));
    std::uint32_t q[4];
    ld.template words<align_min(A, 2), 4>(blk + 2 + 16 * p, q);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t b = (q[2 * h + i / 4] >> (8 * (i & 3))) & 0xffu;
        out[h].code[i] = code_to_float<128>(b ^ 0x80u);  // the int8 value
      }
      out[h].scale = d;
      out[h].offset = 0.0f;
    }
  }
};

// q4_0: f16 d at 0, qs[16] at 2; w[j] = ((qs[j] & 15) - 8) * d, w[j + 16] = ((qs[j] >> 4) - 8) * d.
// Piece p: qs[8p .. 8p + 8), run 0 their low nibbles (elements 8p..), run 1 the high (16 + 8p..).
struct fmt_q4_0 {
  static constexpr dtype type = dtype::q4_0;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 18, pieces = 2, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<A>(blk)));
    std::uint32_t q[2];
    ld.template words<align_min(A, 2), 2>(blk + 2 + 8 * p, q);
    nibble_runs(q, d, 0.0f, [](std::uint32_t c) { return code_to_float<8>(c); }, out);
  }
};

// q4_k: f16 d at 0, f16 dmin at 2, 12 bytes of 6-bit scales and mins at 4, qs[128] at 16. Chunk c
// (64 elements) is qs[32c .. 32c + 32): sub-block 2c in the low nibbles, 2c + 1 in the high;
// w = (d * sc) * q - dmin * m. Piece p = 4c + u: qs[8p .. 8p + 8), run 0 the low nibbles (elements
// 64c + 8u..), run 1 the high (64c + 32 + 8u..).
struct fmt_q4_k {
  static constexpr dtype type = dtype::q4_k;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 144, pieces = 16, affine = 2;
  static constexpr int max_align = 16, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 64 * (p >> 2) + 32 * h + 8 * (p & 3); }
  // ggml's get_scale_min_k4: sub-blocks 0..3 use the low 6 bits of bytes j and j + 4; 4..7 the nibbles
  // of byte j + 4 with the top 2 bits of bytes j - 4 (scale) and j (min).
  TROUPE_HD static void scale_min(std::uint32_t s0, std::uint32_t s1, std::uint32_t s2, int j, std::uint32_t& sc,
                                  std::uint32_t& m) {
    if (j < 4) {
      sc = byte_of3(s0, s1, s2, j) & 63u;
      m = byte_of3(s0, s1, s2, j + 4) & 63u;
    } else {
      const std::uint32_t b = byte_of3(s0, s1, s2, j + 4);
      sc = (b & 0x0fu) | ((byte_of3(s0, s1, s2, j - 4) >> 6) << 4);
      m = (b >> 4) | ((byte_of3(s0, s1, s2, j) >> 6) << 4);
    }
  }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[4];  // d | dmin << 16, then the scale bytes
    ld.template words<A, 4>(blk, head);
    std::uint32_t q[2];
    ld.template words<align_min(A, 8), 2>(blk + 16 + 8 * p, q);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const float dmin = f16_bits_to_float(static_cast<std::uint16_t>(head[0] >> 16));
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      std::uint32_t sc, m;
      scale_min(head[1], head[2], head[3], 2 * (p >> 2) + h, sc, m);
      out[h].scale = mul_rn(d, static_cast<float>(sc));
      out[h].offset = mul_rn(dmin, static_cast<float>(m));
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = code_to_float<0>((q[i / 4] >> (8 * (i & 3) + 4 * h)) & 0xfu);
    }
  }
};

// q6_k: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, f16 d at 208. Half hf (128 elements)
// uses ql[64hf ..] and qh[32hf ..]; its quarter g, element l (0..31) is the nibble g / 2 of
// ql[64hf + 32(g % 2) + l] with bits 2g, 2g + 1 of qh[32hf + l] on top, minus 32, times
// d * scales[8hf + 2g + l / 16]. Piece p = 8hf + 4gp + u: ql[8p .. 8p + 8) and qh[32hf + 8u ..
// + 8); run h is quarter g = gp + 2h (elements 128hf + 32g + 8u..).
struct fmt_q6_k {
  static constexpr dtype type = dtype::q6_k;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 210, pieces = 16, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) {
    return 128 * (p >> 3) + 32 * ((p >> 2) & 1) + 64 * h + 8 * (p & 3);
  }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const int hf = p >> 3, gp = (p >> 2) & 1, u = p & 3;
    std::uint32_t ql[2], qh[2];
    ld.template words<align_min(A, 8), 2>(blk + 8 * p, ql);
    ld.template words<align_min(A, 8), 2>(blk + 128 + 32 * hf + 8 * u, qh);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<align_min(A, 16)>(blk + 208)));
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int g = gp + 2 * h;
      const std::uint32_t sc = ld.u8(blk + 192 + 8 * hf + 2 * g + (u >> 1));
      out[h].scale = mul_rn(d, code_to_float<128>(sc ^ 0x80u));  // d * (int8) sc
      out[h].offset = 0.0f;
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t lo = (ql[i / 4] >> (8 * (i & 3) + 4 * h)) & 0xfu;
        const std::uint32_t hi = (qh[i / 4] >> (8 * (i & 3) + 2 * g)) & 3u;
        out[h].code[i] = code_to_float<32>(lo | (hi << 4));
      }
    }
  }
};

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl); the code of a nibble is its level.
TROUPE_HD float iq4nl_level(std::uint32_t nibble) {
  // Selects rather than an indexed table so the device keeps it in registers.
  constexpr std::int8_t levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  float v = 0.0f;
  TROUPE_QUANT_UNROLL
  for (std::uint32_t j = 0; j < 16; ++j) v = nibble == j ? static_cast<float>(levels[j]) : v;
  return v;
}

// iq4_nl: q4_0's block (f16 d at 0, qs[16] at 2, the same nibble order); w = d * level(nibble).
struct fmt_iq4_nl {
  static constexpr dtype type = dtype::iq4_nl;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 18, pieces = 2, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<A>(blk)));
    std::uint32_t q[2];
    ld.template words<align_min(A, 2), 2>(blk + 2 + 8 * p, q);
    nibble_runs(q, d, 0.0f, [](std::uint32_t c) { return iq4nl_level(c); }, out);
  }
};

// iq4_xs: f16 d at 0, u16 scales_h at 2, scales_l[4] at 4, qs[128] at 8; sub-block ib (32 elements) is
// qs[16ib .. 16ib + 16) in q4_0's nibble order, w = (d * (ls - 32)) * level(nibble) with the 6-bit ls
// from scales_l's nibble ib and scales_h's bits 2ib, 2ib + 1. Piece p = 2ib + u: qs[8p .. 8p + 8), run 0
// the low nibbles (elements 32ib + 8u..), run 1 the high (32ib + 16 + 8u..).
struct fmt_iq4_xs {
  static constexpr dtype type = dtype::iq4_xs;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 136, pieces = 16, affine = 1;
  static constexpr int max_align = 8, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 32 * (p >> 1) + 16 * h + 8 * (p & 1); }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[2];  // d | scales_h << 16, then scales_l
    ld.template words<align_min(A, 8), 2>(blk, head);
    std::uint32_t q[2];
    ld.template words<align_min(A, 8), 2>(blk + 8 + 8 * p, q);
    const int ib = p >> 1;
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const std::uint32_t ls = ((head[1] >> (4 * ib)) & 0xfu) | (((head[0] >> (16 + 2 * ib)) & 3u) << 4);
    const float dl = mul_rn(d, code_to_float<32>(ls));
    nibble_runs(q, dl, 0.0f, [](std::uint32_t c) { return iq4nl_level(c); }, out);
  }
};

// q4_a32 (troupe's row form of GPTQ / AWQ / compressed-tensors 4-bit): f16 d at 0, u8 zero z at 2, qs[16]
// at 4 in q4_0's nibble order; w = d * (q - z), the code q - z exact.
struct fmt_q4_a32 {
  static constexpr dtype type = dtype::q4_a32;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 20, pieces = 2, affine = 1;
  static constexpr int max_align = 4, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[1];
    ld.template words<align_min(A, 4), 1>(blk, head);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const float z = code_to_float<0>((head[0] >> 16) & 0xffu);
    std::uint32_t q[2];
    ld.template words<align_min(A, 4), 2>(blk + 4 + 8 * p, q);
    nibble_runs(q, d, 0.0f, [z](std::uint32_t c) { return code_to_float<0>(c) - z; }, out);
  }
};

// q8_a32 (8-bit GPTQ / compressed-tensors int8): f32 d at 0, u8 zero z at 4, qs[32] at 8; w = d * (q - z).
// Piece p: qs[16p .. 16p + 16).
struct fmt_q8_a32 {
  static constexpr dtype type = dtype::q8_a32;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 40, pieces = 2, affine = 1;
  static constexpr int max_align = 8, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 16 * p + 8 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[2];
    ld.template words<align_min(A, 8), 2>(blk, head);
    const float d = float_of(head[0]);
    const float z = code_to_float<0>(head[1] & 0xffu);
    std::uint32_t q[4];
    ld.template words<align_min(A, 8), 4>(blk + 8 + 16 * p, q);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = code_to_float<0>((q[2 * h + i / 4] >> (8 * (i & 3))) & 0xffu) - z;
      out[h].scale = d;
      out[h].offset = 0.0f;
    }
  }
};

// An E4M3 byte's value (OCP fp8 e4m3fn: no infinities, 0x7f and 0xff NaN), exact.
TROUPE_HD float e4m3_to_float(std::uint32_t b) {
  const std::uint32_t sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15u && m == 7u) return float_of(sign | 0x7fc00000u);
  if (e == 0u) {  // subnormal: m * 2^-9
    const float v = code_to_float<0>(m) * 0x1p-9f;
    return sign != 0 ? -v : v;
  }
  return float_of(sign | ((e + 120u) << 23) | (m << 20));
}

// fp8_s32 (FP8 checkpoints): f32 s at 0, E4M3 codes[32] at 4; w = s * e4m3(code). Piece p: codes[16p ..).
struct fmt_fp8_s32 {
  static constexpr dtype type = dtype::fp8_s32;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 36, pieces = 2, affine = 1;
  static constexpr int max_align = 4, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 16 * p + 8 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[1];
    ld.template words<align_min(A, 4), 1>(blk, head);
    std::uint32_t q[4];
    ld.template words<align_min(A, 4), 4>(blk + 4 + 16 * p, q);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = e4m3_to_float((q[2 * h + i / 4] >> (8 * (i & 3))) & 0xffu);
      out[h].scale = float_of(head[0]);
      out[h].offset = 0.0f;
    }
  }
};

// q4_1: f16 d at 0, f16 m at 2, qs[16] at 4 in q4_0's nibble order; w = q * d + m (offset -m: the
// same rounding, subtracting a negated value being exact).
struct fmt_q4_1 {
  static constexpr dtype type = dtype::q4_1;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 20, pieces = 2, affine = 2;
  static constexpr int max_align = 4, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[1];
    ld.template words<align_min(A, 4), 1>(blk, head);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const float m = f16_bits_to_float(static_cast<std::uint16_t>(head[0] >> 16));
    std::uint32_t q[2];
    ld.template words<align_min(A, 4), 2>(blk + 4 + 8 * p, q);
    nibble_runs(q, d, -m, [](std::uint32_t c) { return code_to_float<0>(c); }, out);
  }
};

// The two runs of q5 nibbles (q4_0's order) with their fifth bits: element j's is bit j of qh.
// Piece p: qs bytes [8p, 8p + 8) in q; run 0 elements 8p.., run 1 elements 16 + 8p...
template <int Bias>
TROUPE_HD void q5_runs(const std::uint32_t (&q)[2], std::uint32_t qh, int p, float scale, float offset, run8 (&out)[2]) {
  TROUPE_QUANT_UNROLL
  for (int h = 0; h < 2; ++h) {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t lo = (q[i / 4] >> (8 * (i & 3) + 4 * h)) & 0xfu;
      const std::uint32_t hi = (qh >> (16 * h + 8 * p + i)) & 1u;
      out[h].code[i] = code_to_float<Bias>(lo | (hi << 4));
    }
    out[h].scale = scale;
    out[h].offset = offset;
  }
}

// q5_0: f16 d at 0, u32 qh at 2, qs[16] at 6; w = ((nibble | fifth bit << 4) - 16) * d.
struct fmt_q5_0 {
  static constexpr dtype type = dtype::q5_0;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 22, pieces = 2, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<A>(blk)));
    const std::uint32_t qh = ld.template u16<align_min(A, 2)>(blk + 2) | (ld.template u16<align_min(A, 2)>(blk + 4) << 16);
    std::uint32_t q[2];
    ld.template words<align_min(A, 2), 2>(blk + 6 + 8 * p, q);
    q5_runs<16>(q, qh, p, d, 0.0f, out);
  }
};

// q5_1: f16 d at 0, f16 m at 2, u32 qh at 4, qs[16] at 8; w = (nibble | fifth bit << 4) * d + m.
struct fmt_q5_1 {
  static constexpr dtype type = dtype::q5_1;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 24, pieces = 2, affine = 2;
  static constexpr int max_align = 8, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[2];  // d | m << 16, qh
    ld.template words<align_min(A, 8), 2>(blk, head);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const float m = f16_bits_to_float(static_cast<std::uint16_t>(head[0] >> 16));
    std::uint32_t q[2];
    ld.template words<align_min(A, 8), 2>(blk + 8 + 8 * p, q);
    q5_runs<0>(q, head[1], p, d, -m, out);
  }
};

// q5_k: q4_k's f16 d, dmin and 12 scale bytes at 0, qh[32] at 16, qs[128] at 48. As q4_k, with the
// fifth bit of element l (0..31) of sub-block s bit s of qh[l]. Piece p = 4c + u: qs[8p .. 8p + 8)
// and qh[8u .. 8u + 8); run 0 the low nibbles (sub-block 2c, elements 64c + 8u..), run 1 the high
// (sub-block 2c + 1, elements 64c + 32 + 8u..).
struct fmt_q5_k {
  static constexpr dtype type = dtype::q5_k;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 176, pieces = 16, affine = 2;
  static constexpr int max_align = 16, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return fmt_q4_k::run_elem(p, h); }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t head[4];  // d | dmin << 16, then the scale bytes
    ld.template words<A, 4>(blk, head);
    std::uint32_t q[2], qh[2];
    ld.template words<align_min(A, 8), 2>(blk + 48 + 8 * p, q);
    ld.template words<align_min(A, 8), 2>(blk + 16 + 8 * (p & 3), qh);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[0] & 0xffffu));
    const float dmin = f16_bits_to_float(static_cast<std::uint16_t>(head[0] >> 16));
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int sub = 2 * (p >> 2) + h;
      std::uint32_t sc, m;
      fmt_q4_k::scale_min(head[1], head[2], head[3], sub, sc, m);
      out[h].scale = mul_rn(d, static_cast<float>(sc));
      out[h].offset = mul_rn(dmin, static_cast<float>(m));
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t lo = (q[i / 4] >> (8 * (i & 3) + 4 * h)) & 0xfu;
        const std::uint32_t hi = (qh[i / 4] >> (8 * (i & 3) + sub)) & 1u;
        out[h].code[i] = code_to_float<0>(lo | (hi << 4));
      }
    }
  }
};

// q2_k and q3_k share a layout of 2-bit fields: element 128 half + 32 g + 16 sub + l (l < 16) is
// bits 2g, 2g + 1 of qs[32 half + 16 sub + l], in sub-block 8 half + 2 g + sub. Piece p reads the
// octet o = p >> 1 of qs (half o >> 2, sub (o >> 1) & 1, l from 8 (o & 1)); its run h is group
// g = 2 (p & 1) + h.
struct k2_layout {
  TROUPE_HD static constexpr int octet(int p) { return p >> 1; }
  TROUPE_HD static constexpr int group(int p, int h) { return 2 * (p & 1) + h; }
  TROUPE_HD static constexpr int run_elem(int p, int h) {
    return 128 * (octet(p) >> 2) + 32 * group(p, h) + 16 * ((octet(p) >> 1) & 1) + 8 * (octet(p) & 1);
  }
  TROUPE_HD static constexpr int sub_block(int p, int h) { return 8 * (octet(p) >> 2) + 2 * group(p, h) + ((octet(p) >> 1) & 1); }
};

// q2_k: scales[16] at 0 (low nibble scale, high nibble min), qs[64] at 16, f16 d at 80, f16 dmin at
// 82; w = (d * scale) * q - dmin * min.
struct fmt_q2_k {
  static constexpr dtype type = dtype::q2_k;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 84, pieces = 16, affine = 2;
  static constexpr int max_align = 4, mid_align = 4;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return k2_layout::run_elem(p, h); }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    std::uint32_t q[2], dd[1];
    ld.template words<align_min(A, 4), 2>(blk + 16 + 8 * k2_layout::octet(p), q);
    ld.template words<align_min(A, 4), 1>(blk + 80, dd);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(dd[0] & 0xffffu));
    const float dmin = f16_bits_to_float(static_cast<std::uint16_t>(dd[0] >> 16));
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t sm = ld.u8(blk + k2_layout::sub_block(p, h));
      const int g = k2_layout::group(p, h);
      out[h].scale = mul_rn(d, code_to_float<0>(sm & 0xfu));
      out[h].offset = mul_rn(dmin, code_to_float<0>(sm >> 4));
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[h].code[i] = code_to_float<0>((q[i / 4] >> (8 * (i & 3) + 2 * g)) & 3u);
    }
  }
};

// q3_k: hmask[32] at 0, qs[64] at 32, 12 bytes of 6-bit scales at 96 (stored plus 32), f16 d at 108.
// As q2_k's layout for the low 2 bits; the element at qs offset 16 sub + l of group g in half `half`
// has its high bit at bit 4 half + g of hmask[16 sub + l], and a clear bit subtracts 4; w = (d *
// scale) * q. Scale j: its low 4 bits the low nibble of byte j (j < 8) or the high of byte j - 8, its
// top 2 bits bits 2 (j / 4) of byte 8 + j % 4.
struct fmt_q3_k {
  static constexpr dtype type = dtype::q3_k;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 256, block_bytes = 110, pieces = 16, affine = 1;
  static constexpr int max_align = 2, mid_align = 2;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return k2_layout::run_elem(p, h); }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const int o = k2_layout::octet(p), half = o >> 2;
    std::uint32_t q[2], hm[2];
    ld.template words<align_min(A, 2), 2>(blk + 32 + 8 * o, q);
    ld.template words<align_min(A, 2), 2>(blk + 8 * (o & 3), hm);
    const float d = f16_bits_to_float(static_cast<std::uint16_t>(ld.template u16<align_min(A, 2)>(blk + 108)));
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int g = k2_layout::group(p, h), j = k2_layout::sub_block(p, h);
      const std::uint32_t low = j < 8 ? (ld.u8(blk + 96 + j) & 0xfu) : (ld.u8(blk + 96 + j - 8) >> 4);
      const std::uint32_t high = (ld.u8(blk + 96 + 8 + (j & 3)) >> (2 * (j >> 2))) & 3u;
      out[h].scale = mul_rn(d, code_to_float<32>(low | (high << 4)));
      out[h].offset = 0.0f;
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t lo = (q[i / 4] >> (8 * (i & 3) + 2 * g)) & 3u;
        const std::uint32_t hb = (hm[i / 4] >> (8 * (i & 3) + 4 * half + g)) & 1u;
        out[h].code[i] = code_to_float<4>(lo | (hb << 2));  // low - 4 without the high bit
      }
    }
  }
};

// MXFP4's E2M1 levels doubled (ggml's kvalues_mxfp4), as selects.
TROUPE_HD float e2m1_doubled_level(std::uint32_t nibble) {
  constexpr std::int8_t levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  float v = 0.0f;
  TROUPE_QUANT_UNROLL
  for (std::uint32_t j = 0; j < 16; ++j) v = nibble == j ? static_cast<float>(levels[j]) : v;
  return v;
}

// 2^(e - 128), exactly: E8M0's scale halved, as ggml pairs it with the doubled levels (e 0 and 1 are
// f32 subnormals).
TROUPE_HD float e8m0_half(std::uint32_t e) { return e < 2 ? float_of(1u << (21 + e)) : float_of((e - 1) << 23); }

// mxfp4 (gpt-oss's experts): an E8M0 exponent byte e at 0, qs[16] at 1 in q4_0's nibble order;
// w = e2m1_doubled(nibble) * 2^(e - 128). 17-byte blocks: byte loads.
struct fmt_mxfp4 {
  static constexpr dtype type = dtype::mxfp4;
  static constexpr bool plain = false;
  static constexpr int elem_bytes = 0, block_elems = 32, block_bytes = 17, pieces = 2, affine = 1;
  static constexpr int max_align = 1, mid_align = 1;
  TROUPE_HD static constexpr int run_elem(int p, int h) { return 8 * p + 16 * h; }
  template <int A, class Ld>
  TROUPE_HD static void load_piece(const Ld& ld, const std::uint8_t* blk, int p, run8 (&out)[2]) {
    const float d = e8m0_half(ld.u8(blk));
    std::uint32_t q[2];
    ld.template words<1, 2>(blk + 1 + 8 * p, q);
    nibble_runs(q, d, 0.0f, [](std::uint32_t c) { return e2m1_doubled_level(c); }, out);
  }
};

// Calls fn(F{}) for the format that reads `t`; false when no format does.
template <class Fn>
bool with_format(dtype t, Fn&& fn) {
  switch (t) {
    case dtype::f32: fn(fmt_f32{}); return true;
    case dtype::f16: fn(fmt_f16{}); return true;
    case dtype::bf16: fn(fmt_bf16{}); return true;
    case dtype::q8_0: fn(fmt_q8_0{}); return true;
    case dtype::q4_0: fn(fmt_q4_0{}); return true;
    case dtype::q4_k: fn(fmt_q4_k{}); return true;
    case dtype::q6_k: fn(fmt_q6_k{}); return true;
    case dtype::iq4_nl: fn(fmt_iq4_nl{}); return true;
    case dtype::iq4_xs: fn(fmt_iq4_xs{}); return true;
    case dtype::q4_a32: fn(fmt_q4_a32{}); return true;
    case dtype::q8_a32: fn(fmt_q8_a32{}); return true;
    case dtype::fp8_s32: fn(fmt_fp8_s32{}); return true;
    case dtype::q4_1: fn(fmt_q4_1{}); return true;
    case dtype::q5_0: fn(fmt_q5_0{}); return true;
    case dtype::q5_1: fn(fmt_q5_1{}); return true;
    case dtype::q5_k: fn(fmt_q5_k{}); return true;
    case dtype::q2_k: fn(fmt_q2_k{}); return true;
    case dtype::q3_k: fn(fmt_q3_k{}); return true;
    case dtype::mxfp4: fn(fmt_mxfp4{}); return true;
    default: return false;
  }
}

// Bytes of a row of `elems` weights (elems a whole number of blocks for the block formats).
template <class F>
TROUPE_HD constexpr std::int64_t row_bytes(std::int64_t elems) {
  if constexpr (F::plain) return elems * F::elem_bytes;
  else return elems / F::block_elems * F::block_bytes;
}

// ---- alignment -------------------------------------------------------------------------------------

// The alignment (a power of two, at most 16) of every address base + i * stride.
TROUPE_HD constexpr int common_align(std::uint64_t base, std::uint64_t stride) {
  const std::uint64_t v = base | stride | 16u;
  return static_cast<int>(v & (~v + 1));
}

// The alignment a kernel is built for, given what the blocks have: 16, F::mid_align or 1.
template <class F>
TROUPE_HD constexpr int select_align(int have) {
  if (F::max_align >= 16 && have >= 16) return 16;
  if (have >= F::mid_align) return F::mid_align;
  return 1;
}

// fn(std::integral_constant<int, A>{}) for the A that select_align<F> chose (host code: the launches
// and the tests pick the instantiation with it).
template <class F, class Fn>
void with_align(int a, Fn&& fn) {
  if constexpr (F::max_align >= 16) {
    if (a == 16) return fn(std::integral_constant<int, 16>{});
  }
  if constexpr (F::mid_align > 1) {
    if (a == F::mid_align) return fn(std::integral_constant<int, F::mid_align>{});
  }
  fn(std::integral_constant<int, 1>{});
}

// Whether x8 may use 16-byte loads on activation rows of length K at `x`: every run starts a multiple
// of 8 elements into a row, so the base and the row stride must be 16-byte multiples.
TROUPE_HD constexpr bool x_vector_ok(std::uint64_t x, std::int64_t K) { return x % 16 == 0 && K % 4 == 0; }

// ---- values ----------------------------------------------------------------------------------------

template <int Affine>
TROUPE_HD float run_value(const run8& r, int i) {
  if constexpr (Affine == 0) return r.code[i];
  else if constexpr (Affine == 1) return mul_rn(r.scale, r.code[i]);
  else return sub_rn(mul_rn(r.scale, r.code[i]), r.offset);
}

template <class F, int A, class Ld>
TROUPE_HD void decode_piece(const Ld& ld, const std::uint8_t* blk, int p, float (&v)[2][8]) {
  run8 runs[2];
  F::template load_piece<A>(ld, blk, p, runs);
  TROUPE_QUANT_UNROLL
  for (int h = 0; h < 2; ++h) {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) v[h][i] = run_value<F::affine>(runs[h], i);
  }
}

// Decodes one block (plain formats: 16 elements) into out[0 .. block_elems).
template <class F, int A = 1, class Ld = byte_loader>
TROUPE_HD void decode_block(const std::uint8_t* blk, float* out, const Ld& ld = Ld{}) {
  for (int p = 0; p < F::pieces; ++p) {
    float v[2][8];
    decode_piece<F, A>(ld, blk, p, v);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) out[F::run_elem(p, h) + i] = v[h][i];
    }
  }
}

// Work items of decoding a row of C weights: its pieces, then (plain formats) its last C % 16
// elements one by one.
template <class F>
TROUPE_HD constexpr std::int64_t decode_items(std::int64_t C) {
  const std::int64_t pieces = C / F::block_elems * F::pieces;
  if constexpr (F::plain) return pieces + C % F::block_elems;
  else return pieces;
}

// Decodes item `it` of a row (aligned to A) of C weights: a piece, whose runs go to elements
// first[0] and first[1] of the row (returns 8), or one element, at first[0], in v[0][0] (returns 1).
template <class F, int A, class Ld>
TROUPE_HD int decode_item(const Ld& ld, const std::uint8_t* row, std::int64_t C, std::int64_t it,
                          std::int64_t (&first)[2], float (&v)[2][8]) {
  const std::int64_t pieces = C / F::block_elems * F::pieces;
  if constexpr (F::plain) {
    if (it >= pieces) {
      first[0] = first[1] = pieces * F::block_elems + (it - pieces);
      v[0][0] = F::template element<A>(ld, row, first[0]);
      return 1;
    }
  }
  const std::int64_t b = it / F::pieces;
  const int p = static_cast<int>(it % F::pieces);
  decode_piece<F, A>(ld, row + b * F::block_bytes, p, v);
  first[0] = b * F::block_elems + F::run_elem(p, 0);
  first[1] = b * F::block_elems + F::run_elem(p, 1);
  return 8;
}

// ---- dot products ----------------------------------------------------------------------------------

// acc + run . x, where sx = sum(x) (only read when Affine == 2): the codes against x in one FMA chain,
// then scaled (and the offset's share taken off) into acc.
template <int Affine>
TROUPE_HD float accumulate_run(const run8& r, const float (&x)[8], float sx, float acc) {
  float s = 0.0f;
  TROUPE_QUANT_UNROLL
  for (int i = 0; i < 8; ++i) s = fma_rn(r.code[i], x[i], s);
  if constexpr (Affine == 0) {
    return acc + s;
  } else {
    acc = fma_rn(r.scale, s, acc);
    if constexpr (Affine == 2) acc = fma_rn(-r.offset, sx, acc);
    return acc;
  }
}

TROUPE_HD float sum8(const float (&x)[8]) {
  float s = 0.0f;
  TROUPE_QUANT_UNROLL
  for (int i = 0; i < 8; ++i) s += x[i];
  return s;
}

// The dot product of one block with x[0 .. block_elems), pieces and runs in order.
template <class F, int A = 1, class Ld = byte_loader>
TROUPE_HD float block_dot(const std::uint8_t* blk, const float* x, const Ld& ld = Ld{}) {
  float acc = 0.0f;
  for (int p = 0; p < F::pieces; ++p) {
    run8 runs[2];
    F::template load_piece<A>(ld, blk, p, runs);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      float xv[8];
      ld.x8(x + F::run_elem(p, h), xv);
      acc = accumulate_run<F::affine>(runs[h], xv, F::affine == 2 ? sum8(xv) : 0.0f, acc);
    }
  }
  return acc;
}

// ---- the GEMV's per-thread work --------------------------------------------------------------------
// A CTA of gemv_threads threads computes gemv_rows output rows for up to MaxM activation rows. Thread
// t takes the pieces t, t + gemv_threads, ... of the rows (the same pieces of every row, so each run of
// x it loads serves all of them), accumulating acc[r][m]. The kernel then sums each warp's 32 values
// by a shuffle butterfly (offsets 16, 8, 4, 2, 1: v += v of lane ^ offset), the warps' sums in warp
// order, and adds the residual last.

inline constexpr int gemv_threads = 128;
inline constexpr int gemv_warps = gemv_threads / 32;
inline constexpr int gemv_rows = 2;
inline constexpr int gemv_max_m = 8;

// The MaxM a pass over mc (1..gemv_max_m) activation rows is built for.
TROUPE_HD constexpr int gemv_pass_m(int mc) { return mc <= 1 ? 1 : mc <= 2 ? 2 : mc <= 4 ? 4 : 8; }

// fn(std::integral_constant<int, MaxM>{}) for MaxM = pm (one of gemv_pass_m's values).
template <class Fn>
void with_pass_m(int pm, Fn&& fn) {
  switch (pm) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

// rows[r]: the weight row of output row r (a valid row even past N; that result is not stored), aligned
// to A; x: the pass's first activation row, K floats each; mc <= MaxM rows used.
template <class F, int A, int MaxM, int R, class Ld>
TROUPE_HD void gemv_thread(const Ld& ld, const std::uint8_t* const (&rows)[R], std::int64_t K, const float* x, int mc,
                           int tid, int nthreads, float (&acc)[R][MaxM]) {
  TROUPE_QUANT_UNROLL
  for (int r = 0; r < R; ++r) {
    TROUPE_QUANT_UNROLL
    for (int m = 0; m < MaxM; ++m) acc[r][m] = 0.0f;
  }
  const std::int64_t pieces = K / F::block_elems * F::pieces;
  for (std::int64_t q = tid; q < pieces; q += nthreads) {
    const std::int64_t b = q / F::pieces;
    const int p = static_cast<int>(q % F::pieces);
    run8 runs[R][2];
    TROUPE_QUANT_UNROLL
    for (int r = 0; r < R; ++r) F::template load_piece<A>(ld, rows[r] + b * F::block_bytes, p, runs[r]);
    TROUPE_QUANT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const float* xr = x + b * F::block_elems + F::run_elem(p, h);
      TROUPE_QUANT_UNROLL
      for (int m = 0; m < MaxM; ++m) {
        if (m < mc) {
          float xv[8];
          ld.x8(xr + m * K, xv);
          const float sx = F::affine == 2 ? sum8(xv) : 0.0f;
          TROUPE_QUANT_UNROLL
          for (int r = 0; r < R; ++r) acc[r][m] = accumulate_run<F::affine>(runs[r][h], xv, sx, acc[r][m]);
        }
      }
    }
  }
  if constexpr (F::plain) {  // the last K % 16 weights, one per thread
    for (std::int64_t k = pieces * F::block_elems + tid; k < K; k += nthreads) {
      float wv[R];
      TROUPE_QUANT_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = F::template element<A>(ld, rows[r], k);
      TROUPE_QUANT_UNROLL
      for (int m = 0; m < MaxM; ++m) {
        if (m < mc) {
          const float xk = x[m * K + k];
          TROUPE_QUANT_UNROLL
          for (int r = 0; r < R; ++r) acc[r][m] = fma_rn(wv[r], xk, acc[r][m]);
        }
      }
    }
  }
}

}  // namespace troupe::exec::cuda::quant

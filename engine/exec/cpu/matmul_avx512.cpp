// The AVX-512 kernels (F/BW/VL/DQ + VNNI, and BF16 where the CPU has it). Only called when
// best_isa() allows avx512.
//
// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused merge operand of their
// unmasked forms, which its -Wmaybe-uninitialized reports at the outermost inlined caller: off for
// this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/matmul_kernels.hpp"

namespace troupe::exec::cpu::detail {
namespace {

struct v512 {
  static constexpr int lanes = 16;
  // q8_0 weights are made unsigned for vpdpbusd by flipping their sign bit (adding 128).
  static constexpr int q8_offset = 128;
  // vpdpbusd sums u8 * s8 products in 32 bits: any u8 is exact.
  static constexpr bool full_u8_dot = true;
  using vi = __m512i;
  using vf = __m512;

  static vf zero_f() { return _mm512_setzero_ps(); }
  static vi zero_i() { return _mm512_setzero_si512(); }
  static vf set1_f(float v) { return _mm512_set1_ps(v); }
  static vi set1_i32(std::int32_t v) { return _mm512_set1_epi32(v); }
  static vi set1_i8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static vf load_f(const float* p) { return _mm512_load_ps(p); }
  static vf loadu_f(const float* p) { return _mm512_loadu_ps(p); }
  static vf load_f16(const std::byte* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 16 E4M3 bytes as f32 of value / 256: sign to bit 15, exponent and mantissa to bits 7..14 of an f16
  // (subnormals included), exact.
  static vf e4m3_f(const std::byte* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7);
    return _mm512_cvtph_ps(_mm256_or_si256(sign, mag));
  }
  static vi load_i(const void* p) { return _mm512_loadu_si512(p); }
  static void store_i(std::int32_t* p, vi v) { _mm512_store_si512(p, v); }
  static void storeu_f(float* p, vf v) { _mm512_storeu_ps(p, v); }
  static void store_partial(float* p, vf v, int n) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v);
  }
  static vi bcast4(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static vf abs_f(vf v) { return _mm512_abs_ps(v); }
  static vf max_f(vf a, vf b) { return _mm512_max_ps(a, b); }
  static vf mul_f(vf a, vf b) { return _mm512_mul_ps(a, b); }
  static vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
  static vf fmsub(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }
  static float reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
  static vi round_i32(vf v) { return _mm512_cvtps_epi32(v); }
  static int reduce_add_i32(vi v) { return _mm512_reduce_add_epi32(v); }
  static void store_i8(std::int8_t* q, vi v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(v));
  }
  static vi and_i(vi a, vi b) { return _mm512_and_si512(a, b); }
  static vi or_i(vi a, vi b) { return _mm512_or_si512(a, b); }
  static vi add_i32(vi a, vi b) { return _mm512_add_epi32(a, b); }
  // An accumulator's step, kept in order (the avx2 level's dot_u8s8 says why).
  static vi pin(vi v) {
    asm("" : "+v"(v));
    return v;
  }
  static vi sub_i32(vi a, vi b) { return _mm512_sub_epi32(a, b); }
  static vi mullo_i32(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
  static vi srl16(vi v, int n) { return _mm512_srl_epi16(v, _mm_cvtsi32_si128(n)); }
  template <int N>
  static vi srli16(vi v) { return _mm512_srli_epi16(v, N); }
  template <int N>
  static vi slli16(vi v) { return _mm512_slli_epi16(v, N); }
  template <int N>
  static vi srai32(vi v) { return _mm512_srai_epi32(v, N); }
  template <int N>
  static vi slli32(vi v) { return _mm512_slli_epi32(v, N); }
  static vf cvt_f(vi v) { return _mm512_cvtepi32_ps(v); }
  static vf as_f(vi v) { return _mm512_castsi512_ps(v); }
  // The 16 bytes at p in every 128-bit lane, and a byte table lookup within lanes (idx in 0..15).
  static vi bcast16(const std::int8_t* p) { return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static vi shuffle_i8(vi table, vi idx) { return _mm512_shuffle_epi8(table, idx); }
  static vi cvt_u8_i32(const std::byte* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vi cvt_i8_i32(const std::byte* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vi dot_u8s8(vi acc, vi u, vi s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static vi q8_weights(vi w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }
  static vi dot_q8(vi acc, vi wp, vi, vi x) { return _mm512_dpbusd_epi32(acc, wp, x); }
  static vf bf16_even(vi v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
  static vf bf16_odd(vi v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

// bf16 weights against activations rounded to bf16 (as ggml does), two columns per vdpbf16ps: twice
// the multiply rate of f32 FMAs, with products exact and sums in f32.
std::size_t bf16_act_bytes(std::int64_t k) { return static_cast<std::size_t>((k + 1) / 2) * 4; }

void prepare_bf16(const float* x, std::int64_t k, std::byte* out) {
  auto* o = reinterpret_cast<std::uint16_t*>(out);
  std::int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(o + i, reinterpret_cast<const __m512i&>(v));
  }
  for (; i < k; ++i) o[i] = f32_to_bf16(x[i]);
  if (k % 2 != 0) o[k] = 0;
}

template <int MR, int NV>
void bf16_dot_tile(const gemm_args& a, std::int64_t p, std::int64_t m) {
  const std::int64_t pairs = (a.w->cols + 1) / 2;
  const std::byte* w[NV];
  for (int c = 0; c < NV; ++c) w[c] = a.w->panel(p + c);
  const std::byte* x[MR];
  for (int i = 0; i < MR; ++i) x[i] = a.acts + static_cast<std::size_t>(m + i) * a.act_stride;
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  for (std::int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh wv[NV];
    for (int c = 0; c < NV; ++c) {
      const __m512i v = _mm512_load_si512(w[c] + static_cast<std::size_t>(kp) * 64);
      wv[c] = reinterpret_cast<const __m512bh&>(v);
    }
    for (int i = 0; i < MR; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, x[i] + 4 * kp, 4);
      const __m512i xb = _mm512_set1_epi32(pair);
      for (int c = 0; c < NV; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], wv[c], reinterpret_cast<const __m512bh&>(xb));
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NV; ++c) store_rows<v512>(a, m + i, p + c, 0, acc[i][c]);
  }
}

template <int MR, int NV>
void compute_bf16_dot(const gemm_args& a) {
  float_compute<v512, MR, NV>(a, [&]<int R, int N>(std::int64_t p, std::int64_t m) { bf16_dot_tile<R, N>(a, p, m); });
}

// With AMX: a task's rows in whole tiles (16 for bf16, 8 for q8_0) run on the tiles, the rest (decode,
// a prefill's last rows) on the vector tiles; a bf16 K that is not a multiple of 32 stays on vectors.
void split_rows(const gemm_args& a, std::int64_t whole, void (*tiles)(const gemm_args&), void (*vectors)(const gemm_args&)) {
  gemm_args t = a;
  if (whole > 0) {
    t.m1 = a.m0 + whole;
    tiles(t);
  }
  if (a.m0 + whole < a.m1) {
    t.m0 = a.m0 + whole;
    t.m1 = a.m1;
    vectors(t);
  }
}
template <int MR, int NV>
void compute_bf16_amx(const gemm_args& a) {
  split_rows(a, a.w->cols % 32 == 0 ? (a.m1 - a.m0) / 16 * 16 : 0, amx_bf16_rows_hardware, compute_bf16_dot<MR, NV>);
}
template <int MR>
void compute_q8_0_amx(const gemm_args& a) {
  const std::int64_t rows = a.m1 - a.m0;
  split_rows(a, a.m0 % act32_group == 0 && rows >= 16 ? rows / act32_group * act32_group : 0, amx_q8_0_rows_hardware, compute_q8_0<v512, MR>);
}

kernel_table make_table() {
  kernel_table t{
      .f32 = {nullptr, nullptr, compute_f32<v512, 6, 4>},
      .f16 = {nullptr, nullptr, compute_f16<v512, 6, 4>},
      .bf16 = {nullptr, nullptr, compute_bf16<v512, 8, 2>},
      .q8_0 = {bytes32, nullptr, compute_q8_0<v512, 8>, prepare_q8_32<v512, v512::q8_offset>},
      .q4_0 = {bytes32, nullptr, compute_q4_0<v512, 8>, prepare_q8_32<v512, 8>},
      .q4_k = {bytes256, prepare_q4_k<v512>, compute_q4_k<v512, 8>},
      .q6_k = {bytes256, prepare_q6_k<v512>, compute_q6_k<v512, 10>},
      .mxfp4 = {bytes32, nullptr, compute_mxfp4<v512, 8>, prepare_q8_32<v512, mxfp4_offset>},
      .iq4_nl = {bytes32, nullptr, compute_iq4_nl<v512, 8>, prepare_q8_32<v512, v512::q8_offset>},
      .iq4_xs = {bytes32, nullptr, compute_iq4_xs<v512, 8>, prepare_q8_32<v512, v512::q8_offset>},
      .q4_a32 = {bytes32, nullptr, compute_q4_a32<v512, 8>, prepare_q8_32<v512, 1>},
      .q8_a32 = {bytes32, nullptr, compute_q8_a32<v512, 8>, prepare_q8_32<v512, 1>},
      .fp8_s32 = {nullptr, nullptr, compute_fp8_s32<v512, 6>},
      .q4_1 = {bytes32, nullptr, compute_nibbles<v512, 8, nibbles::q4_1>, prepare_q8_32<v512, 1>},
      .q5_0 = {bytes32, nullptr, compute_nibbles<v512, 8, nibbles::q5_0>, prepare_q8_32<v512, 16>},
      .q5_1 = {bytes32, nullptr, compute_nibbles<v512, 8, nibbles::q5_1>, prepare_q8_32<v512, 1>},
      .q5_k = {bytes256, prepare_q4_k<v512>, compute_q4_k<v512, 8, true>},
      .q3_k = {bytes256, prepare_q6_k<v512, 4>, compute_q6_k<v512, 10, k16::q3>},
      .q2_k = {bytes256, prepare_q6_k<v512, 1>, compute_q6_k<v512, 10, k16::q2>},
  };
  if (has_bf16_dot()) t.bf16 = {bf16_act_bytes, prepare_bf16, compute_bf16_dot<8, 2>};
  if (amx().bf16) t.bf16.compute = compute_bf16_amx<8, 2>;
  if (amx().int8) t.q8_0.compute = compute_q8_0_amx<8>;
  return t;
}

}  // namespace

const kernel_table& avx512_kernels() {
  static const kernel_table t = make_table();
  return t;
}

}  // namespace troupe::exec::cpu::detail

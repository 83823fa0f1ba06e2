// The AVX2 kernels (AVX2 + FMA + F16C): 8 lanes, so a 16-row panel is two halves, and byte dots
// take maddubs + madd where AVX-512 has vpdpbusd.
#include <immintrin.h>

#include "engine/exec/cpu/matmul_kernels.hpp"

namespace troupe::exec::cpu::detail {
namespace {

struct v256 {
  static constexpr int lanes = 8;
  // maddubs saturates at 16 bits, which a biased q8_0 weight (up to 255) times 127 twice exceeds;
  // q8_0 instead moves the weight's sign onto the activation, and needs no correction.
  static constexpr int q8_offset = 0;
  static constexpr bool full_u8_dot = false;
  using vi = __m256i;
  using vf = __m256;

  static vf zero_f() { return _mm256_setzero_ps(); }
  static vi zero_i() { return _mm256_setzero_si256(); }
  static vf set1_f(float v) { return _mm256_set1_ps(v); }
  static vi set1_i32(std::int32_t v) { return _mm256_set1_epi32(v); }
  static vi set1_i8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static vf load_f(const float* p) { return _mm256_load_ps(p); }
  static vf loadu_f(const float* p) { return _mm256_loadu_ps(p); }
  static vf load_f16(const std::byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 8 E4M3 bytes as f32 of value / 256 (see the avx512 level).
  static vf e4m3_f(const std::byte* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    const __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7);
    return _mm256_cvtph_ps(_mm_or_si128(sign, mag));
  }
  // 16 E4M3 bytes as two vectors (the first 8, the last 8), each exactly as e4m3_f gives them: the
  // sign and magnitude moves done once in 256 bits for both (a one-row FP8 product's two halves).
  static void e4m3_f2(const std::byte* p, vf& lo, vf& hi) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7);
    const __m256i h = _mm256_or_si256(sign, mag);
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
  static vi load_i(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static void store_i(std::int32_t* p, vi v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
  static void storeu_f(float* p, vf v) { _mm256_storeu_ps(p, v); }
  static void store_partial(float* p, vf v, int n) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, mask, v);
  }
  static vi bcast4(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  static vf abs_f(vf v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static vf max_f(vf a, vf b) { return _mm256_max_ps(a, b); }
  static vf mul_f(vf a, vf b) { return _mm256_mul_ps(a, b); }
  static vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
  static vf fmsub(vf a, vf b, vf c) { return _mm256_fmsub_ps(a, b, c); }
  static float reduce_max(vf v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static vi round_i32(vf v) { return _mm256_cvtps_epi32(v); }
  static int reduce_add_i32(vi v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    return _mm_cvtsi128_si32(s);
  }
  static void store_i8(std::int8_t* q, vi v) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(w, w));
  }
  static vi and_i(vi a, vi b) { return _mm256_and_si256(a, b); }
  static vi or_i(vi a, vi b) { return _mm256_or_si256(a, b); }
  static vi add_i32(vi a, vi b) { return _mm256_add_epi32(a, b); }
  // An accumulator's step, kept in order (see dot_u8s8).
  static vi pin(vi v) {
    asm("" : "+x"(v));
    return v;
  }
  static vi sub_i32(vi a, vi b) { return _mm256_sub_epi32(a, b); }
  static vi mullo_i32(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
  static vi srl16(vi v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }
  template <int N>
  static vi srli16(vi v) { return _mm256_srli_epi16(v, N); }
  template <int N>
  static vi slli16(vi v) { return _mm256_slli_epi16(v, N); }
  template <int N>
  static vi srai32(vi v) { return _mm256_srai_epi32(v, N); }
  template <int N>
  static vi slli32(vi v) { return _mm256_slli_epi32(v, N); }
  static vf cvt_f(vi v) { return _mm256_cvtepi32_ps(v); }
  static vf as_f(vi v) { return _mm256_castsi256_ps(v); }
  // The 16 bytes at p in both 128-bit lanes, and a byte table lookup within lanes (idx in 0..15).
  static vi bcast16(const std::int8_t* p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static vi shuffle_i8(vi table, vi idx) { return _mm256_shuffle_epi8(table, idx); }
  static vi cvt_u8_i32(const std::byte* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static vi cvt_i8_i32(const std::byte* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Pairs of u8 * s8 products fit int16 for every caller here (codes up to 63 against |x| <= 127).
  // The empty asm pins each step's sum: integer adds reassociate, and GCC 12, given a fully unrolled
  // block of dots, summed their products as a tree instead of into the row's accumulator, holding
  // every product live and spilling 32 vectors a block to the stack. Pinned, the q8_0 and q4_0 tiles
  // ran 1.3x to 1.6x faster at 16 and 512 rows (troupe_matmul_bench, Zen 3).
  static vi dot_u8s8(vi acc, vi u, vi s) {
    return pin(_mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))));
  }
  static vi q8_weights(vi w) { return _mm256_abs_epi8(w); }
  static vi dot_q8(vi acc, vi wabs, vi w, vi x) { return dot_u8s8(acc, wabs, _mm256_sign_epi8(x, w)); }
  static vf bf16_even(vi v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
  static vf bf16_odd(vi v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

}  // namespace

// Row tiles: 4 rows, except q6_k's 3. Its 4-row tile (4 int accumulators, 4 float sums, the codes and
// the sub-block scales) spilled past the 16 ymm registers and ran prefill at 0.6x the 3-row tile's
// speed (bench/results/cpu-quant-formats-zen3-avx2.md).
const kernel_table& avx2_kernels() {
  static const kernel_table t{
      .f32 = {nullptr, nullptr, compute_f32<v256, 6, 2>},
      .f16 = {nullptr, nullptr, compute_f16<v256, 6, 2>},
      .bf16 = {nullptr, nullptr, compute_bf16<v256, 4, 2>},
      .q8_0 = {bytes32, nullptr, compute_q8_0<v256, 4>, prepare_q8_32<v256, v256::q8_offset>},
      .q4_0 = {bytes32, nullptr, compute_q4_0<v256, 4>, prepare_q8_32<v256, 8>},
      .q4_k = {bytes256, prepare_q4_k<v256>, compute_q4_k<v256, 4>},
      .q6_k = {bytes256, prepare_q6_k<v256>, compute_q6_k<v256, 3>},
      .mxfp4 = {bytes32, nullptr, compute_mxfp4<v256, 4>, prepare_q8_32<v256, mxfp4_offset>},
      .iq4_nl = {bytes32, nullptr, compute_iq4_nl<v256, 4>, prepare_q8_32<v256, v256::q8_offset>},
      .iq4_xs = {bytes32, nullptr, compute_iq4_xs<v256, 4>, prepare_q8_32<v256, v256::q8_offset>},
      .q4_a32 = {bytes32, nullptr, compute_q4_a32<v256, 4>, prepare_q8_32<v256, 1>},
      .q8_a32 = {bytes32, nullptr, compute_q8_a32<v256, 4>, prepare_q8_32<v256, 1>},
      .fp8_s32 = {nullptr, nullptr, compute_fp8_s32<v256, 4>},
      .q4_1 = {bytes32, nullptr, compute_nibbles<v256, 4, nibbles::q4_1>, prepare_q8_32<v256, 1>},
      .q5_0 = {bytes32, nullptr, compute_nibbles<v256, 4, nibbles::q5_0>, prepare_q8_32<v256, 16>},
      .q5_1 = {bytes32, nullptr, compute_nibbles<v256, 4, nibbles::q5_1>, prepare_q8_32<v256, 1>},
      .q5_k = {bytes256, prepare_q4_k<v256>, compute_q4_k<v256, 4, true>},
      .q3_k = {bytes256, prepare_q6_k<v256, 4>, compute_q6_k<v256, 4, k16::q3>},
      .q2_k = {bytes256, prepare_q6_k<v256, 1>, compute_q6_k<v256, 4, k16::q2>},
  };
  return t;
}

}  // namespace troupe::exec::cpu::detail

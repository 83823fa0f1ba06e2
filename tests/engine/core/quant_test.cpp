#include "engine/core/quant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

namespace troupe {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers: blocks built byte by byte, and deterministic data.

std::vector<std::byte> blocks_of(dtype t, std::size_t count = 1, std::uint8_t fill = 0) {
  return std::vector<std::byte>(info(t).block_bytes * count, std::byte{fill});
}

void set_u8(std::vector<std::byte>& b, std::size_t at, std::uint8_t v) { b.at(at) = std::byte{v}; }

void set_u16(std::vector<std::byte>& b, std::size_t at, std::uint16_t v) {
  set_u8(b, at, static_cast<std::uint8_t>(v & 0xff));
  set_u8(b, at + 1, static_cast<std::uint8_t>(v >> 8));
}

std::vector<float> decode(dtype t, const std::vector<std::byte>& b) {
  const auto n = static_cast<std::int64_t>(b.size() / info(t).block_bytes * info(t).block_elems);
  std::vector<float> y(static_cast<std::size_t>(n), -12345.0f);
  const auto r = dequantize_row(t, b.data(), y.data(), n);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message());
  return y;
}

std::vector<std::byte> encode(dtype t, const std::vector<float>& x) {
  std::vector<std::byte> b(*storage_bytes(t, x.size()));
  const auto r = quantize_row(t, x.data(), b.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message());
  return b;
}

std::vector<std::uint8_t> as_u8(const std::vector<std::byte>& b) {
  std::vector<std::uint8_t> out;
  for (auto v : b) out.push_back(std::to_integer<std::uint8_t>(v));
  return out;
}

// A 64-bit LCG with Box-Muller on top, so the data is the same on every platform and run.
class test_rng {
 public:
  explicit test_rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return s_;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  double gaussian() {
    const double u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::uint64_t s_;
};

// ---------------------------------------------------------------------------------------------
// Decoding hand-built blocks. f16 constants: 0x3c00 = 1, 0x3800 = 0.5, 0x3400 = 0.25,
// 0x3000 = 0.125, 0xbc00 = -1. Each test would turn red on a wrong field offset, nibble order,
// bit position or scale unpacking in the decoder of its format.

TEST(quant, q4_0_decodes_nibbles_around_8_and_steps_whole_blocks) {
  // Layout: f16 d, then 16 bytes; byte j holds element j (low nibble) and j + 16 (high nibble).
  auto b = blocks_of(dtype::q4_0, 2, 0x88);  // nibble 8 -> (8 - 8) * d = 0
  set_u16(b, 0, 0x3800);                     // d = 0.5
  set_u8(b, 2 + 0, 0x3a);                    // y[0]: 10 -> (10-8)*0.5 = 1;  y[16]: 3 -> (3-8)*0.5 = -2.5
  set_u8(b, 2 + 15, 0xf0);                   // y[15]: 0 -> -8*0.5 = -4;    y[31]: 15 -> 7*0.5 = 3.5
  set_u16(b, 18, 0x3c00);                    // second block at byte 18: d = 1
  set_u8(b, 18 + 2 + 0, 0x9f);               // y[32]: 15 -> 7;  y[48]: 9 -> 1
  std::vector<float> want(64, 0.0f);
  want[0] = 1.0f;
  want[16] = -2.5f;
  want[15] = -4.0f;
  want[31] = 3.5f;
  want[32] = 7.0f;
  want[48] = 1.0f;
  EXPECT_EQ(decode(dtype::q4_0, b), want);
}

TEST(quant, mxfp4_decodes_e2m1_codes_times_the_e8m0_scale) {
  // Layout (ggml's block_mxfp4): one E8M0 byte e, then 16 bytes; byte j holds element j (low nibble)
  // and j + 16 (high nibble), each an E2M1 code: 0 0.5 1 1.5 2 3 4 6, bit 3 the sign. Scale 2^(e - 127).
  auto b = blocks_of(dtype::mxfp4, 2, 0x00);
  set_u8(b, 0, 127);        // 2^0
  set_u8(b, 1 + 0, 0x7f);   // y[0]: code 15 -> -6;  y[16]: code 7 -> 6
  set_u8(b, 1 + 3, 0x91);   // y[3]: code 1 -> 0.5;  y[19]: code 9 -> -0.5
  set_u8(b, 17, 130);       // second block: 2^3
  set_u8(b, 17 + 1 + 5, 0x05);  // y[37]: code 5 -> 3 * 8 = 24
  set_u8(b, 17 + 1 + 6, 0x80);  // y[54]: code 8 (negative zero) -> 0
  std::vector<float> want(64, 0.0f);
  want[0] = -6.0f;
  want[16] = 6.0f;
  want[3] = 0.5f;
  want[19] = -0.5f;
  want[37] = 24.0f;
  EXPECT_EQ(decode(dtype::mxfp4, b), want);
  // The encoder: the block's largest magnitude in the top binade, values to their nearest code.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = 0.25f * static_cast<float>(j - 16);  // -4 .. 3.75
  const auto q = encode(dtype::mxfp4, x);
  EXPECT_EQ(static_cast<int>(q[0]), 127);  // amax 4: floor(log2 4) - 2 + 127
  const auto y = decode(dtype::mxfp4, q);
  for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(y[j] - x[j]), 0.5f) << j;  // half the widest code step (2 .. 3 .. 4)
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[16], 0.0f);
}

TEST(quant, q4_1_decodes_nibbles_times_d_plus_m) {
  // Layout: f16 d, f16 m, 16 bytes of nibbles as q4_0; y = q * d + m.
  auto b = blocks_of(dtype::q4_1);
  set_u16(b, 0, 0x3800);  // d = 0.5
  set_u16(b, 2, 0xbc00);  // m = -1
  set_u8(b, 4 + 0, 0x3a);   // y[0] = 10*0.5 - 1 = 4;  y[16] = 3*0.5 - 1 = 0.5
  set_u8(b, 4 + 15, 0xf0);  // y[15] = 0*0.5 - 1 = -1; y[31] = 15*0.5 - 1 = 6.5
  std::vector<float> want(32, -1.0f);  // nibble 0 -> m
  want[0] = 4.0f;
  want[16] = 0.5f;
  want[31] = 6.5f;
  EXPECT_EQ(decode(dtype::q4_1, b), want);
}

TEST(quant, q5_0_takes_the_fifth_bit_of_element_j_from_bit_j) {
  // Layout: f16 d, u32 qh (little-endian), 16 bytes of nibbles.
  // q = nibble | (bit j of qh) << 4, y = (q - 16) * d.
  auto b = blocks_of(dtype::q5_0);
  set_u16(b, 0, 0x3400);  // d = 0.25
  // Every fifth bit set except bits 1 and 16: qh = 0xfffefffd. With nibble 0 and the bit set,
  // q = 16 -> 0, so untouched elements decode to 0.
  set_u8(b, 2, 0xfd);
  set_u8(b, 3, 0xff);
  set_u8(b, 4, 0xfe);
  set_u8(b, 5, 0xff);
  set_u8(b, 6 + 0, 0x21);   // y[0]: 1|16 = 17 -> 0.25;  y[16]: 2 (bit 16 clear) -> -14*0.25 = -3.5
  set_u8(b, 6 + 1, 0x43);   // y[1]: 3 (bit 1 clear) -> -13*0.25 = -3.25; y[17]: 4|16 = 20 -> 4*0.25 = 1
  set_u8(b, 6 + 15, 0xf0);  // y[31]: 15|16 = 31 -> 15*0.25 = 3.75
  std::vector<float> want(32, 0.0f);
  want[0] = 0.25f;
  want[16] = -3.5f;
  want[1] = -3.25f;
  want[17] = 1.0f;
  want[31] = 3.75f;
  EXPECT_EQ(decode(dtype::q5_0, b), want);
}

TEST(quant, q5_1_decodes_five_bits_times_d_plus_m) {
  // Layout: f16 d, f16 m, u32 qh, 16 bytes of nibbles; y = q * d + m.
  auto b = blocks_of(dtype::q5_1);
  set_u16(b, 0, 0x3800);  // d = 0.5
  set_u16(b, 2, 0x3c00);  // m = 1
  set_u8(b, 4, 0x04);     // qh bit 2
  set_u8(b, 7, 0x80);     // qh bit 31
  set_u8(b, 8 + 2, 0x0f);   // y[2]: 15|16 = 31 -> 31*0.5 + 1 = 16.5
  set_u8(b, 8 + 15, 0x70);  // y[31]: 7|16 = 23 -> 23*0.5 + 1 = 12.5; y[15]: 0 -> 1
  std::vector<float> want(32, 1.0f);
  want[2] = 16.5f;
  want[31] = 12.5f;
  EXPECT_EQ(decode(dtype::q5_1, b), want);
}

TEST(quant, q8_0_and_q8_1_decode_signed_bytes_times_d) {
  // q8_0: f16 d, 32 int8. q8_1: f16 d, f16 s (a sum, ignored), 32 int8.
  auto a = blocks_of(dtype::q8_0);
  set_u16(a, 0, 0x3000);     // d = 0.125
  set_u8(a, 2 + 0, 0x01);    // 1 * 0.125
  set_u8(a, 2 + 1, 0x80);    // -128 * 0.125 = -16
  set_u8(a, 2 + 2, 0xff);    // -1 * 0.125
  set_u8(a, 2 + 31, 0x7f);   // 127 * 0.125 = 15.875
  std::vector<float> want(32, 0.0f);
  want[0] = 0.125f;
  want[1] = -16.0f;
  want[2] = -0.125f;
  want[31] = 15.875f;
  EXPECT_EQ(decode(dtype::q8_0, a), want);

  auto b = blocks_of(dtype::q8_1);
  set_u16(b, 0, 0x3800);     // d = 0.5
  set_u16(b, 2, 0x4000);     // s = 2, not used for decoding
  set_u8(b, 4 + 0, 0xfd);    // -3 * 0.5 = -1.5
  set_u8(b, 4 + 31, 0x04);   // 4 * 0.5 = 2
  std::vector<float> want1(32, 0.0f);
  want1[0] = -1.5f;
  want1[31] = 2.0f;
  EXPECT_EQ(decode(dtype::q8_1, b), want1);
}

TEST(quant, q2_k_decodes_two_bit_fields_with_nibble_scales_and_mins) {
  // Layout: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit quants, f16 d,
  // f16 dmin. Half h (128 elements) uses qs[32h .. 32h+31]; its group g (32 elements) is bits 2g of
  // those bytes, sub-block s = 8h + 2g + (second 16 of the group); y = d*sc*q - dmin*m.
  auto b = blocks_of(dtype::q2_k);
  set_u16(b, 80, 0x3800);  // d = 0.5
  set_u16(b, 82, 0x3400);  // dmin = 0.25
  set_u8(b, 0, 0x23);      // sub 0: dl = 0.5*3 = 1.5, ml = 0.25*2 = 0.5
  set_u8(b, 2, 0x11);      // sub 2: dl = 0.5, ml = 0.25
  set_u8(b, 6, 0xf1);      // sub 6: dl = 0.5, ml = 0.25*15 = 3.75
  set_u8(b, 9, 0x12);      // sub 9: dl = 1, ml = 0.25
  set_u8(b, 16 + 0, 0xe4);   // qs[0] = 0b11'10'01'00: y[0] q=0, y[32] q=1, y[64] q=2, y[96] q=3
  set_u8(b, 16 + 49, 0x03);  // qs[49] = half 1, second 16, l = 1: y[128+16+1] q=3
  std::vector<float> want(256, 0.0f);
  std::fill(want.begin() + 0, want.begin() + 16, -0.5f);     // sub 0, q=0: -0.5
  std::fill(want.begin() + 32, want.begin() + 48, -0.25f);   // sub 2, q=0: -0.25
  std::fill(want.begin() + 96, want.begin() + 112, -3.75f);  // sub 6, q=0: -3.75
  std::fill(want.begin() + 144, want.begin() + 160, -0.25f); // sub 9, q=0: -0.25
  want[32] = 0.25f;    // 0.5*1 - 0.25
  want[64] = 0.0f;     // sub 4 has scale and min 0
  want[96] = -2.25f;   // 0.5*3 - 3.75
  want[145] = 2.75f;   // 1*3 - 0.25
  EXPECT_EQ(decode(dtype::q2_k, b), want);
}

TEST(quant, q3_k_unpacks_six_bit_scales_and_subtracts_4_for_a_clear_high_bit) {
  // Layout: 32 bytes hmask, 64 bytes of 2-bit quants (as q2_k), 12 scale bytes, f16 d.
  // Scale j (biased by 32): low 4 bits from byte j (j < 8) or the high nibble of byte j-8, top 2
  // bits from bits 2*(j/4) of byte 8 + j%4. The high bit of the element at offset k (0..31) of
  // group g in half h is bit 4h + g of hmask[k]; clear means q - 4.
  auto b = blocks_of(dtype::q3_k);
  for (int k = 0; k < 32; ++k) set_u8(b, k, 0xff);  // all high bits set: q = 0 decodes to 0
  set_u16(b, 108, 0x3800);                           // d = 0.5
  set_u8(b, 96 + 0, 0x02);   // scale 0 low = 2
  set_u8(b, 96 + 8, 0x02);   // scale 0 top = 2 -> (2 | 32) - 32 = 2 -> dl = 1
  set_u8(b, 96 + 1, 0x50);   // scale 9 low = 5 (high nibble of byte 1)
  set_u8(b, 96 + 9, 0x30);   // scale 9 top = bits 4-5 of byte 9 = 3 -> (5 | 48) - 32 = 21 -> dl = 10.5
  set_u8(b, 96 + 7, 0xf0);   // scale 15 low = 15 (high nibble of byte 7)
  set_u8(b, 96 + 11, 0x40);  // scale 15 top = bits 6-7 of byte 11 = 1 -> (15|16) - 32 = -1 -> dl = -0.5
  set_u8(b, 32 + 0, 0x03);   // y[0]: q = 3, high bit set -> 1 * 3 = 3
  set_u8(b, 32 + 1, 0x01);   // y[1]: q = 1 ...
  set_u8(b, 1, 0xfe);        //        ... hmask[1] bit 0 clear -> 1 - 4 = -3 -> -3
  set_u8(b, 32 + 50, 0x02);  // y[146] (half 1, k = 18, group 0, scale 9): q = 2 ...
  set_u8(b, 18, 0xef);       //        ... hmask[18] bit 4 clear -> -2 -> 10.5 * -2 = -21
  set_u8(b, 32 + 63, 0x40);  // y[255] (half 1, k = 31, group 3, scale 15): q = 1 ...
  set_u8(b, 31, 0x7f);       //        ... hmask[31] bit 7 clear -> -3 -> -0.5 * -3 = 1.5
  std::vector<float> want(256, 0.0f);
  want[0] = 3.0f;
  want[1] = -3.0f;
  want[146] = -21.0f;
  want[255] = 1.5f;
  EXPECT_EQ(decode(dtype::q3_k, b), want);
}

TEST(quant, q4_k_unpacks_the_split_scales_of_sub_blocks_4_to_7) {
  // Layout: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles. Sub-block s is elements
  // 32s..32s+31, in the low (even s) or high (odd s) nibbles of qs[32*(s/2) ..]; y = d*sc*q - dmin*m.
  // s < 4: sc = byte s & 63, m = byte s+4 & 63. s >= 4: sc = (byte s+4 & 15) | (byte s-4 >> 6) << 4,
  // m = (byte s+4 >> 4) | (byte s >> 6) << 4.
  auto b = blocks_of(dtype::q4_k);
  set_u16(b, 0, 0x3800);   // d = 0.5
  set_u16(b, 2, 0x3400);   // dmin = 0.25
  set_u8(b, 4 + 0, 0x03);  // sub 0: sc = 3 -> 1.5
  set_u8(b, 4 + 4, 0x02);  // sub 0: m = 2 -> 0.5
  set_u8(b, 4 + 1, 0x40);  // sub 1: sc = 0; sub 5: sc top bits = 1
  set_u8(b, 4 + 5, 0xc0);  // sub 1: m = 0;  sub 5: m top bits = 3
  set_u8(b, 4 + 9, 0x21);  // sub 5: sc low = 1 -> 1 | 16 = 17 -> 8.5; m low = 2 -> 2 | 48 = 50 -> 12.5
  set_u8(b, 4 + 3, 0x80);  // sub 3: sc = 0; sub 7: sc top bits = 2
  set_u8(b, 4 + 11, 0x1f); // sub 7: sc low = 15 -> 15 | 32 = 47 -> 23.5; m = 1 | 0 = 1 -> 0.25
  set_u8(b, 16 + 0, 0x0f);    // y[0]: q = 15 -> 1.5*15 - 0.5 = 22
  set_u8(b, 16 + 67, 0x70);   // y[163] (sub 5, l = 3, high nibble): q = 7 -> 8.5*7 - 12.5 = 47
  set_u8(b, 16 + 127, 0x20);  // y[255] (sub 7, l = 31, high nibble): q = 2 -> 23.5*2 - 0.25 = 46.75
  std::vector<float> want(256, 0.0f);
  std::fill(want.begin() + 0, want.begin() + 32, -0.5f);     // sub 0 at q = 0
  std::fill(want.begin() + 160, want.begin() + 192, -12.5f); // sub 5 at q = 0
  std::fill(want.begin() + 224, want.begin() + 256, -0.25f); // sub 7 at q = 0
  want[0] = 22.0f;
  want[163] = 47.0f;
  want[255] = 46.75f;
  EXPECT_EQ(decode(dtype::q4_k, b), want);
}

TEST(quant, q5_k_takes_the_fifth_bit_of_sub_block_s_from_bit_s_of_qh) {
  // Layout: f16 d, f16 dmin, 12 scale bytes (as q4_k), 32 bytes qh, 128 bytes of nibbles.
  // Element l of sub-block s gets bit s of qh[l] as its fifth bit.
  auto b = blocks_of(dtype::q5_k);
  set_u16(b, 0, 0x3c00);    // d = 1
  set_u16(b, 2, 0x3800);    // dmin = 0.5
  set_u8(b, 4 + 0, 0x01);   // sub 0: sc = 1, m = 0
  set_u8(b, 4 + 2, 0x40);   // sub 2: sc = 0; sub 6: sc top bits = 1
  set_u8(b, 4 + 10, 0x12);  // sub 6: sc low = 2 -> 2 | 16 = 18; m = 1 -> 0.5
  set_u8(b, 16 + 0, 0x01);  // qh[0] bit 0: fifth bit of y[0]
  set_u8(b, 16 + 5, 0x40);  // qh[5] bit 6: fifth bit of y[192 + 5]
  set_u8(b, 48 + 0, 0x0a);  // y[0]: 10 | 16 = 26 -> 26
  // y[197] (sub 6 = low nibbles of qs[96..127], l = 5): 3 | 16 = 19 -> 18*19 - 0.5 = 341.5
  set_u8(b, 48 + 101, 0x03);
  std::vector<float> want(256, 0.0f);
  std::fill(want.begin() + 192, want.begin() + 224, -0.5f);  // sub 6 at q = 0
  want[0] = 26.0f;
  want[197] = 341.5f;
  EXPECT_EQ(decode(dtype::q5_k, b), want);
}

TEST(quant, q6_k_joins_low_nibbles_and_high_bit_pairs_with_signed_scales) {
  // Layout: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d. Half h, quarter g (32 elements),
  // element l: low 4 bits from ql[64h + 32(g%2) + l] (low nibble for g < 2, high for g >= 2), top 2
  // bits from bits 2g of qh[32h + l]; q = that - 32; scale 8h + 2g + l/16; y = d * scale * q.
  auto b = blocks_of(dtype::q6_k);
  for (int k = 0; k < 64; ++k) set_u8(b, 128 + k, 0xaa);  // top bits 0b10 everywhere: q = 32 - 32 = 0
  set_u16(b, 208, 0x3800);      // d = 0.5
  set_u8(b, 192 + 0, 0x02);     // scale 0 = 2
  set_u8(b, 192 + 5, 0xfd);     // scale 5 = -3
  set_u8(b, 192 + 15, 0x80);    // scale 15 = -128
  set_u8(b, 0, 0x05);           // y[0]: low 5 ...
  set_u8(b, 128 + 0, 0xab);     //       ... top bits 3 -> 53 - 32 = 21 -> 0.5*2*21 = 21
  set_u8(b, 17, 0xf0);          // y[81] (h 0, g 2, l 17, scale 5): high nibble 15 ...
  set_u8(b, 128 + 17, 0x8a);    //       ... bits 4-5 = 0 -> 15 - 32 = -17 -> 0.5*-3*-17 = 25.5
  set_u8(b, 127, 0x10);         // y[255] (h 1, g 3, l 31, scale 15): high nibble 1 ...
  set_u8(b, 128 + 63, 0x6a);    //       ... bits 6-7 = 1 -> 17 - 32 = -15 -> 0.5*-128*-15 = 960
  std::vector<float> want(256, 0.0f);
  want[0] = 21.0f;
  want[81] = 25.5f;
  want[255] = 960.0f;
  EXPECT_EQ(decode(dtype::q6_k, b), want);
}

TEST(quant, q8_k_decodes_an_f32_scale_and_ignores_the_block_sums) {
  // Layout: f32 d, 256 int8, 16 int16 sums.
  auto b = blocks_of(dtype::q8_k);
  set_u16(b, 0, 0x0000);  // d = 0.25 = 0x3e800000
  set_u16(b, 2, 0x3e80);
  set_u8(b, 4 + 0, 0xfc);    // -4 * 0.25 = -1
  set_u8(b, 4 + 255, 0x7f);  // 127 * 0.25 = 31.75
  for (int k = 260; k < 292; ++k) set_u8(b, k, 0xff);  // sums that do not match: not read
  std::vector<float> want(256, 0.0f);
  want[0] = -1.0f;
  want[255] = 31.75f;
  EXPECT_EQ(decode(dtype::q8_k, b), want);
}

// ---------------------------------------------------------------------------------------------
// Encoding, byte for byte.

TEST(quant, q8_0_encodes_a_hand_worked_block_byte_exact) {
  // amax = 127, so d = 127/127 = 1 (f16 0x3c00) and each code is roundf(x): halves round away from
  // zero, which is where roundf and round-half-even differ.
  std::vector<float> x = {127.0f, -2.5f, 2.5f, 0.49f, -126.6f, 0.5f};
  for (int j = 6; j < 32; ++j) x.push_back(static_cast<float>(j - 16));
  std::vector<std::uint8_t> want = {0x00, 0x3c, 0x7f, 0xfd /* -3 */, 0x03, 0x00, 0x81 /* -127 */, 0x01};
  for (int j = 6; j < 32; ++j) want.push_back(static_cast<std::uint8_t>(j - 16));
  EXPECT_EQ(as_u8(encode(dtype::q8_0, x)), want);
}

TEST(quant, q4_0_encodes_hand_worked_blocks_byte_exact) {
  // code = min(15, trunc(x / d + 8.5)) with d = (signed value of largest magnitude) / -8.
  std::vector<float> x(64, 0.0f);
  // Block 0: the largest magnitude is -8, so d = 1 and code = trunc(x + 8.5).
  x[0] = 0.0f;    // 8
  x[1] = 7.0f;    // 15.5 -> 15
  x[2] = 7.6f;    // 16.1 -> 16 -> clipped to 15: the positive side ends at +7
  x[3] = 0.5f;    // 9.0 -> 9: a tie rounds up
  x[4] = -0.5f;   // 8.0 -> 8
  x[5] = -8.0f;   // 0.5 -> 0
  x[6] = -3.2f;   // 5.3 -> 5
  x[7] = 2.49f;   // 10.99 -> 10
  x[16] = 1.0f;   // 9.5 -> 9
  x[17] = -7.9f;  // 0.6 -> 0
  x[31] = 3.0f;   // 11.5 -> 11
  // Block 1: 4 and -4 tie for the largest magnitude; the first wins, so d = 4 / -8 = -0.5 (f16
  // 0xb800) and code = trunc(-2x + 8.5).
  x[32 + 0] = 4.0f;    // 0.5 -> 0, decodes to (0-8) * -0.5 = 4
  x[32 + 1] = -4.0f;   // 16.5 -> 15, decodes to -3.5: now the negative side is the short one
  x[32 + 2] = 1.0f;    // 6.5 -> 6
  x[32 + 3] = -1.3f;   // 11.1 -> 11
  x[32 + 4] = 0.25f;   // 8.0 -> 8
  x[32 + 16] = 2.0f;   // 4.5 -> 4
  // Byte j of a block = code[j] | code[j + 16] << 4.
  std::vector<std::uint8_t> want = {0x00, 0x3c, 0x98, 0x0f, 0x8f, 0x89, 0x88, 0x80, 0x85, 0x8a,
                                    0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0xb8,
                                    0x00, 0xb8, 0x40, 0x8f, 0x86, 0x8b, 0x88, 0x88, 0x88, 0x88,
                                    0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
  const auto b = encode(dtype::q4_0, x);
  EXPECT_EQ(as_u8(b), want);
  const auto y = decode(dtype::q4_0, b);
  EXPECT_EQ(y[32 + 0], 4.0f);
  EXPECT_EQ(y[32 + 1], -3.5f);
}

// FNV-1a of the encoded row. The constants are the bytes that ggml's quantize_row_*_ref produce
// for the same input (computed with ggml's reference code), so any drift from ggml's algorithms
// (an operation reordered, a different rounding, another tie rule) turns this red.
std::uint64_t fnv1a(const std::vector<std::byte>& b) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto v : b) {
    h ^= std::to_integer<std::uint8_t>(v);
    h *= 0x100000001b3ull;
  }
  return h;
}

TEST(quant, quantized_bytes_match_ggml_reference) {
  // 512 exactly representable values (24-bit integers times powers of two), with a magnitude that
  // changes every 32 elements so the sub-block scales differ.
  std::vector<float> x(512);
  std::uint64_t s = 0x5eed;
  for (int i = 0; i < 512; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int v = static_cast<std::int32_t>(s >> 32) >> 8;
    x[i] = std::ldexp(static_cast<float>(v), -(16 + (i / 32) % 8));
  }
  const struct {
    dtype type;
    std::uint64_t hash;
  } cases[] = {
      {dtype::q4_0, 0x430b6a1ee8a4def1ull}, {dtype::q4_1, 0xa448ee641c3c7235ull},
      {dtype::q5_0, 0xb36cd9d59770f84eull}, {dtype::q5_1, 0x64c5904fd2ea8340ull},
      {dtype::q8_0, 0xb38ba85333a6df8full}, {dtype::q8_k, 0xc4f48020397c4ab7ull},
      {dtype::q4_k, 0x384e58a7a6f9215eull}, {dtype::q6_k, 0x04a66a33e34217b6ull},
      {dtype::q2_k, 0xa783646a7e56c33aull}, {dtype::q3_k, 0x6ba202924d1cc5f3ull},
      {dtype::q5_k, 0x69fae751f30cc085ull},
  };
  for (const auto& c : cases) EXPECT_EQ(fnv1a(encode(c.type, x)), c.hash) << name(c.type);
}

// ---------------------------------------------------------------------------------------------
// Round trips: quantize then dequantize, per element within each format's bound.

// Storing v as f16 is off by at most half an ulp: 2^-11 relative in the normal range, 2^-25
// absolute below it (subnormals are 2^-24 apart).
double f16_err(double v) { return std::max(std::fabs(v) * 0x1p-11, 0x1p-25); }

// Largest magnitude, and the span of [min(x), max(x)] widened to include 0 (the k-quants' affine
// grids always reach 0, since their min offset is never negative).
struct stats {
  double amax = 0.0;
  double lo = 0.0;
  double hi = 0.0;
  double signed_max = 0.0;  // the value of largest magnitude, first on ties
  double span() const { return hi - lo; }
};

stats stats_of(const float* x, int n) {
  stats s;
  double min = x[0];
  double max = x[0];
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > s.amax) {
      s.amax = std::fabs(x[i]);
      s.signed_max = x[i];
    }
    min = std::min<double>(min, x[i]);
    max = std::max<double>(max, x[i]);
  }
  s.lo = std::min(min, 0.0);
  s.hi = std::max(max, 0.0);
  return s;
}

double true_min(const float* x, int n) { return *std::min_element(x, x + n); }
double true_max(const float* x, int n) { return *std::max_element(x, x + n); }

// The bound for element i of row x, each justified where it is computed. A small relative slack
// (2^-20 of the block's largest magnitude) covers float rounding in the codes' computation.
double error_bound(dtype t, const std::vector<float>& x, std::size_t i) {
  const float* xs = x.data();
  auto block = [&](int elems) { return xs + i / elems * elems; };
  switch (t) {
    case dtype::f32: return 0.0;
    case dtype::f16: return f16_err(x[i]);
    // Half an ulp of an 8-bit significand, or half the 2^-133 spacing of bf16 subnormals.
    case dtype::bf16: return std::max(std::fabs(x[i]) * 0x1p-8, 0x1p-134);
    case dtype::mxfp4: {
      // Scale 2^(floor(log2 amax) - 2): E2M1's largest code, 6 of them, is 1.5 x 2^floor(log2 amax), so
      // a value above it clips by up to half of 2^floor(log2 amax); the codes below are at most that far
      // apart, so rounding errs by no more (ggml's encoder does the same).
      const auto s = stats_of(block(32), 32);
      if (!(s.amax > 0)) return 0.0;
      return 0.5 * std::exp2(std::floor(std::log2(s.amax))) + 0x1p-140;
    }
    case dtype::q8_0: {
      // d = amax/127 and code = round(x/d): |err| <= d/2, plus up to 127 codes times the f16
      // rounding of d.
      const auto s = stats_of(block(32), 32);
      const double d = s.amax / 127;
      return d / 2 + 127 * f16_err(d) + s.amax * 0x1p-20;
    }
    case dtype::q8_k: {
      // As q8_0 over 256 elements, with d kept as f32 (no f16 term). ggml's encoder divides
      // 127 by the largest value; below 127 / FLT_MAX that is infinite, d = 1 / inf = 0 and the
      // block decodes to zeros, off by at most amax.
      const auto s = stats_of(block(256), 256);
      if (s.amax < 127 / static_cast<double>(std::numeric_limits<float>::max())) return s.amax;
      return s.amax / 127 / 2 + s.amax * 0x1p-20;
    }
    case dtype::q4_0:
    case dtype::q5_0: {
      // d = amax/2^(b-1) with the sign chosen so the largest-magnitude value sits exactly on the
      // lowest code. Rounding (trunc(x/d + half + 0.5)) gives |err| <= d/2 except on the opposite
      // side, which ends one step early: values past (2^(b-1) - 0.5) d clip with |err| <= d. Plus
      // up to 2^(b-1) codes times the f16 rounding of d.
      const double half = t == dtype::q4_0 ? 8 : 16;
      const auto s = stats_of(block(32), 32);
      const double d = s.amax / half;
      const bool clipped_side = (x[i] > 0) != (s.signed_max > 0) && std::fabs(x[i]) > (half - 0.5) * d;
      return (clipped_side ? d : d / 2) + half * f16_err(d) + s.amax * 0x1p-20;
    }
    case dtype::q4_1:
    case dtype::q5_1: {
      // d = (max - min)/(2^b - 1), code = round((x - min)/d), never clipped: |err| <= d/2, plus the
      // f16 rounding of d (times up to 2^b - 1 codes) and of min.
      const double levels = t == dtype::q4_1 ? 15 : 31;
      const float* xb = block(32);
      const double min = true_min(xb, 32);
      const double d = (true_max(xb, 32) - min) / levels;
      return d / 2 + levels * f16_err(d) + f16_err(min) + stats_of(xb, 32).amax * 0x1p-20;
    }
    case dtype::q4_k: {
      // Per 32-element sub-block an affine grid of 16 levels over about the sub-block's span, so
      // rounding plus the least-squares fit's clipping of extremes stays within one step,
      // span_sub/15. The fitted scale and min are then coded in 6 bits against the super-block's
      // largest (about span_super/15 and up to span_super): half a code of scale, times 15
      // levels, and half a code of min, each about span_super/126, add span_super/63 (which also
      // covers a sub-block whose scale codes to 0). Last, the f16 rounding of the two super-block
      // factors: relative 2^-11 of values up to span_super each, or 2^-25 absolute times at most
      // 63 * 15 + 63 = 1008.
      const auto sub = stats_of(block(32), 32);
      const auto sup = stats_of(block(256), 256);
      return sub.span() / 15 + sup.span() / 63 + sup.span() * 0x1p-10 + 1008 * 0x1p-25 +
             sup.amax * 0x1p-20;
    }
    case dtype::q5_k: {
      // q4_k's reasoning with 32 levels: one step span_sub/31, the coded scale and min span_super/63,
      // f16 rounding times at most 63 * 31 + 63 = 2016.
      const auto sub = stats_of(block(32), 32);
      const auto sup = stats_of(block(256), 256);
      return sub.span() / 31 + sup.span() / 63 + sup.span() * 0x1p-10 + 2016 * 0x1p-25 + sup.amax * 0x1p-20;
    }
    case dtype::q2_k: {
      // Per 16-element sub-block an affine grid of 4 levels (one step span_sub/3 covers rounding and the
      // fit's clipping); scale and min coded in 4 bits against the super-block's largest: half a code of
      // scale times 3 levels and half a code of min, each about span_super/30, add span_super/15. f16
      // rounding of d and dmin times at most 15 * 3 + 15 = 60.
      const auto sub = stats_of(block(16), 16);
      const auto sup = stats_of(block(256), 256);
      return sub.span() / 3 + sup.span() / 15 + sup.span() * 0x1p-10 + 60 * 0x1p-25 + sup.amax * 0x1p-20;
    }
    case dtype::q3_k: {
      // Per 16-element sub-block a symmetric grid of 8 levels ([-4, 3]) with step about amax_sub/4: the
      // fit's rounding and the clipping of the short side stay within two steps, amax_sub/2. The scales
      // coded in 6 bits against the largest (-> -32): half a code, amax_super/256, times 4 levels,
      // doubled as for q6_k: amax_super/32. f16 rounding of d times at most 32 * 4 = 128.
      const auto sub = stats_of(block(16), 16);
      const auto sup = stats_of(block(256), 256);
      return sub.amax / 2 + sup.amax / 32 + sup.amax * 0x1p-10 + 128 * 0x1p-25 + sup.amax * 0x1p-20;
    }
    case dtype::q6_k: {
      // Per 16-element sub-block a symmetric grid of 64 levels with step about amax_sub/32: rounding
      // and the fit's clipping of the extreme stay within two steps, amax_sub/16. The sixteen
      // scales are coded as int8 against the largest (about amax_super/32 -> -128): half a code,
      // amax_super/8192, times up to 32 levels is amax_super/256; a sub-block whose scale codes
      // to 0 has amax_sub < about amax_super/256 as well. Doubled to amax_super/128 since the
      // fitted scales sit only near amax/32. Plus the f16 rounding of d: relative 2^-11, or 2^-25
      // absolute times at most 128 * 32 = 4096.
      const auto sub = stats_of(block(16), 16);
      const auto sup = stats_of(block(256), 256);
      return sub.amax / 16 + sup.amax / 128 + sup.amax * 0x1p-10 + 4096 * 0x1p-25 + sup.amax * 0x1p-20;
    }
    case dtype::iq4_nl: {
      // d = signed max / -127 on the table's lowest level: the gaps between levels are at most 24, so
      // rounding errs by 12 |d|, and the other side clips at 113 |d|, 14 |d| short of amax. Plus the f16
      // rounding of d times up to 127.
      const auto s = stats_of(block(32), 32);
      const double d = s.amax / 127;
      return 14 * d + 127 * f16_err(d) + s.amax * 0x1p-20;
    }
    case dtype::iq4_xs: {
      // Each sub-block's ideal scale s_i = amax_i / 127 coded as d x l with d = max s / 32 and l in
      // [-32, 31]: |d l| <= |s_i| + |d|, and a wrong-signed or clamped l misses the block's extreme by up
      // to 127 |d|; inside, iq4_nl's 14 |d l|. Plus the f16 rounding of d times 127 x 32.
      const auto sub = stats_of(block(32), 32);
      double dmax = 0.0;
      for (int b = 0; b < 8; ++b) dmax = std::max(dmax, stats_of(block(256) + 32 * b, 32).amax / 127 / 32);
      return 14 * (sub.amax / 127 + dmax) + 127 * dmax + 4064 * f16_err(dmax) + sub.amax * 0x1p-20;
    }
    case dtype::q4_a32:
    case dtype::q8_a32: {
      // d = span / (levels - 1) (span over [min, max] widened to 0), zero rounded to a whole code: the
      // grid reaches each end to within half a step, rounding to it errs by another half. Plus, for 4 bits,
      // the f16 rounding of d times up to 15 (8 bits keep d in f32). A d of 1/id with id overflowing (a
      // subnormal span) codes everything as z: off by at most amax.
      const double levels = t == dtype::q4_a32 ? 15 : 255;
      const auto s = stats_of(block(32), 32);
      const double d = s.span() / levels;
      if (t == dtype::q8_a32 && d < 1.0 / static_cast<double>(std::numeric_limits<float>::max())) return s.amax;
      return d + (t == dtype::q4_a32 ? 16 * f16_err(d) : 0.0) + s.amax * 0x1p-20;
    }
    case dtype::fp8_s32: {
      // s = amax / 448, so each x / s is inside E4M3's range: relative error 2^-4 (3 mantissa bits) for
      // normal codes, half the 2^-9 subnormal spacing below 2^-6, times s.
      const auto s = stats_of(block(32), 32);
      return std::fabs(x[i]) * 0x1p-4 * (1 + 0x1p-20) + s.amax / 448 * 0x1p-10 + s.amax * 0x1p-20;
    }
    default: return 0.0;
  }
}

struct distribution {
  std::string name;
  std::vector<float> (*make)(std::size_t n);
};

std::vector<float> gaussian(std::size_t n) {
  test_rng r(1);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(r.gaussian());
  return x;
}

const distribution distributions[] = {
    {"gaussian", gaussian},
    {"uniform",
     [](std::size_t n) {
       test_rng r(2);
       std::vector<float> x(n);
       for (auto& v : x) v = static_cast<float>(2 * r.uniform() - 1);
       return x;
     }},
    {"all_zero", [](std::size_t n) { return std::vector<float>(n, 0.0f); }},
    {"constant_positive", [](std::size_t n) { return std::vector<float>(n, 0.3f); }},
    {"constant_negative", [](std::size_t n) { return std::vector<float>(n, -2.5f); }},
    {"offset_positive",  // far from 0: exercises the min of q4_1, q5_1 and the k-quants
     [](std::size_t n) {
       test_rng r(3);
       std::vector<float> x(n);
       for (auto& v : x) v = static_cast<float>(5 + std::fabs(r.gaussian()));
       return x;
     }},
    {"one_outlier_per_block",  // noise of 0.01 and one +-100 in every 32 elements
     [](std::size_t n) {
       test_rng r(4);
       std::vector<float> x(n);
       for (std::size_t i = 0; i < n; ++i) {
         x[i] = static_cast<float>(0.01 * r.gaussian());
         if (i % 32 == (i / 32 * 7) % 32) x[i] = (i / 32) % 2 ? 100.0f : -100.0f;
       }
       return x;
     }},
    {"tiny_f16_subnormal_scales",  // values near 1e-6: block scales fall in f16's subnormal range
     [](std::size_t n) {
       auto x = gaussian(n);
       for (auto& v : x) v *= 1e-6f;
       return x;
     }},
    {"subnormal_floats",  // values near 1e-39: 1/d overflows to infinity inside the quantizers
     [](std::size_t n) {
       auto x = gaussian(n);
       for (auto& v : x) v *= 1e-39f;
       return x;
     }},
};

struct format_case {
  dtype type;
  double rms_limit;  // of rms(error) / rms(x) on gaussian rows
};

class quant_round_trip : public ::testing::TestWithParam<format_case> {};

TEST_P(quant_round_trip, every_element_stays_within_the_format_bound) {
  const dtype t = GetParam().type;
  const auto elems = info(t).block_elems;
  // 7 super-blocks (56 blocks of 32) and, for the 32-element formats, a row of 3 blocks: whole
  // blocks that are not a power of two.
  for (std::size_t n : {std::size_t{1792}, std::size_t{96}}) {
    if (n % elems != 0) continue;
    for (const auto& dist : distributions) {
      SCOPED_TRACE(dist.name + ", n = " + std::to_string(n));
      const auto x = dist.make(n);
      const auto y = decode(t, encode(t, x));
      double worst = 0.0;  // largest error / bound
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(y[i])) << "element " << i;
        const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
        const double bound = error_bound(t, x, i);
        ASSERT_LE(err, bound) << "element " << i << ": x = " << x[i] << ", decoded " << y[i];
        if (bound > 0) worst = std::max(worst, err / bound);
      }
      RecordProperty(dist.name + "_n" + std::to_string(n) + "_worst_error_over_bound",
                     std::to_string(worst));
    }
  }
}

TEST_P(quant_round_trip, rms_error_is_small_on_gaussian_rows) {
  const dtype t = GetParam().type;
  const auto x = gaussian(1792);
  const auto y = decode(t, encode(t, x));
  double se = 0.0;
  double sx = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    se += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    sx += static_cast<double>(x[i]) * x[i];
  }
  const double rel = std::sqrt(se / sx);
  RecordProperty("relative_rms_error", std::to_string(rel));
  EXPECT_LT(rel, GetParam().rms_limit);
}

// Relative rms limits: about a step / sqrt(12) over sigma, with a step of amax/levels (amax of a
// gaussian block of 32 is near 2.1 sigma, of 256 near 2.9), and headroom of a third or more.
INSTANTIATE_TEST_SUITE_P(formats, quant_round_trip,
                         ::testing::Values(format_case{dtype::q8_0, 0.01}, format_case{dtype::q8_k, 0.01},
                                           format_case{dtype::q4_0, 0.12}, format_case{dtype::q4_1, 0.1},
                                           format_case{dtype::q5_0, 0.06}, format_case{dtype::q5_1, 0.05},
                                           format_case{dtype::q2_k, 0.35}, format_case{dtype::q3_k, 0.2}, format_case{dtype::q4_k, 0.1}, format_case{dtype::q5_k, 0.05},
                                           format_case{dtype::q6_k, 0.03},
                                           format_case{dtype::f16, 1e-3}, format_case{dtype::bf16, 5e-3},
                                           format_case{dtype::f32, 1e-12}, format_case{dtype::iq4_nl, 0.12},
                                           format_case{dtype::iq4_xs, 0.12}, format_case{dtype::q4_a32, 0.1},
                                           format_case{dtype::q8_a32, 0.01}, format_case{dtype::fp8_s32, 0.04}),
                         [](const auto& p) { return std::string(name(p.param.type)); });

// ---------------------------------------------------------------------------------------------
// Edge inputs.

TEST(quant, non_finite_inputs_stay_inside_their_block) {
  // A NaN, an infinity and a huge finite value each spoil only their own block; the next block of
  // the row still decodes within its bound. The conversions on the way are quant.cpp's clamped ones
  // (ggml's casts would be undefined here); -fsanitize=float-cast-overflow,float-divide-by-zero
  // checks that.
  using lim = std::numeric_limits<float>;
  const float specials[] = {lim::quiet_NaN(), lim::infinity(), -lim::infinity(), lim::max(), 1e13f};
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    if (!supports_quantize(t) || !is_quantized(t)) continue;
    const auto elems = info(t).block_elems;
    for (float special : specials) {
      SCOPED_TRACE(std::string(name(t)) + " with " + std::to_string(special));
      auto x = gaussian(2 * elems);
      x[3] = special;
      const auto y = decode(t, encode(t, x));
      for (std::size_t i = elems; i < 2 * elems; ++i) {
        EXPECT_LE(std::fabs(x[i] - y[i]), error_bound(t, x, i)) << "element " << i;
      }
    }
  }
}

TEST(quant, plain_float_types_convert_both_ways) {
  const std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1.0f / 1024, 3.0f, -448.0f};
  EXPECT_EQ(decode(dtype::f32, encode(dtype::f32, x)), x);
  EXPECT_EQ(decode(dtype::f16, encode(dtype::f16, x)), x);  // all exact in f16
  EXPECT_EQ(decode(dtype::f64, encode(dtype::f64, x)), x);
  EXPECT_EQ(decode(dtype::fp8_e4m3, encode(dtype::fp8_e4m3, {1.0f, -448.0f, 0.5f})),
            (std::vector<float>{1.0f, -448.0f, 0.5f}));
  EXPECT_EQ(decode(dtype::fp8_e5m2, encode(dtype::fp8_e5m2, {1.0f, -57344.0f, 0.25f})),
            (std::vector<float>{1.0f, -57344.0f, 0.25f}));
  // bf16 keeps 8 significant bits: 1 + 2^-8 rounds to even (1), 1 + 3 * 2^-8 to 1 + 2^-6.
  EXPECT_EQ(decode(dtype::bf16, encode(dtype::bf16, {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f})),
            (std::vector<float>{1.0f, 1.0f + 0x1p-6f}));
  // f64 values past float's range decode to infinity, as IEEE narrowing does.
  std::vector<std::byte> wide(16);
  const auto big = std::bit_cast<std::uint64_t>(1e300);
  const auto small = std::bit_cast<std::uint64_t>(-1e-300);
  for (int k = 0; k < 8; ++k) {
    wide[k] = std::byte(static_cast<std::uint8_t>(big >> (8 * k)));
    wide[8 + k] = std::byte(static_cast<std::uint8_t>(small >> (8 * k)));
  }
  const auto y = decode(dtype::f64, wide);
  EXPECT_EQ(y[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[1], -0.0f);
  EXPECT_TRUE(std::signbit(y[1]));
}

TEST(quant, all_zero_rows_encode_without_nan) {
  // An all-zero block has scale 0; a 0/0 anywhere would put NaN in the scale bytes.
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    if (!supports_quantize(t)) continue;
    const std::vector<float> x(512, 0.0f);
    for (float v : decode(t, encode(t, x))) EXPECT_EQ(v, 0.0f) << name(t);
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals.

TEST(quant, rejects_rows_that_are_not_whole_blocks) {
  std::vector<std::byte> bytes(4096);
  std::vector<float> floats(4096);
  const auto r = dequantize_row(dtype::q4_k, bytes.data(), floats.data(), 300);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, quant_error_code::not_whole_blocks);
  EXPECT_EQ(r.error().type, dtype::q4_k);
  EXPECT_EQ(r.error().elems, 300);
  EXPECT_NE(r.error().message().find("256"), std::string::npos) << r.error().message();

  const auto q = quantize_row(dtype::q8_0, floats.data(), bytes.data(), 33);
  ASSERT_FALSE(q.has_value());
  EXPECT_EQ(q.error().code, quant_error_code::not_whole_blocks);

  const auto negative = quantize_row(dtype::f32, floats.data(), bytes.data(), -1);
  ASSERT_FALSE(negative.has_value());
  EXPECT_EQ(negative.error().code, quant_error_code::not_whole_blocks);

  EXPECT_TRUE(dequantize_row(dtype::q6_k, bytes.data(), floats.data(), 0).has_value());
}

TEST(quant, rejects_unsupported_types) {
  std::vector<std::byte> bytes(4096);
  std::vector<float> floats(4096);
  const auto q = quantize_row(dtype::q8_1, floats.data(), bytes.data(), 256);
  ASSERT_FALSE(q.has_value());
  EXPECT_EQ(q.error().code, quant_error_code::unsupported_type);
  EXPECT_EQ(q.error().type, dtype::q8_1);
  EXPECT_NE(q.error().message().find("q8_1"), std::string::npos) << q.error().message();

  const auto d = dequantize_row(dtype::i32, bytes.data(), floats.data(), 4);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code, quant_error_code::unsupported_type);
}

TEST(quant, supported_types) {
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    EXPECT_EQ(supports_dequantize(t), is_quantized(t) || is_float(t)) << name(t);
  }
  for (dtype t : {dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q8_0, dtype::q8_k,
                  dtype::q4_k, dtype::q6_k, dtype::f32, dtype::f16, dtype::bf16, dtype::iq4_nl, dtype::iq4_xs,
                  dtype::q4_a32, dtype::q8_a32, dtype::fp8_s32, dtype::q5_k, dtype::q3_k, dtype::q2_k})
    EXPECT_TRUE(supports_quantize(t)) << name(t);
  for (dtype t : {dtype::q8_1, dtype::i32, dtype::boolean})
    EXPECT_FALSE(supports_quantize(t)) << name(t);
}

}  // namespace
}  // namespace troupe

#include "engine/core/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace troupe {
namespace {

TEST(half, f16_known_values) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65536.0f), 0x7c00);            // overflow -> inf
  EXPECT_EQ(f32_to_f16(5.9604645e-08f), 0x0001);      // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.9802322e-08f), 0x0000);      // half of it: tie to even -> 0
  EXPECT_EQ(f32_to_f16(1.0009765625f), 0x3c01);
  EXPECT_EQ(f32_to_f16(1.00048828125f), 0x3c00);      // tie -> even
  EXPECT_EQ(f32_to_f16(1.00146484375f), 0x3c02);      // tie -> even (up)
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.33325195f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), 5.9604645e-08f);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isinf(f16_to_f32(0xfc00)));
}

TEST(half, f16_round_trips_every_finite_value) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<std::uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(half, bf16_rounds_to_nearest_even) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7f80) == 0x7f80) continue;
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(static_cast<std::uint16_t>(h))), h);
  }
}

TEST(half, fp8_known_values) {
  EXPECT_FLOAT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);  // 2^-9
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1.0f), 0xb8);
  EXPECT_FLOAT_EQ(fp8_e5m2_to_f32(0x3c), 1.0f);
  EXPECT_FLOAT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0x7c)));
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) != 0x7f) {
      EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(v)) & 0x7f, v & 0x7f);
    }
    if (((v >> 2) & 0x1f) != 0x1f) {
      EXPECT_EQ(f32_to_fp8_e5m2(fp8_e5m2_to_f32(v)) & 0x7f, v & 0x7f);
    }
  }
}

}  // namespace
}  // namespace troupe

#include "engine/core/dtype.hpp"

#include <gtest/gtest.h>

namespace troupe {
namespace {

TEST(dtype, block_geometry_matches_ggml) {
  EXPECT_EQ(info(dtype::q4_0).block_bytes, 18u);
  EXPECT_EQ(info(dtype::q8_0).block_bytes, 34u);
  EXPECT_EQ(info(dtype::q2_k).block_bytes, 84u);
  EXPECT_EQ(info(dtype::q3_k).block_bytes, 110u);
  EXPECT_EQ(info(dtype::q4_k).block_bytes, 144u);
  EXPECT_EQ(info(dtype::q5_k).block_bytes, 176u);
  EXPECT_EQ(info(dtype::q6_k).block_bytes, 210u);
  EXPECT_EQ(info(dtype::q8_k).block_bytes, 292u);
  EXPECT_EQ(info(dtype::q4_k).block_elems, 256u);
}

TEST(dtype, names_round_trip) {
  for (int i = 0; i < dtype_count; ++i) {
    const auto t = static_cast<dtype>(i);
    EXPECT_EQ(dtype_from_name(name(t)), t);
    if (info(t).gguf_id) {
      EXPECT_EQ(dtype_from_gguf(*info(t).gguf_id), t);
    }
    if (info(t).safetensors) {
      EXPECT_EQ(dtype_from_safetensors(*info(t).safetensors), t);
    }
  }
  EXPECT_FALSE(dtype_from_gguf(16));  // IQ2_XXS: not supported
  EXPECT_FALSE(dtype_from_safetensors("F4"));
}

TEST(dtype, storage_bytes_refuses_partial_blocks_and_overflow) {
  EXPECT_EQ(storage_bytes(dtype::f32, 10), 40u);
  EXPECT_EQ(storage_bytes(dtype::q4_0, 64), 36u);
  EXPECT_FALSE(storage_bytes(dtype::q4_0, 33));
  EXPECT_FALSE(storage_bytes(dtype::f64, UINT64_MAX / 4));
}

}  // namespace
}  // namespace troupe

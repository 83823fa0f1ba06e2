// The rotary tables of the scaling rules llama.cpp cannot check (dynamic NTK has no GGUF form; the
// others are held to llama.cpp in llama_cpp_parity_test.cpp), against Hugging Face's formulas
// (transformers' modeling_rope_utils) written out here in double.
#include "families/components/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace troupe::families {
namespace {

// HF's default inverse frequencies for `base`: 1 / base^(2i / dim).
double hf_inv(double base, double dim, std::int64_t i) { return 1.0 / std::pow(base, 2.0 * static_cast<double>(i) / dim); }

TEST(rope_table, dynamic_ntk_rescales_the_base_past_the_trained_context_as_hf_does) {
  rope_config c;
  c.theta = 10000.0;
  c.dims = 64;
  c.kind = rope_kind::dynamic;
  c.factor = 2.0;
  c.original_max_positions = 512;
  // Within the trained context the table is the default one.
  const auto within = make_rope_table(c, 400);
  for (std::int64_t i = 0; i < 32; ++i) EXPECT_NEAR(within.inv_freq[i], hf_inv(10000.0, 64, i), 1e-7 * hf_inv(10000.0, 64, i));
  // Past it: base * ((factor * seq_len / max_pos) - (factor - 1))^(dim / (dim - 2)), seq_len the
  // longest sequence the step holds.
  for (const std::int64_t len : {1024, 4096, 32768}) {
    const double base = 10000.0 * std::pow(2.0 * static_cast<double>(len) / 512.0 - 1.0, 64.0 / 62.0);
    const auto t = make_rope_table(c, len);
    ASSERT_EQ(t.inv_freq.size(), 32u);
    EXPECT_DOUBLE_EQ(t.scale, 1.0);
    for (std::int64_t i = 0; i < 32; ++i) {
      const double want = hf_inv(base, 64, i);
      EXPECT_NEAR(t.inv_freq[i], want, 1e-6 * want) << "length " << len << " dim " << i;
    }
    // The fastest frequency is never touched; the slowest moves the most.
    EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
    EXPECT_LT(t.inv_freq[31], within.inv_freq[31]);
  }
}

TEST(rope_table, yarn_derives_its_attention_factor_as_hf_does) {
  rope_config c;
  c.dims = 128;
  c.kind = rope_kind::yarn;
  c.factor = 4.0;
  c.original_max_positions = 4096;
  EXPECT_NEAR(make_rope_table(c, 8192).scale, 0.1 * std::log(4.0) + 1.0, 1e-12);
  c.attention_factor = 0.75;
  EXPECT_DOUBLE_EQ(make_rope_table(c, 8192).scale, 0.75);
}

// transformers' _compute_longrope_parameters: inv_freq = 1 / (ext_i * base^(2i / dim)), ext the long
// factors when the sequence runs past original_max_position_embeddings (troupe: when the step's capacity
// does, as llama.cpp decides by its context size), and cos / sin scaled by sqrt(1 + ln(factor) /
// ln(original)) unless attention_factor is given.
TEST(rope_table, longrope_divides_by_the_short_or_long_factors_and_scales_as_hf_does) {
  rope_config c;
  c.theta = 10000.0;
  c.dims = 8;
  c.kind = rope_kind::longrope;
  c.original_max_positions = 4096;
  c.factor = 32.0;  // 131072 / 4096
  c.short_factor = {1.0, 1.1, 1.2, 1.5};
  c.long_factor = {1.0, 2.0, 8.0, 40.0};
  const double mscale = std::sqrt(1.0 + std::log(32.0) / std::log(4096.0));
  for (const std::int64_t capacity : {256, 4096, 4097, 131072}) {
    const auto t = make_rope_table(c, capacity);
    const auto& ext = capacity > 4096 ? c.long_factor : c.short_factor;
    ASSERT_EQ(t.inv_freq.size(), 4u);
    for (std::int64_t i = 0; i < 4; ++i) {
      const double want = 1.0 / (ext[static_cast<std::size_t>(i)] * std::pow(10000.0, 2.0 * static_cast<double>(i) / 8.0));
      EXPECT_NEAR(t.inv_freq[i], want, 1e-6 * want) << "capacity " << capacity << " pair " << i;
    }
    EXPECT_NEAR(t.scale, mscale, 1e-12);
  }
  c.attention_factor = 1.19;
  EXPECT_DOUBLE_EQ(make_rope_table(c, 256).scale, 1.19);
  c.attention_factor = 0.0;
  c.factor = 1.0;  // no extension: no scaling
  EXPECT_DOUBLE_EQ(make_rope_table(c, 256).scale, 1.0);
}

}  // namespace
}  // namespace troupe::families

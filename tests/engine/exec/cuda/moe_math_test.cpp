// The CUDA target's routing math (moe_math.hpp), run on the host against the oracle: top_k_row gives
// the oracle's top_k indices on rows with ties and NaNs, expert_of maps ids as linear_id's meaning
// says, and an online softmax closed by sink_factor gives the oracle's attention with sinks.
#include "engine/exec/cuda/moe_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <algorithm>
#include <random>
#include <vector>

#include "engine/core/tensor.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/graph/builder.hpp"

namespace troupe::exec::cuda {
namespace {

TEST(moe_math, top_k_row_is_the_oracles_top_k) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (const auto& [rows, E, k] : {std::tuple{7, 8, 2}, std::tuple{5, 64, 8}, std::tuple{3, 128, 6}, std::tuple{4, 5, 5}}) {
    graph::builder b;
    const auto x = b.slot(graph::slot_kind::request_input, {dtype::f32, {rows, E}}, "x");
    b.output("top", b.top_k(x, k));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor xv(dtype::f32, {rows, E});
    float* p = xv.as<float>();
    for (std::int64_t i = 0; i < rows * E; ++i) p[i] = u(rng);
    for (std::int64_t j = 0; j < E; j += 2) p[j] = 0.25f;  // row 0: ties, the lower index first
    p[E + 1] = std::numeric_limits<float>::quiet_NaN();      // row 1: NaNs rank below every number
    p[E + E - 1] = std::numeric_limits<float>::quiet_NaN();
    for (std::int64_t j = 0; j < E; ++j) p[2 * E + j] = std::numeric_limits<float>::quiet_NaN();  // row 2: all NaN
    eval::eval_inputs ei;
    ei.slots = {{"x", xv.view()}};
    eval::map_const_source none;
    ei.weights = &none;
    auto want = eval::evaluate(*g, ei);
    ASSERT_TRUE(want) << want.error().message();
    const auto* w = want->outputs.at("top").as<std::int32_t>();
    std::vector<std::int32_t> got(static_cast<std::size_t>(k));
    for (std::int64_t r = 0; r < rows; ++r) {
      top_k_row(p + r * E, E, k, got.data());
      for (std::int64_t j = 0; j < k; ++j) EXPECT_EQ(got[static_cast<std::size_t>(j)], w[r * k + j]) << "row " << r << " pick " << j << " of " << E;
    }
  }
}

TEST(moe_math, expert_ids_select_refuse_or_skip) {
  bool bad = true;
  EXPECT_EQ(expert_of(3, 8, bad), 3);
  EXPECT_FALSE(bad);
  EXPECT_EQ(expert_of(-1, 8, bad), -1);  // another rank's expert: zeros, not an error
  EXPECT_FALSE(bad);
  EXPECT_EQ(expert_of(8, 8, bad), -1);  // past the experts: refused, and nothing read
  EXPECT_TRUE(bad);
  EXPECT_EQ(expert_of(std::int64_t{1} << 40, 8, bad), -1);
  EXPECT_TRUE(bad);
}

TEST(moe_math, an_online_softmax_closed_by_sink_factor_is_the_oracles_attention) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  const std::int64_t Tq = 4, C = 9, H = 3, D = 8;
  for (float sink : {-2.0f, 0.5f, 60.0f}) {
    graph::builder b;
    auto slot = [&](const char* n, dtype t, troupe::shape s) { return b.slot(graph::slot_kind::request_input, {t, std::move(s)}, n); };
    const auto q = slot("q", dtype::f32, {Tq, H, D});
    const auto k = slot("k", dtype::f32, {C, 1, D});
    const auto v = slot("v", dtype::f32, {C, 1, D});
    const auto ix = slot("ix", dtype::i32, {1, C});
    const auto al = slot("al", dtype::boolean, {1, Tq, C});
    const auto sk = slot("sinks", dtype::f32, {H});
    b.output("att", b.attention(q, k, v, ix, al, 0.5, 0.0, sk));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor qv(dtype::f32, {Tq, H, D}), kv(dtype::f32, {C, 1, D}), vv(dtype::f32, {C, 1, D}), iv(dtype::i32, {1, C}), av(dtype::boolean, {1, Tq, C}),
        sv(dtype::f32, {H});
    for (std::int64_t i = 0; i < Tq * H * D; ++i) qv.as<float>()[i] = u(rng);
    for (std::int64_t i = 0; i < C * D; ++i) kv.as<float>()[i] = u(rng), vv.as<float>()[i] = u(rng);
    for (std::int64_t c = 0; c < C; ++c) iv.as<std::int32_t>()[c] = static_cast<std::int32_t>(c);
    for (std::int64_t t = 0; t < Tq; ++t)
      for (std::int64_t c = 0; c < C; ++c) av.as<std::uint8_t>()[t * C + c] = t == 3 ? 0 : c <= t + 4;  // query 3: nothing allowed
    for (std::int64_t h = 0; h < H; ++h) sv.as<float>()[h] = sink - static_cast<float>(h);
    eval::eval_inputs ei;
    ei.slots = {{"q", qv.view()}, {"k", kv.view()}, {"v", vv.view()}, {"ix", iv.view()}, {"al", av.view()}, {"sinks", sv.view()}};
    eval::map_const_source none;
    ei.weights = &none;
    auto want = eval::evaluate(*g, ei);
    ASSERT_TRUE(want) << want.error().message();
    const float* w = want->outputs.at("att").as<float>();
    // The kernel's online softmax over the keys in order, in f32, closed by sink_factor.
    for (std::int64_t t = 0; t < Tq; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        float m = -INFINITY, l = 0.0f;
        std::vector<float> acc(D, 0.0f);
        for (std::int64_t c = 0; c < C; ++c) {
          if (!av.as<std::uint8_t>()[t * C + c]) continue;
          float s = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) s += qv.as<float>()[(t * H + h) * D + d] * kv.as<float>()[c * D + d];
          s *= 0.5f;
          const float m2 = std::max(m, s), alpha = m == -INFINITY ? 0.0f : std::exp(m - m2), p = std::exp(s - m2);
          l = l * alpha + p;
          for (std::int64_t d = 0; d < D; ++d) acc[d] = acc[d] * alpha + p * vv.as<float>()[c * D + d];
          m = m2;
        }
        const float f = sink_factor(m, l, sv.as<float>()[h]);
        for (std::int64_t d = 0; d < D; ++d)
          EXPECT_NEAR(acc[d] * f, w[(t * H + h) * D + d], 1e-5) << "sink " << sink << " query " << t << " head " << h;
      }
  }
}

// Split decode attention: the kernel's online softmax over each of 1..9 key ranges (some ranges with no
// allowed key, one query with none at all), merged by merge_splits_norm / merge_splits_value, equals the
// one-range softmax, with and without a sink.
TEST(moe_math, split_decode_attention_merges_to_the_whole_softmax) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  constexpr std::int64_t C = 300, Dv = 40;
  std::vector<float> score(C), value(C * Dv);
  for (auto& x : score) x = normal(rng);
  for (auto& x : value) x = normal(rng);
  for (const int mask : {0, 1, 2})  // all allowed; every third key; none
    for (const bool with_sink : {false, true}) {
      std::vector<bool> allowed(C);
      for (std::int64_t c = 0; c < C; ++c) allowed[c] = mask == 0 || (mask == 1 && c % 3 == 0 && c < 200);
      const float sink = 1.5f;
      // One range: the reference.
      auto run = [&](std::int64_t c0, std::int64_t c1, float* out) {  // [m, l, acc[Dv]]
        float m = -INFINITY, l = 0.0f;
        std::vector<float> acc(Dv, 0.0f);
        for (std::int64_t c = c0; c < c1; ++c) {
          if (!allowed[c]) continue;
          const float m2 = std::max(m, score[c]), alpha = m == -INFINITY ? 0.0f : std::exp(m - m2), p = std::exp(score[c] - m2);
          l = l * alpha + p;
          for (std::int64_t d = 0; d < Dv; ++d) acc[d] = acc[d] * alpha + p * value[c * Dv + d];
          m = m2;
        }
        out[0] = m, out[1] = l;
        for (std::int64_t d = 0; d < Dv; ++d) out[2 + d] = acc[d];
      };
      std::vector<float> whole(Dv + 2);
      run(0, C, whole.data());
      std::vector<float> want(Dv, 0.0f);
      const float f = with_sink ? sink_factor(whole[0], whole[1], sink) : (whole[1] > 0 ? 1.0f / whole[1] : 0.0f);
      for (std::int64_t d = 0; d < Dv; ++d) want[d] = whole[2 + d] * f;
      for (int splits = 1; splits <= 9; ++splits) {
        const std::int64_t span = (C + splits - 1) / splits;
        std::vector<float> part(static_cast<std::size_t>(splits * (Dv + 2)));
        for (int s = 0; s < splits; ++s) run(std::min(C, s * span), std::min(C, (s + 1) * span), part.data() + s * (Dv + 2));
        float M = 0.0f;
        const float inv = merge_splits_norm(part.data(), splits, Dv + 2, with_sink ? &sink : nullptr, M);
        for (std::int64_t d = 0; d < Dv; ++d) {
          const float got = inv > 0.0f ? merge_splits_value(part.data(), splits, Dv + 2, M, d) * inv : 0.0f;
          EXPECT_NEAR(got, want[d], 1e-5 * (1.0f + std::fabs(want[d]))) << "mask " << mask << " sink " << with_sink << " splits " << splits;
        }
      }
    }
}

}  // namespace
}  // namespace troupe::exec::cuda

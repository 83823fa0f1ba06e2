// The packed matrix products against a double-precision reference, for every packable format on every
// isa level this CPU can run, at sizes that leave partial panels, partial row tiles and odd K.
//
// Two references per output:
//  * exact: the dequantized weights (engine/core/quant.hpp) against the exact activations. The
//    quantized formats round activations to int8 per block (32 elements for q8_0 / q4_0, 256 for the
//    k-quants), x = d q + e with |e| <= d / 2 = amax / 254 for the block's largest magnitude amax, so
//    the product can move by up to sum_k |w_k| amax(k) / 254. bf16 weights on a CPU with vdpbf16ps
//    round activations to bf16, |e| <= 2^-8 |x|. That bound plus the float term below is the
//    tolerance; it is what a caller may rely on.
//  * model: the same weights against the activations as the kernels round them (the rounding is
//    specified: symmetric, amax / 127 per block, to nearest even), which leaves only f32 arithmetic.
//    Its tolerance, c u (L + extra) A with u = 2^-24, L the length of the longest f32 summation chain
//    (K for the plain floats, K / block for the quantized ones), A the sum of the magnitudes of the
//    summed terms and c = 2, is the classic recursive summation bound with a factor to spare. It is
//    tight enough that one wrong code in a block fails: a single element's share of a product is
//    about A / K, far above it, whereas it may hide under the exact bound.
// A final check: outputs outside [0, N) of each row of y are never written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"
#include "engine/core/tensor.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::exec::cpu {
namespace {

constexpr double u32 = 1.0 / 16777216.0;  // f32 unit roundoff
constexpr isa all_levels[] = {isa::scalar, isa::avx2, isa::avx512};

struct weights {
  dtype type = dtype::f32;
  std::int64_t n = 0, k = 0;
  std::vector<std::byte> stored;
  std::vector<float> deq;        // dequantized, [n, k]
  std::vector<float> min_shift;  // q4_k: the sub-block's dmin * min, q4_1 / q5_1 minus the block's m, else 0
  tensor_view view() const { return {type, shape{n, k}, stored.data()}; }
};

// Rows of varied scale with a few outliers, as trained weights have.
weights make_weights(dtype t, std::int64_t n, std::int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.05f, 2.0f);
  std::bernoulli_distribution outlier(0.01);
  std::vector<float> src(static_cast<std::size_t>(n * k));
  for (std::int64_t r = 0; r < n; ++r) {
    const float s = scale(rng);
    for (std::int64_t c = 0; c < k; ++c) src[r * k + c] = nd(rng) * s * (outlier(rng) ? 6.0f : 1.0f);
  }
  weights w;
  w.type = t;
  w.n = n;
  w.k = k;
  w.stored.resize(*storage_bytes(t, static_cast<std::uint64_t>(n * k)));
  EXPECT_TRUE(quantize_row(t, src.data(), w.stored.data(), n * k).has_value());
  w.deq.resize(src.size());
  EXPECT_TRUE(dequantize_row(t, w.stored.data(), w.deq.data(), n * k).has_value());
  w.min_shift.assign(src.size(), 0.0f);
  if (t == dtype::q4_k || t == dtype::q5_k) {
    // ggml's block: f16 d, f16 dmin, 6-bit scales and mins in 12 bytes, (q5_k: 32 bytes of fifth bits,)
    // 128 bytes of nibbles.
    for (std::int64_t b = 0; b < n * k / 256; ++b) {
      const std::byte* blk = w.stored.data() + b * (t == dtype::q4_k ? 144 : 176);
      std::uint16_t dmin_bits;
      std::memcpy(&dmin_bits, blk + 2, 2);
      const float dmin = f16_to_f32(dmin_bits);
      std::uint8_t s[12];
      std::memcpy(s, blk + 4, 12);
      for (int j = 0; j < 8; ++j) {
        const int m = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        for (int l = 0; l < 32; ++l) w.min_shift[b * 256 + 32 * j + l] = dmin * static_cast<float>(m);
      }
    }
  }
  if (t == dtype::q2_k) {
    // ggml's block: 16 bytes of 4-bit scales (low) and mins (high), 64 bytes of codes, f16 d, f16 dmin.
    for (std::int64_t b = 0; b < n * k / 256; ++b) {
      const std::byte* blk = w.stored.data() + b * 84;
      std::uint16_t dmin_bits;
      std::memcpy(&dmin_bits, blk + 82, 2);
      const float dmin = f16_to_f32(dmin_bits);
      for (int j = 0; j < 16; ++j) {
        const int m = std::to_integer<int>(blk[j]) >> 4;
        for (int l = 0; l < 16; ++l) w.min_shift[b * 256 + 16 * j + l] = dmin * static_cast<float>(m);
      }
    }
  }
  if (t == dtype::q4_1 || t == dtype::q5_1) {
    // Their kernels sum d*q and m as two terms: both magnitudes round (q4_k's convention, negated).
    const std::size_t block_bytes = t == dtype::q4_1 ? 20 : 24;
    for (std::int64_t b = 0; b < n * k / 32; ++b) {
      std::uint16_t m_bits;
      std::memcpy(&m_bits, w.stored.data() + b * block_bytes + 2, 2);
      for (int l = 0; l < 32; ++l) w.min_shift[b * 32 + l] = -f16_to_f32(m_bits);
    }
  }
  return w;
}

// Activations: normal, with outliers, an all-zero row and a row whose blocks each hold one huge value.
std::vector<float> make_activations(std::int64_t m, std::int64_t k, std::int64_t ldx, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::bernoulli_distribution outlier(0.02);
  std::vector<float> x(static_cast<std::size_t>(m * ldx), std::nanf(""));
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t c = 0; c < k; ++c) {
      float v = nd(rng) * (outlier(rng) ? 10.0f : 1.0f);
      if (r == 1) v = 0.0f;
      if (r == 2 && c % 32 == 5) v = 300.0f;
      x[r * ldx + c] = v;
    }
  }
  return x;
}

// How the kernels round the activations of one row for a format and level.
std::vector<double> modeled_activations(dtype t, isa level, const float* x, std::int64_t k, std::vector<double>* err) {
  std::vector<double> xm(x, x + k);
  err->assign(static_cast<std::size_t>(k), 0.0);
  int block = 0;
  if (t == dtype::q8_0 || t == dtype::q4_0 || t == dtype::iq4_nl || t == dtype::iq4_xs || t == dtype::q4_a32 ||
      t == dtype::q8_a32 || t == dtype::q4_1 || t == dtype::q5_0 || t == dtype::q5_1)
    block = 32;
  if (t == dtype::q2_k || t == dtype::q3_k || t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k) block = 256;
  if (block > 0) {
    for (std::int64_t b = 0; b < k / block; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      const float d = amax / 127.0f;
      for (int i = 0; i < block; ++i) {
        const float q = std::nearbyint(x[b * block + i] * id);
        xm[b * block + i] = static_cast<double>(d) * q;
        // d / 2, with room for the rounding of id and d themselves.
        (*err)[b * block + i] = amax / 254.0 * (1.0 + 1e-4);
      }
    }
  } else if (t == dtype::bf16 && level == isa::avx512 && has_bf16_dot()) {
    for (std::int64_t i = 0; i < k; ++i) {
      xm[i] = bf16_to_f32(f32_to_bf16(x[i]));
      (*err)[i] = std::ldexp(std::fabs(x[i]), -8);
    }
  }
  return xm;
}

// The length of the longest f32 summation chain, plus the roundings each term takes before it.
double chain_length(dtype t, std::int64_t k) {
  switch (t) {
    case dtype::q8_0:
    case dtype::q4_0:
    case dtype::iq4_nl:
    case dtype::iq4_xs:
    case dtype::q4_a32:
    case dtype::q8_a32:
    case dtype::q5_0: return static_cast<double>(k / 32) + 3;
    case dtype::q4_1:
    case dtype::q5_1: return static_cast<double>(k / 32) + 4;
    case dtype::fp8_s32: return static_cast<double>(k) + 3;
    case dtype::q2_k:
    case dtype::q4_k:
    case dtype::q5_k: return static_cast<double>(k / 256) + 6;
    case dtype::q3_k:
    case dtype::q6_k: return static_cast<double>(k / 256) + 4;
    default: return static_cast<double>(k) + 2;
  }
}

struct check_result {
  double worst_exact = 0;  // largest |error| / tolerance, exact reference
  double worst_model = 0;  // the same against the modeled activations
  bool wrote_outside = false;
  std::string where;
};

check_result run_case(const weights& w, const packed_matrix& pm, std::int64_t M, isa level, thread_pool& pool,
                      std::mt19937& rng) {
  const std::int64_t k = w.k, n = w.n;
  const std::int64_t ldx = k + 3;  // rows not vector-aligned
  const std::int64_t ldy = n + 5;
  const auto x = make_activations(M, k, ldx, rng);
  constexpr float sentinel = -12345.0f;
  std::vector<float> y(static_cast<std::size_t>(M * ldy), sentinel);
  matmul(pm, x.data(), ldx, M, y.data(), ldy, pool, level);

  check_result res;
  std::vector<double> err;
  for (std::int64_t m = 0; m < M; ++m) {
    const float* xr = x.data() + m * ldx;
    const auto xm = modeled_activations(w.type, level, xr, k, &err);
    for (std::int64_t c = n; c < ldy; ++c) res.wrote_outside |= y[m * ldy + c] != sentinel;
    for (std::int64_t r = 0; r < n; ++r) {
      const float* wr = w.deq.data() + r * k;
      const float* shift = w.min_shift.data() + r * k;
      double exact = 0, model = 0, mag = 0, qerr = 0;
      for (std::int64_t c = 0; c < k; ++c) {
        exact += static_cast<double>(wr[c]) * xr[c];
        model += static_cast<double>(wr[c]) * xm[c];
        // q4_k's kernel sums d*scale*q and dmin*min separately: both magnitudes round.
        const double wmag = std::fabs(static_cast<double>(wr[c]) + shift[c]) + std::fabs(shift[c]);
        mag += wmag * std::fabs(xm[c]);
        qerr += std::fabs(static_cast<double>(wr[c])) * err[c];
      }
      const double tol_model = 2.0 * u32 * chain_length(w.type, k) * mag + 1e-30;
      const double tol_exact = tol_model + qerr;
      const double got = y[m * ldy + r];
      const double e_model = std::fabs(got - model) / tol_model;
      const double e_exact = std::fabs(got - exact) / tol_exact;
      if (!(e_model <= res.worst_model) || !(e_exact <= res.worst_exact)) {
        res.where = "m=" + std::to_string(m) + " n=" + std::to_string(r) + " got " + std::to_string(got) +
                    " exact " + std::to_string(exact) + " model " + std::to_string(model) + " tol_model " +
                    std::to_string(tol_model) + " tol_exact " + std::to_string(tol_exact);
      }
      // NaN compares false: a NaN output makes the ratio NaN, kept as infinitely wrong.
      res.worst_model = std::isnan(e_model) ? INFINITY : std::max(res.worst_model, e_model);
      res.worst_exact = std::isnan(e_exact) ? INFINITY : std::max(res.worst_exact, e_exact);
    }
  }
  return res;
}

std::vector<std::int64_t> ks_for(dtype t) {
  switch (t) {
    // 1056: 33 blocks, which several row tiles walk in three K ranges (k_range_blocks).
    case dtype::q8_0: return {32, 96, 288, 768, 1056};
    case dtype::q4_0:
    case dtype::iq4_nl:
    case dtype::q4_a32:
    case dtype::q8_a32:
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::fp8_s32: return {32, 96, 288, 768};
    case dtype::iq4_xs:
    case dtype::q2_k:
    case dtype::q3_k:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k: return {256, 768};
    default: return {1, 7, 33, 96, 288, 768};
  }
}

thread_pool& shared_pool() {
  static thread_pool pool(2);
  return pool;
}

class matmul_format : public ::testing::TestWithParam<dtype> {};

TEST_P(matmul_format, matches_reference_on_every_level) {
  const dtype t = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(t));
  for (const std::int64_t k : ks_for(t)) {
    for (const std::int64_t n : {1, 3, 33, 257}) {
      const weights w = make_weights(t, n, k, rng);
      auto pm = packed_matrix::pack(w.view());
      ASSERT_TRUE(pm.has_value()) << pm.error();
      EXPECT_EQ(pm->rows(), n);
      EXPECT_EQ(pm->cols(), k);
      EXPECT_EQ(pm->type(), t);
      for (const std::int64_t M : {1, 2, 3, 7, 17, 64, 130}) {
        for (const isa level : all_levels) {
          if (!usable(level)) continue;
          const auto r = run_case(w, *pm, M, level, shared_pool(), rng);
          const std::string ctx = std::string(name(t)) + " " + std::string(isa_name(level)) + " M=" +
                                  std::to_string(M) + " N=" + std::to_string(n) + " K=" + std::to_string(k);
          EXPECT_LE(r.worst_model, 1.0) << ctx << ": " << r.where;
          EXPECT_LE(r.worst_exact, 1.0) << ctx << ": " << r.where;
          EXPECT_FALSE(r.wrote_outside) << ctx;
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(formats, matmul_format,
                         ::testing::Values(dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k,
                                           dtype::q6_k, dtype::iq4_nl, dtype::iq4_xs, dtype::q4_a32, dtype::q8_a32, dtype::fp8_s32,
                                           dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q5_k, dtype::q3_k, dtype::q2_k),
                         [](const auto& info) { return std::string(name(info.param)); });

// GPTQ / AWQ groups of 64 or 128 columns give every 32-block of a group one scale and zero point: the
// affine panels then keep one header for 2^s blocks (the widest aligned run every row shares, at most
// 64 blocks), which takes 17 bytes a row per 32 4-bit weights for groups of 128 instead of 20, and the
// products stay what the row form computes. One row that breaks a run narrows the group for all.
TEST(matmul, affine_groups_keep_one_header_per_group) {
  std::mt19937 rng(77);
  struct grouping {
    std::int64_t k;
    std::int64_t period;  // blocks that share their header in the row form
    bool broken;          // the last row's blocks 2 and 3 take another header
    int shift;            // the group the packer must find
  };
  for (const dtype t : {dtype::q4_a32, dtype::q8_a32}) {
    const std::size_t block_bytes = t == dtype::q4_a32 ? 20 : 40, header = t == dtype::q4_a32 ? 3 : 5;
    const auto& layout = t == dtype::q4_a32 ? detail::q4_a32_groups : detail::q8_a32_groups;
    for (const grouping g : {grouping{768, 4, false, 2}, grouping{768, 24, false, 4}, grouping{768, 4, true, 1},
                             grouping{96, 2, false, 1}, grouping{4096, 128, false, 6}, grouping{768, 1, false, 0}}) {
      const std::int64_t n = 37, blocks = g.k / 32;
      weights w = make_weights(t, n, g.k, rng);
      for (std::int64_t r = 0; r < n; ++r) {
        std::byte* row = w.stored.data() + static_cast<std::size_t>(r * blocks) * block_bytes;
        for (std::int64_t b = 0; b < blocks; ++b)
          std::memcpy(row + b * block_bytes, row + (b / g.period * g.period) * block_bytes, header);
        if (g.broken && r == n - 1)
          for (std::int64_t b : {2, 3}) row[b * block_bytes + header - 1] ^= std::byte{1};  // the zero point
      }
      ASSERT_TRUE(dequantize_row(t, w.stored.data(), w.deq.data(), n * g.k).has_value());
      auto pm = packed_matrix::pack(w.view());
      ASSERT_TRUE(pm.has_value()) << pm.error();
      const std::string ctx = std::string(name(t)) + " K=" + std::to_string(g.k) + " period " + std::to_string(g.period) +
                              (g.broken ? " broken" : "");
      EXPECT_EQ(pm->data().group_shift, g.shift) << ctx;
      EXPECT_EQ(pm->bytes(), static_cast<std::size_t>((n + 15) / 16) * layout.panel_bytes(blocks, g.shift)) << ctx;
      for (const isa level : all_levels) {
        if (!usable(level)) continue;
        for (const std::int64_t M : {1, 7, 17}) {
          const auto r = run_case(w, *pm, M, level, shared_pool(), rng);
          EXPECT_LE(r.worst_model, 1.0) << ctx << " " << isa_name(level) << " M=" << M << ": " << r.where;
          EXPECT_LE(r.worst_exact, 1.0) << ctx << " " << isa_name(level) << " M=" << M << ": " << r.where;
          EXPECT_FALSE(r.wrote_outside) << ctx;
        }
      }
    }
  }
  // Per-32 headers (period 1) take exactly the bytes the pairs did for 4 bits: 20 a row per 32.
  EXPECT_EQ(detail::q4_a32_groups.panel_bytes(24, 0), std::size_t{24} * 16 * 20);
  EXPECT_EQ(detail::q4_a32_groups.panel_bytes(32, 2), std::size_t{32} * 16 * 17);
}

// The split of work over threads must not change what is computed: every pool size and level gives a
// result within the model tolerance (checked here at a size that makes many tasks).
TEST(matmul, any_pool_size) {
  std::mt19937 rng(99);
  for (const dtype t : {dtype::f32, dtype::q4_0, dtype::q6_k}) {
    const weights w = make_weights(t, 300, 512, rng);
    auto pm = packed_matrix::pack(w.view());
    ASSERT_TRUE(pm.has_value());
    for (const int threads : {1, 3}) {
      thread_pool pool(threads);
      for (const std::int64_t M : {1, 100}) {
        const auto r = run_case(w, *pm, M, best_isa(), pool, rng);
        EXPECT_LE(r.worst_model, 1.0) << name(t) << " threads=" << threads << " M=" << M << ": " << r.where;
      }
    }
  }
}

// A row's result must not depend on the rest of the batch: row r of an M-row product (M = 16 is
// batched decode; 2 and 5 are verify windows, whose float tiles are wider than others; the others put
// rows in every position of a row tile, a remainder tile and a second row chunk) equals the product of
// that row alone, bit for bit, on every level.
TEST(matmul, rows_do_not_depend_on_the_batch) {
  std::mt19937 rng(2024);
  constexpr std::int64_t n = 257, k = 768;
  for (const dtype t : {dtype::q8_0, dtype::q4_0, dtype::f32, dtype::f16, dtype::bf16, dtype::q4_k, dtype::q6_k, dtype::q5_1, dtype::q5_k, dtype::q3_k, dtype::q2_k,
                        dtype::fp8_s32}) {
    const weights w = make_weights(t, n, k, rng);
    auto pm = packed_matrix::pack(w.view());
    ASSERT_TRUE(pm.has_value()) << pm.error();
    for (const isa level : all_levels) {
      if (!usable(level)) continue;
      for (const std::int64_t M : {16, 5, 2, 130}) {
        const std::int64_t ldx = k + 3, ldy = n + 5;
        const std::vector<float> x = make_activations(M, k, ldx, rng);
        std::vector<float> y(static_cast<std::size_t>(M * ldy)), one(static_cast<std::size_t>(n));
        matmul(*pm, x.data(), ldx, M, y.data(), ldy, shared_pool(), level);
        for (std::int64_t r = 0; r < M; ++r) {
          matmul(*pm, x.data() + r * ldx, ldx, 1, one.data(), n, shared_pool(), level);
          ASSERT_EQ(std::memcmp(y.data() + r * ldy, one.data(), static_cast<std::size_t>(n) * sizeof(float)), 0)
              << name(t) << " " << isa_name(level) << " M=" << M << ": row " << r << " differs from its M=1 product";
        }
      }
    }
  }
}

// A batch of products (a step's selected experts) gives each job exactly what its own matmul gives,
// bit for bit, whatever the mix of single rows and gathered rows, on every level and pool size.
TEST(matmul, a_batch_equals_its_products_one_by_one) {
  std::mt19937 rng(77);
  constexpr std::int64_t n = 96, k = 512;
  for (const dtype t : {dtype::q8_0, dtype::f16, dtype::q4_k, dtype::f32}) {
    std::vector<weights> ws;
    std::vector<packed_matrix> pms;
    for (int e = 0; e < 5; ++e) {
      ws.push_back(make_weights(t, n, k, rng));
      auto pm = packed_matrix::pack(ws.back().view());
      ASSERT_TRUE(pm.has_value()) << pm.error();
      pms.push_back(std::move(*pm));
    }
    for (const isa level : all_levels) {
      if (!usable(level)) continue;
      for (const int threads : {1, 3}) {
        thread_pool pool(threads);
        const std::int64_t rows[] = {1, 3, 1, 140, 2};
        std::vector<std::vector<float>> xs, ys, want;
        std::vector<matmul_job> jobs;
        for (int e = 0; e < 5; ++e) {
          xs.push_back(make_activations(rows[e], k, k, rng));
          ys.emplace_back(static_cast<std::size_t>(rows[e] * n), -1.0f);
          want.emplace_back(static_cast<std::size_t>(rows[e] * n));
          matmul(pms[e], xs[e].data(), k, rows[e], want[e].data(), n, pool, level);
        }
        for (int e = 0; e < 5; ++e) jobs.push_back({&pms[e], xs[e].data(), k, rows[e], ys[e].data(), n});
        // Two more over job 3's rows (the sharing of one preparation), with other matrices.
        std::vector<float> extra_y(2 * static_cast<std::size_t>(rows[3] * n)), extra_want(extra_y.size());
        for (int e = 0; e < 2; ++e) {
          matmul(pms[e], xs[3].data(), k, rows[3], extra_want.data() + e * rows[3] * n, n, pool, level);
          jobs.push_back({&pms[e], xs[3].data(), k, rows[3], extra_y.data() + e * rows[3] * n, n});
        }
        matmul_batch(jobs, pool, level);
        for (int e = 0; e < 5; ++e)
          ASSERT_EQ(std::memcmp(ys[e].data(), want[e].data(), ys[e].size() * sizeof(float)), 0)
              << name(t) << " " << isa_name(level) << " threads=" << threads << ": job " << e << " differs";
        ASSERT_EQ(std::memcmp(extra_y.data(), extra_want.data(), extra_y.size() * sizeof(float)), 0)
            << name(t) << " " << isa_name(level) << ": a job sharing another's rows differs";
      }
    }
  }
}

// MXFP4 is packed as stored (q4_0's panel layout, its E8M0 exponents for scales, 4.5 bits a weight) and
// its kernel reads the E2M1 codes through a table: the product equals the q8_0 kernel's over the exact
// q8_0 rewrite of the same blocks bit for bit (the same integer dots, the same power-of-two scales), at
// every isa level, in q4_0's bytes (half of q8_0's). Scales f16 cannot hold are as exact: every block's
// exponent raised by 72 multiplies the product by exactly 2^72.
TEST(matmul, mxfp4_is_packed_as_stored_and_equals_its_q8_0_rewrite) {
  std::mt19937 rng(5);
  constexpr std::int64_t n = 40, k = 256;
  const weights w = make_weights(dtype::mxfp4, n, k, rng);
  std::vector<std::byte> q8(static_cast<std::size_t>(n * k / 32 * 34));
  ASSERT_TRUE(mxfp4_as_q8_0(w.stored.data(), q8.data(), n * k / 32));
  std::vector<float> a(static_cast<std::size_t>(n * k)), b(a.size());
  ASSERT_TRUE(dequantize_row(dtype::mxfp4, w.stored.data(), a.data(), n * k).has_value());
  ASSERT_TRUE(dequantize_row(dtype::q8_0, q8.data(), b.data(), n * k).has_value());
  EXPECT_EQ(a, b);
  std::vector<std::byte> big(w.stored.begin(), w.stored.end());
  for (std::int64_t blk = 0; blk < n * k / 32; ++blk) big[static_cast<std::size_t>(blk * 17)] = std::byte{static_cast<std::uint8_t>(std::to_integer<int>(big[static_cast<std::size_t>(blk * 17)]) + 72)};
  EXPECT_FALSE(mxfp4_as_q8_0(big.data(), q8.data(), n * k / 32)) << "2^72 is no f16 scale";
  ASSERT_TRUE(mxfp4_as_q8_0(w.stored.data(), q8.data(), n * k / 32));
  auto pm = packed_matrix::pack(w.view());
  auto pq = packed_matrix::pack(tensor_view(dtype::q8_0, shape{n, k}, q8.data()));
  auto pb = packed_matrix::pack(tensor_view(dtype::mxfp4, shape{n, k}, big.data()));
  const weights q4 = make_weights(dtype::q4_0, n, k, rng);
  auto p4 = packed_matrix::pack(q4.view());
  ASSERT_TRUE(pm && pq && pb && p4);
  EXPECT_EQ(pm->type(), dtype::mxfp4);
  EXPECT_EQ(pm->bytes(), p4->bytes());
  EXPECT_LT(pm->bytes() * 100, pq->bytes() * 55);  // 4.5 bits a weight against q8_0's 8.5
  for (const isa level : all_levels) {
    if (!usable(level)) continue;
    for (const std::int64_t m : {1, 3, 9}) {
      const std::vector<float> x = make_activations(m, k, k, rng);
      std::vector<float> y1(static_cast<std::size_t>(m * n)), y2(y1.size()), y3(y1.size());
      matmul(*pm, x.data(), k, m, y1.data(), n, shared_pool(), level);
      matmul(*pq, x.data(), k, m, y2.data(), n, shared_pool(), level);
      matmul(*pb, x.data(), k, m, y3.data(), n, shared_pool(), level);
      EXPECT_EQ(y1, y2) << isa_name(level) << " m=" << m;
      for (auto& v : y1) v = std::ldexp(v, 72);
      EXPECT_EQ(y1, y3) << isa_name(level) << " m=" << m;
    }
  }
}

TEST(matmul, zero_k_gives_zeros) {
  std::mt19937 rng(1);
  const weights w = make_weights(dtype::f32, 5, 0, rng);
  auto pm = packed_matrix::pack(w.view());
  ASSERT_TRUE(pm.has_value());
  std::vector<float> x(1), y(10, 7.0f);
  matmul(*pm, x.data(), 0, 2, y.data(), 5, shared_pool(), best_isa());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(matmul, pack_refuses_what_it_cannot_lay_out) {
  std::vector<std::byte> bytes(4096);
  EXPECT_FALSE(packable(dtype::i32));
  EXPECT_FALSE(packed_matrix::pack(tensor_view(dtype::i32, shape{4, 256}, bytes.data())).has_value());
  // A block format without its own kernel must still be whole blocks per row.
  EXPECT_FALSE(packed_matrix::pack(tensor_view(dtype::q8_k, shape{4, 128}, bytes.data())).has_value());
  EXPECT_FALSE(packed_matrix::pack(tensor_view(dtype::f32, shape{2, 4, 8}, bytes.data())).has_value());
  const auto odd = packed_matrix::pack(tensor_view(dtype::q8_0, shape{4, 48}, bytes.data()));
  ASSERT_FALSE(odd.has_value());
  EXPECT_NE(odd.error().find("48"), std::string::npos);
}

// A block format without its own kernel (q8_k here, an activation format no checkpoint stores as weights)
// packs decoded to f16: its products are the f16 kernel's over the decoded weights rounded to f16.
TEST(matmul, other_block_formats_run_decoded_to_f16) {
  EXPECT_FALSE(packable(dtype::q8_k));
  constexpr std::int64_t n = 8, k = 512;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> src(static_cast<std::size_t>(n * k));
  for (auto& v : src) v = g(rng);
  std::vector<std::byte> q(*storage_bytes(dtype::q8_k, n * k));
  ASSERT_TRUE(quantize_row(dtype::q8_k, src.data(), q.data(), n * k).has_value());
  auto pm = packed_matrix::pack(tensor_view(dtype::q8_k, shape{n, k}, q.data()));
  ASSERT_TRUE(pm.has_value()) << pm.error();
  EXPECT_EQ(pm->type(), dtype::f16);
  std::vector<float> x(static_cast<std::size_t>(k));
  for (auto& v : x) v = g(rng);
  std::vector<float> y(static_cast<std::size_t>(n));
  thread_pool pool(1);
  matmul(*pm, x.data(), k, 1, y.data(), n, pool, isa::scalar);
  std::vector<float> row(static_cast<std::size_t>(k));
  for (std::int64_t r = 0; r < n; ++r) {
    ASSERT_TRUE(dequantize_row(dtype::q8_k, q.data() + static_cast<std::size_t>(r) * (*storage_bytes(dtype::q8_k, k)), row.data(), k));
    double want = 0, scale = 0;
    for (std::int64_t c = 0; c < k; ++c) {
      want += static_cast<double>(f16_to_f32(f32_to_f16(row[static_cast<std::size_t>(c)]))) * x[static_cast<std::size_t>(c)];
      scale += std::fabs(row[static_cast<std::size_t>(c)] * x[static_cast<std::size_t>(c)]);
    }
    EXPECT_NEAR(y[static_cast<std::size_t>(r)], want, 1e-5 * (1 + scale)) << "row " << r;
  }
}

// Packing keeps a quantized matrix at about its stored size: no f32 copy.
TEST(matmul, packed_size_is_about_the_stored_size) {
  std::mt19937 rng(5);
  for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    const weights w = make_weights(t, 64, 1024, rng);
    auto pm = packed_matrix::pack(w.view());
    ASSERT_TRUE(pm.has_value());
    const double ratio = static_cast<double>(pm->bytes()) / static_cast<double>(w.stored.size());
    EXPECT_GE(ratio, 1.0) << name(t);
    EXPECT_LE(ratio, 1.03) << name(t);
  }
}

// Small packed matrices share slabs of memory: one's release must not disturb another's data, and
// every panel stays 64-byte aligned.
TEST(matmul, packed_matrices_are_independent) {
  std::mt19937 rng(21);
  const weights a = make_weights(dtype::q4_0, 40, 96, rng);
  const weights b = make_weights(dtype::q8_0, 33, 288, rng);
  std::vector<packed_matrix> keep;
  for (int round = 0; round < 50; ++round) {
    auto pa = packed_matrix::pack(a.view());
    auto pb = packed_matrix::pack(b.view());
    ASSERT_TRUE(pa.has_value() && pb.has_value());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pb->data().data.get()) % 64, 0u);
    if (round % 2 == 0) keep.push_back(*pb);
  }
  for (const auto& pm : keep) {
    const auto r = run_case(b, pm, 5, best_isa(), shared_pool(), rng);
    EXPECT_LE(r.worst_model, 1.0) << r.where;
  }
}

TEST(gather_rows, matches_dequantize_row) {
  std::mt19937 rng(11);
  for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_k}) {
    const weights w = make_weights(t, 10, 256, rng);
    const std::int32_t ids[] = {3, 0, 9, 3};
    std::vector<float> out(4 * 256);
    gather_rows(w.view(), ids, 4, out.data());
    for (int i = 0; i < 4; ++i) {
      for (int c = 0; c < 256; ++c) EXPECT_EQ(out[i * 256 + c], w.deq[ids[i] * 256 + c]) << name(t);
    }
  }
}

}  // namespace
}  // namespace troupe::exec::cpu

// The AMX products (engine/exec/cpu/detail/amx_tiles.hpp). The emulated tile unit runs on every CPU:
// its bf16 and q8_0 products are held to the exact sums (in double) over the packed panels, on shapes
// with a partial last panel, an odd panel count and row counts that leave a lone row tile, with and
// without the residual. Where the CPU has AMX (amx().bf16 / .int8), the hardware's products are held
// to the emulation's and the dispatcher's products (matmul at avx512, which then runs on the tiles) to
// the exact sums; elsewhere those skip, naming why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::exec::cpu {
namespace {

struct problem {
  dtype type;
  std::int64_t N, K, M;
  std::vector<std::byte> w;         // stored (ggml / safetensors) bytes
  std::vector<std::byte> acts;      // the kernels' prepared activations
  std::size_t act_stride = 0;
  std::vector<double> x;            // the activations as the kernel sees them
  std::vector<double> wd;           // the weights' values [N, K]
  std::vector<float> r;             // residual [M, N]
};

problem make(dtype type, std::int64_t N, std::int64_t K, std::int64_t M, std::uint32_t seed) {
  problem p{type, N, K, M};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> code(-127, 127);
  p.wd.resize(static_cast<std::size_t>(N * K));
  p.x.resize(static_cast<std::size_t>(M * K));
  p.r.resize(static_cast<std::size_t>(M * N));
  for (auto& v : p.r) v = u(rng);
  if (type == dtype::bf16) {
    p.w.resize(static_cast<std::size_t>(N * K * 2));
    for (std::int64_t i = 0; i < N * K; ++i) {
      const std::uint16_t h = f32_to_bf16(u(rng));
      std::memcpy(p.w.data() + 2 * i, &h, 2);
      p.wd[static_cast<std::size_t>(i)] = bf16_to_f32(h);
    }
    p.act_stride = detail::round64(static_cast<std::size_t>(K) * 2);
    p.acts.resize(p.act_stride * static_cast<std::size_t>(M));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k) {
        const std::uint16_t h = f32_to_bf16(u(rng));
        std::memcpy(p.acts.data() + m * p.act_stride + 2 * k, &h, 2);
        p.x[static_cast<std::size_t>(m * K + k)] = bf16_to_f32(h);
      }
  } else {  // q8_0
    const std::int64_t blocks = K / 32;
    p.w.resize(static_cast<std::size_t>(N * blocks * 34));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t b = 0; b < blocks; ++b) {
        std::byte* blk = p.w.data() + (n * blocks + b) * 34;
        const std::uint16_t d = f32_to_f16(0.001f + 0.01f * (u(rng) + 1.0f));
        std::memcpy(blk, &d, 2);
        for (int j = 0; j < 32; ++j) {
          const auto q = static_cast<std::int8_t>(code(rng));
          blk[2 + j] = static_cast<std::byte>(q);
          p.wd[static_cast<std::size_t>(n * K + 32 * b + j)] = static_cast<double>(f16_to_f32(d)) * q;
        }
      }
    p.act_stride = detail::round64(detail::act32_group_bytes(K));
    p.acts.resize(p.act_stride * static_cast<std::size_t>((M + 7) / 8));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t b = 0; b < blocks; ++b) {
        std::byte* unit = p.acts.data() + (m / 8) * p.act_stride + b * 8 * detail::act32_unit + (m % 8) * detail::act32_unit;
        const float d = 0.002f + 0.02f * (u(rng) + 1.0f);
        std::memcpy(unit + 32, &d, 4);
        for (int j = 0; j < 32; ++j) {
          const auto q = static_cast<std::int8_t>(code(rng));
          unit[j] = static_cast<std::byte>(q);
          p.x[static_cast<std::size_t>(m * K + 32 * b + j)] = static_cast<double>(d) * q;
        }
      }
  }
  return p;
}

// The products in double, and each one's sum of magnitudes (the scale of its rounding).
void exact(const problem& p, bool residual, std::vector<double>& y, std::vector<double>& mag) {
  y.assign(static_cast<std::size_t>(p.M * p.N), 0.0);
  mag.assign(y.size(), 0.0);
  for (std::int64_t m = 0; m < p.M; ++m)
    for (std::int64_t n = 0; n < p.N; ++n) {
      double s = residual ? p.r[static_cast<std::size_t>(m * p.N + n)] : 0.0, a = std::fabs(s);
      for (std::int64_t k = 0; k < p.K; ++k) {
        const double t = p.x[static_cast<std::size_t>(m * p.K + k)] * p.wd[static_cast<std::size_t>(n * p.K + k)];
        s += t;
        a += std::fabs(t);
      }
      y[static_cast<std::size_t>(m * p.N + n)] = s;
      mag[static_cast<std::size_t>(m * p.N + n)] = a;
    }
}

std::vector<float> run(const problem& p, const packed_matrix& w, bool residual, void (*rows)(const detail::gemm_args&)) {
  std::vector<float> y(static_cast<std::size_t>(p.M * p.N), -1234.5f);
  detail::gemm_args a;
  a.w = &w.data();
  a.acts = p.acts.data();
  a.act_stride = p.act_stride;
  a.y = y.data();
  a.ldy = p.N;
  if (residual) {
    a.r = p.r.data();
    a.ldr = p.N;
  }
  a.m0 = 0;
  a.m1 = p.M;
  a.p0 = 0;
  a.p1 = w.data().panels;
  rows(a);
  return y;
}

void expect_exact(const problem& p, const std::vector<float>& got, bool residual, const std::string& what) {
  std::vector<double> want, mag;
  exact(p, residual, want, mag);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], static_cast<double>(p.K + 8) * 6e-8 * mag[i] + 1e-30) << what << " at row " << i / p.N << " column " << i % p.N;
}

struct shape {
  std::int64_t N, K, M;
};

TEST(amx_emulation, bf16_tiles_give_the_exact_products) {
  // 40 rows of W: three panels, the last partial; M = 48: a 32-row pair of tiles and a lone tile.
  for (const auto s : {shape{40, 96, 48}, shape{32, 32, 16}, shape{17, 64, 32}}) {
    const auto p = make(dtype::bf16, s.N, s.K, s.M, 7);
    auto w = packed_matrix::pack(tensor_view(dtype::bf16, troupe::shape{s.N, s.K}, p.w.data()));
    ASSERT_TRUE(w) << w.error();
    for (const bool residual : {false, true})
      expect_exact(p, run(p, *w, residual, detail::amx_bf16_rows_emulated), residual,
                   "bf16 N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " M=" + std::to_string(s.M) + (residual ? " +r" : ""));
  }
}

TEST(amx_emulation, q8_0_tiles_give_the_exact_products) {
  // M = 24: a pair of 8-row groups and a lone group; 40 rows of W; K of one, three and five blocks.
  for (const auto s : {shape{40, 96, 24}, shape{16, 32, 8}, shape{33, 160, 16}}) {
    const auto p = make(dtype::q8_0, s.N, s.K, s.M, 11);
    auto w = packed_matrix::pack(tensor_view(dtype::q8_0, troupe::shape{s.N, s.K}, p.w.data()));
    ASSERT_TRUE(w) << w.error();
    for (const bool residual : {false, true})
      expect_exact(p, run(p, *w, residual, detail::amx_q8_0_rows_emulated), residual,
                   "q8_0 N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " M=" + std::to_string(s.M) + (residual ? " +r" : ""));
  }
}

// amx() says why a unit is off (this CPU lacks it, the kernel refused it, ...), and never turns the
// tiles on below the avx512 level.
TEST(amx_emulation, the_status_names_why_amx_is_off) {
  const auto& s = amx();
  if (!s.bf16 || !s.int8) {
    EXPECT_FALSE(s.why_not.empty());
  }
  if (detected_isa() != isa::avx512) {
    EXPECT_FALSE(s.bf16);
    EXPECT_FALSE(s.int8);
  }
}

TEST(amx_hardware, tiles_equal_the_emulation) {
  const auto& s = amx();
  if (!s.bf16 && !s.int8) GTEST_SKIP() << "AMX is not used here: " << s.why_not;
  for (const auto type : {dtype::bf16, dtype::q8_0}) {
    if ((type == dtype::bf16 && !s.bf16) || (type == dtype::q8_0 && !s.int8)) continue;
    const auto p = make(type, 72, 256, 64, 3);
    auto w = packed_matrix::pack(tensor_view(type, troupe::shape{p.N, p.K}, p.w.data()));
    ASSERT_TRUE(w) << w.error();
    const bool bf = type == dtype::bf16;
    for (const bool residual : {false, true}) {
      const auto hw = run(p, *w, residual, bf ? detail::amx_bf16_rows_hardware : detail::amx_q8_0_rows_hardware);
      expect_exact(p, hw, residual, std::string(bf ? "bf16" : "q8_0") + " hardware");
    }
  }
}

// Through the dispatcher: with AMX in use, a prefill-sized product (rows in whole tiles and a tail
// the vector tiles take) of bf16 and q8_0 weights against f32 activations equals the vector tiles'
// (the same activation rounding; sums within f32 rounding).
TEST(amx_hardware, the_dispatcher_takes_the_tiles_for_prefill) {
  const auto& s = amx();
  if (!s.bf16 && !s.int8) GTEST_SKIP() << "AMX is not used here: " << s.why_not;
  thread_pool pool(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  constexpr std::int64_t N = 80, K = 256, M = 37;
  std::vector<float> x(static_cast<std::size_t>(M * K));
  for (auto& v : x) v = nd(rng);
  for (const auto type : {dtype::bf16, dtype::q8_0}) {
    if ((type == dtype::bf16 && !s.bf16) || (type == dtype::q8_0 && !s.int8)) continue;
    const auto p = make(type, N, K, 1, 9);
    auto w = packed_matrix::pack(tensor_view(type, troupe::shape{N, K}, p.w.data()));
    ASSERT_TRUE(w) << w.error();
    std::vector<float> tiles(static_cast<std::size_t>(M * N)), rows(static_cast<std::size_t>(M * N));
    matmul(*w, x.data(), K, M, tiles.data(), N, pool, isa::avx512);
    for (std::int64_t m = 0; m < M; ++m) matmul(*w, x.data() + m * K, K, 1, rows.data() + m * N, N, pool, isa::avx512);  // decode: vectors
    for (std::size_t i = 0; i < tiles.size(); ++i) ASSERT_NEAR(tiles[i], rows[i], 1e-4 * (1.0 + std::fabs(rows[i]))) << name(type) << " at " << i;
  }
}

}  // namespace
}  // namespace troupe::exec::cpu

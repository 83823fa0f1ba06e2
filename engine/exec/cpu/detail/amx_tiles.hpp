#pragma once
// AMX (Advanced Matrix Extensions: Sapphire Rapids and later) products over the packed panels, written
// once over a tile unit `U` and instantiated twice: over the hardware's tile instructions
// (matmul_amx.cpp, compiled with -mamx-*) and over `amx_emulated` below, a software model of the same
// instructions as Intel's SDM states them, which runs on any CPU. Tests hold the emulated kernels to
// the exact products, and the executor holds the hardware to the emulation once before it uses it
// (engine/exec/cpu/amx.cpp), so a kernel error shows on every machine and a hardware surprise costs
// the AMX path, never a wrong token.
//
// A tile unit U provides, for tile registers T, A, B, C in [0, 8) given as template arguments:
//   config(const amx_config&), release(), zero<T>(), load<T>(p, stride), store<T>(p, stride),
//   dp_bf16<C, A, B>() (tdpbf16ps) and dp_s8<C, A, B>() (tdpbssd); and f16x16(p, out), 16 f16 to f32.
// Everything here has internal linkage, as in matmul_kernels.hpp.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"

namespace troupe::exec::cpu::detail {
namespace {

// ldtilecfg's 64-byte operand: palette 1, then each tile's bytes per row and rows.
struct alignas(64) amx_config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(amx_config) == 64);

// The instructions' meaning in software (Intel SDM, vol. 2: TILELOADD, TILESTORED, TILEZERO,
// TDPBF16PS, TDPBSSD). Rows and bytes past a tile's configured shape read as zero.
struct amx_emulated {
  struct regs {
    amx_config cfg;
    alignas(64) std::uint8_t t[8][16][64];
  };
  static regs& r() {
    thread_local regs s{};
    return s;
  }
  static void config(const amx_config& c) {
    r().cfg = c;
    std::memset(r().t, 0, sizeof r().t);
  }
  static void release() { std::memset(r().t, 0, sizeof r().t); }
  template <int T>
  static void zero() {
    std::memset(r().t[T], 0, sizeof r().t[T]);
  }
  template <int T>
  static void load(const void* p, std::size_t stride) {
    auto& s = r();
    std::memset(s.t[T], 0, sizeof s.t[T]);
    for (int i = 0; i < s.cfg.rows[T]; ++i) std::memcpy(s.t[T][i], static_cast<const std::byte*>(p) + i * stride, s.cfg.colsb[T]);
  }
  template <int T>
  static void store(void* p, std::size_t stride) {
    auto& s = r();
    for (int i = 0; i < s.cfg.rows[T]; ++i) std::memcpy(static_cast<std::byte*>(p) + i * stride, s.t[T][i], s.cfg.colsb[T]);
  }
  static void f16x16(const std::byte* p, float* out) {
    for (int j = 0; j < 16; ++j) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * j, 2);
      out[j] = f16_to_f32(h);
    }
  }
  static float bf16(const std::uint8_t* p) {
    std::uint32_t u = static_cast<std::uint32_t>(p[0] | (p[1] << 8)) << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;  // denormals are zero
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // C[m][n] += A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1] over k, each an FMA (round to nearest even).
  template <int C, int A, int B>
  static void dp_bf16() {
    auto& s = r();
    const int M = s.cfg.rows[C], N = s.cfg.colsb[C] / 4, Kp = s.cfg.colsb[A] / 4;
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < Kp; ++k)
        for (int n = 0; n < N; ++n) {
          float c;
          std::memcpy(&c, s.t[C][m] + 4 * n, 4);
          c = std::fma(bf16(s.t[A][m] + 4 * k), bf16(s.t[B][k] + 4 * n), c);
          c = std::fma(bf16(s.t[A][m] + 4 * k + 2), bf16(s.t[B][k] + 4 * n + 2), c);
          std::uint32_t u;
          std::memcpy(&u, &c, 4);
          if ((u & 0x7f800000u) == 0) u &= 0x80000000u;  // flush to zero
          std::memcpy(s.t[C][m] + 4 * n, &u, 4);
        }
  }
  // C[m][n] += sum_i A[m][4k+i] B[k][4n+i] over k, signed bytes, in 32-bit integers.
  template <int C, int A, int B>
  static void dp_s8() {
    auto& s = r();
    const int M = s.cfg.rows[C], N = s.cfg.colsb[C] / 4, Kq = s.cfg.colsb[A] / 4;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        std::int32_t c;
        std::memcpy(&c, s.t[C][m] + 4 * n, 4);
        std::uint32_t acc = static_cast<std::uint32_t>(c);
        for (int k = 0; k < Kq; ++k)
          for (int i = 0; i < 4; ++i)
            acc += static_cast<std::uint32_t>(static_cast<std::int8_t>(s.t[A][m][4 * k + i]) * static_cast<std::int8_t>(s.t[B][k][4 * n + i]));
        c = static_cast<std::int32_t>(acc);
        std::memcpy(s.t[C][m] + 4 * n, &c, 4);
      }
  }
};

// Writes rows [m, m + n) of a block of sums (the 16 columns of panel p) where they belong: rows of W
// past its end are the panel's padding; with a residual, y = sum + r (r may be y itself).
inline void amx_store_block(const gemm_args& a, std::int64_t m, std::int64_t p, const float (&s)[16][16], int n = 16) {
  const std::int64_t col = p * panel_rows;
  const std::int64_t cols = a.w->rows - col < panel_rows ? a.w->rows - col : panel_rows;
  for (int i = 0; i < n; ++i) {
    float* y = a.y + (m + i) * a.ldy + col;
    if (a.r) {
      const float* r = a.r + (m + i) * a.ldr + col;
      for (std::int64_t j = 0; j < cols; ++j) y[j] = s[i][j] + r[j];
    } else {
      for (std::int64_t j = 0; j < cols; ++j) y[j] = s[i][j];
    }
  }
}

// bf16 weights (the bf16 panel: per pair of columns [16 rows][2] bf16, so 16 pairs are a B tile of 16
// rows of 64 bytes) against activations rounded to bf16 (rows of K bf16 at act_stride: 32 columns of
// 16 rows are an A tile), sums in f32 across the whole of K in the C tiles. NM row tiles of 16 by NP
// panels: C tiles 0-3, A tiles 4-5, B tiles 6-7.
template <class U, int NM, int NP>
void amx_bf16_block(const gemm_args& a, std::int64_t m, std::int64_t p) {
  const std::int64_t steps = a.w->cols / 32;
  U::template zero<0>();
  if constexpr (NP == 2) U::template zero<1>();
  if constexpr (NM == 2) U::template zero<2>();
  if constexpr (NM == 2 && NP == 2) U::template zero<3>();
  const std::byte* x0 = a.acts + static_cast<std::size_t>(m) * a.act_stride;
  const std::byte* x1 = x0 + 16 * a.act_stride;
  const std::byte* w0 = a.w->panel(p);
  const std::byte* w1 = NP == 2 ? a.w->panel(p + 1) : w0;
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::size_t xo = static_cast<std::size_t>(k) * 64, wo = static_cast<std::size_t>(k) * 16 * 64;
    U::template load<4>(x0 + xo, a.act_stride);
    if constexpr (NM == 2) U::template load<5>(x1 + xo, a.act_stride);
    U::template load<6>(w0 + wo, 64);
    if constexpr (NP == 2) U::template load<7>(w1 + wo, 64);
    U::template dp_bf16<0, 4, 6>();
    if constexpr (NP == 2) U::template dp_bf16<1, 4, 7>();
    if constexpr (NM == 2) U::template dp_bf16<2, 5, 6>();
    if constexpr (NM == 2 && NP == 2) U::template dp_bf16<3, 5, 7>();
  }
  alignas(64) float s[16][16];
  U::template store<0>(s, 64);
  amx_store_block(a, m, p, s);
  if constexpr (NP == 2) {
    U::template store<1>(s, 64);
    amx_store_block(a, m, p + 1, s);
  }
  if constexpr (NM == 2) {
    U::template store<2>(s, 64);
    amx_store_block(a, m + 16, p, s);
  }
  if constexpr (NM == 2 && NP == 2) {
    U::template store<3>(s, 64);
    amx_store_block(a, m + 16, p + 1, s);
  }
}

// Walks the task's panels two at a time and its rows [m0, m1) in blocks of two row tiles of `tile`
// rows (a last lone one), `block.operator()<NM, NP>(m, p)` running each under the tile shapes `cfg`.
template <class U, class Block>
void amx_walk(const gemm_args& a, const amx_config& cfg, std::int64_t tile, Block&& block) {
  U::config(cfg);
  for (std::int64_t p = a.p0; p < a.p1; p += 2) {
    const bool two = p + 1 < a.p1;
    std::int64_t m = a.m0;
    for (; m + 2 * tile <= a.m1; m += 2 * tile) two ? block.template operator()<2, 2>(m, p) : block.template operator()<2, 1>(m, p);
    if (m < a.m1) two ? block.template operator()<1, 2>(m, p) : block.template operator()<1, 1>(m, p);
  }
  U::release();
}

// Rows [m0, m1) (a multiple of 16) of the task against its panels; K a multiple of 32.
template <class U>
void amx_bf16_rows(const gemm_args& a) {
  amx_config cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  amx_walk<U>(a, cfg, 16, [&]<int NM, int NP>(std::int64_t m, std::int64_t p) { amx_bf16_block<U, NM, NP>(a, m, p); });
}

// q8_0 weights (each 32-block's codes in the panel are [8 g][16 rows][4] i8: a B tile of 8 rows of 64
// bytes) against int8 activations in block-major units (act32_unit bytes a row, 8 rows a group: a
// block of a group is an A tile of 8 rows of 32 bytes at stride act32_unit). A 32-block's integer sums
// (tdpbssd, signed by signed: no offset) are scaled by the weights' and the activations' scales and
// added in f32 per block. NM groups of 8 rows by NP panels: C tiles 0-3 (8 rows x 16 sums), A 4-5, B 6-7.
template <class U, int NM, int NP>
void amx_q8_0_block(const gemm_args& a, std::int64_t m, std::int64_t p) {
  const std::int64_t blocks = a.w->cols / 32;
  const std::byte* g0 = a.acts + static_cast<std::size_t>(m / act32_group) * a.act_stride;
  const std::byte* g1 = g0 + a.act_stride;
  const std::byte* w0 = a.w->panel(p);
  const std::byte* w1 = NP == 2 ? a.w->panel(p + 1) : w0;
  float acc[NM][NP][8][16] = {};
  alignas(64) std::int32_t c[8][16];
  const auto scale = [&](int e, int f, const std::byte* grp, const std::byte* panel, std::int64_t b) {
    alignas(64) float dw[16];
    U::f16x16(panel + block_scales(b, q8_0_unit), dw);
    const std::byte* units = grp + static_cast<std::size_t>(b) * act32_group * act32_unit;
    for (int i = 0; i < 8; ++i) {
      float dx;
      std::memcpy(&dx, units + i * act32_unit + 32, 4);
      for (int j = 0; j < 16; ++j) acc[e][f][i][j] += static_cast<float>(c[i][j]) * (dw[j] * dx);
    }
  };
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t xo = static_cast<std::size_t>(b) * act32_group * act32_unit;
    U::template load<4>(g0 + xo, act32_unit);
    if constexpr (NM == 2) U::template load<5>(g1 + xo, act32_unit);
    U::template load<6>(w0 + block_codes(b, q8_0_unit), 64);
    if constexpr (NP == 2) U::template load<7>(w1 + block_codes(b, q8_0_unit), 64);
    U::template zero<0>();
    U::template dp_s8<0, 4, 6>();
    if constexpr (NP == 2) {
      U::template zero<1>();
      U::template dp_s8<1, 4, 7>();
    }
    if constexpr (NM == 2) {
      U::template zero<2>();
      U::template dp_s8<2, 5, 6>();
    }
    if constexpr (NM == 2 && NP == 2) {
      U::template zero<3>();
      U::template dp_s8<3, 5, 7>();
    }
    U::template store<0>(c, 64);
    scale(0, 0, g0, w0, b);
    if constexpr (NP == 2) {
      U::template store<1>(c, 64);
      scale(0, 1, g0, w1, b);
    }
    if constexpr (NM == 2) {
      U::template store<2>(c, 64);
      scale(1, 0, g1, w0, b);
    }
    if constexpr (NM == 2 && NP == 2) {
      U::template store<3>(c, 64);
      scale(1, 1, g1, w1, b);
    }
  }
  alignas(64) float s[16][16];
  for (int f = 0; f < NP; ++f) {
    for (int e = 0; e < NM; ++e)
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 16; ++j) s[i + 8 * e][j] = acc[e][f][i][j];
    amx_store_block(a, m, p + f, s, 8 * NM);
  }
}

// Rows [m0, m1) of the task (m0 and m1 multiples of 8) against its panels.
template <class U>
void amx_q8_0_rows(const gemm_args& a) {
  amx_config cfg;
  for (int t = 0; t < 4; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 8;  // C: 8 rows of 16 sums
  for (int t = 4; t < 6; ++t) cfg.colsb[t] = 32, cfg.rows[t] = 8;  // A: 8 rows of one block
  for (int t = 6; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 8;  // B: 8 groups of 4 columns
  amx_walk<U>(a, cfg, 8, [&]<int NM, int NP>(std::int64_t m, std::int64_t p) { amx_q8_0_block<U, NM, NP>(a, m, p); });
}

}  // namespace
}  // namespace troupe::exec::cpu::detail

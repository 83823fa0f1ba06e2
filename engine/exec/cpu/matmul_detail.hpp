#pragma once
// Internals of the matrix products, shared by the dispatcher (matmul.cpp) and the kernel files of
// each isa level: the packed weight layouts and the table of kernels a level provides. Not a public
// interface.
//
// Packed weights are panels of 16 rows of W. Within a panel, each unit of K (one column for the
// plain floats, one block for the quantized formats) keeps the 16 rows side by side, so one vector
// load covers 16 output rows and no kernel needs a horizontal sum. A panel is:
//   f32   per column: [16] f32
//   f16   per column: [16] f16
//   bf16  per column pair: [16 rows][2] bf16 (K padded to even with zeros)
//   q8_0  per pair of 32-blocks: d[2][16] f16, then per block q[8 g][16 rows][4] i8: group g holds
//         elements 4g..4g+3 of each row
//   q4_0  per pair of 32-blocks: d[2][16] f16, then per block q[4 g][16 rows][4] u8: ggml's bytes
//         4g..4g+3 of each row, whose low nibbles are elements 4g.. and high nibbles 16+4g..
//   mxfp4 q4_0's layout with each block's E8M0 exponents e[16] u8 where q4_0 keeps its f16 scales
//         (the other 16 bytes of the block's 32 unused); the codes are E2M1, read through a table
//   q4_k  per 256-superblock: d[16] f16, dmin[16] f16, scale[8 sub][16 rows] u8, min[2 h][16 rows][4]
//         u8 (the min of sub-block 4h+t at [h][row][t]), q[4 c][8 g][16 rows][4] u8: ggml's bytes
//         32c+4g.. of each row, low nibbles elements 64c+4g.., high nibbles 64c+32+4g..
//   q5_k  q4_k's unit, then the fifth bits h[4 c][2 w][16 rows][4] u8: byte t of word (c, w) holds in bit
//         g the fifth bit of element 64c+4(4w+g)+t and in bit 4+g that of element 64c+32+4(4w+g)+t
//   q6_k  d[K/256][16] f16 (padded to 64 bytes), then per 256-superblock ql[2 h][16 v][16 rows][4]
//         (ggml's ql bytes 64h+4v..), qh[2 h][8 u][16 rows][4] (ggml's qh bytes 32h+4u..),
//         scale[16 sub][16 rows] i8
//   q3_k  q6_k's leading d run, then per 256-superblock ql[2 n][8 v][16 rows][4] (ggml's qs bytes 32n+4v..),
//         hm[8 v][16 rows][4] (ggml's hmask bytes 4v..), scale[16 sub][16 rows] i8 (unbiased)
//   q2_k  q6_k's leading d run, then per 256-superblock q3_k's ql, sm[16 sub][16 rows] u8 (ggml's byte:
//         the scale in the low nibble, the min in the high one), dmin[16] f16 (padded to 64 bytes): 86
//         bytes a row per 256 weights against the file's 84
//   iq4_nl q4_0's layout; the codes index IQ4_NL's table of 16 int8 levels
//   iq4_xs per 256-superblock: d[16] f32, ls[8 blocks][16 rows] i8 (each 32-block's scale less 32, so
//         the block's scale is d (ls - 32), as ggml computes it), then the eight blocks' codes in iq4_nl's
//         layout: 140 bytes a row per 256 weights against the file's 136
//   q4_a32 per group of 2^s blocks (s the layout's group_shift: the most consecutive blocks whose rows
//         all share their scale and zero point, as a GPTQ / AWQ group of 64 or 128 columns does): d[16]
//         f16, z[16] u8 (the zero points), 16 unused bytes, then q4_0's codes of each block (unsigned
//         nibbles); a group of 128 columns is 17 bytes a row per 32 weights, not 20
//   q8_a32 per group of 2^s blocks: d[16] f32, z[16] i8 (the zero points less 128), 48 unused bytes,
//         then q8_0's codes of each block, less 128 (signed)
//   fp8_s32 per 32-block: s[16] f32, then q[32 k][16 rows] E4M3 bytes
//   q4_1  per pair: d[2][16] f16, m[2][16] f16 (the block minimums), then q4_0's codes (unsigned)
//   q5_0  per pair: d[2][16] f16, then per block q4_0's codes of the low nibbles and the fifth bits,
//         h[16 rows] u32: byte t of a row's word holds in bit g the fifth bit of element 4g+t and in
//         bit 4+g that of element 16+4g+t, so group g's bits are one shift and mask away
//   q5_1  q4_1's header with q5_0's blocks
// Vector loads stay 64-byte aligned, a panel holds the bytes of its 16 stored rows (q4_k adds 4 a
// superblock row by unpacking its 6-bit scales; scale runs and an odd last block round up to 64 bytes),
// and a final partial panel is padded with zero rows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "engine/core/dtype.hpp"
#include "engine/exec/cpu/matmul.hpp"

namespace troupe::exec::cpu {

namespace detail {

inline constexpr int panel_rows = 16;

struct weight_slab;
// Frees memory from allocate_aligned, or returns a weight allocation to its slab.
struct free_aligned {
  weight_slab* slab = nullptr;
  void operator()(std::byte* p) const;
};
using aligned_bytes = std::unique_ptr<std::byte[], free_aligned>;
// 64-byte aligned, zero-filled.
aligned_bytes allocate_aligned(std::size_t bytes);
// The same for packed weights, which decode streams from memory: on transparent huge pages, small
// ones sharing slabs of them.
aligned_bytes allocate_weights(std::size_t bytes);
// Hands back the pages of the slab being carved past its last matrix (a later matrix faults them in
// again): an executor calls it once an entry's weights are packed.
void trim_weight_slabs();

inline constexpr std::size_t round64(std::size_t n) { return (n + 63) / 64 * 64; }

// Bytes of one block (superblock) of one panel, scales excluded where they live in a leading run.
inline constexpr std::size_t q8_0_unit = 16 * 32;
inline constexpr std::size_t q4_0_unit = 16 * 16;
inline constexpr std::size_t q4_k_unit = 32 + 32 + 128 + 128 + 16 * 128;
inline constexpr std::size_t q6_k_unit = 16 * 128 + 16 * 64 + 256;
inline constexpr std::size_t q5_k_unit = q4_k_unit + 512;
inline constexpr std::size_t q3_k_unit = 16 * 64 + 8 * 64 + 256;
inline constexpr std::size_t q3_k_hm = 1024, q3_k_scale = 1536;
inline constexpr std::size_t q2_k_unit = 16 * 64 + 256 + 64;
inline constexpr std::size_t q2_k_scale = 1024, q2_k_dmin = 1280;
// Offsets inside a q4_k / q6_k unit.
inline constexpr std::size_t q4_k_dmin = 32, q4_k_scale = 64, q4_k_min = 192, q4_k_q = 320, q5_k_h = q4_k_unit;
inline constexpr std::size_t q6_k_qh = 2048, q6_k_scale = 3072;
// The leading f16 scale run of a q6_k (q3_k) panel with `blocks` superblocks.
inline constexpr std::size_t scale_run(std::int64_t blocks) { return round64(static_cast<std::size_t>(blocks) * 32); }
// q8_0 / q4_0 panels hold blocks in pairs, [2][16] f16 scales then the two blocks' codes, so a panel
// is one aligned stream; a last odd block pads its scales to 64 bytes. Offsets of block b:
inline constexpr std::size_t pair_bytes(std::size_t unit) { return 64 + 2 * unit; }
inline constexpr std::size_t block_scales(std::int64_t b, std::size_t unit) {
  return static_cast<std::size_t>(b / 2) * pair_bytes(unit) + static_cast<std::size_t>(b % 2) * 32;
}
inline constexpr std::size_t block_codes(std::int64_t b, std::size_t unit) {
  return static_cast<std::size_t>(b / 2) * pair_bytes(unit) + 64 + static_cast<std::size_t>(b % 2) * unit;
}
inline constexpr std::size_t paired_panel_bytes(std::int64_t blocks, std::size_t unit) {
  return static_cast<std::size_t>(blocks / 2) * pair_bytes(unit) + (blocks % 2 != 0 ? 64 + unit : 0);
}

// Pairs with a larger header (q4_1, q5_1: 128 bytes) or a larger unit (q5_0, q5_1): the block's scales
// (of `scale_bytes` each per row) and, after `zeros_at` bytes of the header, its zero points or
// minimums (of `zero_bytes` each per row).
struct pair_layout {
  std::size_t unit, header, scale_bytes, zeros_at, zero_bytes = 1;
  constexpr std::size_t pair() const { return header + 2 * unit; }
  constexpr std::size_t scales(std::int64_t b) const {
    return static_cast<std::size_t>(b / 2) * pair() + static_cast<std::size_t>(b % 2) * 16 * scale_bytes;
  }
  constexpr std::size_t zeros(std::int64_t b) const {
    return static_cast<std::size_t>(b / 2) * pair() + zeros_at + static_cast<std::size_t>(b % 2) * 16 * zero_bytes;
  }
  constexpr std::size_t codes(std::int64_t b) const {
    return static_cast<std::size_t>(b / 2) * pair() + header + static_cast<std::size_t>(b % 2) * unit;
  }
  constexpr std::size_t panel_bytes(std::int64_t blocks) const {
    return static_cast<std::size_t>(blocks / 2) * pair() + (blocks % 2 != 0 ? header + unit : 0);
  }
};

// iq4_xs's superblocks (eight 32-blocks b, K a multiple of 256).
struct iq4_xs_layout {
  static constexpr std::size_t unit = 64 + 128 + 8 * q4_0_unit;
  static constexpr std::size_t d(std::int64_t b) { return static_cast<std::size_t>(b / 8) * unit; }
  static constexpr std::size_t scales(std::int64_t b) { return d(b) + 64 + static_cast<std::size_t>(b % 8) * 16; }
  static constexpr std::size_t codes(std::int64_t b) { return d(b) + 192 + static_cast<std::size_t>(b % 8) * q4_0_unit; }
  static constexpr std::size_t panel_bytes(std::int64_t blocks) { return static_cast<std::size_t>(blocks / 8) * unit; }
};
inline constexpr iq4_xs_layout iq4_xs_blocks{};

// The affine formats' groups: 2^shift blocks after one header of the group's scales (`scale_bytes`
// each per row) and, `zeros_at` bytes in, its zero points (one byte each per row). The last group may
// hold fewer blocks.
struct group_layout {
  std::size_t unit, header, scale_bytes, zeros_at;
  constexpr std::size_t group(int shift) const { return header + (unit << shift); }
  // The header of block b's group, and block b's codes.
  constexpr std::size_t head(std::int64_t b, int shift) const { return static_cast<std::size_t>(b >> shift) * group(shift); }
  constexpr std::size_t codes(std::int64_t b, int shift) const {
    return head(b, shift) + header + static_cast<std::size_t>(b & ((std::int64_t{1} << shift) - 1)) * unit;
  }
  constexpr std::size_t panel_bytes(std::int64_t blocks, int shift) const {
    const std::int64_t left = blocks & ((std::int64_t{1} << shift) - 1);
    return static_cast<std::size_t>(blocks >> shift) * group(shift) + (left != 0 ? header + static_cast<std::size_t>(left) * unit : 0);
  }
};
inline constexpr group_layout q4_a32_groups{q4_0_unit, 64, 2, 32};
inline constexpr group_layout q8_a32_groups{q8_0_unit, 128, 4, 64};
// The widest group a panel layout takes (64 blocks: 2048 columns).
inline constexpr int max_group_shift = 6;
// A q5 block: q4_0's codes, then the fifth bits of its 16 rows.
inline constexpr std::size_t q5_unit = q4_0_unit + 64;
inline constexpr pair_layout q4_1_pairs{q4_0_unit, 128, 2, 64, 2};
inline constexpr pair_layout q5_0_pairs{q5_unit, 64, 2, 0, 0};
inline constexpr pair_layout q5_1_pairs{q5_unit, 128, 2, 64, 2};
inline constexpr std::size_t fp8_s32_unit = 64 + 32 * 16;

// Prepared activations, one row each (kernels that read f32 x need none).
// 32-block rows (q8_0, q4_0): q[K] i8, then d[K/32] f32, then s[K/32] i32 (each block's sum of q times
// the offset that level's kernel adds to the weights to make them unsigned).
inline std::size_t act32_d(std::int64_t k) { return round64(static_cast<std::size_t>(k)); }
inline std::size_t act32_s(std::int64_t k) { return act32_d(k) + 4 * static_cast<std::size_t>(k / 32); }
inline std::size_t act32_bytes(std::int64_t k) { return round64(act32_s(k) + 4 * static_cast<std::size_t>(k / 32)); }
// 256-block rows (q4_k, q6_k): q[K] i8, d[K/256] f32, s[K/16] i32 (per-group sums, as the format's
// kernel wants them), hl[K/256][16] i8 (q4_k: the 32-element sums split as 128 h + l).
inline std::size_t act256_d(std::int64_t k) { return round64(static_cast<std::size_t>(k)); }
inline std::size_t act256_s(std::int64_t k) { return act256_d(k) + round64(4 * static_cast<std::size_t>(k / 256)); }
inline std::size_t act256_hl(std::int64_t k) { return act256_s(k) + 4 * static_cast<std::size_t>(k / 16); }
inline std::size_t act256_bytes(std::int64_t k) { return round64(act256_hl(k) + 16 * static_cast<std::size_t>(k / 256)); }

// Block-major prepared activations (the 32-element families on the vector levels): rows in groups of
// act32_group; the unit of block b of row m (32 int8 codes, then the f32 scale and the i32 sum term,
// as act32's s) at acts + (m / 8) * act_stride + b * 8 * act32_unit + (m % 8) * act32_unit, where
// act_stride is a group's bytes. A row tile (8 rows or fewer, never across a group) then reads one
// stream, its rows at fixed offsets from one pointer that moves a fixed step per block. With rows
// apart (act32), a tile of 8 rows needed 24 pointers, more than x86 has registers, and the q8_0
// kernel spilled in its inner loop.
inline constexpr std::size_t act32_unit = 40;
inline constexpr std::int64_t act32_group = 8;
inline std::size_t act32_group_bytes(std::int64_t k) { return act32_unit * act32_group * static_cast<std::size_t>(k / 32); }

// One task's share of a product: rows [m0, m1) of x against panels [p0, p1) of W. Row m's prepared
// activations start at acts + m * act_stride (for kernels that read x directly, acts is x), or are
// block-major (above).
struct gemm_args {
  const packed_matrix::layout* w = nullptr;
  const std::byte* acts = nullptr;
  std::size_t act_stride = 0;
  float* y = nullptr;
  std::int64_t ldy = 0;
  const float* r = nullptr;  // when set, each stored row adds r[m * ldr + n] (the residual epilogue)
  std::int64_t ldr = 0;
  std::int64_t m0 = 0, m1 = 0, p0 = 0, p1 = 0;
};

struct format_kernel {
  // Bytes of one row of prepared activations for K columns; null when the kernel reads f32 x.
  std::size_t (*act_bytes)(std::int64_t k) = nullptr;
  // Prepares one row of x (K floats) into act_bytes(K) bytes.
  void (*prepare)(const float* x, std::int64_t k, std::byte* out) = nullptr;
  void (*compute)(const gemm_args& a) = nullptr;
  // Instead of `prepare`, for a block-major layout: one row of x into its units, block b's at
  // out + b * block_stride.
  void (*prepare_blocks)(const float* x, std::int64_t k, std::byte* out, std::size_t block_stride) = nullptr;
};

struct kernel_table {
  format_kernel f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, mxfp4, iq4_nl, iq4_xs, q4_a32, q8_a32, fp8_s32, q4_1, q5_0, q5_1, q5_k, q3_k, q2_k;
};

// The AMX products of detail/amx_tiles.hpp over rows [m0, m1) of a task: bf16 (K a multiple of 32,
// rows a multiple of 16, bf16 activations in rows) and q8_0 (m0 and m1 multiples of 8, block-major
// activations). The hardware's run only where amx_usable() says so (matmul_amx.cpp); the emulation's
// anywhere (amx.cpp), for tests and for the check that admits the hardware.
void amx_bf16_rows_hardware(const gemm_args& a);
void amx_q8_0_rows_hardware(const gemm_args& a);
void amx_bf16_rows_emulated(const gemm_args& a);
void amx_q8_0_rows_emulated(const gemm_args& a);

const kernel_table& scalar_kernels();
const kernel_table& avx2_kernels();
const kernel_table& avx512_kernels();

}  // namespace detail

struct packed_matrix::layout {
  dtype type = dtype::f32;
  std::int64_t rows = 0, cols = 0;
  std::int64_t panels = 0;
  std::size_t panel_bytes = 0;
  int group_shift = 0;  // q4_a32, q8_a32: blocks per header, log 2 (detail::group_layout)
  detail::aligned_bytes data;
  const std::byte* panel(std::int64_t p) const { return data.get() + static_cast<std::size_t>(p) * panel_bytes; }
};

}  // namespace troupe::exec::cpu

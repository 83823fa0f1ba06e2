#pragma once
// The per-level entry points behind the dispatchers of kernels.hpp: one table of plain functions per
// isa level, built from the same templates (kernels_impl.hpp) in kernels.cpp (scalar),
// kernels_avx2.cpp and kernels_avx512.cpp. Only plain data and function pointers cross between the
// objects of different levels. The namespace is kernels_detail, not detail: matmul's per-level tables
// live in detail under the same names, and a shared name would let the linker swap one for the other.
#include <cstdint>

#include "engine/exec/cpu/kernels.hpp"

namespace troupe::exec::cpu::kernels_detail {

// Keys per attention tile, the unit of one online-softmax update: 64 rows of K and V (32 KiB at head
// dim 64) stay in L1 while every query of a task reads them.
inline constexpr std::int64_t attention_tile = 64;

// One attention task: the queries of tokens [t0, t1) of row r whose heads read kv heads [kh0, kh1)
// (every query head of those groups), over the keys c in [c0, c1); several tokens read one kv head.
// Scratch is the caller's, per thread, 64-byte aligned, the larger of the two forms' needs. The
// per-query (decode) form, for nq = (kh1 - kh0) x group queries of one token, holds
// attention_scratch_floats(): scaled queries [nq][D], accumulators [nq][Dv], running max [nq] and sum
// [nq], and a tile's scores [nq][tile]; `keys` holds c1 - c0 ints and `any` c1 - c0 bytes.
constexpr std::int64_t attention_scratch_floats(std::int64_t tokens, std::int64_t queries_per_token, std::int64_t D,
                                                std::int64_t Dv) {
  return tokens * queries_per_token * (D + Dv + 2 + attention_tile);
}

// The block form's scratch (kernels_impl.hpp attention_task_block), for nq = tokens x group queries of
// one kv head: the transposed queries and the tile's scores over nq rounded up to 16, three vectors of
// per-query state, accumulators over nq rounded up to 4, and the tile decoded to f32.
constexpr std::int64_t attention_block_scratch_floats(std::int64_t tokens, std::int64_t queries_per_token, std::int64_t D,
                                                      std::int64_t Dv) {
  const std::int64_t nq = tokens * queries_per_token, nqp = (nq + 15) / 16 * 16, nq4 = (nq + 3) / 4 * 4;
  return nqp * (D + attention_tile + 3) + (nq4 * Dv + 15) / 16 * 16 + attention_tile * (D + Dv);
}

struct attention_task {
  std::int64_t r = 0, kh0 = 0, kh1 = 0, t0 = 0, t1 = 0, c0 = 0, c1 = 0;
  float* scratch = nullptr;
  std::int32_t* keys = nullptr;
  std::uint8_t* any = nullptr;
  // Null: the task writes its normalized rows into out. Otherwise it leaves, for query i (token-major,
  // then query head), [running max, running sum, unnormalized acc[Dv]] at part + i * (Dv + 2), to be
  // merged with the other key ranges of the same queries.
  float* part = nullptr;
  // The decode task this thread runs next, if known: its first tile's K and V rows are fetched during
  // this task's last tile, so a batch of short rows does not wait on memory at every row's start.
  const attention_task* ahead = nullptr;
};

struct kernel_table {
  void (*attention)(const attention_args& a, const attention_task& task);
  void (*rms_norm)(const float* x, const float* w, std::int64_t rows, std::int64_t n, float eps, float* y);
  void (*layer_norm)(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps,
                     float* y);
  void (*rope)(float* x, std::int64_t T, std::int64_t H, std::int64_t D, const std::int32_t* pos, const float* inv_freq,
               std::int64_t half, bool neox, float scale);
  void (*softmax_rows)(const float* x, std::int64_t rows, std::int64_t n, bool log, float* y);
  void (*unary)(unary_kind k, const float* x, std::int64_t n, float* y);
  void (*gated)(unary_kind act, const float* g, const float* u, std::int64_t n, float* y);
  void (*ssm_scan_heads)(const ssm_scan_args& a, std::int64_t h0, std::int64_t h1);
  void (*delta_rule_heads)(const delta_rule_args& a, std::int64_t h0, std::int64_t h1);
  void (*ssm_conv_channels)(const ssm_conv_args& a, std::int64_t c0, std::int64_t c1);
  void (*binary)(binary_kind k, const float* a, bool a_scalar, const float* b, bool b_scalar, std::int64_t n, float* y);
  void (*to_f16)(const float* x, std::int64_t n, std::uint16_t* y);
};

const kernel_table& scalar_kernels();
const kernel_table& avx2_kernels();
const kernel_table& avx512_kernels();

// The table of `level`, or of the best usable level below it when this CPU lacks it.
const kernel_table& kernels_for(isa level);

}  // namespace troupe::exec::cpu::kernels_detail

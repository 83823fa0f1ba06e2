#pragma once
// Matrix products over packed weights: y[M, N] = x[M, K] W^T for a weight W [N, K] stored as f32, f16,
// bf16, q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4, iq4_nl, iq4_xs, q4_k, q6_k or the repacked Hugging Face forms
// (q4_a32, q8_a32, fp8_s32). Weights are packed once, at load, into a kernel-friendly layout of
// the same format (never widened to f32 copies); activations are f32 and may be quantized on the fly
// (to 8-bit blocks, as llama.cpp does) where integer dot products win. M = 1 is the decode GEMV; large
// M is the prefill GEMM.
//
// What each format computes (tests/engine/exec/cpu/matmul_test.cpp holds every level to it):
//  * f32, f16: the products in f32 with FMA.
//  * bf16: the same; on an avx512 CPU with BF16 the activations are first rounded to bf16 (relative
//    error up to 2^-8 each) and multiplied with vdpbf16ps.
//  * q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_a32, q8_a32, mxfp4: activations rounded to int8 per 32-element block (scale amax / 127, to nearest
//    even), integer dot products per block, scaled in f32 (mxfp4's E2M1 codes through a table, its
//    E8M0 scales exact: the q8_0 kernel's result over the same values, bit for bit). The formats with
//    a block minimum (q4_1, q5_1) add m times the block's activation sum as a second f32 term.
//  * q4_k, q6_k: the same with 256-element activation blocks (ggml's q8_K).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::exec::cpu {

bool packable(dtype t);

class packed_matrix {
 public:
  // A [N, K] weight in one of the packable formats, or in another block format core decodes (run as f16);
  // anything else is refused with the reason.
  // `consumed`, when given, is told each panel's source rows once they are packed (a weight source whose
  // bytes are a file mapping drops their pages: packing then holds the packed form plus one panel of
  // the file, not both in full).
  static result<packed_matrix, std::string> pack(const tensor_view& w, const std::function<void(const tensor_view&)>& consumed = {});
  // A 2-D block-format weight decoded once to `as` (f16 or f32) and packed in that type's panels; then
  // `consumed`, when given, is told of all of `w`.
  static result<packed_matrix, std::string> pack_decoded(const tensor_view& w, dtype as, const std::function<void(const tensor_view&)>& consumed = {});

  dtype type() const;
  std::int64_t rows() const;  // N
  std::int64_t cols() const;  // K
  std::size_t bytes() const;  // of the packed data

  struct layout;
  const layout& data() const { return *l_; }

 private:
  std::shared_ptr<const layout> l_;
};

// y[m * ldy + n] = sum_k x[m * ldx + k] * W[n, k] for m < M, n < N; nothing else of y is written.
// `level` must be usable. The work is split over the pool (one matmul at a time per pool); y must not
// overlap x. With r (the residual epilogue), y[m * ldy + n] = that sum + r[m * ldr + n], rounded as a
// separate add would; r may be exactly y (ldr == ldy), never partly overlap it.
void matmul(const packed_matrix& w, const float* x, std::int64_t ldx, std::int64_t M, float* y, std::int64_t ldy,
            thread_pool& pool, isa level, const float* r = nullptr, std::int64_t ldr = 0);

// Several independent products in one dispatch: job j computes y_j = x_j W_j^T (+ r_j) as `matmul`
// would. Every W_j has one format. Jobs over the same rows (the same x, M and ldx: a layer's q, k and v,
// or its gate and up, or a decode token's selected experts) share one preparation of the activations,
// and every job's (panel range, row range) tasks share one parallel_for, so many small products pay
// one dispatch instead of one each. `matmul` is the batch of one.
struct matmul_job {
  const packed_matrix* w = nullptr;
  const float* x = nullptr;
  std::int64_t ldx = 0, M = 0;
  float* y = nullptr;
  std::int64_t ldy = 0;
  const float* r = nullptr;  // the residual epilogue, as matmul's
  std::int64_t ldr = 0;
};
void matmul_batch(std::span<const matmul_job> jobs, thread_pool& pool, isa level);

// out[i, :] = row ids[i] of a stored table (any dtype core can dequantize), as f32. Ids are checked by
// the caller.
void gather_rows(const tensor_view& table, const std::int32_t* ids, std::int64_t n, float* out);

}  // namespace troupe::exec::cpu

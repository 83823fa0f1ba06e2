#pragma once
// Weight-format kernels of the CUDA target: plain C++ declarations of what linear_kernels.cu launches
// (no CUDA header needed by the caller). Pointers are device pointers; `stream` is a cudaStream_t.
// Weights stay in their stored layout (GGUF blocks byte for byte, row-major [N, K]).
#include <cstdint>

#include "engine/core/dtype.hpp"

namespace troupe::exec::cuda {

// Formats the GEMV and the f16 decode below read: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k.
bool weight_format_supported(dtype t);

// y[m, n] = sum_k x[m, k] * W[n, k] (+ r[m, n] when r is not null; r may equal y) for m < M, with W
// [N, K] stored as `t`, x and y f32 row-major. Meant for small M (decode): each weight byte is read
// once per launch. K must be a whole number of the format's blocks.
void launch_gemv(dtype t, const void* w, std::int64_t N, std::int64_t K, const float* x, std::int64_t M,
                 float* y, const float* r, void* stream);

// linear_id's product: y[p, n] = sum_k x[p or p / picks, k] * W[ids[p], n, k] for each pick p < P,
// with W [E, N, K] stored as `t` (E experts of [N, K], each as launch_gemv reads one) and ids already
// checked (launch_expert_ids: -1 selects nothing and gives a zero row). x holds one row per pick when
// `x_per_pick`, else one per token (picks = P / tokens picks each). Only the selected experts' weights
// are read: one pass over an expert's bytes per pick.
void launch_gemv_id(dtype t, const void* w, std::int64_t N, std::int64_t K, const float* x, bool x_per_pick, std::int64_t picks,
                    const std::int32_t* ids, std::int64_t P, float* y, void* stream);

// Decodes W ([N, K] stored as `t`) into f16 [N, K] at `out` (the prefill path hands it to cuBLASLt).
void launch_decode_f16(dtype t, const void* w, std::int64_t N, std::int64_t K, void* out, void* stream);

// f32 -> f16 / bf16 (round to nearest even), n elements.
void launch_to_f16(const float* x, std::int64_t n, void* out, void* stream);
void launch_to_bf16(const float* x, std::int64_t n, void* out, void* stream);

// out[j, :] = f32 of row ids[j] of table ([R, C] stored as `t`), for j < count. Ids were checked.
void launch_gather_decode(dtype t, const void* table, std::int64_t C, const std::int32_t* ids, std::int64_t count,
                          float* out, void* stream);

}  // namespace troupe::exec::cuda

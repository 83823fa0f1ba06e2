// The recurrent mixers on the device: the causal depthwise convolution, Mamba2's selective scan and
// the gated delta rule (kernels.hpp). A prefill chunk is one launch; what each thread does is
// recurrent_threads.hpp's, which the host test runs too.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/exec/cuda/device_flag.cuh"
#include "engine/exec/cuda/kernels.hpp"
#include "engine/exec/cuda/recurrent_threads.hpp"

namespace troupe::exec::cuda {
namespace {

namespace rt = recurrent_threads;

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }

// The device's execution context for recurrent_threads.
struct device_ctx {
  __device__ std::int64_t block_x() const { return blockIdx.x; }
  __device__ std::int64_t block_y() const { return blockIdx.y; }
  __device__ std::int64_t thread_x() const { return threadIdx.x; }
  __device__ std::int64_t block_dim_x() const { return blockDim.x; }
  __device__ float warp_sum(float v) const {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  __device__ void raise(step_flag* f, std::int32_t code, std::int32_t eqn, std::int64_t value, std::int64_t bound) const {
    raise_flag(f, code, eqn, value, bound);
  }
};

__global__ void ssm_conv_kernel(recurrent_rows rr, const float* x, const float* state, const float* w, std::int64_t C, std::int64_t K,
                                float* y, step_flag* flag, std::int32_t eqn) {
  device_ctx cx;
  rt::ssm_conv(cx, rr, x, state, w, C, K, y, flag, eqn);
}

__global__ void ssm_scan_kernel(recurrent_rows rr, const float* x, const float* dt, const float* A, const float* B, const float* Cm,
                                const float* state, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N, float* y,
                                step_flag* flag, std::int32_t eqn) {
  device_ctx cx;
  rt::ssm_scan(cx, rr, x, dt, A, B, Cm, state, H, P, G, N, y, flag, eqn);
}

__global__ void delta_rule_kernel(recurrent_rows rr, const float* q, const float* k, const float* v, const float* g, const float* beta,
                                  const float* state, std::int64_t Hk, std::int64_t Dk, std::int64_t H, std::int64_t Dv, float* y,
                                  step_flag* flag, std::int32_t eqn) {
  device_ctx cx;
  rt::delta_rule(cx, rr, q, k, v, g, beta, state, Hk, Dk, H, Dv, y, flag, eqn);
}

dim3 grid_of(std::int64_t units, std::int64_t per, std::int64_t R) {
  return dim3(static_cast<unsigned>(rt::blocks_of(units, per)), static_cast<unsigned>(R < 1 ? 1 : R));
}

}  // namespace

void launch_ssm_conv(const recurrent_rows& rr, const float* x, const float* state, const float* w, std::int64_t C, std::int64_t K,
                     float* y, step_flag* flag, std::int32_t eqn, void* stream) {
  if (rr.R < 1 || C < 1) return;
  ssm_conv_kernel<<<grid_of(C, rt::conv_threads, rr.R), rt::conv_threads, 0, S(stream)>>>(rr, x, state, w, C, K, y, flag, eqn);
}

void launch_ssm_scan(const recurrent_rows& rr, const float* x, const float* dt, const float* A, const float* B, const float* Cm,
                     const float* state, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N, float* y, step_flag* flag,
                     std::int32_t eqn, void* stream) {
  if (rr.R < 1 || H * P < 1) return;
  ssm_scan_kernel<<<grid_of(H * P, rt::warps_per_block, rr.R), rt::warps_per_block * 32, 0, S(stream)>>>(rr, x, dt, A, B, Cm, state, H, P, G,
                                                                                                         N, y, flag, eqn);
}

void launch_delta_rule(const recurrent_rows& rr, const float* q, const float* k, const float* v, const float* g, const float* beta,
                       const float* state, std::int64_t Hk, std::int64_t Dk, std::int64_t H, std::int64_t Dv, float* y, step_flag* flag,
                       std::int32_t eqn, void* stream) {
  if (rr.R < 1 || H * Dv < 1) return;
  delta_rule_kernel<<<grid_of(H * Dv, rt::warps_per_block, rr.R), rt::warps_per_block * 32, 0, S(stream)>>>(rr, q, k, v, g, beta, state, Hk,
                                                                                                            Dk, H, Dv, y, flag, eqn);
}

}  // namespace troupe::exec::cuda

// The sampling head on the device: one thread block per row runs sample_math.hpp's sample_row_run (the
// code the host tests run serially against exec::sample_row); this file adds only how a block's
// threads cooperate (barriers, warp-shuffle reductions in a fixed order, shared-memory atomics) and
// the launches.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/exec/cuda/sample_kernels.hpp"
#include "engine/exec/cuda/sample_math.hpp"

namespace troupe::exec::cuda {
namespace {

using sampling::mass128;

constexpr int sample_threads = 512;
constexpr int record_threads = 256;
constexpr unsigned full_warp = 0xffffffffu;

// Per-warp partials of the block reductions.
struct block_scratch {
  float f[32];
  std::uint32_t u[32];
  long long i[32];
  mass128 m[32];
};

__device__ float shfl_down(float v, int o) { return __shfl_down_sync(full_warp, v, o); }
__device__ std::uint32_t shfl_down(std::uint32_t v, int o) { return __shfl_down_sync(full_warp, v, o); }
__device__ long long shfl_down(long long v, int o) { return __shfl_down_sync(full_warp, v, o); }
__device__ mass128 shfl_down(mass128 v, int o) {
  const auto lo = __shfl_down_sync(full_warp, static_cast<unsigned long long>(v.lo), o);
  const auto hi = __shfl_down_sync(full_warp, static_cast<unsigned long long>(v.hi), o);
  return mass128{lo, hi};
}

struct max_op {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct min_op {
  __device__ long long operator()(long long a, long long b) const { return b < a ? b : a; }
};
struct sum_op {
  __device__ std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const { return a + b; }
  __device__ mass128 operator()(mass128 a, mass128 b) const { return sampling::mass_add(a, b); }
};

// The block of sample_math.hpp's passes: every thread of a 1-D block, blockDim.x a multiple of 32.
// Reductions combine in a fixed tree (lanes by shuffles, then warps in order), so results do not
// depend on timing; every thread gets the result.
struct cuda_block {
  block_scratch& s;

  __device__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ int threads() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() { __syncthreads(); }

  template <class T, class Op>
  __device__ T reduce(T v, T* slots, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_down(v, o));
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = slots[0];
    for (unsigned w = 1; w < (blockDim.x >> 5); ++w) r = op(r, slots[w]);
    __syncthreads();  // the slots are free again
    return r;
  }

  __device__ bool any(bool v) { return __syncthreads_or(v ? 1 : 0) != 0; }
  __device__ float max(float v) { return reduce(v, s.f, max_op{}); }
  __device__ std::uint32_t sum(std::uint32_t v) { return reduce(v, s.u, sum_op{}); }
  __device__ mass128 sum(mass128 v) { return reduce(v, s.m, sum_op{}); }
  __device__ std::int64_t min(std::int64_t v) { return reduce(static_cast<long long>(v), s.i, min_op{}); }

  __device__ std::uint32_t atomic_add(std::uint32_t* p, std::uint32_t v) { return atomicAdd(p, v); }
  __device__ std::uint64_t atomic_add(std::uint64_t* p, std::uint64_t v) {
    return atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }
};

__global__ void __launch_bounds__(sample_threads)
    sample_rows(const float* logits, std::int64_t stride, std::int64_t vocab, const device_sample_row* params, device_history_table hist,
                const std::uint32_t* masks, std::int64_t mask_words, device_sample_out* out, float* work) {
  __shared__ sampling::sample_shared sh;
  __shared__ block_scratch scratch;
  const std::int64_t row = blockIdx.x;
  const device_sample_row p = params[row];
  sampling::history_row h{nullptr, nullptr, nullptr};
  if (p.history >= 0 && hist.counts != nullptr) {
    const std::int64_t off = static_cast<std::int64_t>(p.history) * vocab;
    h.counts = hist.counts + off;
    h.prompt = hist.prompt != nullptr ? hist.prompt + off : nullptr;
    h.bias = hist.bias != nullptr ? hist.bias + off : nullptr;
  }
  const sampling::sample_row_input in{logits + row * stride, vocab, p, h, p.masked != 0 ? masks + row * mask_words : nullptr,
                                      work + row * vocab};
  cuda_block blk{scratch};
  sampling::sample_row_run(blk, sh, in, out[row]);
}

// After every row is sampled (so rows of one launch all see the history as it was before it).
__global__ void record_picks(int rows, std::int64_t vocab, const device_sample_row* params, device_history_table hist, const device_sample_out* out) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const std::int32_t slot = params[r].history;
  const std::int32_t token = out[r].token;
  if (slot < 0 || token < 0 || token >= vocab) return;
  atomicAdd(hist.counts + static_cast<std::int64_t>(slot) * vocab + token, 1);
}

}  // namespace

std::size_t sample_work_bytes(int rows, std::int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab) * sizeof(float);
}

void launch_sample(const float* logits, std::int64_t stride, std::int64_t vocab, int rows, const device_sample_row* params,
                   device_history_table hist, const std::uint32_t* masks, std::int64_t mask_words, device_sample_out* out, void* work,
                   void* stream) {
  if (rows <= 0 || vocab <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  sample_rows<<<static_cast<unsigned>(rows), sample_threads, 0, s>>>(logits, stride, vocab, params, hist, masks, mask_words, out,
                                                                     static_cast<float*>(work));
  if (hist.counts != nullptr)
    record_picks<<<static_cast<unsigned>((rows + record_threads - 1) / record_threads), record_threads, 0, s>>>(rows, vocab, params, hist, out);
}

}  // namespace troupe::exec::cuda

// Weight-format kernels of the CUDA target: the decode GEMV, the f16 decode for cuBLASLt, the f32 to
// f16/bf16 narrowing of activations and the decoding gather. The formats' arithmetic and the GEMV's
// per-thread work are quant_math.hpp's (tested on the host); this file adds the device loads, the
// reductions and the launches.
//
// GEMV. A CTA of 128 threads computes two output rows for up to eight activation rows (larger M runs
// in passes of eight, each reading the weights once more). Its threads stride over the rows' pieces
// (16 weights: two runs of eight), so a warp reads a contiguous stretch of each row; each run of x is
// loaded once per activation row and used for both weight rows. Weight loads are as wide as the
// blocks' alignment allows: 16 bytes for f32/f16/bf16 and the q4_k header, 8 for q4_k quants, 2 for
// q8_0/q4_0/q6_k (34-, 18- and 210-byte blocks are only 2-aligned), bytes when the base is odd.
#include "engine/exec/cuda/linear_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/exec/cuda/quant_math.hpp"

namespace troupe::exec::cuda {
namespace {

using namespace quant;  // NOLINT: this file is quant_math's device half

// Device loads for quant_math's loader interface; the host branches (never run) read bytes.
struct device_loader {
  bool xvec = false;  // activation runs may be read as float4

  TROUPE_HD std::uint32_t u8(const std::uint8_t* p) const {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return p[0];
#endif
  }

  template <int Align>
  TROUPE_HD std::uint32_t u16(const std::uint8_t* p) const {
#if defined(__CUDA_ARCH__)
    if constexpr (Align >= 2) {
      return __ldg(reinterpret_cast<const unsigned short*>(p));
    } else {
      return static_cast<std::uint32_t>(__ldg(p)) | (static_cast<std::uint32_t>(__ldg(p + 1)) << 8);
    }
#else
    return byte_loader{}.u16<Align>(p);
#endif
  }

  template <int Align, int N>
  TROUPE_HD void words(const std::uint8_t* p, std::uint32_t (&w)[N]) const {
#if defined(__CUDA_ARCH__)
    if constexpr (Align >= 16 && N % 4 == 0) {
      const uint4* v = reinterpret_cast<const uint4*>(p);
      TROUPE_QUANT_UNROLL
      for (int j = 0; j < N / 4; ++j) {
        const uint4 t = __ldg(v + j);
        w[4 * j] = t.x, w[4 * j + 1] = t.y, w[4 * j + 2] = t.z, w[4 * j + 3] = t.w;
      }
    } else if constexpr (Align >= 8 && N % 2 == 0) {
      const uint2* v = reinterpret_cast<const uint2*>(p);
      TROUPE_QUANT_UNROLL
      for (int j = 0; j < N / 2; ++j) {
        const uint2 t = __ldg(v + j);
        w[2 * j] = t.x, w[2 * j + 1] = t.y;
      }
    } else if constexpr (Align >= 4) {
      const unsigned int* v = reinterpret_cast<const unsigned int*>(p);
      TROUPE_QUANT_UNROLL
      for (int j = 0; j < N; ++j) w[j] = __ldg(v + j);
    } else if constexpr (Align >= 2) {
      const unsigned short* v = reinterpret_cast<const unsigned short*>(p);
      TROUPE_QUANT_UNROLL
      for (int j = 0; j < N; ++j)
        w[j] = static_cast<std::uint32_t>(__ldg(v + 2 * j)) | (static_cast<std::uint32_t>(__ldg(v + 2 * j + 1)) << 16);
    } else {
      TROUPE_QUANT_UNROLL
      for (int j = 0; j < N; ++j) {
        const std::uint8_t* q = p + 4 * j;
        w[j] = static_cast<std::uint32_t>(__ldg(q)) | (static_cast<std::uint32_t>(__ldg(q + 1)) << 8) |
               (static_cast<std::uint32_t>(__ldg(q + 2)) << 16) | (static_cast<std::uint32_t>(__ldg(q + 3)) << 24);
      }
    }
#else
    byte_loader{}.words<Align, N>(p, w);
#endif
  }

  TROUPE_HD void x8(const float* p, float (&v)[8]) const {
#if defined(__CUDA_ARCH__)
    if (xvec) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p));
      const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      TROUPE_QUANT_UNROLL
      for (int i = 0; i < 8; ++i) v[i] = __ldg(p + i);
    }
#else
    byte_loader{}.x8(p, v);
#endif
  }
};

// ---- GEMV ------------------------------------------------------------------------------------------

template <class F, int A, int MaxM>
__global__ void __launch_bounds__(gemv_threads)
    gemv_kernel(const std::uint8_t* __restrict__ w, std::int64_t N, std::int64_t K, std::int64_t rbytes,
                const float* __restrict__ x, int mc, float* y, const float* r, bool xvec) {
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * gemv_rows;
  const std::uint8_t* rows[gemv_rows];
  TROUPE_QUANT_UNROLL
  for (int i = 0; i < gemv_rows; ++i) rows[i] = w + (n0 + i < N ? n0 + i : N - 1) * rbytes;  // past N: row N - 1, not stored
  float acc[gemv_rows][MaxM];
  gemv_thread<F, A, MaxM>(device_loader{xvec}, rows, K, x, mc, static_cast<int>(threadIdx.x), gemv_threads, acc);

  __shared__ float part[gemv_warps][gemv_rows][MaxM];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  TROUPE_QUANT_UNROLL
  for (int i = 0; i < gemv_rows; ++i) {
    TROUPE_QUANT_UNROLL
    for (int m = 0; m < MaxM; ++m) {
      float v = acc[i][m];
      TROUPE_QUANT_UNROLL
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) part[warp][i][m] = v;
    }
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < gemv_rows * MaxM) {
    const int i = t / MaxM, m = t % MaxM;
    const std::int64_t n = n0 + i;
    if (m < mc && n < N) {
      float s = part[0][i][m];
      TROUPE_QUANT_UNROLL
      for (int wp = 1; wp < gemv_warps; ++wp) s += part[wp][i][m];
      const std::int64_t o = m * N + n;
      if (r != nullptr) s += r[o];  // r may be y: read before the write, by this thread
      y[o] = s;
    }
  }
}

// linear_id: CTA (n tile, pick) computes gemv_rows outputs of one pick from its expert's rows; a pick
// without an expert (-1) writes zeros. Picks past the grid's height loop (gridDim.y <= 65535).
template <class F, int A>
__global__ void __launch_bounds__(gemv_threads)
    gemv_id_kernel(const std::uint8_t* __restrict__ w, std::int64_t N, std::int64_t K, std::int64_t rbytes, const float* __restrict__ x,
                   bool x_per_pick, std::int64_t picks, const std::int32_t* __restrict__ ids, std::int64_t P, float* y, bool xvec) {
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * gemv_rows;
  __shared__ float part[gemv_warps][gemv_rows];
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  for (std::int64_t p = blockIdx.y; p < P; p += gridDim.y) {
    const std::int32_t e = ids[p];
    if (e < 0) {
      if (t < gemv_rows && n0 + t < N) y[p * N + n0 + t] = 0.0f;
      continue;
    }
    const std::uint8_t* expert = w + static_cast<std::int64_t>(e) * N * rbytes;
    const std::uint8_t* rows[gemv_rows];
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < gemv_rows; ++i) rows[i] = expert + (n0 + i < N ? n0 + i : N - 1) * rbytes;
    const float* xr = x + (x_per_pick ? p : p / picks) * K;
    float acc[gemv_rows][1];
    gemv_thread<F, A, 1>(device_loader{xvec}, rows, K, xr, 1, t, gemv_threads, acc);
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < gemv_rows; ++i) {
      float v = acc[i][0];
      TROUPE_QUANT_UNROLL
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) part[warp][i] = v;
    }
    __syncthreads();
    if (t < gemv_rows && n0 + t < N) {
      float s = part[0][t];
      TROUPE_QUANT_UNROLL
      for (int wp = 1; wp < gemv_warps; ++wp) s += part[wp][t];
      y[p * N + n0 + t] = s;
    }
    __syncthreads();  // part is written again by the next pick
  }
}

// ---- decoding --------------------------------------------------------------------------------------

constexpr int decode_threads = 256;

__device__ __forceinline__ void store8(std::uint16_t* out, std::int64_t e, const float (&v)[8], bool vec) {
  std::uint32_t h[4];
  TROUPE_QUANT_UNROLL
  for (int j = 0; j < 4; ++j)
    h[j] = static_cast<std::uint32_t>(float_to_f16_bits(v[2 * j])) |
           (static_cast<std::uint32_t>(float_to_f16_bits(v[2 * j + 1])) << 16);
  if (vec) {
    __stcg(reinterpret_cast<uint4*>(out + e), make_uint4(h[0], h[1], h[2], h[3]));
  } else {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) out[e + i] = static_cast<std::uint16_t>(h[i / 2] >> (16 * (i & 1)));
  }
}
__device__ __forceinline__ void store8(float* out, std::int64_t e, const float (&v)[8], bool vec) {
  if (vec) {
    __stcg(reinterpret_cast<float4*>(out + e), make_float4(v[0], v[1], v[2], v[3]));
    __stcg(reinterpret_cast<float4*>(out + e) + 1, make_float4(v[4], v[5], v[6], v[7]));
  } else {
    TROUPE_QUANT_UNROLL
    for (int i = 0; i < 8; ++i) out[e + i] = v[i];
  }
}
__device__ __forceinline__ void store1(std::uint16_t* out, std::int64_t e, float v) { out[e] = float_to_f16_bits(v); }
__device__ __forceinline__ void store1(float* out, std::int64_t e, float v) { out[e] = v; }

// out[j, :] = the C weights of source row ids[j] (ids null: row j), for j < rows. A: the source rows'
// alignment; out_vec: every run of 8 outputs may be stored with 16-byte stores.
template <class F, int A, class Out>
__global__ void __launch_bounds__(decode_threads)
    decode_kernel(const std::uint8_t* __restrict__ src, std::int64_t rbytes, const std::int32_t* __restrict__ ids,
                  std::int64_t rows, std::int64_t C, Out* __restrict__ out, bool out_vec) {
  const std::int64_t items = decode_items<F>(C);
  const device_loader ld{};
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = blockIdx.y; j < rows; j += gridDim.y) {
    const std::int64_t from = ids != nullptr ? static_cast<std::int64_t>(ids[j]) : j;
    const std::uint8_t* row = src + from * rbytes;
    Out* dst = out + j * C;
    for (std::int64_t it = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += stride) {
      std::int64_t first[2];
      float v[2][8];
      if (decode_item<F, A>(ld, row, C, it, first, v) == 8) {
        store8(dst, first[0], v[0], out_vec);
        store8(dst, first[1], v[1], out_vec);
      } else {
        store1(dst, first[0], v[0][0]);
      }
    }
  }
}

template <bool Bf16>
__global__ void __launch_bounds__(decode_threads)
    narrow_kernel(const float* __restrict__ x, std::int64_t n, std::uint16_t* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = Bf16 ? float_to_bf16_bits(x[i]) : float_to_f16_bits(x[i]);
}

// ---- launches --------------------------------------------------------------------------------------

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

// A grid-stride launch over n items: at most 2^20 CTAs.
unsigned grid_for(std::int64_t n) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + decode_threads - 1) / decode_threads, std::int64_t{1} << 20));
}

template <class F, class Out>
void decode_rows(const void* src, std::int64_t rbytes, const std::int32_t* ids, std::int64_t rows, std::int64_t C, Out* out,
                 bool out_vec, cudaStream_t s) {
  const std::int64_t items = decode_items<F>(C);
  if (rows <= 0 || items <= 0) return;
  const auto* sb = static_cast<const std::uint8_t*>(src);
  const int a = select_align<F>(common_align(reinterpret_cast<std::uintptr_t>(sb), static_cast<std::uint64_t>(rbytes)));
  const dim3 grid(grid_for(items), static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
  with_align<F>(a, [&](auto al) {
    decode_kernel<F, decltype(al)::value, Out><<<grid, decode_threads, 0, s>>>(sb, rbytes, ids, rows, C, out, out_vec);
  });
}

}  // namespace

bool weight_format_supported(dtype t) {
  return with_format(t, [](auto) {});
}

void launch_gemv(dtype t, const void* w, std::int64_t N, std::int64_t K, const float* x, std::int64_t M, float* y,
                 const float* r, void* stream) {
  if (N <= 0 || M <= 0) return;
  const auto* wb = static_cast<const std::uint8_t*>(w);
  const cudaStream_t s = S(stream);
  with_format(t, [&](auto f) {
    using F = decltype(f);
    const std::int64_t rbytes = row_bytes<F>(K);
    const int a = select_align<F>(common_align(reinterpret_cast<std::uintptr_t>(wb), static_cast<std::uint64_t>(rbytes)));
    const bool xvec = x_vector_ok(reinterpret_cast<std::uintptr_t>(x), K);
    const auto grid = static_cast<unsigned>((N + gemv_rows - 1) / gemv_rows);
    for (std::int64_t m0 = 0; m0 < M; m0 += gemv_max_m) {
      const int mc = static_cast<int>(std::min<std::int64_t>(gemv_max_m, M - m0));
      const float* xp = x + m0 * K;
      float* yp = y + m0 * N;
      const float* rp = r != nullptr ? r + m0 * N : nullptr;
      with_align<F>(a, [&](auto al) {
        with_pass_m(gemv_pass_m(mc), [&](auto pm) {
          gemv_kernel<F, decltype(al)::value, decltype(pm)::value>
              <<<grid, gemv_threads, 0, s>>>(wb, N, K, rbytes, xp, mc, yp, rp, xvec);
        });
      });
    }
  });
}

void launch_gemv_id(dtype t, const void* w, std::int64_t N, std::int64_t K, const float* x, bool x_per_pick, std::int64_t picks,
                    const std::int32_t* ids, std::int64_t P, float* y, void* stream) {
  if (N <= 0 || P <= 0) return;
  const auto* wb = static_cast<const std::uint8_t*>(w);
  with_format(t, [&](auto f) {
    using F = decltype(f);
    const std::int64_t rbytes = row_bytes<F>(K);
    // Every expert starts at a multiple of N rows, so the rows' common alignment is the base's and a row's.
    const int a = select_align<F>(common_align(reinterpret_cast<std::uintptr_t>(wb), static_cast<std::uint64_t>(rbytes)));
    const bool xvec = x_vector_ok(reinterpret_cast<std::uintptr_t>(x), K);
    const dim3 grid(static_cast<unsigned>((N + gemv_rows - 1) / gemv_rows), static_cast<unsigned>(std::min<std::int64_t>(P, 65535)));
    with_align<F>(a, [&](auto al) {
      gemv_id_kernel<F, decltype(al)::value><<<grid, gemv_threads, 0, S(stream)>>>(wb, N, K, rbytes, x, x_per_pick, picks > 0 ? picks : 1, ids, P, y, xvec);
    });
  });
}

void launch_decode_f16(dtype t, const void* w, std::int64_t N, std::int64_t K, void* out, void* stream) {
  // One flat row of N * K weights: rows are whole blocks, so the blocks are contiguous.
  auto* o = static_cast<std::uint16_t*>(out);
  const bool out_vec = reinterpret_cast<std::uintptr_t>(o) % 16 == 0;
  with_format(t, [&](auto f) { decode_rows<decltype(f)>(w, 0, nullptr, 1, N * K, o, out_vec, S(stream)); });
}

void launch_to_f16(const float* x, std::int64_t n, void* out, void* stream) {
  if (n > 0) narrow_kernel<false><<<grid_for(n), decode_threads, 0, S(stream)>>>(x, n, static_cast<std::uint16_t*>(out));
}

void launch_to_bf16(const float* x, std::int64_t n, void* out, void* stream) {
  if (n > 0) narrow_kernel<true><<<grid_for(n), decode_threads, 0, S(stream)>>>(x, n, static_cast<std::uint16_t*>(out));
}

void launch_gather_decode(dtype t, const void* table, std::int64_t C, const std::int32_t* ids, std::int64_t count,
                          float* out, void* stream) {
  const bool out_vec = reinterpret_cast<std::uintptr_t>(out) % 16 == 0 && (count == 1 || C % 4 == 0);
  with_format(t, [&](auto f) {
    using F = decltype(f);
    decode_rows<F>(table, row_bytes<F>(C), ids, count, C, out, out_vec, S(stream));
  });
}

}  // namespace troupe::exec::cuda

// The CUDA target's graph-op kernels. Each kernel states the op it runs; the meanings are the oracle's
// (engine/graph/ops.hpp, engine/eval/oracle.cpp), checked whole-model against the CPU oracle by
// tests/engine/exec/cuda/cuda_executor_test.cpp on a machine with a device.
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "engine/exec/cuda/device_flag.cuh"
#include "engine/exec/cuda/kernels.hpp"
#include "engine/exec/cuda/moe_math.hpp"
#include "engine/exec/cuda/quant_math.hpp"

namespace troupe::exec::cuda {
namespace {

constexpr int threads = 256;

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
unsigned blocks_for(std::int64_t n, int per = threads) {
  const std::int64_t b = (n + per - 1) / per;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b));
}

__device__ float unary_f(ew op, float x) {
  switch (op) {
    case ew::neg: return -x;
    case ew::abs: return fabsf(x);
    case ew::exp: return expf(x);
    case ew::log: return logf(x);
    case ew::sqrt: return sqrtf(x);
    case ew::rsqrt: return rsqrtf(x);
    case ew::recip: return 1.0f / x;
    case ew::tanh: return tanhf(x);
    case ew::erf: return erff(x);
    case ew::sigmoid: return 1.0f / (1.0f + expf(-x));
    case ew::silu: return x / (1.0f + expf(-x));
    case ew::gelu_tanh: {
      const float z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return x / (1.0f + expf(-2.0f * z));
    }
    default: return x;
  }
}

__device__ float binary_f(ew op, float a, float b) {
  switch (op) {
    case ew::add: return a + b;
    case ew::sub: return a - b;
    case ew::mul: return a * b;
    case ew::div: return a / b;
    case ew::maximum: return isnan(a) || isnan(b) ? NAN : (a < b ? b : a);  // NaN if either is, as the oracle
    case ew::minimum: return isnan(a) || isnan(b) ? NAN : (b < a ? b : a);
    case ew::pow: return powf(a, b);
    default: return a;
  }
}

__device__ double load_any(dtype t, const void* p, std::int64_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(p)[i];
    case dtype::f16: return quant::f16_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case dtype::bf16: return quant::bf16_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case dtype::i32: return static_cast<const std::int32_t*>(p)[i];
    case dtype::i64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case dtype::boolean: return static_cast<const std::uint8_t*>(p)[i] != 0;
    default: return 0.0;
  }
}

// Round half to even, saturate at [lo, hi] (NaN: 0), as troupe::store_element.
template <class I>
__device__ I saturate(double v, I lo, I hi) {
  if (isnan(v)) return 0;
  const double r = nearbyint(v);
  if (r <= static_cast<double>(lo)) return lo;
  if (r >= static_cast<double>(hi)) return hi;
  return static_cast<I>(r);
}

__device__ void store_any(dtype t, void* p, std::int64_t i, double v) {
  switch (t) {
    case dtype::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case dtype::f16: static_cast<std::uint16_t*>(p)[i] = quant::float_to_f16_bits(static_cast<float>(v)); return;
    case dtype::bf16: static_cast<std::uint16_t*>(p)[i] = quant::float_to_bf16_bits(static_cast<float>(v)); return;
    case dtype::i32: static_cast<std::int32_t*>(p)[i] = saturate<std::int32_t>(v, INT32_MIN, INT32_MAX); return;
    case dtype::i64:
      static_cast<std::int64_t*>(p)[i] = saturate<std::int64_t>(v, INT64_MIN, INT64_MAX);
      return;
    case dtype::boolean: static_cast<std::uint8_t*>(p)[i] = v != 0.0; return;
    default: return;
  }
}

__device__ double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

__device__ double unary_d(ew op, double x) {
  switch (op) {
    case ew::neg: return -x;
    case ew::abs: return fabs(x);
    case ew::exp: return exp(x);
    case ew::log: return log(x);
    case ew::sqrt: return sqrt(x);
    case ew::rsqrt: return 1.0 / sqrt(x);
    case ew::recip: return 1.0 / x;
    case ew::tanh: return tanh(x);
    case ew::erf: return erf(x);
    case ew::sigmoid: return 1.0 / (1.0 + exp(-x));
    case ew::silu: return x / (1.0 + exp(-x));
    case ew::gelu_tanh: return gelu_tanh_d(x);
    default: return x;
  }
}

__global__ void unary_f32_kernel(ew op, const float* x, std::int64_t n, float* y) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = unary_f(op, x[i]);
}

__global__ void binary_f32_kernel(ew op, const float* a, const float* b, std::int64_t n, std::int64_t b_len, float* y) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = binary_f(op, a[i], b[b_len == n ? i : i % b_len]);
}

__global__ void gated_f32_kernel(ew act, const float* g, const float* u, std::int64_t n, float* y) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = unary_f(act, g[i]) * u[i];
}

__global__ void elementwise_nd_kernel(ew op, dtype in, dtype out, const void* a, const void* b, const void* c, nd_map m,
                                      void* y, std::int64_t n, step_flag* flag, std::int32_t eqn) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t off[3] = {m.base[0], m.base[1], m.base[2]};
    std::int64_t rest = j;
    for (int d = m.rank - 1; d >= 0; --d) {
      const std::int64_t i = rest % m.dims[d];
      rest /= m.dims[d];
      off[0] += i * m.strides[0][d];
      off[1] += i * m.strides[1][d];
      off[2] += i * m.strides[2][d];
    }
    double r = 0;
    if (op == ew::where) {
      r = static_cast<const std::uint8_t*>(a)[off[0]] != 0 ? load_any(in, b, off[1]) : load_any(in, c, off[2]);
    } else if (op == ew::cast || op <= ew::gelu_tanh) {
      const double x = load_any(in, a, off[0]);
      r = op == ew::cast ? x : unary_d(op, x);
    } else {
      const double x = load_any(in, a, off[0]), z = load_any(in, b, off[1]);
      const bool integer = in != dtype::f32;
      switch (op) {
        case ew::add: r = x + z; break;
        case ew::sub: r = x - z; break;
        case ew::mul: r = x * z; break;
        case ew::div:
          if (integer) {
            if (z == 0) {
              raise_flag(flag, flag_div_zero, eqn, static_cast<std::int64_t>(x), 0);
              r = 0;
            } else {
              r = trunc(x / z);
            }
          } else {
            r = x / z;
          }
          break;
        case ew::maximum: r = isnan(x) || isnan(z) ? NAN : (x < z ? z : x); break;
        case ew::minimum: r = isnan(x) || isnan(z) ? NAN : (z < x ? z : x); break;
        case ew::pow: r = pow(x, z); break;
        case ew::equal: r = x == z; break;
        case ew::less: r = x < z; break;
        case ew::less_equal: r = x <= z; break;
        case ew::greater: r = x > z; break;
        default: break;
      }
      // f32 arithmetic rounds each result to f32, as the CPU target's float path does.
      if (!integer && op <= ew::pow) r = static_cast<float>(r);
    }
    store_any(out, y, j, r);
  }
}

// Block reduction helpers (blockDim.x == threads).
template <class T, class F>
__device__ T block_reduce(T v, F f, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = f(r, shared[w]);
  return r;
}

// softmax / log_softmax over f32 rows (inner == 1): a block per row.
__global__ void softmax_rows_kernel(const float* x, std::int64_t len, bool log_out, float* y) {
  __shared__ float red[threads / 32];
  __shared__ double redd[threads / 32];
  const float* row = x + blockIdx.x * len;
  float* out = y + blockIdx.x * len;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce(m, [](float a, float b) { return fmaxf(a, b); }, red);
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < len; j += blockDim.x) s += exp(static_cast<double>(row[j]) - m);
  s = block_reduce(s, [](double a, double b) { return a + b; }, redd);
  const double ls = log(s);
  for (std::int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double d = static_cast<double>(row[j]) - m;
    out[j] = static_cast<float>(log_out ? d - ls : exp(d) / s);
  }
}

// Any reduction: a thread per (outer, inner) pair, in double, as the oracle.
__global__ void reduce_kernel(ew kind, dtype in, dtype out, const void* x, std::int64_t outer, std::int64_t len,
                              std::int64_t inner, void* y) {
  const std::int64_t n = outer * inner;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = q / inner, k = q % inner;
    auto at = [&](std::int64_t j) { return load_any(in, x, (p * len + j) * inner + k); };
    if (kind == ew::exp || kind == ew::log) {
      double m = -INFINITY, s = 0;
      for (std::int64_t j = 0; j < len; ++j) m = fmax(m, at(j));
      for (std::int64_t j = 0; j < len; ++j) s += exp(at(j) - m);
      for (std::int64_t j = 0; j < len; ++j)
        store_any(out, y, (p * len + j) * inner + k, kind == ew::log ? at(j) - m - log(s) : exp(at(j) - m) / s);
      continue;
    }
    double r = kind == ew::maximum ? at(0) : 0;
    std::int64_t best = 0;
    for (std::int64_t j = 0; j < len; ++j) {
      const double v = at(j);
      if (kind == ew::add || kind == ew::div) r += v;
      else if (kind == ew::maximum) r = isnan(r) || isnan(v) ? NAN : fmax(r, v);
      else if (j > 0 && !isnan(at(best)) && (isnan(v) || v > at(best))) best = j;
    }
    if (kind == ew::div) r /= static_cast<double>(len);
    if (kind == ew::greater) r = static_cast<double>(best);
    store_any(out, y, p * inner + k, r);
  }
}

__global__ void copy_nd_kernel(std::int32_t es, const unsigned char* x, nd_map m, unsigned char* y, std::int64_t n) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t off = m.base[0], rest = j;
    for (int d = m.rank - 1; d >= 0; --d) {
      off += (rest % m.dims[d]) * m.strides[0][d];
      rest /= m.dims[d];
    }
    for (int b = 0; b < es; ++b) y[j * es + b] = x[off * es + b];
  }
}

__global__ void matmul_f32_kernel(const float* a, const float* b, std::int64_t B, std::int64_t M, std::int64_t K,
                                  std::int64_t N, float* y) {
  const std::int64_t n = B * M * N;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t z = q / (M * N), r = (q / N) % M, c = q % N;
    float s = 0;
    for (std::int64_t k = 0; k < K; ++k) s += a[(z * M + r) * K + k] * b[(z * K + k) * N + c];
    y[q] = s;
  }
}

__global__ void check_ids_kernel(dtype t, const void* ids, std::int64_t count, std::int64_t rows, std::int32_t* ids32,
                                 step_flag* flag, std::int32_t eqn) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < count;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t id = t == dtype::i64 ? static_cast<const std::int64_t*>(ids)[j] : static_cast<const std::int32_t*>(ids)[j];
    if (id < 0 || id >= rows) {
      raise_flag(flag, flag_gather_range, eqn, id, rows);
      ids32[j] = 0;
    } else {
      ids32[j] = static_cast<std::int32_t>(id);
    }
  }
}

__global__ void gather_bytes_kernel(const unsigned char* table, std::int64_t row_bytes, const std::int32_t* ids32,
                                    std::int64_t count, unsigned char* y) {
  const std::int64_t n = count * row_bytes;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = q / row_bytes, b = q % row_bytes;
    y[q] = table[ids32[j] * row_bytes + b];
  }
}

__device__ std::int64_t id_at(dtype t, const void* ids, std::int64_t j) {
  return t == dtype::i64 ? static_cast<const std::int64_t*>(ids)[j] : static_cast<const std::int32_t*>(ids)[j];
}

// One block checks every id of a scatter before any row is written: range, then distinctness.
__global__ void scatter_check_kernel(dtype t, const void* ids, std::int64_t count, std::int64_t rows, step_flag* flag,
                                     std::int32_t eqn) {
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t id = id_at(t, ids, j);
    if (id < 0) continue;
    if (id >= rows) {
      raise_flag(flag, flag_scatter_range, eqn, id, rows);
      continue;
    }
    for (std::int64_t i = 0; i < j; ++i)
      if (id_at(t, ids, i) == id) {
        raise_flag(flag, flag_scatter_twice, eqn, id, rows);
        break;
      }
  }
}

__global__ void scatter_kernel(dtype t, const void* ids, std::int64_t count, std::int64_t row_bytes, const unsigned char* src,
                               unsigned char* dst, const step_flag* flag) {
  if (*reinterpret_cast<const volatile std::int32_t*>(&flag->code) != 0) return;  // a refused step writes no state
  const std::int64_t n = count * row_bytes;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = q / row_bytes, b = q % row_bytes;
    const std::int64_t id = id_at(t, ids, j);
    if (id >= 0) dst[id * row_bytes + b] = src[q];
  }
}

__global__ void commit_kernel(const unsigned char* src, std::int64_t bytes, unsigned char* dst, const step_flag* flag) {
  if (*reinterpret_cast<const volatile std::int32_t*>(&flag->code) != 0) return;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < bytes;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[q] = src[q];
}

// rms_norm / layer_norm: a block per row; sums in double.
__global__ void norm_kernel(const float* x, const float* w, const float* b, std::int64_t n, float eps, float* y) {
  __shared__ double red[threads / 32];
  const float* row = x + blockIdx.x * n;
  float* out = y + blockIdx.x * n;
  double mean = 0;
  if (b) {
    double s = 0;
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
    mean = block_reduce(s, [](double p, double q) { return p + q; }, red) / static_cast<double>(n);
  }
  double ss = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double d = row[j] - mean;
    ss += d * d;
  }
  ss = block_reduce(ss, [](double p, double q) { return p + q; }, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = (row[j] - static_cast<float>(mean)) * inv * w[j];
    out[j] = b ? v + b[j] : v;
  }
}

// rope in place: a thread per (token, head, pair); the angle in double as the CPU target.
__global__ void rope_kernel(float* x, std::int64_t T, std::int64_t H, std::int64_t D, dtype pt, const void* pos,
                            const float* inv, std::int64_t half, bool neox, float scale) {
  const std::int64_t n = T * H * half;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = q / (H * half), h = (q / half) % H, i = q % half;
    const std::int64_t p = pt == dtype::i64 ? static_cast<const std::int64_t*>(pos)[t] : static_cast<const std::int32_t*>(pos)[t];
    double sn, cs;
    sincos(static_cast<double>(static_cast<std::int32_t>(p)) * static_cast<double>(inv[i]), &sn, &cs);
    const float c = static_cast<float>(cs) * scale, s = static_cast<float>(sn) * scale;
    float* head = x + (t * H + h) * D;
    const std::int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const float a = head[i0], b2 = head[i1];
    head[i0] = a * c - b2 * s;
    head[i1] = a * s + b2 * c;
  }
}

__global__ void kv_check_kernel(dtype t, const void* index, const std::uint8_t* allow, std::int64_t R, std::int64_t T,
                                std::int64_t C, std::int64_t S, std::int32_t* ix32, step_flag* flag, std::int32_t eqn) {
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < R * C;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = q / C, c = q % C;
    bool used = false;
    for (std::int64_t tt = 0; tt < T && !used; ++tt) used = allow[(r * T + tt) * C + c] != 0;
    const std::int64_t v = id_at(t, index, q);
    if (used && (v < 0 || v >= S)) raise_flag(flag, flag_kv_range, eqn, v, S);
    ix32[q] = used && v >= 0 && v < S ? static_cast<std::int32_t>(v) : 0;
  }
}

// Flash-style attention. Block (query tile, head, row): one warp per query of the tile; K and V rows of
// a tile of keys are staged in shared memory once for all the tile's queries; each warp keeps its
// query's running max, sum and output (lane l owns output dims l, l + 32, ...).
constexpr int attn_warps = 4;
constexpr int max_dims_per_lane = static_cast<int>(max_attention_dim / 32);

__global__ void attention_kernel(attention_launch a, int keys_per_tile) {
  extern __shared__ float smem[];
  // K rows padded by one float: lane j reads row j at the same d, and an unpadded row of D (a multiple
  // of 32) floats would put all 32 lanes in one bank.
  const std::int64_t kstride = a.D + 1;
  float* ks = smem;                                   // [tile, D + 1]
  float* vs = ks + keys_per_tile * kstride;           // [tile, Dv]
  float* qs = vs + keys_per_tile * a.Dv;              // [warps, D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t h = blockIdx.y, r = blockIdx.z;
  // Split decode: block x is the key range (T = 1, one warp); otherwise the query tile.
  const int split = a.splits > 1 ? static_cast<int>(blockIdx.x) : 0;
  const std::int64_t t = (a.splits > 1 ? 0 : static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32)) + warp;
  const std::int64_t span = (a.C + a.splits - 1) / a.splits;
  const std::int64_t c_begin = split * span < a.C ? split * span : a.C;
  const std::int64_t c_end = c_begin + span < a.C ? c_begin + span : a.C;
  const bool live = t < a.T;
  const std::int64_t kvh = h / (a.Hq / a.Hkv);
  const std::int64_t n = r * a.T + t;
  float* qw = qs + warp * a.D;
  if (live)
    for (std::int64_t d = lane; d < a.D; d += 32) qw[d] = a.q[(n * a.Hq + h) * a.D + d];
  float m = -INFINITY, l = 0.0f;
  float acc[max_dims_per_lane];
  for (int i = 0; i < max_dims_per_lane; ++i) acc[i] = 0.0f;
  const std::uint8_t* allow_row = a.allow + (r * a.T + (live ? t : 0)) * a.C;
  for (std::int64_t c0 = c_begin; c0 < c_end; c0 += keys_per_tile) {
    const int tile = static_cast<int>(c_end - c0 < keys_per_tile ? c_end - c0 : keys_per_tile);
    __syncthreads();
    for (std::int64_t e = threadIdx.x; e < static_cast<std::int64_t>(tile) * a.D; e += blockDim.x) {
      const std::int64_t j = e / a.D, d = e % a.D;
      ks[j * kstride + d] = quant::kv_element(a.k, a.kv_type, (static_cast<std::int64_t>(a.ix32[r * a.C + c0 + j]) * a.Hkv + kvh) * a.D + d);
    }
    for (std::int64_t e = threadIdx.x; e < static_cast<std::int64_t>(tile) * a.Dv; e += blockDim.x) {
      const std::int64_t j = e / a.Dv, d = e % a.Dv;
      vs[e] = quant::kv_element(a.v, a.kv_type, (static_cast<std::int64_t>(a.ix32[r * a.C + c0 + j]) * a.Hkv + kvh) * (a.Vw > 0 ? a.Vw : a.Dv) + d);
    }
    __syncthreads();
    if (!live) continue;
    // Lane j scores key c0 + j (keys_per_tile <= 32).
    float s = -INFINITY;
    if (lane < tile && allow_row[c0 + lane]) {
      float dot = 0.0f;
      for (std::int64_t d = 0; d < a.D; ++d) dot += qw[d] * ks[lane * kstride + d];
      s = dot * a.scale;
      if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
      if (a.alibi_slopes != nullptr) s += a.alibi_slopes[h] * a.alibi_dist[n * a.C + c0 + lane];
    }
    float tmax = s;
    for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
    const float m_new = fmaxf(m, tmax);
    if (m_new == -INFINITY) continue;  // nothing allowed yet
    const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    float psum = p;
    for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
    l = l * alpha + psum;
    for (int i = 0; i < max_dims_per_lane; ++i) acc[i] *= alpha;
    for (int j = 0; j < tile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj == 0.0f) continue;
      for (int i = 0; i < max_dims_per_lane; ++i) {
        const std::int64_t d = lane + 32 * i;
        if (d < a.Dv) acc[i] += pj * vs[j * a.Dv + d];
      }
    }
    m = m_new;
  }
  if (!live) return;
  if (a.splits > 1) {  // this range's partial state, merged by attention_merge_kernel
    float* p = a.part + ((r * a.Hq + h) * a.splits + split) * (a.Dv + 2);
    if (lane == 0) p[0] = m, p[1] = l;
    for (int i = 0; i < max_dims_per_lane; ++i) {
      const std::int64_t d = lane + 32 * i;
      if (d < a.Dv) p[2 + d] = acc[i];
    }
    return;
  }
  const float f = a.sinks != nullptr ? sink_factor(m, l, a.sinks[h]) : 0.0f;
  for (int i = 0; i < max_dims_per_lane; ++i) {
    const std::int64_t d = lane + 32 * i;
    if (d < a.Dv) a.out[(n * a.Hq + h) * a.Dv + d] = a.sinks != nullptr ? acc[i] * f : l > 0.0f ? acc[i] / l : 0.0f;
  }
}

// The merge of split decode attention: a block per (head, row), threads over the value dims.
__global__ void attention_merge_kernel(attention_launch a) {
  const std::int64_t h = blockIdx.y, r = blockIdx.z;
  const float* p = a.part + (r * a.Hq + h) * a.splits * (a.Dv + 2);
  float M = 0.0f;
  const float inv = merge_splits_norm(p, a.splits, a.Dv + 2, a.sinks != nullptr ? a.sinks + h : nullptr, M);
  for (std::int64_t d = threadIdx.x; d < a.Dv; d += blockDim.x)
    a.out[(r * a.Hq + h) * a.Dv + d] = inv > 0.0f ? merge_splits_value(p, a.splits, a.Dv + 2, M, d) * inv : 0.0f;
}

__global__ void quantize_q8_0_kernel(const float* x, std::int64_t blocks, std::uint8_t* y) {
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    quant::quantize_block_q8_0(x + b * 32, y + b * 34);
}

// ---- mixture-of-experts routing ----

__global__ void top_k_kernel(const float* x, std::int64_t rows, std::int64_t E, std::int64_t k, std::int32_t* out) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    top_k_row(x + r * E, E, k, out + r * k);
}

__global__ void take_along_kernel(std::int32_t es, const unsigned char* x, std::int64_t rows, std::int64_t E, dtype it,
                                  const void* idx, std::int64_t k, unsigned char* out, step_flag* flag, std::int32_t eqn) {
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < rows * k;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = q / k;
    std::int64_t i = id_at(it, idx, q);
    if (i < 0 || i >= E) {
      raise_flag(flag, flag_take_range, eqn, i, E);
      i = 0;
    }
    const unsigned char* src = x + (r * E + i) * es;
    for (std::int32_t b = 0; b < es; ++b) out[q * es + b] = src[b];
  }
}

__global__ void expert_ids_kernel(dtype t, const void* ids, std::int64_t count, std::int64_t E, std::int32_t* ids32, step_flag* flag,
                                  std::int32_t eqn) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < count;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t id = id_at(t, ids, j);
    bool bad = false;
    ids32[j] = expert_of(id, E, bad);
    if (bad) raise_flag(flag, flag_expert_range, eqn, id, E);
  }
}

}  // namespace

void launch_unary_f32(ew op, const float* x, std::int64_t n, float* y, void* stream) {
  if (n > 0) unary_f32_kernel<<<blocks_for(n), threads, 0, S(stream)>>>(op, x, n, y);
}
void launch_binary_f32(ew op, const float* a, const float* b, std::int64_t n, std::int64_t b_len, float* y, void* stream) {
  if (n > 0) binary_f32_kernel<<<blocks_for(n), threads, 0, S(stream)>>>(op, a, b, n, b_len < 1 ? 1 : b_len, y);
}
void launch_gated_f32(ew act, const float* g, const float* u, std::int64_t n, float* y, void* stream) {
  if (n > 0) gated_f32_kernel<<<blocks_for(n), threads, 0, S(stream)>>>(act, g, u, n, y);
}
void launch_elementwise_nd(ew op, dtype in, dtype out, const void* a, const void* b, const void* c, const nd_map& map,
                           void* y, step_flag* flag, std::int32_t eqn, void* stream) {
  std::int64_t n = 1;
  for (int d = 0; d < map.rank; ++d) n *= map.dims[d];
  if (n > 0) elementwise_nd_kernel<<<blocks_for(n), threads, 0, S(stream)>>>(op, in, out, a, b, c, map, y, n, flag, eqn);
}
void launch_reduce(ew kind, dtype in, dtype out, const void* x, std::int64_t outer, std::int64_t len, std::int64_t inner,
                   void* y, void* stream) {
  if (outer * inner <= 0 || len <= 0) return;
  if ((kind == ew::exp || kind == ew::log) && inner == 1 && in == dtype::f32 && out == dtype::f32 && outer <= 2147483647LL)
    softmax_rows_kernel<<<static_cast<unsigned>(outer), threads, 0, S(stream)>>>(static_cast<const float*>(x), len,
                                                                                    kind == ew::log, static_cast<float*>(y));
  else
    reduce_kernel<<<blocks_for(outer * inner), threads, 0, S(stream)>>>(kind, in, out, x, outer, len, inner, y);
}
void launch_copy_nd(std::int32_t es, const void* x, const nd_map& map, void* y, void* stream) {
  std::int64_t n = 1;
  for (int d = 0; d < map.rank; ++d) n *= map.dims[d];
  if (n > 0)
    copy_nd_kernel<<<blocks_for(n), threads, 0, S(stream)>>>(es, static_cast<const unsigned char*>(x), map,
                                                              static_cast<unsigned char*>(y), n);
}
void launch_matmul_f32(const float* a, const float* b, std::int64_t B, std::int64_t M, std::int64_t K, std::int64_t N,
                       float* y, void* stream) {
  if (B * M * N > 0) matmul_f32_kernel<<<blocks_for(B * M * N), threads, 0, S(stream)>>>(a, b, B, M, K, N, y);
}
void launch_check_ids(dtype t, const void* ids, std::int64_t count, std::int64_t rows, std::int32_t* ids32, step_flag* flag,
                      std::int32_t eqn, void* stream) {
  if (count > 0) check_ids_kernel<<<blocks_for(count), threads, 0, S(stream)>>>(t, ids, count, rows, ids32, flag, eqn);
}
void launch_gather_bytes(const void* table, std::int64_t row_bytes, const std::int32_t* ids32, std::int64_t count, void* y,
                         void* stream) {
  if (count * row_bytes > 0 && table != nullptr)
    gather_bytes_kernel<<<blocks_for(count * row_bytes), threads, 0, S(stream)>>>(
        static_cast<const unsigned char*>(table), row_bytes, ids32, count, static_cast<unsigned char*>(y));
}
void launch_scatter_rows(dtype t, const void* ids, std::int64_t count, std::int64_t rows, std::int64_t row_bytes,
                         const void* src, void* dst, step_flag* flag, std::int32_t eqn, void* stream) {
  if (count <= 0) return;
  scatter_check_kernel<<<1, 1024, 0, S(stream)>>>(t, ids, count, rows, flag, eqn);
  if (row_bytes > 0)
    scatter_kernel<<<blocks_for(count * row_bytes), threads, 0, S(stream)>>>(
        t, ids, count, row_bytes, static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst), flag);
}
void launch_commit(const void* src, std::int64_t bytes, void* dst, const step_flag* flag, void* stream) {
  if (bytes > 0)
    commit_kernel<<<blocks_for(bytes), threads, 0, S(stream)>>>(static_cast<const unsigned char*>(src), bytes,
                                                                 static_cast<unsigned char*>(dst), flag);
}
void launch_norm(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps, float* y,
                 void* stream) {
  if (rows > 0 && n > 0) norm_kernel<<<static_cast<unsigned>(rows), threads, 0, S(stream)>>>(x, w, b, n, eps, y);
}
void launch_rope(float* x, std::int64_t T, std::int64_t H, std::int64_t D, dtype pt, const void* pos, const float* inv_freq,
                 std::int64_t half, bool neox, float scale, void* stream) {
  if (T * H * half > 0)
    rope_kernel<<<blocks_for(T * H * half), threads, 0, S(stream)>>>(x, T, H, D, pt, pos, inv_freq, half, neox, scale);
}
void launch_attention(const attention_launch& a, step_flag* flag, std::int32_t eqn, void* stream) {
  if (a.R * a.C > 0)
    kv_check_kernel<<<blocks_for(a.R * a.C), threads, 0, S(stream)>>>(a.index_type, a.index, a.allow, a.R, a.T, a.C, a.S,
                                                                      a.ix32, flag, eqn);
  if (a.R * a.T * a.Hq <= 0) return;
  if (a.S == 0) {  // no key row exists: every allowed index was refused above, and a query reads nothing
    cudaMemsetAsync(a.out, 0, static_cast<std::size_t>(a.R * a.T * a.Hq * a.Dv) * sizeof(float), S(stream));
    return;
  }
  const int warps = a.T < attn_warps ? static_cast<int>(a.T) : attn_warps;
  const int tile = a.D + a.Dv > 256 ? 16 : 32;
  const std::size_t smem = (static_cast<std::size_t>(tile) * (a.D + 1 + a.Dv) + static_cast<std::size_t>(warps) * a.D) * sizeof(float);
  const bool split = a.splits > 1 && a.T == 1 && a.part != nullptr;
  attention_launch b = a;
  if (!split) b.splits = 1;
  const dim3 grid(static_cast<unsigned>(split ? a.splits : (a.T + warps - 1) / warps), static_cast<unsigned>(a.Hq), static_cast<unsigned>(a.R));
  attention_kernel<<<grid, warps * 32, smem, S(stream)>>>(b, tile);
  if (split) attention_merge_kernel<<<dim3(1, static_cast<unsigned>(a.Hq), static_cast<unsigned>(a.R)), 128, 0, S(stream)>>>(b);
}

void launch_quantize_q8_0(const float* x, std::int64_t blocks, void* y, void* stream) {
  if (blocks > 0) quantize_q8_0_kernel<<<blocks_for(blocks), threads, 0, S(stream)>>>(x, blocks, static_cast<std::uint8_t*>(y));
}

void launch_top_k(const float* x, std::int64_t rows, std::int64_t E, std::int64_t k, std::int32_t* out, void* stream) {
  if (rows > 0 && k > 0) top_k_kernel<<<blocks_for(rows, 128), 128, 0, S(stream)>>>(x, rows, E, k, out);
}
void launch_take_along(std::int32_t es, const void* x, std::int64_t rows, std::int64_t E, dtype idx_type, const void* idx,
                       std::int64_t k, void* out, step_flag* flag, std::int32_t eqn, void* stream) {
  if (rows * k > 0)
    take_along_kernel<<<blocks_for(rows * k), threads, 0, S(stream)>>>(es, static_cast<const unsigned char*>(x), rows, E, idx_type, idx, k,
                                                                        static_cast<unsigned char*>(out), flag, eqn);
}
void launch_expert_ids(dtype t, const void* ids, std::int64_t count, std::int64_t E, std::int32_t* ids32, step_flag* flag,
                       std::int32_t eqn, void* stream) {
  if (count > 0) expert_ids_kernel<<<blocks_for(count), threads, 0, S(stream)>>>(t, ids, count, E, ids32, flag, eqn);
}

}  // namespace troupe::exec::cuda

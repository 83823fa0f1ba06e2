// Packed matrix products at the shapes of Qwen2.5-0.5B (hidden 896, ffn 4864, vocab 151936) on a pool
// of 2 threads, at the best isa level (TROUPE_CPU_ISA lowers it):
//  * decode (M = 1): GB/s of weight bytes read, and that as a fraction of the machine's read
//    bandwidth (memory_read_bandwidth: 2 threads over 1 GiB; each decode run pairs its passes with
//    read passes of the same size, `bw`, and reports the median ratio as of_bw). The weights rotate
//    through enough copies to exceed the last-level cache many times over, as a model's layers do in
//    decode.
//  * batched decode (M = 16): GFLOP/s (2 M N K per product), the weights rotating as in decode.
//  * prefill (M = 512): GFLOP/s (2 M N K per product).
// k-quants need K to be a multiple of 256, so they run at 896x4864 (the down projection) only.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/core/quant.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace {

using troupe::dtype;
namespace cpu = troupe::exec::cpu;

constexpr int threads = 2;
constexpr std::size_t rotate_bytes = std::size_t{384} << 20;  // > 10x a 32 MiB L3

cpu::thread_pool& pool() {
  static cpu::thread_pool p(threads);
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The read bandwidth two threads get, each summing its half of a 1 GiB buffer on huge pages (as the
// packed weights are): the median of `passes`. Measured at start and again after every decode run,
// since what a VM's memory delivers drifts with its neighbours.
struct read_buffer {
  static constexpr std::size_t bytes = std::size_t{1} << 30;
  std::byte* data = nullptr;
  read_buffer() {
    void* p = nullptr;
    if (posix_memalign(&p, std::size_t{2} << 20, bytes) != 0) std::abort();
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    // Distinct contents in every page: a hypervisor that merges identical pages would otherwise serve
    // the whole buffer from a few cached ones.
    auto* w = static_cast<std::uint64_t*>(p);
    for (std::size_t i = 0; i < bytes / 8; ++i) w[i] = i * 0x9e3779b97f4a7c15ull;
    data = static_cast<std::byte*>(p);
  }
  ~read_buffer() { std::free(data); }
};

#if defined(__x86_64__)
__attribute__((target("avx2"))) std::uint64_t sum_avx2(const std::byte* p, std::size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i < n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

std::uint64_t sum_portable(const std::byte* p, std::size_t n) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(p);
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (std::size_t i = 0; i < n / 8; i += 4) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

// Two threads each sum half of the first `bytes` of the buffer; the median rate of `passes`.
double measure_read_bandwidth(std::size_t bytes, int passes) {
  static const read_buffer buf;
  bytes = std::min(bytes, read_buffer::bytes) / (threads * 128) * (threads * 128);
  std::vector<double> rates;
  std::uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    std::uint64_t sums[threads * 8] = {};
    const auto t0 = std::chrono::steady_clock::now();
    pool().parallel_for(threads, [&](std::int64_t t, int) {
      const std::size_t n = bytes / threads;
      const std::byte* p = buf.data + static_cast<std::size_t>(t) * n;
#if defined(__x86_64__)
      sums[t * 8] = cpu::features().avx2 ? sum_avx2(p, n) : sum_portable(p, n);
#else
      sums[t * 8] = sum_portable(p, n);
#endif
    });
    rates.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
    for (auto s : sums) sink += s;
  }
  benchmark::DoNotOptimize(sink);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void memory_read_bandwidth(benchmark::State& st) {
  double gbs = 0;
  for (auto _ : st) {
    gbs = measure_read_bandwidth(read_buffer::bytes, 5);
    st.SetIterationTime(1.0);
  }
  st.counters["GB/s"] = gbs;
}

// The byte of a stored element or block that can change freely: the low byte of a float (mantissa
// bits only, below 0x80 for bf16) or the first code byte of a block.
std::size_t free_byte(dtype t) {
  switch (t) {
    case dtype::q8_0:
    case dtype::q4_0: return 2;
    case dtype::q4_k: return 16;
    default: return 0;
  }
}

// `copies` packed copies of one random [n, k] matrix in format t. Each copy changes two code bytes
// every 512, so no two copies share a page that a hypervisor could merge (identical copies read
// faster than memory can deliver).
std::vector<cpu::packed_matrix> make_weights(dtype t, std::int64_t n, std::int64_t k, int copies) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> src(static_cast<std::size_t>(n * k));
  for (auto& v : src) v = nd(rng);
  std::vector<std::byte> stored(*troupe::storage_bytes(t, static_cast<std::uint64_t>(n * k)));
  if (!troupe::quantize_row(t, src.data(), stored.data(), n * k)) std::abort();
  const std::size_t block = troupe::info(t).block_bytes;
  const troupe::tensor_view view(t, troupe::shape{n, k}, stored.data());
  std::vector<cpu::packed_matrix> out;
  // Copy c flips bits of one byte every 512 with (1 + c % 127) and of another 256 bytes on with
  // (1 + c / 127 % 127); flipping them again restores the original for the next copy.
  auto mark = [&](int c) {
    const auto lo = std::byte{static_cast<unsigned char>(1 + c % 127)};
    const auto hi = std::byte{static_cast<unsigned char>(1 + c / 127 % 127)};
    for (std::size_t pos = 0; pos < stored.size(); pos += 512) {
      stored[pos / block * block + free_byte(t)] ^= lo;
      if (pos + 256 < stored.size()) stored[(pos + 256) / block * block + free_byte(t)] ^= hi;
    }
  };
  for (int c = 0; c < copies; ++c) {
    mark(c);
    out.push_back(*cpu::packed_matrix::pack(view));
    mark(c);
  }
  return out;
}

// Decode figures. The memory a VM gets drifts (here between about 30 and 60 GB/s within seconds), so
// every pass over the copies is paired with a read-bandwidth pass over as many bytes right after it;
// of_bw is the median ratio of the pairs, and GB/s the bytes a product must read (the stored weights;
// packed ones are the same size or a few percent larger, see matmul_test) over the total time. A call
// reads `call_bytes`; `passes_every` calls make one pass over the copies.
template <class Call>
void decode_figures(benchmark::State& st, double call_bytes, std::int64_t passes_every, Call&& call) {
  std::int64_t in_pass = 0;
  double secs = 0;
  std::int64_t runs = 0;
  std::vector<double> ratios, bws;
  auto pass_start = std::chrono::steady_clock::now();
  for (auto _ : st) {
    call(runs);
    ++runs;
    if (++in_pass == passes_every) {
      const double pass = seconds_since(pass_start);
      secs += pass;
      st.PauseTiming();
      const double pass_bytes = call_bytes * static_cast<double>(passes_every);
      const double bw = measure_read_bandwidth(static_cast<std::size_t>(pass_bytes), 1);
      bws.push_back(bw);
      ratios.push_back(pass_bytes / pass / 1e9 / bw);
      st.ResumeTiming();
      in_pass = 0;
      pass_start = std::chrono::steady_clock::now();
    }
  }
  if (in_pass != 0) secs += seconds_since(pass_start);
  st.counters["GB/s"] = call_bytes * static_cast<double>(runs) / secs / 1e9;
  st.counters["bw"] = median(bws);
  st.counters["of_bw"] = median(ratios);
}

void matmul_run(benchmark::State& st, dtype t, std::int64_t n, std::int64_t k, std::int64_t M, bool cached) {
  const std::size_t one = *troupe::storage_bytes(t, static_cast<std::uint64_t>(n * k));
  // Decode shapes (M = 1, and the batched decode of M = 16) stream their weights from memory, unless
  // the case is a small model's, whose weights stay in the caches between steps.
  const bool streams = M <= 16 && !cached;
  const int copies = streams ? static_cast<int>(std::max<std::size_t>(2, rotate_bytes / one)) : 1;
  const auto w = make_weights(t, n, k, copies);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(M * k));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<std::size_t>(M * n));
  const cpu::isa level = cpu::best_isa();
  cpu::matmul(w[0], x.data(), k, M, y.data(), n, pool(), level);

  st.SetLabel(std::string(cpu::isa_name(level)));
  if (M > 1 || cached) {
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t runs = 0;
    std::size_t next = 0;
    for (auto _ : st) {
      cpu::matmul(w[next], x.data(), k, M, y.data(), n, pool(), level);
      ++runs;
      if (++next == w.size()) next = 0;
    }
    const double secs = seconds_since(t0);
    benchmark::DoNotOptimize(y.data());
    st.counters["GFLOP/s"] = 2.0 * static_cast<double>(M * n * k) * static_cast<double>(runs) / secs / 1e9;
    return;
  }
  decode_figures(st, static_cast<double>(one), static_cast<std::int64_t>(w.size()), [&](std::int64_t run) {
    cpu::matmul(w[static_cast<std::size_t>(run) % w.size()], x.data(), k, M, y.data(), n, pool(), level);
  });
  benchmark::DoNotOptimize(y.data());
}

// A routed decode step's expert products: `experts` matrices of [n, k], each its own allocation, in one
// matmul_batch against one activation row (as the CPU executor's linear_id runs a token's selected
// experts). Small products are where a call's fixed costs (dispatch, the first misses of each task's
// stream) weigh against the bytes.
void experts_run(benchmark::State& st, dtype t, std::int64_t experts, std::int64_t n, std::int64_t k) {
  const std::size_t one = *troupe::storage_bytes(t, static_cast<std::uint64_t>(n * k));
  const int copies = static_cast<int>(std::max<std::size_t>(static_cast<std::size_t>(2 * experts), rotate_bytes / one)) /
                     static_cast<int>(experts) * static_cast<int>(experts);
  const auto w = make_weights(t, n, k, copies);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(k));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<std::size_t>(experts * n));
  const cpu::isa level = cpu::best_isa();
  std::vector<cpu::matmul_job> jobs(static_cast<std::size_t>(experts));
  auto batch = [&](std::size_t first) {
    for (std::int64_t e = 0; e < experts; ++e)
      jobs[static_cast<std::size_t>(e)] = {&w[first + static_cast<std::size_t>(e)], x.data(), k, 1, y.data() + e * n, n};
    cpu::matmul_batch(jobs, pool(), level);
  };
  batch(0);
  st.SetLabel(std::string(cpu::isa_name(level)));
  const auto batches = static_cast<std::int64_t>(w.size()) / experts;
  decode_figures(st, static_cast<double>(one) * static_cast<double>(experts), batches,
                 [&](std::int64_t run) { batch(static_cast<std::size_t>(run % batches * experts)); });
  benchmark::DoNotOptimize(y.data());
}

struct shape_case {
  const char* name;
  std::int64_t n, k;
};
constexpr shape_case shapes[] = {
    {"896x896", 896, 896},
    {"4864x896", 4864, 896},
    {"896x4864", 896, 4864},
    {"151936x896", 151936, 896},
    // SmolLM2-135M's projections (batched decode of a small model: dispatch and activation costs weigh
    // against little arithmetic).
    {"576x576", 576, 576},
    {"1536x576", 1536, 576},
    {"576x1536", 576, 1536},
    // A 1024-wide llama's (the speculative-decoding target of bench/results/speculative.md): rows of
    // x exactly 4 KiB apart, so a verify window's rows fall in the same L1 sets.
    {"2816x1024", 2816, 1024},
    {"1024x2816", 1024, 2816},
};

int register_all() {
  benchmark::RegisterBenchmark("memory_read_bandwidth", memory_read_bandwidth)->UseManualTime()->Iterations(1);
  const dtype formats[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k};
  for (const std::int64_t M : {1, 5, 16, 512}) {  // 5: a verify window of 4 drafts
    for (const dtype t : formats) {
      for (const auto& s : shapes) {
        if (s.k % static_cast<std::int64_t>(troupe::info(t).block_elems) != 0) continue;
        if (M > 16 && s.n > 10000) continue;  // the LM head runs for one position in prefill
        const std::string label = "matmul/" + std::string(troupe::name(t)) + "/" + s.name + "/M=" + std::to_string(M);
        benchmark::RegisterBenchmark(label.c_str(), matmul_run, t, s.n, s.k, M, false)
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(M == 1 ? 0.5 : 1.0);
      }
    }
  }
  // troupe-kjv's products (hidden 256, ffn 768, f16), its weights cache-resident: decode (M = 1) against
  // the verify windows of 1 to 5 drafts, whose products are arithmetic-bound here.
  for (const std::int64_t M : {1, 2, 3, 4, 5, 6})
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{768, 256}, {256, 768}}) {
      const std::string label = "cached/f16/" + std::to_string(n) + "x" + std::to_string(k) + "/M=" + std::to_string(M);
      benchmark::RegisterBenchmark(label.c_str(), matmul_run, dtype::f16, n, k, M, true)->Unit(benchmark::kMicrosecond)->MinTime(0.3);
    }
  // A Qwen3-MoE-shaped decode step: 8 experts of width 512 over hidden 1024 (gate/up, then down).
  for (const dtype t : {dtype::f16, dtype::q8_0, dtype::q4_0})
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{512, 1024}, {1024, 512}}) {
      const std::string label = "experts/" + std::string(troupe::name(t)) + "/8x" + std::to_string(n) + "x" + std::to_string(k) + "/M=1";
      benchmark::RegisterBenchmark(label.c_str(), experts_run, t, std::int64_t{8}, n, k)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
    }
  return 0;
}

const int registered = register_all();

}  // namespace

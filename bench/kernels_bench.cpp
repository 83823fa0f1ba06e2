// Throughput of the CPU kernels besides matrix products, per isa level. Decode attention is reported
// as GB/s of K and V read (the bound it should meet), for a Qwen2.5-0.5B head layout: 14 query heads
// over 2 kv heads of dim 64. "cold" cycles through enough layers' caches to overflow the last-level
// cache, as a real decode step does; "hot" rereads one layer's. Arguments: keys, isa level (0 scalar,
// 1 avx2, 2 avx512), threads, and for attention whether the cache is paged (a shuffled row map).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/kernels.hpp"

namespace {

using namespace troupe::exec::cpu;

constexpr std::int64_t hq = 14, hkv = 2, head_dim = 64;

thread_pool& pool(int threads) {
  static std::map<int, std::unique_ptr<thread_pool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<thread_pool>(threads);
  return *p;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

bool level_or_skip(benchmark::State& st, std::int64_t arg, isa& level) {
  level = static_cast<isa>(arg);
  if (usable(level)) return true;
  st.SkipWithError("isa level not available on this CPU");
  return false;
}

// T > 1: a verify window of T tokens (attention_args::per_token), the last T positions of the C keys,
// each token computed as decode computes it.
void decode_attention(benchmark::State& st, bool cold, std::int64_t T, bool paged, kv_elem kv = kv_elem::f32) {
  const std::int64_t C = st.range(0);
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  const int threads = static_cast<int>(st.range(2));
  const std::int64_t row_floats = hkv * head_dim;
  const std::int64_t elem_bytes = kv == kv_elem::f16 ? 2 : 4;
  const std::int64_t layer_bytes = 2 * C * row_floats * elem_bytes;
  // 256 MiB of cache in all when cold: well past the last-level cache.
  const std::int64_t layers = cold ? std::max<std::int64_t>(2, (256LL << 20) / layer_bytes) : 1;
  const auto k = random_floats(static_cast<std::size_t>(layers * C * row_floats), 1);
  const auto v = random_floats(static_cast<std::size_t>(layers * C * row_floats), 2);
  const auto q = random_floats(static_cast<std::size_t>(T * hq * head_dim), 3);
  std::vector<std::uint16_t> k16, v16;  // the f16 cache (kv_elem::f16)
  if (kv == kv_elem::f16) {
    k16.resize(k.size());
    v16.resize(v.size());
    to_f16(k.data(), static_cast<std::int64_t>(k.size()), k16.data(), level);
    to_f16(v.data(), static_cast<std::int64_t>(v.size()), v16.data(), level);
  }
  std::vector<std::int32_t> index(static_cast<std::size_t>(C));
  std::iota(index.begin(), index.end(), 0);
  if (paged) std::shuffle(index.begin(), index.end(), std::mt19937(4));
  std::vector<std::uint8_t> allow(static_cast<std::size_t>(T * C), 1);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = C - T + t + 1; c < C; ++c) allow[static_cast<std::size_t>(t * C + c)] = 0;
  std::vector<float> out(static_cast<std::size_t>(T * hq * head_dim));
  attention_args a;
  a.q = q.data();
  a.index = index.data();
  a.allow = allow.data();
  a.out = out.data();
  a.R = 1, a.T = T, a.C = C, a.Hq = hq, a.Hkv = hkv, a.D = head_dim, a.Dv = head_dim;
  a.per_token = T > 1;
  a.scale = 0.125f;
  a.kv = kv;
  auto& p = pool(threads);
  std::int64_t layer = 0;
  for (auto _ : st) {
    if (kv == kv_elem::f16) {
      a.k = k16.data() + layer * C * row_floats;
      a.v = v16.data() + layer * C * row_floats;
    } else {
      a.k = k.data() + layer * C * row_floats;
      a.v = v.data() + layer * C * row_floats;
    }
    attention(a, p, level);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  st.counters["kv_GBps"] = benchmark::Counter(static_cast<double>(layer_bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void decode_attention_cold(benchmark::State& st) { decode_attention(st, true, 1, st.range(3) != 0); }
void decode_attention_hot(benchmark::State& st) { decode_attention(st, false, 1, st.range(3) != 0); }
// The same over an f16 cache (the default KV type), contiguous.
void decode_attention_f16_cold(benchmark::State& st) { decode_attention(st, true, 1, false, kv_elem::f16); }
void decode_attention_f16_hot(benchmark::State& st) { decode_attention(st, false, 1, false, kv_elem::f16); }
// A verify window of st.range(3) tokens over a cold contiguous cache (1: a decode token, for
// comparison; the window reads the keys once for all its tokens).
void verify_attention_cold(benchmark::State& st) { decode_attention(st, true, st.range(3), false); }

// Batched decode over short contexts, as 16 sequences decoding together do: R rows of one token each,
// SmolLM2-135M's heads (9 query heads over 3 kv heads of 64), an f16 cache of C slots paged in blocks
// of 16 (the rows' blocks interleaved), row r reading its first 32 + 4 r keys; each call reads the next
// of 64 layers' caches (about 75 MiB at 16 rows: past the last-level cache, as a step's 30 layers and
// its weights are). Reported as attention calls per second (one call: one layer of one step).
void batched_decode_attention(benchmark::State& st) {
  const std::int64_t R = st.range(0), C = 96, hq9 = 9, hkv3 = 3, layers = 64;
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  const int threads = static_cast<int>(st.range(2));
  const std::int64_t slots = R * C * layers;
  const auto kf = random_floats(static_cast<std::size_t>(slots * hkv3 * head_dim), 1);
  const auto vf = random_floats(static_cast<std::size_t>(slots * hkv3 * head_dim), 2);
  std::vector<std::uint16_t> k(kf.size()), v(vf.size());
  to_f16(kf.data(), static_cast<std::int64_t>(kf.size()), k.data(), level);
  to_f16(vf.data(), static_cast<std::int64_t>(vf.size()), v.data(), level);
  const auto q = random_floats(static_cast<std::size_t>(R * hq9 * head_dim), 3);
  std::vector<std::int32_t> index(static_cast<std::size_t>(R * C));
  std::vector<std::uint8_t> allow(static_cast<std::size_t>(R * C), 0);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      index[static_cast<std::size_t>(r * C + c)] = static_cast<std::int32_t>(((c / 16) * R + r) * 16 + c % 16);
      allow[static_cast<std::size_t>(r * C + c)] = c < 32 + 4 * r ? 1 : 0;
    }
  std::vector<float> out(static_cast<std::size_t>(R * hq9 * head_dim));
  attention_args a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.kv = kv_elem::f16;
  a.index = index.data();
  a.allow = allow.data();
  a.out = out.data();
  a.R = R, a.T = 1, a.C = C, a.Hq = hq9, a.Hkv = hkv3, a.D = head_dim, a.Dv = head_dim;
  a.scale = 0.125f;
  auto& p = pool(threads);
  std::int64_t layer = 0;
  const std::int64_t layer_halves = R * C * hkv3 * head_dim;
  for (auto _ : st) {
    a.k = k.data() + layer * layer_halves;
    a.v = v.data() + layer * layer_halves;
    attention(a, p, level);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  st.SetItemsProcessed(st.iterations());
}

// Causal prefill of T tokens from scratch, Qwen layout, the cache f32 or f16 (the fourth argument: 0,
// 1); GFLOP/s counts 4 D flops per (query head, allowed key): the score and the P.V product.
void prefill_attention(benchmark::State& st) {
  const std::int64_t T = st.range(0);
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  const int threads = static_cast<int>(st.range(2));
  const bool half = st.range(3) == 1;
  const auto q = random_floats(static_cast<std::size_t>(T * hq * head_dim), 1);
  const auto k = random_floats(static_cast<std::size_t>(T * hkv * head_dim), 2);
  const auto v = random_floats(static_cast<std::size_t>(T * hkv * head_dim), 3);
  std::vector<std::uint16_t> k16(half ? k.size() : 0), v16(half ? v.size() : 0);
  for (std::size_t i = 0; i < k16.size(); ++i) k16[i] = troupe::f32_to_f16(k[i]), v16[i] = troupe::f32_to_f16(v[i]);
  std::vector<std::int32_t> index(static_cast<std::size_t>(T));
  std::iota(index.begin(), index.end(), 0);
  std::vector<std::uint8_t> allow(static_cast<std::size_t>(T * T));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c <= t; ++c) allow[t * T + c] = 1;
  std::vector<float> out(static_cast<std::size_t>(T * hq * head_dim));
  attention_args a;
  a.q = q.data(), a.index = index.data(), a.allow = allow.data(), a.out = out.data();
  if (half) a.k = k16.data(), a.v = v16.data(), a.kv = kv_elem::f16;
  else a.k = k.data(), a.v = v.data();
  a.R = 1, a.T = T, a.C = T, a.Hq = hq, a.Hkv = hkv, a.D = head_dim, a.Dv = head_dim;
  a.scale = 0.125f;
  auto& p = pool(threads);
  for (auto _ : st) {
    attention(a, p, level);
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
  st.counters["GFLOPs"] = benchmark::Counter(pairs * hq * 4.0 * head_dim * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// rms_norm over rows of Qwen2.5-0.5B's width; GB/s of x read and y written.
void rms_norm_rows(benchmark::State& st) {
  const std::int64_t rows = st.range(0), n = 896;
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  const auto x = random_floats(static_cast<std::size_t>(rows * n), 1);
  const auto w = random_floats(static_cast<std::size_t>(n), 2);
  std::vector<float> y(x.size());
  for (auto _ : st) {
    rms_norm(x.data(), w.data(), rows, n, 1e-6f, y.data(), level);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GBps"] = benchmark::Counter(2.0 * rows * n * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// NeoX rope over T tokens of the 14 query heads; includes the per-token cos/sin table.
void rope_tokens(benchmark::State& st) {
  const std::int64_t T = st.range(0), half = head_dim / 2;
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  auto x = random_floats(static_cast<std::size_t>(T * hq * head_dim), 1);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(T));
  std::iota(pos.begin(), pos.end(), 1000);
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) inv[i] = std::pow(1000000.0f, -static_cast<float>(i) / half);
  for (auto _ : st) {
    rope(x.data(), T, hq, head_dim, pos.data(), inv.data(), half, true, 1.0f, level);
    benchmark::DoNotOptimize(x.data());
  }
  st.counters["GBps"] = benchmark::Counter(2.0 * T * hq * head_dim * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void silu_gated(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  isa level;
  if (!level_or_skip(st, st.range(1), level)) return;
  const auto g = random_floats(static_cast<std::size_t>(n), 1), u = random_floats(static_cast<std::size_t>(n), 2);
  std::vector<float> y(static_cast<std::size_t>(n));
  for (auto _ : st) {
    gated(unary_kind::silu, g.data(), u.data(), n, y.data(), level);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * n);
}

void levels_keys_threads(benchmark::internal::Benchmark* b) {
  for (const std::int64_t C : {512, 4096})
    for (const std::int64_t level : {0, 1, 2})
      for (const std::int64_t threads : {1, 2})
        for (const std::int64_t paged : {0, 1})
          if (level == 2 || (threads == 1 && paged == 0)) b->Args({C, level, threads, paged});
}

}  // namespace

BENCHMARK(decode_attention_cold)->Apply(levels_keys_threads)->UseRealTime();
BENCHMARK(decode_attention_hot)->Apply(levels_keys_threads)->UseRealTime();
BENCHMARK(decode_attention_f16_cold)->ArgsProduct({{512, 4096}, {1, 2}, {1, 2}})->UseRealTime();
BENCHMARK(decode_attention_f16_hot)->ArgsProduct({{512, 4096}, {1, 2}, {1, 2}})->UseRealTime();
BENCHMARK(verify_attention_cold)->ArgsProduct({{512, 4096, 16384}, {1, 2}, {2}, {1, 5}})->UseRealTime();
BENCHMARK(batched_decode_attention)->ArgsProduct({{16, 64}, {2}, {1, 2}})->UseRealTime();
BENCHMARK(prefill_attention)->ArgsProduct({{128, 512}, {1, 2}, {1, 2}, {0}})->UseRealTime();
BENCHMARK(prefill_attention)->ArgsProduct({{2048, 8192}, {1, 2}, {2}, {0, 1}})->UseRealTime();
BENCHMARK(rms_norm_rows)->ArgsProduct({{1, 512}, {0, 1, 2}});
BENCHMARK(rope_tokens)->ArgsProduct({{1, 512}, {0, 1, 2}});
BENCHMARK(silu_gated)->ArgsProduct({{4864}, {0, 1, 2}});

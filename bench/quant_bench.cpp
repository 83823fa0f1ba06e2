// Row (de)quantization throughput of the reference block codecs, in elements per second. These are
// the scalar reference paths the oracle and the fixture writers use, not the executors' kernels.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/core/quant.hpp"

namespace {

constexpr std::int64_t row = 4096;

std::vector<float> data() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(row);
  for (auto& v : x) v = nd(rng);
  return x;
}

void dequantize(benchmark::State& st, troupe::dtype t) {
  const auto x = data();
  std::vector<std::byte> q(*troupe::storage_bytes(t, row));
  if (troupe::supports_quantize(t)) (void)troupe::quantize_row(t, x.data(), q.data(), row);
  std::vector<float> y(row);
  for (auto _ : st) {
    (void)troupe::dequantize_row(t, q.data(), y.data(), row);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * row);
}

void quantize(benchmark::State& st, troupe::dtype t) {
  const auto x = data();
  std::vector<std::byte> q(*troupe::storage_bytes(t, row));
  for (auto _ : st) {
    (void)troupe::quantize_row(t, x.data(), q.data(), row);
    benchmark::DoNotOptimize(q.data());
  }
  st.SetItemsProcessed(st.iterations() * row);
}

}  // namespace

BENCHMARK_CAPTURE(dequantize, f16, troupe::dtype::f16);
BENCHMARK_CAPTURE(dequantize, bf16, troupe::dtype::bf16);
BENCHMARK_CAPTURE(dequantize, q8_0, troupe::dtype::q8_0);
BENCHMARK_CAPTURE(dequantize, q4_0, troupe::dtype::q4_0);
BENCHMARK_CAPTURE(dequantize, q4_k, troupe::dtype::q4_k);
BENCHMARK_CAPTURE(dequantize, q5_k, troupe::dtype::q5_k);
BENCHMARK_CAPTURE(dequantize, q6_k, troupe::dtype::q6_k);
BENCHMARK_CAPTURE(quantize, q8_0, troupe::dtype::q8_0);
BENCHMARK_CAPTURE(quantize, q4_0, troupe::dtype::q4_0);
BENCHMARK_CAPTURE(quantize, q4_k, troupe::dtype::q4_k);
BENCHMARK_CAPTURE(quantize, q6_k, troupe::dtype::q6_k);

#pragma once
// `troupe bench`: prefill and decode throughput of one model on an executor, medians over runs, and the
// machine's memory bandwidth with decode as a fraction of its bound.
#include <cstdint>
#include <string>

#include "apps/speculation_flags.hpp"

namespace troupe::app {

struct bench_options {
  std::string model;
  std::int64_t prompt_len = 512;
  std::int64_t gen = 128;
  std::int64_t batch = 1;
  int threads = 0;
  int runs = 3;
  bool json = false;
  bool actors = false;  // --batch N jobs through a one-process actor cluster vs the driver directly
  int tensor_parallel = 0;  // > 1: one sequence on 1 rank and on N in-process ranks (docs/tensor-parallel.md)
  int pipeline_parallel = 0;  // > 1: one sequence through the driver on 1 x 1 and on N x M ranks (cpu_replica)
  std::string backend = "cpu";  // cpu or cuda (single sequence and --batch N)
  int device = 0;
  // Speculative decoding: one sequence decoded with and without the policy, same prompt, same driver
  // options, both in this run: tokens/s of each, the speedup, the acceptance, and whether the tokens
  // are identical. `prompt` repetitive: a phrase of 8 tokens over and over; random: what the other
  // modes use.
  speculation_flags speculation;
  std::string prompt = "random";
  std::int64_t chain = 1;  // > 1: --batch sequences decoded with and without chains of this many steps
  std::string kv_type = "f16";  // the KV cache's element type: f32, f16, bf16 or q8_0 (model::with_kv_type)

};
int run_bench(const bench_options& opt);

// Read bandwidth of this machine in bytes per second, over `bytes` with `threads` threads.
double measure_read_bandwidth(std::size_t bytes, int threads);

}  // namespace troupe::app

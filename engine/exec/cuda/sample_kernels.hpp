#pragma once
// The sampling head on the device (rules of engine/exec/sampling.hpp): plain C++ declarations of what
// sample_kernels.cu launches, so the executor's host code needs no CUDA header. Pointers are device
// pointers; `stream` is a cudaStream_t.
#include <cstddef>
#include <cstdint>

namespace troupe::exec::cuda {

inline constexpr int max_device_top_logprobs = 20;

// One row's rules, in device memory.
struct device_sample_row {
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::int32_t top_k = 0;
  std::int32_t top_logprobs = 0;
  std::uint64_t seed = 0;
  std::uint64_t draw = 0;
  std::int32_t history = -1;  // the row's slot in the history table; -1: no history (no penalties, no bias)
  std::int32_t masked = 0;    // 1: the row's guided mask is at masks + row * mask_words
};

// The device-kept histories, one slot per open sequence, dense over the vocabulary.
struct device_history_table {
  std::int32_t* counts = nullptr;      // [slots, vocab] how often each token was drawn (output only)
  const std::uint8_t* prompt = nullptr;  // [slots, vocab] 1 where the prompt holds the token
  const float* bias = nullptr;         // [slots, vocab] the logit bias the sequence was opened with (0: none)
};

// What the host reads back per row.
struct device_sample_out {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::int32_t non_finite = 0;
  std::int32_t top_count = 0;
  std::int32_t top_tokens[max_device_top_logprobs] = {};
  float top_logprobs[max_device_top_logprobs] = {};
};

// Scratch the launch needs for `rows` rows of `vocab` logits.
std::size_t sample_work_bytes(int rows, std::int64_t vocab);

// Samples rows [0, rows) of `logits` ([rows, vocab], row r at logits + r * stride) on `stream` into
// out[r], and records each row's pick into its history slot's counts (so the next step's penalties
// see it without the host). Parameters were checked by the host (exec::check) before the launch.
void launch_sample(const float* logits, std::int64_t stride, std::int64_t vocab, int rows,
                   const device_sample_row* params, device_history_table hist, const std::uint32_t* masks,
                   std::int64_t mask_words, device_sample_out* out, void* work, void* stream);

}  // namespace troupe::exec::cuda

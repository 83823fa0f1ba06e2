#pragma once
// Rotary position embeddings: the inverse frequencies of each scaling rule (default, linear, dynamic
// NTK, YaRN, Llama 3, LongRoPE) and partial rotary dimensions. The result is a literal table the graph's
// `rope` op reads, plus the factor YaRN and LongRoPE apply to cos and sin.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::families {

// longrope: Phi-3's (HF "longrope", earlier "su"; llama.cpp's rope_factors_long / rope_factors_short
// tensors): a divisor per rotated pair, one set for sequences within the trained context and one past it.
enum class rope_kind : std::uint8_t { none, linear, dynamic, yarn, llama3, longrope };

struct rope_config {
  double theta = 10000.0;
  std::int64_t dims = 0;  // rotated dimensions per head (head_dim x partial rotary factor), even
  rope_kind kind = rope_kind::none;
  double factor = 1.0;
  std::int64_t original_max_positions = 0;  // dynamic, yarn, llama3, longrope
  double low_freq_factor = 1.0;             // llama3
  double high_freq_factor = 4.0;            // llama3
  double beta_fast = 32.0;                  // yarn
  double beta_slow = 1.0;                   // yarn
  double attention_factor = 0.0;            // yarn; 0 derives 0.1 ln(factor) + 1 (longrope: sqrt(1 + ln(factor) / ln(original)))
  // longrope: dims / 2 divisors each. The long set applies when the step's capacity (the longest sequence
  // it holds) is past original_max_positions, as llama.cpp chooses by its context size, so a sequence's
  // keys never mix the two; `factor` is the context's extension (max / original positions).
  std::vector<double> long_factor, short_factor;
};

struct rope_table {
  std::vector<float> inv_freq;  // dims / 2 entries
  double scale = 1.0;           // multiplies cos and sin
};

// `capacity` is the longest sequence the step can hold; dynamic NTK rescales its base for it.
rope_table make_rope_table(const rope_config& c, std::int64_t capacity);

}  // namespace troupe::families

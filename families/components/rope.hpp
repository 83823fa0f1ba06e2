#pragma once
// Rotary position embeddings: the inverse frequencies of each scaling rule (default, linear, dynamic
// NTK, YaRN, Llama 3) and partial rotary dimensions. The result is a literal table the graph's `rope`
// op reads, plus the factor YaRN applies to cos and sin.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::families {

enum class rope_kind : std::uint8_t { none, linear, dynamic, yarn, llama3 };

struct rope_config {
  double theta = 10000.0;
  std::int64_t dims = 0;  // rotated dimensions per head (head_dim x partial rotary factor), even
  rope_kind kind = rope_kind::none;
  double factor = 1.0;
  std::int64_t original_max_positions = 0;  // dynamic, yarn, llama3
  double low_freq_factor = 1.0;             // llama3
  double high_freq_factor = 4.0;            // llama3
  double beta_fast = 32.0;                  // yarn
  double beta_slow = 1.0;                   // yarn
  double attention_factor = 0.0;            // yarn; 0 derives 0.1 ln(factor) + 1
};

struct rope_table {
  std::vector<float> inv_freq;  // dims / 2 entries
  double scale = 1.0;           // multiplies cos and sin
};

// `capacity` is the longest sequence the step can hold; dynamic NTK rescales its base for it.
rope_table make_rope_table(const rope_config& c, std::int64_t capacity);

}  // namespace troupe::families

#pragma once
// The sampling head (Head::Sample) of a step, run by the executor over the logits rows it produced, so
// the host reads back a token id, a non-finite flag and, when asked, a logprob record, never the
// logits. This is the host implementation every executor may use on its own buffers (the CPU executor
// does; a device backend runs the same rules on the device). Each rule's meaning:
//
//  1. logit bias: logits[t] += bias[t] for every (t, bias) the sequence was opened with.
//  2. repetition penalty r (1 = off; HF / vLLM meaning): for every token seen in the prompt or the
//     output so far, a logit l becomes l / r when l > 0 and l * r otherwise.
//  3. frequency f and presence p penalties (OpenAI meaning, output tokens only):
//     l -= f * count(t) + p * (count(t) > 0).
//  4. guided mask: a token whose bit is clear in the row's mask becomes -inf.
//  5. temperature T: greedy when T == 0 (the first maximum, lowest id on ties); otherwise l /= T.
//     The logprobs reported are log_softmax of the logits after steps 1-5 (the adjusted distribution;
//     at T == 0 no scaling): the pick's and the top-n's, highest first, lowest id on ties.
//  6. truncation (sampled rows only): top-k keeps the k highest (0 = off), then top-p keeps the
//     smallest prefix of the descending order whose mass, renormalised over what top-k kept, reaches
//     p (1 = off; always at least one), then min-p drops tokens whose probability is below
//     min_p x the highest (0 = off).
//  7. the draw: one uniform u in [0, 1) from a counter-based generator keyed by (seed, draw index) and
//     nothing else, so a row's draws do not depend on the batch it shares or the rows beside it; the
//     pick is the first token, in descending probability order (lowest id on ties), whose cumulative
//     renormalised mass exceeds u.
// A row whose logits hold a NaN or +-inf (before the rules) is flagged non_finite; its pick is still
// made over the finite values, or is token 0 (logprob -inf, no top entries) when no finite, allowed
// token is left. Rules 1-3 saturate at +-FLT_MAX instead of overflowing, so only a non-finite logit
// or the mask removes a token. Sampled rows compute the softmax and the cumulative masses in double
// (exponentials within 2 ulp); greedy rows need only the float logprobs (float exponentials summed in
// double). Should rounding leave u x mass past the last cumulative sum, the pick is the last kept
// token with non-zero probability.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe::exec {

struct sample_params {
  float temperature = 0.0f;  // 0: greedy
  std::int32_t top_k = 0;    // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::int32_t top_logprobs = 0;  // how many top alternatives to report (0: none)
  std::uint64_t seed = 0;
};

enum class sample_error_code : std::uint8_t {
  bad_parameter,   // temperature < 0 or not finite, top_p outside (0, 1], min_p outside [0, 1], top_k < 0,
                   // repetition_penalty <= 0, top_logprobs < 0 or > max_top_logprobs, non-finite penalty
  bad_history,     // a history whose vocabulary differs from the logits row, a prompt or bias id outside
                   // it, a non-finite bias, a vocabulary outside [1, 2^31 - 1], an empty logits row
  bad_mask,        // a mask of the wrong length, or one that allows no token
};
std::string_view name(sample_error_code c);

struct sample_error {
  sample_error_code code;
  std::string reason;
  std::string message() const;
};

inline constexpr std::int32_t max_top_logprobs = 20;

// Checks parameters without sampling (admission uses it before a request takes a slot).
result<void, sample_error> check(const sample_params& p);

// What the head keeps per sequence: which tokens the prompt holds, how often each was drawn since,
// and the logit bias the sequence was opened with. Seeded once by the host when a sequence opens;
// updated by `record` with each token the head draws (or the host commits).
class token_history {
 public:
  token_history() = default;
  // `vocab` rows of logits; prompt ids and bias ids must lie in [0, vocab).
  static result<token_history, sample_error> create(std::int64_t vocab, std::span<const std::int32_t> prompt,
                                                    std::span<const std::pair<std::int32_t, float>> bias = {});
  std::int64_t vocab() const { return vocab_; }
  void record(std::int32_t token);  // ids outside the vocabulary are ignored
  std::int32_t count(std::int32_t token) const;
  bool in_prompt(std::int32_t token) const;
  // Every token seen in the prompt or the output, ascending, without repeats.
  const std::vector<std::int32_t>& seen() const { return seen_; }
  const std::vector<std::pair<std::int32_t, float>>& bias() const { return bias_; }

 private:
  std::int64_t vocab_ = 0;
  std::vector<std::int32_t> counts_;       // output counts, dense over the vocabulary
  std::vector<std::uint8_t> prompt_;       // 1 where the prompt holds the token
  std::vector<std::int32_t> seen_;         // sorted union of prompt and output tokens
  std::vector<std::pair<std::int32_t, float>> bias_;
};

struct logprob_entry {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

struct sample_pick {
  std::int32_t token = 0;
  float logprob = 0.0f;              // of the pick in the adjusted distribution
  bool non_finite = false;
  std::vector<logprob_entry> top;    // top_logprobs entries, highest first
};

// The uniform draw of rule 7: the same (seed, draw) always gives the same u in [0, 1).
double uniform_draw(std::uint64_t seed, std::uint64_t draw);

// One row. `mask` is empty (no guidance) or holds ceil(vocab / 32) words, bit t % 32 of word t / 32
// set where token t is allowed. `history` may be null (no penalties, no bias apply).
// `scratch` is reused across calls to avoid allocation.
struct sample_scratch {
  std::vector<float> logits;          // the adjusted logits (rules 1-4), -inf where excluded
  std::vector<std::int32_t> order;    // the sorted head of the descending order
  std::vector<double> weights;        // exp((l - max) / T) per token, -1 where excluded
};
result<sample_pick, sample_error> sample_row(std::span<const float> logits, const sample_params& p, const token_history* history,
                                             std::uint64_t draw, std::span<const std::uint32_t> mask, sample_scratch& scratch);

}  // namespace troupe::exec

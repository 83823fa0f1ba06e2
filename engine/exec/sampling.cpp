#include "engine/exec/sampling.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>

namespace troupe::exec {

std::string_view name(sample_error_code c) {
  switch (c) {
    case sample_error_code::bad_parameter: return "bad_parameter";
    case sample_error_code::bad_history: return "bad_history";
    case sample_error_code::bad_mask: return "bad_mask";
  }
  return "unknown";
}

std::string sample_error::message() const { return "sampling: " + reason + " (" + std::string(name(code)) + ")"; }

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

unexpected<sample_error> fail(sample_error_code c, std::string reason) { return unexpected(sample_error{c, std::move(reason)}); }

std::string num(double v) {
  // std::to_string prints 6 decimals, which hides tiny or huge values; %g is enough for a message.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Rules 1-3 saturate instead of overflowing to +-inf (which would read as "excluded" or poison the
// softmax).
float saturate(float v) { return std::clamp(v, -FLT_MAX, FLT_MAX); }

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix with full avalanche.
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The head of the descending order is found through a histogram of the weights w = exp(z) in (0, 1]
// by their bit patterns: positive doubles order like their bits, so (bits(1) - bits(w)) >> 49 is a
// bin of 1/8 octave, 0 holding the maximum. Weights below 2^-64 share the last bin.
constexpr int kBinShift = 49;
constexpr int kBins = 8 * 64 + 1;
constexpr std::uint64_t kOneBits = std::bit_cast<std::uint64_t>(1.0);

int bin_of(double w) {
  const std::uint64_t b = (kOneBits - std::bit_cast<std::uint64_t>(w)) >> kBinShift;
  return b < static_cast<std::uint64_t>(kBins - 1) ? static_cast<int>(b) : kBins - 1;
}

struct weight_histogram {
  std::array<std::size_t, kBins> count{};
  std::array<double, kBins> mass{};
  std::size_t candidates = 0;
};

// The histogram of the candidates' weights (w >= 0). Four interleaved copies, so that neighbours in
// one bin do not wait on each other's increments.
weight_histogram histogram(const double* w, std::size_t V) {
  constexpr std::size_t kOut = kBins;  // the slot excluded tokens (w < 0) land in, dropped
  std::array<std::array<std::uint32_t, kBins + 1>, 4> count{};
  std::array<std::array<double, kBins + 1>, 4> mass{};
  auto add = [&](std::size_t copy, double e) {
    const std::size_t b = e < 0 ? kOut : static_cast<std::size_t>(bin_of(e));
    ++count[copy][b];
    mass[copy][b] += e;
  };
  std::size_t t = 0;
  for (; t + 4 <= V; t += 4)
    for (std::size_t j = 0; j < 4; ++j) add(j, w[t + j]);
  for (; t < V; ++t) add(0, w[t]);
  weight_histogram h;
  for (std::size_t b = 0; b < kBins; ++b) {
    h.count[b] = std::size_t{count[0][b]} + count[1][b] + count[2][b] + count[3][b];
    h.mass[b] = (mass[0][b] + mass[1][b]) + (mass[2][b] + mass[3][b]);
    h.candidates += h.count[b];
  }
  return h;
}

// Every weight in bins 0..b (b < kBins - 1) is strictly above this value.
double bin_floor(int b) { return std::bit_cast<double>(kOneBits - (static_cast<std::uint64_t>(b + 1) << kBinShift)); }

#if defined(__GNUC__) && !defined(__clang__)
// Under -ftrapping-math GCC keeps a loop's selects as branches (a compare could trap), which stops
// vectorisation. The weight loops compare no NaN (their inputs are finite or -inf), so they opt out.
#define TROUPE_SELECTS_VECTORIZE __attribute__((optimize("no-trapping-math")))
#if defined(__x86_64__)
// The weight loop also gets an AVX2 clone (picked at load time). Floating-point contraction is off
// (ISO C++ mode), so both clones round every operation alike and give bitwise-equal weights.
#define TROUPE_WEIGHTS_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef TROUPE_SELECTS_VECTORIZE
#define TROUPE_SELECTS_VECTORIZE
#endif
#ifndef TROUPE_WEIGHTS_CLONES
#define TROUPE_WEIGHTS_CLONES
#endif

// exp(x) for x <= 0 (or -inf), written so a loop of it vectorises; within 2 ulp of std::exp, and 0
// below -708 (weights under 1e-307 of the maximum's). Cody-Waite reduction x = k ln2 + r with
// |r| <= ln2 / 2 (fdlibm's split of ln2), then the degree-13 Taylor polynomial of exp(r) (remainder
// below 2^-56 relative) evaluated by Estrin's scheme, scaled by 2^k built in the exponent bits.
TROUPE_SELECTS_VECTORIZE inline double exp_nonpositive(double x) {
  const double xc = x < -708.0 ? -708.0 : x;
  constexpr double shifter = 0x1.8p52;  // adding it rounds to an integer held in the low mantissa bits
  const double ks = xc * 1.4426950408889634 + shifter;
  const double k = ks - shifter;
  const double r = (xc - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
  const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const double p01 = 1.0 + r, p23 = 1.0 / 2 + r * (1.0 / 6), p45 = 1.0 / 24 + r * (1.0 / 120), p67 = 1.0 / 720 + r * (1.0 / 5040);
  const double p89 = 1.0 / 40320 + r * (1.0 / 362880), p1011 = 1.0 / 3628800 + r * (1.0 / 39916800);
  const double p1213 = 1.0 / 479001600 + r * (1.0 / 6227020800.0);
  const double p03 = p01 + r2 * p23, p47 = p45 + r2 * p67, p811 = p89 + r2 * p1011;
  const double q = (p03 + r4 * p47) + r8 * (p811 + r4 * p1213);
  // The low bits of ks hold k (-1022 <= k <= 0); shifted into the exponent field they give 2^k (the
  // shifter's own bits leave through the top). __builtin_bit_cast: std::bit_cast would not inline
  // across the optimize attribute.
  const double scale = __builtin_bit_cast(double, (__builtin_bit_cast(std::uint64_t, ks) + 1023) << 52);
  const double v = q * scale;
  return x < -708.0 ? 0.0 : v;
}

// w[t] = exp((a[t] - m) x inv_t), -1 where a[t] is -inf (excluded). inv_t = 1 / T is finite in double
// for every float T > 0.
TROUPE_WEIGHTS_CLONES TROUPE_SELECTS_VECTORIZE void softmax_weights(const float* __restrict a, std::size_t V, double m, double inv_t,
                                                                    double* __restrict w) {
  for (std::size_t t = 0; t < V; ++t) {
    const float at = a[t];
    const double e = exp_nonpositive((static_cast<double>(at) - m) * inv_t);
    w[t] = at == -kInf ? -1.0 : e;
  }
}

// expf(x) for x <= 0 (or -inf) in the same vectorisable form (Cephes' expf: Cody-Waite reduction,
// degree-5 polynomial; within 1 ulp), 0 below -87 (under 2^-125 of the maximum's weight).
TROUPE_SELECTS_VECTORIZE inline float expf_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  constexpr float shifter = 0x1.8p23f;
  const float ks = xc * 1.44269504088896341f + shifter;
  const float k = ks - shifter;
  const float r = (xc - k * 0.693359375f) - k * -2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * (r * r) + r + 1.0f;
  const float scale = __builtin_bit_cast(float, (__builtin_bit_cast(std::uint32_t, ks) + 127u) << 23);
  const float v = q * scale;
  return x < -87.0f ? 0.0f : v;
}

// log sum_t exp(a[t] - m) for greedy rows, where only the float logprobs need it: float exponentials
// summed in double, eight interleaved partial sums.
TROUPE_WEIGHTS_CLONES TROUPE_SELECTS_VECTORIZE double greedy_log_z(const float* __restrict a, std::size_t V, float m) {
  double part[8] = {};
  std::size_t t = 0;
  for (; t + 8 <= V; t += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(expf_nonpositive(a[t + j] - m));
  for (; t < V; ++t) part[0] += static_cast<double>(expf_nonpositive(a[t] - m));
  return std::log(((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])));
}

// Appends to `order` the ids whose weight is above `floor_w`, ascending; returns how many. Blocks of
// eight with none above are skipped at a glance (most of the vocabulary, for a head).
TROUPE_SELECTS_VECTORIZE std::size_t collect_above(const double* __restrict w, std::size_t V, double floor_w, std::int32_t* __restrict order) {
  std::size_t n = 0, t = 0;
  for (; t + 8 <= V; t += 8) {
    int any = 0;
    for (int j = 0; j < 8; ++j) any |= w[t + j] > floor_w;
    if (!any) continue;
    for (std::size_t j = t; j < t + 8; ++j) {
      order[n] = static_cast<std::int32_t>(j);
      n += w[j] > floor_w;
    }
  }
  for (; t < V; ++t) {
    order[n] = static_cast<std::int32_t>(t);
    n += w[t] > floor_w;
  }
  return n;
}

// The largest value, in eight interleaved partial maxima (the values hold no NaN).
TROUPE_SELECTS_VECTORIZE float max_value(const float* __restrict a, std::size_t V) {
  float part[8] = {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  std::size_t t = 0;
  for (; t + 8 <= V; t += 8)
    for (int j = 0; j < 8; ++j) part[j] = a[t + j] > part[j] ? a[t + j] : part[j];
  for (; t < V; ++t) part[0] = a[t] > part[0] ? a[t] : part[0];
  float m = part[0];
  for (int j = 1; j < 8; ++j) m = part[j] > m ? part[j] : m;
  return m;
}

// The sum of the non-negative weights, in eight interleaved partial sums.
TROUPE_SELECTS_VECTORIZE double sum_weights(const double* __restrict w, std::size_t V) {
  double part[8] = {};
  std::size_t t = 0;
  for (; t + 8 <= V; t += 8)
    for (int j = 0; j < 8; ++j) part[j] += w[t + j] > 0 ? w[t + j] : 0.0;
  for (; t < V; ++t) part[0] += w[t] > 0 ? w[t] : 0.0;
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// Whether any of a[0..8) is above x.
TROUPE_SELECTS_VECTORIZE inline bool any_above(const float* __restrict a, float x) {
  int any = 0;
  for (int j = 0; j < 8; ++j) any |= a[j] > x;
  return any != 0;
}

// Top-n ids by (adjusted logit descending, id ascending) among the candidates (not -inf).
struct top_ids {
  std::array<std::int32_t, max_top_logprobs> id{};
  std::size_t size = 0;
};
TROUPE_SELECTS_VECTORIZE top_ids select_top(const float* a, std::size_t V, int n) {
  top_ids out;
  const auto cap = static_cast<std::size_t>(std::clamp(n, 0, max_top_logprobs));
  if (cap == 0) return out;
  float floor_value = -kInf;  // only values above it may enter: -inf, then the smallest kept once full
  for (std::size_t t = 0; t < V; ++t) {
    if ((t & 7) == 0 && t + 8 <= V && !any_above(a + t, floor_value)) {
      t += 7;
      continue;
    }
    const float x = a[t];
    if (!(x > floor_value)) continue;
    std::size_t pos = out.size < cap ? out.size++ : cap - 1;
    // A later id with an equal value goes after the earlier ones (strict >).
    while (pos > 0 && x > a[out.id[pos - 1]]) {
      out.id[pos] = out.id[pos - 1];
      --pos;
    }
    out.id[pos] = static_cast<std::int32_t>(t);
    if (out.size == cap) floor_value = a[out.id[cap - 1]];
  }
  return out;
}

}  // namespace

result<void, sample_error> check(const sample_params& p) {
  using enum sample_error_code;
  if (!std::isfinite(p.temperature) || p.temperature < 0) return fail(bad_parameter, "temperature " + num(p.temperature) + " is not a finite value >= 0");
  if (p.top_k < 0) return fail(bad_parameter, "top_k " + std::to_string(p.top_k) + " is negative");
  if (!(p.top_p > 0 && p.top_p <= 1)) return fail(bad_parameter, "top_p " + num(p.top_p) + " is outside (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return fail(bad_parameter, "min_p " + num(p.min_p) + " is outside [0, 1]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0)
    return fail(bad_parameter, "repetition_penalty " + num(p.repetition_penalty) + " is not a finite value > 0");
  if (!std::isfinite(p.presence_penalty)) return fail(bad_parameter, "presence_penalty " + num(p.presence_penalty) + " is not finite");
  if (!std::isfinite(p.frequency_penalty)) return fail(bad_parameter, "frequency_penalty " + num(p.frequency_penalty) + " is not finite");
  if (p.top_logprobs < 0 || p.top_logprobs > max_top_logprobs)
    return fail(bad_parameter, "top_logprobs " + std::to_string(p.top_logprobs) + " is outside [0, " + std::to_string(max_top_logprobs) + "]");
  return {};
}

result<token_history, sample_error> token_history::create(std::int64_t vocab, std::span<const std::int32_t> prompt,
                                                          std::span<const std::pair<std::int32_t, float>> bias) {
  using enum sample_error_code;
  if (vocab <= 0 || vocab > std::numeric_limits<std::int32_t>::max())
    return fail(bad_history, "vocabulary of " + std::to_string(vocab) + " tokens is outside [1, 2^31 - 1]");
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return fail(bad_history, "prompt token " + std::to_string(prompt[i]) + " at " + std::to_string(i) + " is outside the vocabulary of " +
                                   std::to_string(vocab));
  }
  for (const auto& [t, b] : bias) {
    if (t < 0 || t >= vocab)
      return fail(bad_history, "bias token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(vocab));
    if (!std::isfinite(b)) return fail(bad_history, "bias " + num(b) + " of token " + std::to_string(t) + " is not finite");
  }
  token_history h;
  h.vocab_ = vocab;
  h.counts_.assign(static_cast<std::size_t>(vocab), 0);
  h.prompt_.assign(static_cast<std::size_t>(vocab), 0);
  for (auto t : prompt) {
    auto& in = h.prompt_[static_cast<std::size_t>(t)];
    if (!in) h.seen_.push_back(t);
    in = 1;
  }
  std::sort(h.seen_.begin(), h.seen_.end());
  h.bias_.assign(bias.begin(), bias.end());
  return h;
}

void token_history::record(std::int32_t token) {
  if (token < 0 || token >= vocab_) return;
  const auto i = static_cast<std::size_t>(token);
  if (counts_[i] == 0 && !prompt_[i]) seen_.insert(std::lower_bound(seen_.begin(), seen_.end(), token), token);
  if (counts_[i] < std::numeric_limits<std::int32_t>::max()) ++counts_[i];
}

std::int32_t token_history::count(std::int32_t token) const {
  return token >= 0 && token < vocab_ ? counts_[static_cast<std::size_t>(token)] : 0;
}

bool token_history::in_prompt(std::int32_t token) const { return token >= 0 && token < vocab_ && prompt_[static_cast<std::size_t>(token)]; }

double uniform_draw(std::uint64_t seed, std::uint64_t draw) {
  // Counter-based: the key is the mixed seed, the counter the draw index, two keyed rounds of the
  // splitmix64 finaliser. Nothing else (no state) enters, so a draw can be recomputed anywhere.
  const std::uint64_t key = mix64(seed ^ 0x6a09e667f3bcc909ULL);
  std::uint64_t x = mix64(key + (draw + 1) * 0x9e3779b97f4a7c15ULL);
  x = mix64(x ^ ((key << 32) | (key >> 32)));
  return static_cast<double>(x >> 11) * 0x1.0p-53;  // 53 bits: [0, 1)
}

result<sample_pick, sample_error> sample_row(std::span<const float> logits, const sample_params& p, const token_history* history,
                                             std::uint64_t draw, std::span<const std::uint32_t> mask, sample_scratch& scratch) {
  using enum sample_error_code;
  if (auto c = check(p); !c) return unexpected(c.error());
  const std::size_t V = logits.size();
  if (V == 0) return fail(bad_history, "the logits row is empty");
  if (V > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    return fail(bad_history, "a logits row of " + std::to_string(V) + " entries exceeds 32-bit token ids");
  if (history && history->vocab() != static_cast<std::int64_t>(V))
    return fail(bad_history, "the history's vocabulary of " + std::to_string(history->vocab()) + " differs from the logits row of " +
                                 std::to_string(V));
  const std::size_t words = (V + 31) / 32;
  if (!mask.empty()) {
    if (mask.size() != words)
      return fail(bad_mask, "mask of " + std::to_string(mask.size()) + " words for a vocabulary of " + std::to_string(V) + " (needs " +
                                std::to_string(words) + ")");
    std::uint32_t any = 0;
    for (std::size_t i = 0; i + 1 < words; ++i) any |= mask[i];
    const unsigned tail = static_cast<unsigned>(V - (words - 1) * 32);  // 1..32 valid bits in the last word
    any |= mask[words - 1] & (tail == 32 ? ~0u : ((1u << tail) - 1));
    if (!any) return fail(bad_mask, "the mask allows no token");
  }

  sample_pick pick;
  scratch.logits.resize(V);
  float* a = scratch.logits.data();

  // Non-finite logits are flagged and leave the candidates (-inf marks an excluded token from here on).
  unsigned bad = 0;
  for (std::size_t t = 0; t < V; ++t) {
    const float x = logits[t];
    const bool finite = std::fabs(x) <= FLT_MAX;  // false for NaN too
    bad |= !finite;
    a[t] = finite ? x : -kInf;
  }
  pick.non_finite = bad != 0;

  if (history) {
    // 1. logit bias
    for (const auto& [t, b] : history->bias()) {
      float& l = a[t];
      if (l != -kInf) l = saturate(l + b);
    }
    // 2-3. repetition, frequency and presence penalties: only the seen tokens can be touched.
    const float r = p.repetition_penalty, f = p.frequency_penalty, pres = p.presence_penalty;
    if (r != 1.0f || f != 0.0f || pres != 0.0f) {
      for (auto t : history->seen()) {
        float& l = a[t];
        if (l == -kInf) continue;
        float v = l;
        if (r != 1.0f) v = saturate(v > 0 ? v / r : v * r);
        if (const std::int32_t c = history->count(t); c > 0) v = saturate(v - (f * static_cast<float>(c) + pres));
        l = v;
      }
    }
  }
  // 4. guided mask
  if (!mask.empty()) {
    for (std::size_t i = 0; i < words; ++i) {
      const std::uint32_t m = mask[i];
      if (m == ~0u) continue;
      const std::size_t begin = i * 32, end = std::min(V, begin + 32);
      if (m == 0) {
        std::fill(a + begin, a + end, -kInf);
        continue;
      }
      for (std::size_t t = begin; t < end; ++t)
        if (!((m >> (t - begin)) & 1u)) a[t] = -kInf;
    }
  }

  // The first maximum (lowest id on ties) over the candidates.
  const float amax = max_value(a, V);
  if (amax == -kInf) {  // nothing finite survived
    pick.token = 0;
    pick.logprob = -kInf;
    return pick;
  }
  const double m = amax;
  auto report_top = [&](auto&& logprob) {
    const top_ids top = select_top(a, V, p.top_logprobs);
    pick.top.reserve(top.size);
    for (std::size_t i = 0; i < top.size; ++i) pick.top.push_back({top.id[i], static_cast<float>(logprob(top.id[i]))});
  };

  // 5. greedy
  if (p.temperature == 0.0f) {
    const double log_z = greedy_log_z(a, V, amax);
    pick.token = static_cast<std::int32_t>(std::find(a, a + V, amax) - a);
    pick.logprob = static_cast<float>(-log_z);
    report_top([&](std::int32_t t) { return static_cast<double>(a[t]) - m - log_z; });
    return pick;
  }

  // 5. temperature: w = exp((l - max) / T), the softmax numerators, with a histogram of their bins.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  scratch.weights.resize(V);
  double* w = scratch.weights.data();
  softmax_weights(a, V, m, inv_t, w);
  const double Z = sum_weights(w, V);
  const weight_histogram hist = histogram(w, V);
  const std::size_t candidates = hist.candidates;
  const double log_z = std::log(Z);
  auto logprob_of = [&](std::int32_t t) { return (static_cast<double>(a[t]) - m) * inv_t - log_z; };

  // 6-7. The rules need only the head of the descending order (w descending, id ascending): the kept
  // prefix when something truncates, else the prefix up to the draw's crossing. The histogram picks
  // a bin B whose bins 0..B hold it. Those tokens are collected and bucketed by bin (a bucket sort:
  // the buckets follow the order), and only the buckets where a rule's boundary or the draw's
  // crossing falls are sorted; whole buckets before a boundary count by their mass. Rounding may make
  // the estimate short, so B grows until every rule is decided within the head.
  const std::size_t k = p.top_k > 0 && static_cast<std::size_t>(p.top_k) < candidates ? static_cast<std::size_t>(p.top_k) : candidates;
  const bool top_k_on = k < candidates;
  const bool top_p_on = p.top_p < 1.0f;
  const bool min_p_on = p.min_p > 0.0f;
  const bool truncating = top_k_on || top_p_on || min_p_on;
  const double top_p = p.top_p, min_p = p.min_p;
  const double u = uniform_draw(p.seed, draw);

  // Bins before b: their token count (= where bucket b starts in the head) and mass.
  std::array<std::size_t, kBins + 1> count_before{};
  std::array<double, kBins + 1> mass_before{};
  for (std::size_t b = 0; b < kBins; ++b) {
    count_before[b + 1] = count_before[b] + hist.count[b];
    mass_before[b + 1] = mass_before[b] + hist.mass[b];
  }
  auto first_bin = [&](auto&& reached) {
    for (int b = 0; b < kBins; ++b)
      if (reached(static_cast<std::size_t>(b))) return b;
    return kBins - 1;
  };
  int B = kBins - 1;
  if (top_k_on) {
    B = first_bin([&](std::size_t b) { return count_before[b + 1] >= k; });  // top-p and min-p work inside the top-k
  } else if (truncating) {
    if (top_p_on) B = first_bin([&](std::size_t b) { return mass_before[b + 1] >= top_p * Z; });
    if (min_p_on) B = std::min(B, bin_of(min_p));
  } else {
    B = first_bin([&](std::size_t b) { return mass_before[b + 1] > u * Z; });
  }
  B = std::min(B + 1, kBins - 1);  // one bin of margin for rounding

  auto& order = scratch.order;
  if (order.size() < V) order.resize(V);
  const auto by_weight = [w](std::int32_t x, std::int32_t y) { return w[x] > w[y] || (w[x] == w[y] && x < y); };
  for (int attempt = 0;; ++attempt) {
    // With every candidate in the head each rule is decided, so the loop ends; after a few short
    // estimates (which only rounding should cause) it goes there directly.
    if (attempt >= 3) B = kBins - 1;
    const bool all = B == kBins - 1;
    const auto nb = static_cast<std::size_t>(B) + 1;  // buckets 0..B
    const std::size_t n = collect_above(w, V, all ? -0.5 : bin_floor(B), order.data());
    std::int32_t* head = order.data();
    std::array<bool, kBins> sorted{};
    if (n == count_before[nb] && 2 * n <= V) {
      head = order.data() + n;
      std::array<std::size_t, kBins> fill{};
      std::copy(count_before.begin(), count_before.begin() + static_cast<std::ptrdiff_t>(nb), fill.begin());
      for (std::size_t i = 0; i < n; ++i) head[fill[static_cast<std::size_t>(bin_of(w[order[i]]))]++] = order[i];
    } else {  // most of the vocabulary is in the head (a flat distribution): sort it whole
      std::sort(head, head + n, by_weight);
      sorted.fill(true);
    }
    auto ensure_sorted = [&](std::size_t b) {
      if (sorted[b]) return;
      std::sort(head + count_before[b], head + count_before[b + 1], by_weight);
      sorted[b] = true;
    };
    auto bucket_of = [&](std::size_t pos) {
      return static_cast<std::size_t>(std::upper_bound(count_before.begin(), count_before.begin() + static_cast<std::ptrdiff_t>(nb) + 1, pos) -
                                      count_before.begin()) - 1;
    };
    // The first position in [from, limit) of the head where the running mass, which is mass_before
    // at the start of from's bucket, passes `target` (`strict`: exceeds it); sorts the buckets it walks.
    auto crossing = [&](std::size_t from_bucket, std::size_t limit, double target, bool strict) -> std::size_t {
      double cum = mass_before[from_bucket];
      for (std::size_t i = count_before[from_bucket], b = from_bucket; i < limit; ++i) {
        while (i >= count_before[b + 1]) ++b;
        ensure_sorted(b);
        cum += w[head[i]];
        if (strict ? cum > target : cum >= target) return i;
      }
      return limit;
    };
    if (top_k_on && n < k) {  // B is chosen to hold the top-k; this only guards it
      B = std::min(B + 8, kBins - 1);
      continue;
    }
    bool short_head = false;
    std::size_t L = candidates;  // the kept prefix
    double base = Z;             // its mass before top-p
    if (top_k_on) {
      L = k;
      const std::size_t bk = bucket_of(k - 1);
      ensure_sorted(bk);
      base = mass_before[bk];
      for (std::size_t i = count_before[bk]; i < k; ++i) base += w[head[i]];
    }
    if (top_p_on) {
      const double target = top_p * base;
      const std::size_t limit = std::min(L, n);
      std::size_t b = 0;  // the first bucket whose end passes the target (from the histogram)
      while (b + 1 < nb && count_before[b + 1] < limit && mass_before[b + 1] < target) ++b;
      const std::size_t i = crossing(b, limit, target, false);
      if (i < limit) L = i + 1;
      else if (limit < L) short_head = true;  // else rounding: keep them all
    }
    if (!short_head && min_p_on) {
      // Buckets before min_p's hold weights above it, those after weights below it.
      const auto bm = static_cast<std::size_t>(bin_of(min_p));
      if (bm < nb) {
        ensure_sorted(bm);
        std::size_t c = count_before[bm];
        while (c < count_before[bm + 1] && w[head[c]] >= min_p) ++c;
        L = std::min(L, c);
      } else if (L > n) {
        short_head = true;
      }
    }
    if (short_head || (truncating && L > n)) {
      B = std::min(B + 8, kBins - 1);
      continue;
    }
    // 7. the draw over the kept prefix (the whole distribution when nothing truncates)
    double kept = Z;
    if (L < candidates) {
      const std::size_t bl = bucket_of(L - 1);
      kept = mass_before[bl];
      for (std::size_t i = count_before[bl]; i < L; ++i) kept += w[head[i]];
    }
    const double target = u * kept;
    const std::size_t limit = std::min(L, n);
    std::size_t b = 0;
    while (b + 1 < nb && count_before[b + 1] < limit && mass_before[b + 1] <= target) ++b;
    std::size_t chosen = crossing(b, limit, target, true);
    if (chosen == limit) {
      if (limit < L) {
        B = std::min(B + 8, kBins - 1);
        continue;
      }
      // Rounding left u x mass past the cumulative sum: the last kept token with any mass.
      chosen = 0;
      for (std::size_t i = limit; i-- > 0;) {
        ensure_sorted(bucket_of(i));
        if (w[head[i]] > 0) {
          chosen = i;
          break;
        }
      }
    }
    pick.token = head[chosen];
    break;
  }
  pick.logprob = static_cast<float>(logprob_of(pick.token));
  report_top(logprob_of);
  return pick;
}

}  // namespace troupe::exec

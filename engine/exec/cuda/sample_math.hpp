#pragma once
// The sampling head's arithmetic and selection passes (the rules of engine/exec/sampling.hpp), written
// once for both compilers: sample_kernels.cu runs sample_row_run with a block of threads, and the host
// tests run the very same code with one thread (serial_block) against exec::sample_row. A "block" here
// is anything with thread()/threads()/sync(), block-wide reductions and atomics (see serial_block).
//
// Exactness. The orders are the host's: the draw and the truncations walk (weight descending, id
// ascending) with weight = exp((l - max) / T) computed by the same double-precision polynomial, every
// operation rounded on its own (no fused multiply-add), so weights and their ties match bit for bit;
// the top-n report walks (adjusted logit descending, id ascending). Masses are summed exactly in
// 128-bit fixed point (units of 2^-94, integer atomics, so the result does not depend on thread
// timing) and rounded to double once where a rule compares them, where the host sums in double in its
// own order: the two can only disagree when a target lands within rounding of a cumulative sum.
//
// Selection is a radix select over a 96-bit key (64 bits of order value, then the 32-bit id): one pass
// over the row per 8-bit digit, each pass histogramming the tokens under the prefix chosen so far
// (counts and masses in 256 bins), then walking the bins to the one where the goal is reached (a
// rank, a mass at least / above a target). Once a single token is left under the prefix, one more
// pass finds it.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "engine/exec/cuda/hd.hpp"
#include "engine/exec/cuda/sample_kernels.hpp"

namespace troupe::exec::cuda::sampling {

// ---- bits and once-rounded arithmetic ------------------------------------------------------------
// On the device the explicit _rn intrinsics keep nvcc from contracting a * b + c into an FMA (which
// would change the weights' last bits); g++ in ISO mode does not contract.

using cuda::bits_of;
using cuda::double_of;
using cuda::float_of;

#if defined(__CUDA_ARCH__)
TROUPE_HD double dadd(double a, double b) { return __dadd_rn(a, b); }
TROUPE_HD double dsub(double a, double b) { return __dsub_rn(a, b); }
TROUPE_HD double dmul(double a, double b) { return __dmul_rn(a, b); }
TROUPE_HD double ddiv(double a, double b) { return __ddiv_rn(a, b); }
TROUPE_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
TROUPE_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
TROUPE_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
TROUPE_HD float fdiv(float a, float b) { return __fdiv_rn(a, b); }
TROUPE_HD double u64_to_double(std::uint64_t x) { return __ull2double_rn(static_cast<unsigned long long>(x)); }
TROUPE_HD double log_of(double x) { return ::log(x); }
#else
TROUPE_HD double dadd(double a, double b) { return a + b; }
TROUPE_HD double dsub(double a, double b) { return a - b; }
TROUPE_HD double dmul(double a, double b) { return a * b; }
TROUPE_HD double ddiv(double a, double b) { return a / b; }
TROUPE_HD float fadd(float a, float b) { return a + b; }
TROUPE_HD float fsub(float a, float b) { return a - b; }
TROUPE_HD float fmul(float a, float b) { return a * b; }
TROUPE_HD float fdiv(float a, float b) { return a / b; }
TROUPE_HD double u64_to_double(std::uint64_t x) { return static_cast<double>(x); }
TROUPE_HD double log_of(double x) { return std::log(x); }
#endif

TROUPE_HD float neg_inf() { return float_of(0xff800000u); }

// ---- rule 7's generator ---------------------------------------------------------------------------

// splitmix64's finaliser, as exec::uniform_draw uses it.
TROUPE_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Bit for bit exec::uniform_draw(seed, draw): u in [0, 1) from 53 bits.
TROUPE_HD double uniform_draw(std::uint64_t seed, std::uint64_t draw) {
  const std::uint64_t key = mix64(seed ^ 0x6a09e667f3bcc909ULL);
  std::uint64_t x = mix64(key + (draw + 1) * 0x9e3779b97f4a7c15ULL);
  x = mix64(x ^ ((key << 32) | (key >> 32)));
  return dmul(u64_to_double(x >> 11), 0x1.0p-53);
}

// ---- exponentials (the host sampler's, operation for operation) ----------------------------------

// exp(x) for x <= 0 (or -inf): Cody-Waite reduction and a degree-13 Taylor polynomial by Estrin's
// scheme, 0 below -708. Bitwise the host sampler's exp_nonpositive.
TROUPE_HD double exp_nonpositive(double x) {
  const double xc = x < -708.0 ? -708.0 : x;
  constexpr double shifter = 0x1.8p52;
  const double ks = dadd(dmul(xc, 1.4426950408889634), shifter);
  const double k = dsub(ks, shifter);
  const double r = dsub(dsub(xc, dmul(k, 6.93147180369123816490e-01)), dmul(k, 1.90821492927058770002e-10));
  const double r2 = dmul(r, r), r4 = dmul(r2, r2), r8 = dmul(r4, r4);
  const double p01 = dadd(1.0, r);
  const double p23 = dadd(1.0 / 2, dmul(r, 1.0 / 6));
  const double p45 = dadd(1.0 / 24, dmul(r, 1.0 / 120));
  const double p67 = dadd(1.0 / 720, dmul(r, 1.0 / 5040));
  const double p89 = dadd(1.0 / 40320, dmul(r, 1.0 / 362880));
  const double p1011 = dadd(1.0 / 3628800, dmul(r, 1.0 / 39916800));
  const double p1213 = dadd(1.0 / 479001600, dmul(r, 1.0 / 6227020800.0));
  const double p03 = dadd(p01, dmul(r2, p23));
  const double p47 = dadd(p45, dmul(r2, p67));
  const double p811 = dadd(p89, dmul(r2, p1011));
  const double q = dadd(dadd(p03, dmul(r4, p47)), dmul(r8, dadd(p811, dmul(r4, p1213))));
  const double scale = double_of((bits_of(ks) + 1023) << 52);  // 2^k from k in the low bits of ks
  const double v = dmul(q, scale);
  return x < -708.0 ? 0.0 : v;
}

// expf(x) for x <= 0 (or -inf), Cephes' polynomial, 0 below -87: the host's expf_nonpositive.
TROUPE_HD float expf_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  constexpr float shifter = 0x1.8p23f;
  const float ks = fadd(fmul(xc, 1.44269504088896341f), shifter);
  const float k = fsub(ks, shifter);
  const float r = fsub(fsub(xc, fmul(k, 0.693359375f)), fmul(k, -2.12194440e-4f));
  float q = 1.9875691500e-4f;
  q = fadd(fmul(q, r), 1.3981999507e-3f);
  q = fadd(fmul(q, r), 8.3334519073e-3f);
  q = fadd(fmul(q, r), 4.1665795894e-2f);
  q = fadd(fmul(q, r), 1.6666665459e-1f);
  q = fadd(fmul(q, r), 5.0000001201e-1f);
  q = fadd(fadd(fmul(q, fmul(r, r)), r), 1.0f);
  const float scale = float_of((bits_of(ks) + 127u) << 23);
  const float v = fmul(q, scale);
  return x < -87.0f ? 0.0f : v;
}

// The softmax numerator of rule 5: exp((a - m) / T) with inv_t = 1 / T, in (0, 1] (or 0 on underflow).
TROUPE_HD double token_weight(float a, double m, double inv_t) { return exp_nonpositive(dmul(dsub(static_cast<double>(a), m), inv_t)); }

// log_softmax of an adjusted logit: (a - m) / T - log Z (greedy rows pass inv_t = 1: no scaling).
TROUPE_HD double token_logprob(float a, double m, double inv_t, double log_z) {
  return dsub(dmul(dsub(static_cast<double>(a), m), inv_t), log_z);
}

// ---- rules 1-4 -------------------------------------------------------------------------------------

// NaN and +-inf are not finite.
TROUPE_HD bool finite_logit(float x) { return x <= FLT_MAX && x >= -FLT_MAX; }

// std::clamp(v, -FLT_MAX, FLT_MAX): rules 1-3 saturate instead of overflowing.
TROUPE_HD float saturate(float v) { return v < -FLT_MAX ? -FLT_MAX : (FLT_MAX < v ? FLT_MAX : v); }

// One sequence's history, dense over the vocabulary (null counts: no history, so no bias nor penalty).
struct history_row {
  const std::int32_t* counts;
  const std::uint8_t* prompt;
  const float* bias;  // may be null: no bias
};

// Token t's adjusted logit: -inf when the logit is not finite or the mask clears it.
TROUPE_HD float adjust_logit(float x, std::int64_t t, const device_sample_row& p, const history_row& h, const std::uint32_t* mask) {
  const float ninf = neg_inf();
  float l = finite_logit(x) ? x : ninf;
  if (h.counts != nullptr && l != ninf) {
    // 1. logit bias (0: none; the host adds only the biases it lists, and adding 0 changes nothing)
    if (h.bias != nullptr) {
      const float b = h.bias[t];
      if (b != 0.0f) l = saturate(fadd(l, b));
    }
    // 2-3. repetition, frequency and presence penalties, on the tokens the prompt or output holds
    const float r = p.repetition_penalty, f = p.frequency_penalty, pres = p.presence_penalty;
    if (r != 1.0f || f != 0.0f || pres != 0.0f) {
      const std::int32_t c = h.counts[t];
      const bool seen = c > 0 || (h.prompt != nullptr && h.prompt[t] != 0);
      if (seen) {
        float v = l;
        if (r != 1.0f) v = saturate(v > 0 ? fdiv(v, r) : fmul(v, r));
        if (c > 0) v = saturate(fsub(v, fadd(fmul(f, static_cast<float>(c)), pres)));
        l = v;
      }
    }
  }
  // 4. guided mask
  if (mask != nullptr && ((mask[t >> 5] >> (t & 31)) & 1u) == 0) l = ninf;
  return l;
}

// ---- keys --------------------------------------------------------------------------------------

// A total order as an unsigned number: smaller comes first. hi holds the order value, lo the id, so
// equal values go lowest id first.
struct key96 {
  std::uint64_t hi;
  std::uint32_t lo;
};
inline constexpr int key_levels = 12;  // 8-bit digits, most significant first: 8 of hi, 4 of lo

TROUPE_HD key96 key_last() { return key96{~std::uint64_t{0}, ~std::uint32_t{0}}; }
TROUPE_HD bool key_le(key96 a, key96 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo <= b.lo); }
TROUPE_HD key96 key_min(key96 a, key96 b) { return key_le(a, b) ? a : b; }

TROUPE_HD unsigned key_digit(key96 k, int level) {
  return level < 8 ? static_cast<unsigned>((k.hi >> (56 - 8 * level)) & 0xffu) : static_cast<unsigned>((k.lo >> (24 - 8 * (level - 8))) & 0xffu);
}

// Whether a and b agree on their first `levels` digits.
TROUPE_HD bool key_prefix_equal(key96 a, key96 b, int levels) {
  if (levels <= 0) return true;
  if (levels < 8) return (a.hi >> (64 - 8 * levels)) == (b.hi >> (64 - 8 * levels));
  if (a.hi != b.hi) return false;
  if (levels == 8) return true;
  const int shift = 32 - 8 * (levels - 8);
  return (a.lo >> shift) == (b.lo >> shift);
}

// k with digit `level` set to d (k holds zeros there).
TROUPE_HD key96 key_with_digit(key96 k, int level, unsigned d) {
  if (level < 8) k.hi |= static_cast<std::uint64_t>(d) << (56 - 8 * level);
  else k.lo |= static_cast<std::uint32_t>(d) << (24 - 8 * (level - 8));
  return k;
}

// (weight descending, id ascending). Weights lie in [0, 1], whose doubles order like their bits.
inline constexpr std::uint64_t one_bits = 0x3ff0000000000000ULL;
TROUPE_HD key96 weight_key(double w, std::uint32_t id) { return key96{one_bits - bits_of(w), id}; }

// The weights at least w (w in (0, 1]) are the keys up to this one.
TROUPE_HD key96 weight_floor_key(double w) { return key96{one_bits - bits_of(w), ~std::uint32_t{0}}; }

// (adjusted logit descending, id ascending), -0 tying with +0. The value takes 32 bits, so digits
// 0-3 are zero and selection starts at digit 4.
inline constexpr int logit_key_first_level = 4;
TROUPE_HD key96 logit_key(float a, std::uint32_t id) {
  const std::uint32_t u = bits_of(a == 0.0f ? 0.0f : a);
  const std::uint32_t ascending = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  return key96{static_cast<std::uint64_t>(~ascending), id};
}

// ---- exact masses ----------------------------------------------------------------------------------

// A sum of weights in units of 2^-94 (weights below 2^-94 count as 0: under 2^-94 of the top token's
// weight, which is 1). Integer, so sums are exact and independent of their order; a vocabulary of
// 2^31 weights of 1 stays below 2^125.
struct mass128 {
  std::uint64_t lo;
  std::uint64_t hi;
};

TROUPE_HD mass128 mass_add(mass128 a, mass128 b) {
  mass128 r;
  r.lo = a.lo + b.lo;
  r.hi = a.hi + b.hi + (r.lo < a.lo ? 1u : 0u);
  return r;
}
TROUPE_HD bool mass_is_zero(mass128 m) { return m.lo == 0 && m.hi == 0; }

// w in [0, 1] to fixed point, truncating below 2^-94.
TROUPE_HD mass128 mass_of(double w) {
  const std::uint64_t b = bits_of(w);
  const int e = static_cast<int>((b >> 52) & 0x7ff);
  if (e == 0 || (b >> 63) != 0) return mass128{0, 0};  // zero, subnormal (or a negative, never passed)
  const std::uint64_t m = (b & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1} << 52);  // w = m 2^(e - 1075)
  const int s = e - 1075 + 94;                                                               // w = m 2^s units
  if (s <= -53) return mass128{0, 0};
  if (s < 0) return mass128{m >> -s, 0};
  if (s == 0) return mass128{m, 0};
  return mass128{m << s, m >> (64 - s)};  // s <= 42 for w <= 1
}

// The double nearest the mass (within an ulp; monotone in the mass).
TROUPE_HD double mass_value(mass128 m) { return dadd(dmul(u64_to_double(m.hi), 0x1.0p-30), dmul(u64_to_double(m.lo), 0x1.0p-94)); }

// ---- the radix select -------------------------------------------------------------------------------

inline constexpr int radix_bins = 256;
inline constexpr int radix_groups = 16;  // the walk first steps over groups of 16 bins, then into one
inline constexpr int radix_group_bins = radix_bins / radix_groups;

enum class radix_goal : std::uint8_t {
  rank,           // the rank-th token of the order (1-based)
  mass_at_least,  // the first token where the cumulative mass reaches target (top-p)
  mass_above,     // the first token where it exceeds target (the draw); past all of them, the last
                  // token with mass (the host's rounding rule)
};
enum class key_kind : std::uint8_t { weight, logit };

struct radix_query {
  radix_goal goal;
  key_kind kind;
  std::uint32_t rank;
  double target;
  key96 bound;  // only tokens whose key is at most this one take part
};

// Shared between the block's threads; trivial types only (CUDA __shared__ storage).
struct radix_histogram {
  std::uint32_t count[radix_bins];
  std::uint64_t mass_lo[radix_bins];  // mass128 split so each half takes a 64-bit atomic
  std::uint64_t mass_hi[radix_bins];
  std::uint32_t group_count[radix_groups];
  mass128 group_mass[radix_groups];
};

struct radix_state {
  key96 prefix;                // the digits chosen so far, zeros below
  std::uint32_t count_before;  // tokens taking part that come before the prefix
  mass128 mass_before;         // and their mass
  std::int32_t level;          // the digit the next pass chooses
  bool fallback;               // mass_above passed every sum: follow the last bin with mass
  bool locate;                 // one token is left under the prefix: the next pass finds it
  bool done;
  bool found;                  // false: the goal is not reached by all of them (top-p after rounding)
};

// What one row's run keeps in the block's shared memory.
struct sample_shared {
  radix_histogram hist;
  radix_state state;
  key96 located;
  std::uint32_t top_count;
  std::int32_t top_ids[max_device_top_logprobs];
};

// The row a selection reads: the adjusted logits and what turns them into weights.
struct row_context {
  const float* a;  // -inf where excluded
  std::int64_t vocab;
  double m;      // the largest adjusted logit
  double inv_t;  // 1 / T
};

TROUPE_HD key96 token_key(const row_context& r, key_kind kind, float a, std::int64_t t, double& w) {
  const auto id = static_cast<std::uint32_t>(t);
  if (kind == key_kind::logit) {
    w = 0.0;
    return logit_key(a, id);
  }
  w = token_weight(a, r.m, r.inv_t);
  return weight_key(w, id);
}

TROUPE_HD bool radix_reached(const radix_query& q, std::uint32_t count, mass128 mass) {
  switch (q.goal) {
    case radix_goal::rank: return count >= q.rank;
    case radix_goal::mass_at_least: return mass_value(mass) >= q.target;
    case radix_goal::mass_above: return mass_value(mass) > q.target;
  }
  return false;
}

TROUPE_HD mass128 bin_mass(const radix_histogram& h, int d) { return mass128{h.mass_lo[d], h.mass_hi[d]}; }

// Adds one thread's run of tokens in bin d. The 128-bit add takes two atomics: the low word's wrap
// (seen in the value it replaced) carries into the high word, so the total is exact in any order.
template <class Block>
TROUPE_HD void radix_flush(Block& blk, radix_histogram& h, int d, std::uint32_t count, mass128 mass) {
  if (count == 0) return;
  blk.atomic_add(&h.count[d], count);
  if (mass_is_zero(mass)) return;
  const std::uint64_t old = blk.atomic_add(&h.mass_lo[d], mass.lo);
  const std::uint64_t hi = mass.hi + (old + mass.lo < old ? 1u : 0u);
  if (hi != 0) blk.atomic_add(&h.mass_hi[d], hi);
}

// Pass: histogram of digit s.level over the tokens taking part that lie under the prefix. Each thread
// adds runs of equal digits at once (its tokens mostly share a bin), so atomics stay few.
template <class Block>
TROUPE_HD void radix_histogram_pass(Block& blk, radix_histogram& h, const row_context& r, const radix_query& q, const radix_state& s) {
  const float ninf = neg_inf();
  int run = -1;
  std::uint32_t run_count = 0;
  mass128 run_mass{0, 0};
  for (std::int64_t t = blk.thread(); t < r.vocab; t += blk.threads()) {
    const float a = r.a[t];
    if (a == ninf) continue;
    double w;
    const key96 k = token_key(r, q.kind, a, t, w);
    if (!key_le(k, q.bound) || !key_prefix_equal(k, s.prefix, s.level)) continue;
    const int d = static_cast<int>(key_digit(k, s.level));
    if (d != run) {
      if (run >= 0) radix_flush(blk, h, run, run_count, run_mass);
      run = d;
      run_count = 0;
      run_mass = mass128{0, 0};
    }
    ++run_count;
    if (q.kind == key_kind::weight) run_mass = mass_add(run_mass, mass_of(w));
  }
  if (run >= 0) radix_flush(blk, h, run, run_count, run_mass);
}

// Pass: the groups' totals (16 threads' work).
template <class Block>
TROUPE_HD void radix_group_pass(Block& blk, radix_histogram& h) {
  for (int g = blk.thread(); g < radix_groups; g += blk.threads()) {
    std::uint32_t c = 0;
    mass128 m{0, 0};
    for (int d = g * radix_group_bins; d < (g + 1) * radix_group_bins; ++d) {
      c += h.count[d];
      m = mass_add(m, bin_mass(h, d));
    }
    h.group_count[g] = c;
    h.group_mass[g] = m;
  }
}

// One thread: chooses digit s.level from the histogram and moves the state on.
TROUPE_HD void radix_walk(const radix_histogram& h, const radix_query& q, radix_state& s) {
  std::uint32_t c = s.count_before;
  mass128 m = s.mass_before;
  int chosen = -1;
  if (!s.fallback) {
    int g = 0;
    for (; g < radix_groups; ++g) {
      if (radix_reached(q, c + h.group_count[g], mass_add(m, h.group_mass[g]))) break;
      c += h.group_count[g];
      m = mass_add(m, h.group_mass[g]);
    }
    // Sums are exact and the goal monotone, so a group that reaches it holds a bin that does.
    if (g < radix_groups) {
      for (int d = g * radix_group_bins; d < (g + 1) * radix_group_bins; ++d) {
        if (radix_reached(q, c + h.count[d], mass_add(m, bin_mass(h, d)))) {
          chosen = d;
          break;
        }
        c += h.count[d];
        m = mass_add(m, bin_mass(h, d));
      }
    }
    if (chosen < 0) {
      if (q.goal != radix_goal::mass_above) {
        s.done = true;
        s.found = false;
        return;
      }
      s.fallback = true;
    }
  }
  if (s.fallback) {
    for (int d = radix_bins - 1; d >= 0 && chosen < 0; --d)
      if (!mass_is_zero(bin_mass(h, d))) chosen = d;
    if (chosen < 0) {
      s.done = true;
      s.found = false;
      return;
    }
    c = s.count_before;
    m = s.mass_before;
    for (int d = 0; d < chosen; ++d) {
      c += h.count[d];
      m = mass_add(m, bin_mass(h, d));
    }
  }
  s.count_before = c;
  s.mass_before = m;
  s.prefix = key_with_digit(s.prefix, s.level, static_cast<unsigned>(chosen));
  ++s.level;
  if (s.level == key_levels) {
    s.done = true;
    s.found = true;
  } else if (h.count[chosen] == 1) {
    s.locate = true;
  }
}

// Pass: the one token under the prefix writes its key.
template <class Block>
TROUPE_HD void radix_locate_pass(Block& blk, sample_shared& sh, const row_context& r, const radix_query& q, const radix_state& s) {
  const float ninf = neg_inf();
  for (std::int64_t t = blk.thread(); t < r.vocab; t += blk.threads()) {
    const float a = r.a[t];
    if (a == ninf) continue;
    double w;
    const key96 k = token_key(r, q.kind, a, t, w);
    if (key_le(k, q.bound) && key_prefix_equal(k, s.prefix, s.level)) sh.located = k;
  }
}

// The whole selection, run by every thread of the block; returns the final state (its prefix is the
// token's key when found).
template <class Block>
TROUPE_HD radix_state radix_select(Block& blk, sample_shared& sh, const row_context& r, const radix_query& q) {
  blk.sync();  // every thread has read the previous selection's state
  if (blk.thread() == 0) {
    radix_state s;
    s.prefix = key96{0, 0};
    s.count_before = 0;
    s.mass_before = mass128{0, 0};
    s.level = q.kind == key_kind::logit ? logit_key_first_level : 0;
    s.fallback = s.locate = s.done = s.found = false;
    sh.state = s;
  }
  blk.sync();
  while (!sh.state.done) {
    const radix_state s = sh.state;
    for (int d = blk.thread(); d < radix_bins; d += blk.threads()) {
      sh.hist.count[d] = 0;
      sh.hist.mass_lo[d] = 0;
      sh.hist.mass_hi[d] = 0;
    }
    blk.sync();
    radix_histogram_pass(blk, sh.hist, r, q, s);
    blk.sync();
    radix_group_pass(blk, sh.hist);
    blk.sync();
    if (blk.thread() == 0) radix_walk(sh.hist, q, sh.state);
    blk.sync();
    if (sh.state.locate) {
      radix_locate_pass(blk, sh, r, q, sh.state);
      blk.sync();
      if (blk.thread() == 0) {
        sh.state.prefix = sh.located;
        sh.state.locate = false;
        sh.state.done = sh.state.found = true;
      }
      blk.sync();
    }
  }
  return sh.state;
}

// The exact mass of the weights whose key is at most `bound`.
template <class Block>
TROUPE_HD mass128 mass_upto(Block& blk, const row_context& r, key96 bound) {
  const float ninf = neg_inf();
  mass128 m{0, 0};
  for (std::int64_t t = blk.thread(); t < r.vocab; t += blk.threads()) {
    const float a = r.a[t];
    if (a == ninf) continue;
    const double w = token_weight(a, r.m, r.inv_t);
    if (key_le(weight_key(w, static_cast<std::uint32_t>(t)), bound)) m = mass_add(m, mass_of(w));
  }
  return blk.sum(m);
}

// ---- one row ----------------------------------------------------------------------------------------

struct sample_row_input {
  const float* logits;  // the row, unmodified
  std::int64_t vocab;
  device_sample_row p;
  history_row history;
  const std::uint32_t* mask;  // null: no guidance
  float* work;                // vocab floats: the adjusted logits
};

// The top-n report: the n_eff first of (adjusted logit descending, id ascending), with their logprobs.
template <class Block>
TROUPE_HD void report_top(Block& blk, sample_shared& sh, const row_context& r, std::uint32_t n_eff, double log_z, device_sample_out& out) {
  if (blk.thread() == 0) sh.top_count = 0;  // ordered before the collection by radix_select's syncs
  radix_query q;
  q.goal = radix_goal::rank;
  q.kind = key_kind::logit;
  q.rank = n_eff;
  q.target = 0.0;
  q.bound = key_last();
  const radix_state s = radix_select(blk, sh, r, q);
  const float ninf = neg_inf();
  for (std::int64_t t = blk.thread(); t < r.vocab; t += blk.threads()) {
    const float a = r.a[t];
    if (a == ninf || !key_le(logit_key(a, static_cast<std::uint32_t>(t)), s.prefix)) continue;
    const std::uint32_t i = blk.atomic_add(&sh.top_count, 1u);
    if (i < static_cast<std::uint32_t>(max_device_top_logprobs)) sh.top_ids[i] = static_cast<std::int32_t>(t);
  }
  blk.sync();
  if (blk.thread() == 0) {
    const int n = static_cast<int>(n_eff);
    for (int i = 1; i < n; ++i) {  // insertion sort by key: at most 20 ids
      const std::int32_t id = sh.top_ids[i];
      const key96 k = logit_key(r.a[id], static_cast<std::uint32_t>(id));
      int j = i;
      for (; j > 0 && !key_le(logit_key(r.a[sh.top_ids[j - 1]], static_cast<std::uint32_t>(sh.top_ids[j - 1])), k); --j) sh.top_ids[j] = sh.top_ids[j - 1];
      sh.top_ids[j] = id;
    }
    for (int i = 0; i < n; ++i) {
      out.top_tokens[i] = sh.top_ids[i];
      out.top_logprobs[i] = static_cast<float>(token_logprob(r.a[sh.top_ids[i]], r.m, r.inv_t, log_z));
    }
    out.top_count = n;
  }
}

// Samples one row into `out` (written by thread 0). Every thread of the block calls it.
template <class Block>
TROUPE_HD void sample_row_run(Block& blk, sample_shared& sh, const sample_row_input& in, device_sample_out& out) {
  const float ninf = neg_inf();
  const std::int64_t V = in.vocab;
  const device_sample_row& p = in.p;

  // Rules 1-4 into the work row; non-finite logits are flagged and leave the candidates.
  bool bad = false;
  float amax_local = ninf;
  std::uint32_t candidates_local = 0;
  for (std::int64_t t = blk.thread(); t < V; t += blk.threads()) {
    const float x = in.logits[t];
    bad = bad || !finite_logit(x);
    const float a = adjust_logit(x, t, p, in.history, in.mask);
    in.work[t] = a;
    if (a > amax_local) amax_local = a;
    if (a != ninf) ++candidates_local;
  }
  const bool non_finite = blk.any(bad);  // the reductions also order the work row's writes before its reads
  const float amax = blk.max(amax_local);
  const std::uint32_t candidates = blk.sum(candidates_local);
  if (amax == ninf) {  // nothing finite survived
    if (blk.thread() == 0) {
      out.token = 0;
      out.logprob = ninf;
      out.non_finite = non_finite ? 1 : 0;
      out.top_count = 0;
    }
    return;
  }
  row_context r{in.work, V, static_cast<double>(amax), 1.0};
  std::int32_t token = 0;
  double log_z = 0.0;

  if (p.temperature == 0.0f) {
    // 5. greedy: the first maximum; the logprobs need only float exponentials (summed exactly here).
    std::int64_t first = V;
    mass128 z{0, 0};
    for (std::int64_t t = blk.thread(); t < V; t += blk.threads()) {
      const float a = in.work[t];
      if (a == ninf) continue;
      if (a == amax && t < first) first = t;
      z = mass_add(z, mass_of(static_cast<double>(expf_nonpositive(fsub(a, amax)))));
    }
    token = static_cast<std::int32_t>(blk.min(first));
    log_z = log_of(mass_value(blk.sum(z)));
  } else {
    // 5. temperature: the weights exp((l - max) / T), recomputed by each pass from the work row.
    r.inv_t = ddiv(1.0, static_cast<double>(p.temperature));
    mass128 z_local{0, 0};
    for (std::int64_t t = blk.thread(); t < V; t += blk.threads()) {
      const float a = in.work[t];
      if (a != ninf) z_local = mass_add(z_local, mass_of(token_weight(a, r.m, r.inv_t)));
    }
    const mass128 z = blk.sum(z_local);
    log_z = log_of(mass_value(z));

    // 6. truncation: each rule keeps a prefix of (weight descending, id ascending), so what is kept
    // is the keys up to `bound`.
    const bool top_k_on = p.top_k > 0 && static_cast<std::uint32_t>(p.top_k) < candidates;
    const bool top_p_on = p.top_p < 1.0f;
    const bool min_p_on = p.min_p > 0.0f;
    key96 bound = key_last();
    radix_query q;
    q.kind = key_kind::weight;
    q.rank = 0;
    q.target = 0.0;
    if (top_k_on) {
      q.goal = radix_goal::rank;
      q.rank = static_cast<std::uint32_t>(p.top_k);
      q.bound = key_last();
      bound = radix_select(blk, sh, r, q).prefix;
    }
    if (top_p_on) {
      // The smallest prefix of the top-k whose mass reaches top_p of the top-k's (all if rounding
      // leaves the target past the total).
      const mass128 base = top_k_on ? mass_upto(blk, r, bound) : z;
      q.goal = radix_goal::mass_at_least;
      q.target = dmul(static_cast<double>(p.top_p), mass_value(base));
      q.bound = bound;
      const radix_state s = radix_select(blk, sh, r, q);
      if (s.found) bound = s.prefix;
    }
    if (min_p_on) bound = key_min(bound, weight_floor_key(static_cast<double>(p.min_p)));  // w >= min_p x 1

    // 7. the draw: the first kept token whose cumulative mass exceeds u x the kept mass.
    const bool all = bound.hi == key_last().hi && bound.lo == key_last().lo;
    const mass128 kept = all ? z : mass_upto(blk, r, bound);
    q.goal = radix_goal::mass_above;
    q.target = dmul(uniform_draw(p.seed, p.draw), mass_value(kept));
    q.bound = bound;
    token = static_cast<std::int32_t>(radix_select(blk, sh, r, q).prefix.lo);
  }

  const int n = p.top_logprobs < max_device_top_logprobs ? p.top_logprobs : max_device_top_logprobs;
  const std::uint32_t n_eff = n <= 0 ? 0u : (static_cast<std::uint32_t>(n) < candidates ? static_cast<std::uint32_t>(n) : candidates);
  if (n_eff > 0) report_top(blk, sh, r, n_eff, log_z, out);
  if (blk.thread() == 0) {
    out.token = token;
    out.logprob = static_cast<float>(token_logprob(in.work[token], r.m, r.inv_t, log_z));
    out.non_finite = non_finite ? 1 : 0;
    if (n_eff == 0) out.top_count = 0;
  }
}

// ---- the one-thread block the host runs ----------------------------------------------------------

struct serial_block {
  TROUPE_HD int thread() const { return 0; }
  TROUPE_HD int threads() const { return 1; }
  TROUPE_HD void sync() {}
  TROUPE_HD bool any(bool v) { return v; }
  TROUPE_HD float max(float v) { return v; }
  TROUPE_HD std::uint32_t sum(std::uint32_t v) { return v; }
  TROUPE_HD mass128 sum(mass128 v) { return v; }
  TROUPE_HD std::int64_t min(std::int64_t v) { return v; }
  TROUPE_HD std::uint32_t atomic_add(std::uint32_t* p, std::uint32_t v) {
    const std::uint32_t old = *p;
    *p = old + v;
    return old;
  }
  TROUPE_HD std::uint64_t atomic_add(std::uint64_t* p, std::uint64_t v) {
    const std::uint64_t old = *p;
    *p = old + v;
    return old;
  }
};

// The device's algorithm for one row, run serially on the host (the tests' view of the kernel).
inline device_sample_out emulate_sample_row(const sample_row_input& in) {
  serial_block blk;
  sample_shared sh{};
  device_sample_out out{};
  sample_row_run(blk, sh, in, out);
  return out;
}

}  // namespace troupe::exec::cuda::sampling

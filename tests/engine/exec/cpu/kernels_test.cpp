// The CPU kernels against the oracle, on every isa level this CPU runs (lower levels forced through the
// `level` argument), on random inputs of awkward sizes. Each tolerance is an error bound for f32
// arithmetic over the kernel's terms (u = 2^-24, the f32 unit roundoff), written next to its check.
#include "engine/exec/cpu/kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/graph/recurrent_math.hpp"
#include "engine/graph/builder.hpp"

namespace troupe::exec::cpu {
namespace {

using graph::builder;
using graph::op;
using graph::slot_kind;
using graph::value_id;

constexpr double u = 0x1p-24;
// Results below this may be flushed to zero: x / (1 + exp(-x)) is 0 once exp(-x) overflows (x < -88.7),
// where silu is still -88.7 e^-88.7 = -3e-37.
constexpr double tiny = 1e-36;
// The oracle's gelu_tanh, 0.5 x (1 + tanh(z)) in double, cancels for negative x: tanh(z) near -1 is
// off by up to 2 ulp of double, so the oracle is off by |x| 2^-53 (it gives 0 below x = -5.9).
double oracle_gelu_error(double x) { return std::fabs(x) * 0x1p-52; }

std::vector<isa> usable_levels() {
  std::vector<isa> out;
  for (const isa l : {isa::scalar, isa::avx2, isa::avx512})
    if (usable(l)) out.push_back(l);
  return out;
}

template <class T>
tensor make_tensor(dtype type, troupe::shape s, const std::vector<T>& xs) {
  tensor t(type, std::move(s));
  std::memcpy(t.data(), xs.data(), xs.size() * sizeof(T));
  return t;
}
tensor f32s(troupe::shape s, const std::vector<float>& xs) { return make_tensor(dtype::f32, std::move(s), xs); }
tensor i32s(troupe::shape s, const std::vector<std::int32_t>& xs) { return make_tensor(dtype::i32, std::move(s), xs); }
tensor bools(troupe::shape s, const std::vector<std::uint8_t>& xs) { return make_tensor(dtype::boolean, std::move(s), xs); }

// Evaluates a graph over slots named a, b, c... bound to `inputs` and returns its output "out".
std::vector<double> oracle(const std::vector<tensor>& inputs,
                           const std::function<value_id(builder&, const std::vector<value_id>&)>& body) {
  builder b;
  std::vector<value_id> ins;
  eval::eval_inputs in;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string name(1, static_cast<char>('a' + i));
    ins.push_back(b.slot(slot_kind::request_input, {inputs[i].type(), inputs[i].shape()}, name));
    in.slots.emplace(name, inputs[i].view());
  }
  b.output("out", body(b, ins));
  auto g = std::move(b).finish();
  EXPECT_TRUE(g) << g.error().message();
  if (!g) return {};
  auto ev = eval::evaluate(*g, in);
  EXPECT_TRUE(ev) << ev.error().message();
  if (!ev) return {};
  const tensor& t = ev->outputs.at("out");
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) out[i] = t.as<float>()[i];
  return out;
}

// Every element within its tolerance of the oracle (NaN and infinities must match exactly); reports
// the first few misses and the worst error relative to its tolerance.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w)) ok = g == w;
    else {
      const double err = std::fabs(g - w);
      ok = err <= tol[i];
      if (tol[i] > 0) worst = std::max(worst, err / tol[i]);
    }
    if (!ok && misses++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w << " (tolerance " << tol[i] << ")";
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements out of tolerance";
  ::testing::Test::RecordProperty(what + ".worst_error_over_tolerance", std::to_string(worst));
}

class kernels : public ::testing::TestWithParam<isa> {
 protected:
  isa level() const { return GetParam(); }
  std::string tag(const std::string& what) const { return what + " @" + std::string(isa_name(level())); }
  std::mt19937 rng_{20240611};
  std::vector<float> normal(std::size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> out(n);
    for (auto& x : out) x = d(rng_);
    return out;
  }
  std::vector<float> uniform(std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> out(n);
    for (auto& x : out) x = d(rng_);
    return out;
  }
};

// ---- attention ------------------------------------------------------------------------------------

enum class mask_kind { causal, window, random };

struct attention_case {
  const char* name;
  std::int64_t R, T, C, Hq, Hkv, D, Dv;
  mask_kind mask = mask_kind::causal;
  std::int64_t window = 0;           // keys (p - window, p] for the token at position p
  bool paged = false;                // index: a shuffled permutation of a cache larger than C
  float softcap = 0.0f;
  float sharpness = 1.0f;            // scale = sharpness / sqrt(D): larger makes the softmax peakier
  std::int64_t dead_token = -1;      // a query token (r T + t) with no allowed key
  std::int64_t dead_row = -1;        // a row with no allowed key at all
};

std::string case_name(const attention_case& c) { return c.name; }

const attention_case attention_cases[] = {
    // Qwen2.5-0.5B decode: 14 query heads over 2 kv heads, long context, paged; key ranges split.
    {"decode_qwen_paged", 1, 1, 1000, 14, 2, 64, 64, mask_kind::causal, 0, true},
    {"decode_qwen_long", 1, 1, 3000, 14, 2, 64, 64, mask_kind::causal, 0, false, 0.0f, 3.0f},
    // Group 7, head dim 128, sliding window, softcap.
    {"decode_group7_window_softcap", 1, 1, 777, 7, 1, 128, 128, mask_kind::window, 300, true, 30.0f},
    // Batched decode, group 1, head dim 80 (not a power of two), random masks, one row fully masked.
    {"decode_batch_mha_random", 3, 1, 517, 4, 4, 80, 80, mask_kind::random, 0, true, 0.0f, 1.0f, -1, 1},
    // Sixteen short rows (more tasks than threads: each thread fetches its next row's keys while it
    // computes the current one), about 80 random keys each (two tiles of 64), one row fully masked.
    {"decode_batch16_short_rows", 16, 1, 160, 9, 3, 64, 64, mask_kind::random, 0, true, 0.0f, 1.0f, -1, 5},
    // Prefill: causal from scratch, paged, group 7.
    {"prefill_causal_paged", 1, 37, 37, 14, 2, 64, 64, mask_kind::causal, 0, true},
    // Chunked prefill over a prefix, head dim 256, group 2, softcap, one token with nothing allowed.
    {"prefill_chunk_d256_softcap", 2, 20, 300, 8, 4, 256, 256, mask_kind::causal, 0, true, 50.0f, 1.0f, 3},
    // Sliding-window prefill, longer block.
    {"prefill_window", 1, 64, 200, 2, 1, 64, 64, mask_kind::window, 50, false, 0.0f, 2.0f},
    // Sizes of one and dims that are not a multiple of any vector width (tails everywhere).
    {"single_key", 1, 5, 1, 3, 1, 40, 24, mask_kind::causal},
    {"tiny_dims_group7", 2, 3, 17, 7, 1, 3, 5, mask_kind::random, 0, true},
    {"prefill_random_d80", 1, 9, 130, 6, 2, 80, 48, mask_kind::random, 0, true, 0.0f, 4.0f},
};

class attention_test : public ::testing::TestWithParam<std::tuple<isa, attention_case>> {};

TEST_P(attention_test, matches_oracle) {
  const auto [level, c] = GetParam();
  std::mt19937 rng(static_cast<std::uint32_t>(c.C * 131 + c.T * 7 + c.D));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t S = c.paged ? 2 * c.C + 3 : c.C, G = c.Hq / c.Hkv, N = c.R * c.T;
  auto fill = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = normal(rng);
    return v;
  };
  const auto q = fill(N * c.Hq * c.D), k = fill(S * c.Hkv * c.D), v = fill(S * c.Hkv * c.Dv);

  std::vector<std::uint8_t> allow(static_cast<std::size_t>(N * c.C));
  std::bernoulli_distribution coin(0.5);
  for (std::int64_t r = 0; r < c.R; ++r)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t j = 0; j < c.C; ++j) {
        const std::int64_t p = c.C - c.T + t;  // the token's position: the last T of the C keys
        bool ok = c.mask == mask_kind::random ? coin(rng) : j <= p;
        if (c.mask == mask_kind::window) ok = ok && j > p - c.window;
        if (r * c.T + t == c.dead_token || r == c.dead_row) ok = false;
        allow[(r * c.T + t) * c.C + j] = ok;
      }
  // Each row reads its own permutation of the cache; a key no token may read gets an index far out
  // of range, which the kernel must never follow.
  std::vector<std::int32_t> index(static_cast<std::size_t>(c.R * c.C));
  for (std::int64_t r = 0; r < c.R; ++r) {
    std::vector<std::int32_t> perm(static_cast<std::size_t>(S));
    std::iota(perm.begin(), perm.end(), 0);
    if (c.paged) std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t j = 0; j < c.C; ++j) {
      bool used = false;
      for (std::int64_t t = 0; t < c.T; ++t) used = used || allow[(r * c.T + t) * c.C + j];
      index[r * c.C + j] = used ? perm[j] : (1 << 30);
    }
  }

  const float scale = c.sharpness / std::sqrt(static_cast<float>(c.D));
  const auto want = oracle({f32s({N, c.Hq, c.D}, q), f32s({S, c.Hkv, c.D}, k), f32s({S, c.Hkv, c.Dv}, v),
                            i32s({c.R, c.C}, index), bools({c.R, c.T, c.C}, allow)},
                           [&](builder& b, const std::vector<value_id>& in) {
                             return b.attention(in[0], in[1], in[2], in[3], in[4], scale, c.softcap);
                           });
  ASSERT_FALSE(want.empty());

  // Tolerance per query: a score s_j = scale q.k_j is off by at most 2 D u A (D products and sums,
  // plus the rounding of q * scale), A = max_j scale sum_d |q_d k_jd|, and a softcap adds its tanh's
  // 4 u cap; softmax weights perturbed by ds move the output by at most 2 ds vmax. The weighted sums
  // over n allowed keys (numerator and denominator, with the per-tile rescales) add (2 n + 16) u vmax,
  // which also covers exp's 2 ulp. vmax is the largest |v| among the allowed keys.
  std::vector<double> tol(want.size(), 0.0);
  for (std::int64_t r = 0; r < c.R; ++r)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        const std::int64_t n_ = r * c.T + t, kh = h / G;
        double A = 0, vmax = 0;
        std::int64_t n = 0;
        for (std::int64_t j = 0; j < c.C; ++j) {
          if (!allow[n_ * c.C + j]) continue;
          const std::int64_t row = index[r * c.C + j];
          double dot = 0;
          for (std::int64_t d = 0; d < c.D; ++d) dot += std::fabs(q[(n_ * c.Hq + h) * c.D + d] * k[(row * c.Hkv + kh) * c.D + d]);
          A = std::max(A, scale * dot);
          for (std::int64_t d = 0; d < c.Dv; ++d) vmax = std::max<double>(vmax, std::fabs(v[(row * c.Hkv + kh) * c.Dv + d]));
          ++n;
        }
        const double bound = vmax * (4.0 * c.D * u * A + 8.0 * u * c.softcap + (2.0 * n + 16.0) * u);
        for (std::int64_t d = 0; d < c.Dv; ++d) tol[(n_ * c.Hq + h) * c.Dv + d] = bound;
      }

  for (const int threads : {1, 3}) {
    thread_pool pool(threads);
    std::vector<float> out(want.size(), std::numeric_limits<float>::quiet_NaN());
    attention_args a;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.index = index.data();
    a.allow = allow.data();
    a.out = out.data();
    a.R = c.R, a.T = c.T, a.C = c.C, a.Hq = c.Hq, a.Hkv = c.Hkv, a.D = c.D, a.Dv = c.Dv;
    a.scale = scale;
    a.softcap = c.softcap;
    attention(a, pool, level);
    expect_close(out, want, tol, std::string(c.name) + " @" + std::string(isa_name(level)) + " x" + std::to_string(threads));
  }
}

INSTANTIATE_TEST_SUITE_P(cases, attention_test,
                         ::testing::Combine(::testing::ValuesIn(usable_levels()), ::testing::ValuesIn(attention_cases)),
                         [](const auto& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" + case_name(std::get<1>(info.param));
                         });

// Latent attention's shared cache: the values are the first Dv dims of each key row (attrs.ints), the
// kernel reading them in place from the keys (a.v = a.k, a.Vw = D). Decode and a chunked prefill, one
// kv head for eight query heads, as DeepSeek runs absorbed.
TEST_P(kernels, attention_values_as_a_prefix_of_the_keys_match_oracle) {
  const isa level = GetParam();
  for (const auto& [R, T, C] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{2, 1, 300}, {1, 19, 40}}) {
    const std::int64_t Hq = 8, Hkv = 1, D = 72, Dv = 64, S = C + 5, N = R * T;
    std::mt19937 rng(static_cast<std::uint32_t>(R * 7 + T * 131 + C));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<std::size_t>(N * Hq * D)), k(static_cast<std::size_t>(S * Hkv * D));
    for (auto& x : q) x = normal(rng);
    for (auto& x : k) x = normal(rng);
    std::vector<std::uint8_t> allow(static_cast<std::size_t>(N * C));
    std::vector<std::int32_t> index(static_cast<std::size_t>(R * C));
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t j = 0; j < C; ++j) {
        index[r * C + j] = static_cast<std::int32_t>((j * 7 + r) % S);
        for (std::int64_t t = 0; t < T; ++t) allow[(r * T + t) * C + j] = j <= C - T + t;
      }
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const auto want = oracle({f32s({N, Hq, D}, q), f32s({S, Hkv, D}, k), i32s({R, C}, index), bools({R, T, C}, allow)},
                             [&](builder& b, const std::vector<value_id>& in) {
                               return b.attention(in[0], in[1], in[1], in[2], in[3], scale, 0.0, {}, Dv);
                             });
    ASSERT_EQ(want.size(), static_cast<std::size_t>(N * Hq * Dv));
    // Every |k| entry is a few units; the output is a convex combination of value rows.
    const std::vector<double> tol(want.size(), 2e-5 * 5.0 * static_cast<double>(D));
    thread_pool pool(2);
    std::vector<float> out(want.size(), std::numeric_limits<float>::quiet_NaN());
    attention_args a;
    a.q = q.data();
    a.k = k.data();
    a.v = k.data();
    a.index = index.data();
    a.allow = allow.data();
    a.out = out.data();
    a.R = R, a.T = T, a.C = C, a.Hq = Hq, a.Hkv = Hkv, a.D = D, a.Dv = Dv, a.Vw = D;
    a.scale = scale;
    attention(a, pool, level);
    expect_close(out, want, tol, "value prefix R" + std::to_string(R) + " T" + std::to_string(T) + " @" + std::string(isa_name(level)));
  }
}

// n draws of N(0, 1).
std::vector<float> draws(std::mt19937& rng, std::int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

// x as rows of `row` values in a KV cache of type t: the bytes the kernel reads, and their values.
std::pair<std::vector<std::byte>, std::vector<float>> stored(dtype t, const std::vector<float>& x, std::int64_t row) {
  std::vector<std::byte> bytes(*storage_bytes(t, x.size()));
  if (t == dtype::f32) {
    std::memcpy(bytes.data(), x.data(), bytes.size());
    return {bytes, x};
  }
  std::vector<float> back(x.size());
  const auto rb = *storage_bytes(t, static_cast<std::uint64_t>(row));
  for (std::size_t r = 0; r * row < x.size(); ++r) {
    EXPECT_TRUE(quantize_row(t, x.data() + r * row, bytes.data() + r * rb, row));
    EXPECT_TRUE(dequantize_row(t, bytes.data() + r * rb, back.data() + r * row, row));
  }
  return {bytes, back};
}

// A KV cache stored as f16, bf16 or q8_0 (an f16 scale per 32 values of a head): the kernel decodes the
// keys and values in registers; the oracle casts the same f32 rows to the type (the same rounding) and
// reads them back. Decode over a long paged cache, a batch of rows, a chunked prefill with head dim 96,
// and latent attention's values as a prefix of the keys. The tolerance is the f32 kernel's bound over
// the decoded values: storage changes what is read, not how it is summed.
TEST_P(kernels, attention_over_stored_kv_types_matches_oracle) {
  const isa level = GetParam();
  struct shape_case {
    std::int64_t R, T, C, Hq, Hkv, D, Dv;
    bool prefix;  // v = k's first Dv dims
  };
  for (const dtype t : {dtype::f16, dtype::bf16, dtype::q8_0})
    for (const auto& c : {shape_case{1, 1, 700, 14, 2, 64, 64, false}, shape_case{3, 1, 300, 8, 8, 128, 128, false},
                          shape_case{2, 20, 150, 8, 4, 96, 96, false}, shape_case{1, 7, 90, 8, 1, 96, 64, true}}) {
      const std::int64_t S = c.C + 9, N = c.R * c.T, Vw = c.prefix ? c.D : c.Dv, G = c.Hq / c.Hkv;
      std::mt19937 rng(static_cast<std::uint32_t>(c.C * 31 + c.D + static_cast<int>(t)));
      const auto q = draws(rng, N * c.Hq * c.D), k = draws(rng, S * c.Hkv * c.D), v = c.prefix ? k : draws(rng, S * c.Hkv * c.Dv);
      // The stored bytes the kernel reads, and their values (for the bound).
      const auto [kb, kd] = stored(t, k, c.D);
      const auto [vb, vd] = stored(t, v, Vw);
      std::vector<std::uint8_t> allow(static_cast<std::size_t>(N * c.C));
      std::vector<std::int32_t> index(static_cast<std::size_t>(c.R * c.C));
      for (std::int64_t r = 0; r < c.R; ++r)
        for (std::int64_t j = 0; j < c.C; ++j) {
          index[r * c.C + j] = static_cast<std::int32_t>((j * 13 + r * 5) % S);
          for (std::int64_t tt = 0; tt < c.T; ++tt) allow[(r * c.T + tt) * c.C + j] = j <= c.C - c.T + tt && (c.R < 3 || (j + r) % 3 != 0);
        }
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
      const std::int64_t vdims = c.prefix ? c.Dv : 0;
      std::vector<tensor> ins{f32s({N, c.Hq, c.D}, q), f32s({S, c.Hkv, c.D}, k)};
      if (!c.prefix) ins.push_back(f32s({S, c.Hkv, c.Dv}, v));
      ins.push_back(i32s({c.R, c.C}, index));
      ins.push_back(bools({c.R, c.T, c.C}, allow));
      const auto want = oracle(ins, [&](builder& b, const std::vector<value_id>& in) {
        const auto ks = b.cast(in[1], t);
        const auto vs = c.prefix ? ks : b.cast(in[2], t);
        const std::size_t at = c.prefix ? 2 : 3;
        return b.attention(in[0], ks, vs, in[at], in[at + 1], scale, 0.0, {}, vdims);
      });
      ASSERT_FALSE(want.empty());
      std::vector<double> tol(want.size());
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < c.Hq; ++h) {
          const std::int64_t r = n / c.T, kh = h / G;
          double A = 0, vmax = 0, cnt = 0;
          for (std::int64_t j = 0; j < c.C; ++j) {
            if (!allow[n * c.C + j]) continue;
            const std::int64_t row = index[r * c.C + j];
            double dot = 0;
            for (std::int64_t d = 0; d < c.D; ++d) dot += std::fabs(q[(n * c.Hq + h) * c.D + d] * kd[(row * c.Hkv + kh) * c.D + d]);
            A = std::max(A, scale * dot);
            for (std::int64_t d = 0; d < c.Dv; ++d) vmax = std::max<double>(vmax, std::fabs(vd[(row * c.Hkv + kh) * Vw + d]));
            ++cnt;
          }
          for (std::int64_t d = 0; d < c.Dv; ++d) tol[(n * c.Hq + h) * c.Dv + d] = vmax * (4.0 * c.D * u * A + (2.0 * cnt + 16.0) * u);
        }
      thread_pool pool(2);
      std::vector<float> out(want.size(), std::numeric_limits<float>::quiet_NaN());
      attention_args a;
      a.q = q.data();
      a.k = kb.data();
      a.v = c.prefix ? kb.data() : vb.data();
      a.kv = t == dtype::f16 ? kv_elem::f16 : t == dtype::bf16 ? kv_elem::bf16 : kv_elem::q8_0;
      a.index = index.data();
      a.allow = allow.data();
      a.out = out.data();
      a.R = c.R, a.T = c.T, a.C = c.C, a.Hq = c.Hq, a.Hkv = c.Hkv, a.D = c.D, a.Dv = c.Dv, a.Vw = c.prefix ? c.D : 0;
      a.scale = scale;
      attention(a, pool, level);
      expect_close(out, want, tol,
                   tag(std::string(troupe::name(t)) + " R" + std::to_string(c.R) + " T" + std::to_string(c.T) + " D" + std::to_string(c.D)));
    }
}

// A verify window's tokens (attention_args::per_token) run as one task a kv head that reads the keys
// once for the whole window, and each token must still be the bits it is as a decode token of its own
// (a step of one token over the same capacity): with splits merged (C past 256), holes in the read
// map, every stored type, sinks, ALiBi, a softcap, values as a prefix of the keys, one and two
// threads, and a sliding window that moves inside the window (whose tokens' keys are not prefixes of
// each other: they run one after the other).
TEST_P(kernels, a_verify_windows_tokens_are_decode_tokens_bit_for_bit) {
  const isa level = GetParam();
  struct window_case {
    std::int64_t R, T, C, Hq, Hkv, D, Dv;
    bool prefix = false, sinks = false, alibi = false, softcap = false;
    std::int64_t slide = 0;  // > 0: token t reads only its last `slide` positions
  };
  const window_case cases[] = {
      {2, 5, 1100, 8, 2, 64, 64},
      {1, 9, 300, 14, 2, 64, 64, false, true},
      {2, 3, 200, 6, 3, 32, 32, false, false, true},
      {1, 5, 90, 4, 4, 80, 80, false, false, false, true},
      {1, 4, 130, 8, 1, 96, 64, true},
      {2, 5, 120, 4, 2, 64, 64, false, false, false, false, 40},
  };
  for (const dtype t : {dtype::f32, dtype::f16, dtype::q8_0})
    for (const auto& c : cases)
      for (const int threads : {1, 2}) {
        if (t == dtype::q8_0 && (c.D % 32 != 0 || c.Dv % 32 != 0)) continue;  // q8_0 rows are whole blocks
        const std::int64_t S = c.C + 11, N = c.R * c.T, Vw = c.prefix ? c.D : c.Dv;
        std::mt19937 rng(static_cast<std::uint32_t>(c.C * 7 + c.T + static_cast<int>(t)));
        const auto q = draws(rng, N * c.Hq * c.D), k = draws(rng, S * c.Hkv * c.D), v = c.prefix ? k : draws(rng, S * c.Hkv * c.Dv);
        const auto kb = stored(t, k, c.D).first;
        const auto vb = stored(t, v, Vw).first;
        std::vector<std::uint8_t> allow(static_cast<std::size_t>(N * c.C));
        std::vector<std::int32_t> index(static_cast<std::size_t>(c.R * c.C));
        std::vector<float> dist(static_cast<std::size_t>(N * c.C));
        for (std::int64_t r = 0; r < c.R; ++r)
          for (std::int64_t j = 0; j < c.C; ++j) {
            index[r * c.C + j] = static_cast<std::int32_t>((j * 17 + r * 3) % S);
            for (std::int64_t tt = 0; tt < c.T; ++tt) {
              const std::int64_t pos = c.C - c.T + tt;  // the token's own position: the window is the last T
              const bool hole = r == 1 && j % 7 == 3;
              const bool in = j <= pos && (c.slide == 0 || j > pos - c.slide);
              allow[(r * c.T + tt) * c.C + j] = in && !hole;
              dist[(r * c.T + tt) * c.C + j] = static_cast<float>(j - pos);
            }
          }
        const auto sinks = draws(rng, c.Hq);
        std::vector<float> slopes(static_cast<std::size_t>(c.Hq));
        for (std::int64_t h = 0; h < c.Hq; ++h) slopes[h] = std::pow(2.0f, -static_cast<float>(h + 1));
        thread_pool pool(threads);
        attention_args a;
        a.k = kb.data();
        a.v = c.prefix ? kb.data() : vb.data();
        a.kv = t == dtype::f32 ? kv_elem::f32 : t == dtype::f16 ? kv_elem::f16 : kv_elem::q8_0;
        a.Hq = c.Hq, a.Hkv = c.Hkv, a.D = c.D, a.Dv = c.Dv, a.Vw = c.prefix ? c.D : 0, a.C = c.C;
        a.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
        if (c.softcap) a.softcap = 3.0f;
        if (c.sinks) a.sinks = sinks.data();
        if (c.alibi) a.alibi_slopes = slopes.data();
        std::vector<float> window(static_cast<std::size_t>(N * c.Hq * c.Dv), std::numeric_limits<float>::quiet_NaN());
        attention_args w = a;
        w.q = q.data(), w.index = index.data(), w.allow = allow.data(), w.out = window.data();
        w.alibi_dist = c.alibi ? dist.data() : nullptr;
        w.R = c.R, w.T = c.T, w.per_token = true;
        attention(w, pool, level);
        const std::string what = tag(std::string(troupe::name(t)) + " R" + std::to_string(c.R) + " T" + std::to_string(c.T) + " C" +
                                     std::to_string(c.C) + " threads " + std::to_string(threads));
        for (std::int64_t n = 0; n < N; ++n) {
          std::vector<float> one(static_cast<std::size_t>(c.Hq * c.Dv), std::numeric_limits<float>::quiet_NaN());
          attention_args d = a;
          d.q = q.data() + n * c.Hq * c.D;
          d.index = index.data() + n / c.T * c.C;
          d.allow = allow.data() + n * c.C;
          d.alibi_dist = c.alibi ? dist.data() + n * c.C : nullptr;
          d.out = one.data();
          d.R = 1, d.T = 1;
          attention(d, pool, level);
          for (std::int64_t e = 0; e < c.Hq * c.Dv; ++e)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(window[n * c.Hq * c.Dv + e]), std::bit_cast<std::uint32_t>(one[e]))
                << what << ": token " << n << " element " << e << " " << window[n * c.Hq * c.Dv + e] << " vs " << one[e];
        }
      }
}

// A kv head's query heads share its keys' loads (AVX2 scores two or three of them at once), and each
// still gets the bits it would get alone: decode over G query heads a kv head equals, bit for bit, decode
// over the same queries with the kv heads copied so that each query head has its own; and on one thread
// (a task over every kv head) what it gets on two (a task a kv head, when one row has under 512 keys).
TEST_P(kernels, a_kv_heads_queries_get_the_bits_they_would_get_alone) {
  const isa level = GetParam();
  struct group_case {
    std::int64_t C, Hkv, G, D;
    bool softcap = false, alibi = false;
  };
  const group_case cases[] = {
      {700, 2, 7, 64}, {300, 2, 2, 64}, {300, 1, 3, 128}, {520, 2, 4, 64, true}, {260, 2, 5, 32, false, true},
      {300, 1, 6, 64}, {300, 2, 8, 96}, {200, 2, 3, 80}, {150, 1, 4, 36},
  };
  for (const dtype t : {dtype::f32, dtype::f16, dtype::q8_0})
    for (const auto& c : cases) {
      std::vector<float> one_thread;  // threads 1 (one task over every kv head) against 2 (a task a kv head under 512 keys)
      for (const int threads : {1, 2}) {
        if (t == dtype::q8_0 && c.D % 32 != 0) continue;  // q8_0 rows are whole blocks
        const std::int64_t S = c.C + 5, Hq = c.Hkv * c.G;
        std::mt19937 rng(static_cast<std::uint32_t>(c.C * 13 + c.G + static_cast<int>(t)));
        const auto q = draws(rng, Hq * c.D), k = draws(rng, S * c.Hkv * c.D), v = draws(rng, S * c.Hkv * c.D);
        // The copies: query head h reads kv head h / G of the same row.
        std::vector<float> k1(static_cast<std::size_t>(S * Hq * c.D)), v1(k1.size());
        for (std::int64_t r = 0; r < S; ++r)
          for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t d = 0; d < c.D; ++d) {
              k1[(r * Hq + h) * c.D + d] = k[(r * c.Hkv + h / c.G) * c.D + d];
              v1[(r * Hq + h) * c.D + d] = v[(r * c.Hkv + h / c.G) * c.D + d];
            }
        const auto kb = stored(t, k, c.D).first, vb = stored(t, v, c.D).first;
        const auto kb1 = stored(t, k1, c.D).first, vb1 = stored(t, v1, c.D).first;
        std::vector<std::int32_t> index(static_cast<std::size_t>(c.C));
        std::vector<std::uint8_t> allow(static_cast<std::size_t>(c.C));
        std::vector<float> dist(static_cast<std::size_t>(c.C));
        for (std::int64_t j = 0; j < c.C; ++j) {
          index[j] = static_cast<std::int32_t>((j * 7 + 2) % S);
          allow[j] = j % 11 != 4;
          dist[j] = static_cast<float>(j - c.C);
        }
        std::vector<float> slopes(static_cast<std::size_t>(Hq));
        for (std::int64_t h = 0; h < Hq; ++h) slopes[h] = std::pow(2.0f, -0.5f * static_cast<float>(h + 1));
        thread_pool pool(threads);
        attention_args a;
        a.q = q.data(), a.index = index.data(), a.allow = allow.data();
        a.kv = t == dtype::f32 ? kv_elem::f32 : t == dtype::f16 ? kv_elem::f16 : kv_elem::q8_0;
        a.R = 1, a.T = 1, a.C = c.C, a.Hq = Hq, a.D = c.D, a.Dv = c.D;
        a.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
        if (c.softcap) a.softcap = 2.5f;
        if (c.alibi) a.alibi_slopes = slopes.data(), a.alibi_dist = dist.data();
        std::vector<float> shared(static_cast<std::size_t>(Hq * c.D), std::numeric_limits<float>::quiet_NaN()), alone(shared);
        attention_args g = a;
        g.k = kb.data(), g.v = vb.data(), g.Hkv = c.Hkv, g.out = shared.data();
        attention(g, pool, level);
        attention_args m = a;
        m.k = kb1.data(), m.v = vb1.data(), m.Hkv = Hq, m.out = alone.data();
        attention(m, pool, level);
        const std::string what = tag(std::string(troupe::name(t)) + " C" + std::to_string(c.C) + " G" + std::to_string(c.G) + " D" +
                                     std::to_string(c.D) + " threads " + std::to_string(threads));
        for (std::size_t e = 0; e < shared.size(); ++e)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(shared[e]), std::bit_cast<std::uint32_t>(alone[e]))
              << what << ": element " << e << " " << shared[e] << " vs " << alone[e];
        if (threads == 1) one_thread = shared;
        else
          for (std::size_t e = 0; e < shared.size(); ++e)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(shared[e]), std::bit_cast<std::uint32_t>(one_thread[e]))
                << what << ": element " << e << " differs from one thread's";
      }
    }
}

TEST_P(kernels, to_f16_rounds_as_core_does) {
  auto x = normal(1000, 3.0f);
  x[3] = 65520.0f;   // rounds up to infinity
  x[4] = 6e-8f;      // a subnormal f16
  x[5] = -0.0f;
  std::vector<std::uint16_t> y(x.size());
  to_f16(x.data(), static_cast<std::int64_t>(x.size()), y.data(), level());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], f32_to_f16(x[i])) << tag("to_f16") << " at " << i << " of " << x[i];
}

// ---- norms ----------------------------------------------------------------------------------------

TEST_P(kernels, rms_norm_matches_oracle) {
  for (const std::int64_t n : {1, 7, 64, 100, 896, 4099}) {
    const std::int64_t rows = n > 1000 ? 2 : 5;
    auto x = normal(static_cast<std::size_t>(rows * n), 3.0f);
    const auto w = normal(static_cast<std::size_t>(n));
    const float eps = 1e-6f;
    const auto want = oracle({f32s({rows, n}, x), f32s({n}, w)},
                             [&](builder& b, const std::vector<value_id>& in) { return b.rms_norm(in[0], in[1], eps); });
    // The sum of squares carries n u relative error (halved by the square root); the scale and the two
    // products add 8 u.
    std::vector<double> tol(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) tol[i] = (n / 2.0 + 8.0) * u * std::fabs(want[i]) + tiny;
    std::vector<float> y(x.size());
    rms_norm(x.data(), w.data(), rows, n, eps, y.data(), level());
    expect_close(y, want, tol, tag("rms_norm n=" + std::to_string(n)));
    rms_norm(x.data(), w.data(), rows, n, eps, x.data(), level());  // in place
    expect_close(x, want, tol, tag("rms_norm in place n=" + std::to_string(n)));
  }
}

TEST_P(kernels, layer_norm_matches_oracle) {
  for (const std::int64_t n : {1, 7, 64, 100, 896, 4099}) {
    const std::int64_t rows = n > 1000 ? 2 : 5;
    auto x = normal(static_cast<std::size_t>(rows * n), 2.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += 5.0f;  // an offset the centring must remove
    const auto w = normal(static_cast<std::size_t>(n)), b = normal(static_cast<std::size_t>(n));
    const float eps = 1e-5f;
    const auto want = oracle({f32s({rows, n}, x), f32s({n}, w), f32s({n}, b)}, [&](builder& g, const std::vector<value_id>& in) {
      return g.layer_norm(in[0], in[1], in[2], eps);
    });
    // The mean is off by n u mean|x|; each centred value by that plus u |x - mean|; the variance by
    // n u relative (halved by the root); the final multiply-add by 2 u.
    std::vector<double> tol(want.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      double mean = 0, abs_mean = 0, var = 0;
      for (std::int64_t i = 0; i < n; ++i) mean += x[r * n + i], abs_mean += std::fabs(x[r * n + i]);
      mean /= n, abs_mean /= n;
      for (std::int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
      const double inv = 1.0 / std::sqrt(var / n + eps);
      for (std::int64_t i = 0; i < n; ++i) {
        const double centred = std::fabs(x[r * n + i] - mean);
        const double wi = std::fabs(w[i]);
        tol[r * n + i] = wi * inv * (n * u * abs_mean + 2 * u * centred) + wi * centred * inv * (n / 2.0 + 8.0) * u +
                         2 * u * std::fabs(want[r * n + i]) + tiny;
      }
    }
    std::vector<float> y(x.size());
    layer_norm(x.data(), w.data(), b.data(), rows, n, eps, y.data(), level());
    expect_close(y, want, tol, tag("layer_norm n=" + std::to_string(n)));
  }
}

// ---- rope -----------------------------------------------------------------------------------------

TEST_P(kernels, rope_matches_oracle) {
  struct shape_case { std::int64_t T, H, D, half; bool neox; float scale; };
  const shape_case cases[] = {
      {1, 14, 64, 32, true, 1.0f},    {7, 2, 64, 32, false, 1.0f},  {5, 3, 80, 40, true, 1.0f},
      {3, 5, 128, 16, true, 0.75f},   // partial rotary, scaled
      {4, 1, 80, 10, false, 1.25f},  {2, 4, 6, 3, false, 1.0f},   {1, 1, 2, 1, true, 1.0f},
      {3, 2, 1024, 512, true, 1.0f},  // more pairs than one table block
  };
  for (const auto& sc : cases) {
    auto x = normal(static_cast<std::size_t>(sc.T * sc.H * sc.D));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(sc.T));
    std::uniform_int_distribution<std::int32_t> pd(0, 200000);  // positions far out, where f32 angles fail
    for (auto& p : pos) p = pd(rng_);
    pos[0] = 0;
    std::vector<float> inv(static_cast<std::size_t>(sc.half));
    for (std::int64_t i = 0; i < sc.half; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / (2 * sc.half)));
    const auto want = oracle({f32s({sc.T, sc.H, sc.D}, x), i32s({sc.T}, pos), f32s({sc.half}, inv)},
                             [&](builder& b, const std::vector<value_id>& in) { return b.rope(in[0], in[1], in[2], sc.neox, sc.scale); });
    // Each output is x0 c - x1 s: cos and sin rounded to f32 (u each), scaled (u), two products and
    // a sum: 4 u scale (|x0| + |x1|) at most.
    std::vector<double> tol(want.size());
    for (std::int64_t t = 0; t < sc.T; ++t)
      for (std::int64_t h = 0; h < sc.H; ++h)
        for (std::int64_t d = 0; d < sc.D; ++d) {
          const std::int64_t base = (t * sc.H + h) * sc.D;
          std::int64_t mate = d;
          if (d < 2 * sc.half) mate = sc.neox ? (d < sc.half ? d + sc.half : d - sc.half) : (d ^ 1);
          tol[base + d] = d < 2 * sc.half ? 4 * u * sc.scale * (std::fabs(x[base + d]) + std::fabs(x[base + mate])) : 0.0;
        }
    rope(x.data(), sc.T, sc.H, sc.D, pos.data(), inv.data(), sc.half, sc.neox, sc.scale, level());
    expect_close(x, want, tol, tag("rope D=" + std::to_string(sc.D) + " half=" + std::to_string(sc.half) + (sc.neox ? " neox" : " interleaved")));
  }
}

// ---- softmax --------------------------------------------------------------------------------------

TEST_P(kernels, softmax_rows_match_oracle) {
  for (const std::int64_t n : {1, 3, 16, 17, 100, 1000, 32003}) {
    const std::int64_t rows = n > 10000 ? 1 : 4;
    auto x = normal(static_cast<std::size_t>(rows * n), 6.0f);
    x[0] += 80.0f;  // far from zero: the max must be subtracted first
    for (const bool log : {false, true}) {
      const auto want = oracle({f32s({rows, n}, x)}, [&](builder& b, const std::vector<value_id>& in) {
        return log ? b.log_softmax(in[0]) : b.softmax(in[0]);
      });
      std::vector<double> tol(want.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, spread = 0;
        for (std::int64_t i = 0; i < n; ++i) m = std::max<double>(m, x[r * n + i]);
        for (std::int64_t i = 0; i < n; ++i) spread = std::max(spread, m - x[r * n + i]);
        double s = 0;
        for (std::int64_t i = 0; i < n; ++i) s += std::exp(x[r * n + i] - m);
        for (std::int64_t i = 0; i < n; ++i) {
          const double xi = x[r * n + i];
          // softmax: x - m is rounded (u |x - m| relative in the exponential), exp adds 2 ulp, the sum
          // n u, the reciprocal and product 2 u. log_softmax: x - (m + log s) rounds twice at the
          // magnitudes involved, and log s inherits the sum's relative error as an absolute one.
          tol[r * n + i] = log ? u * (2 * std::fabs(xi) + 2 * (std::fabs(m) + std::log(s)) + spread + n + 8)
                               : std::fabs(want[r * n + i]) * u * (std::fabs(xi - m) + n + 8) + tiny;
        }
      }
      std::vector<float> y(x.size());
      softmax_rows(x.data(), rows, n, log, y.data(), level());
      expect_close(y, want, tol, tag(std::string(log ? "log_softmax" : "softmax") + " n=" + std::to_string(n)));
      auto z = x;
      softmax_rows(z.data(), rows, n, log, z.data(), level());  // in place
      expect_close(z, want, tol, tag(std::string(log ? "log_softmax" : "softmax") + " in place n=" + std::to_string(n)));
    }
  }
}

// ---- elementwise ----------------------------------------------------------------------------------

struct unary_case {
  unary_kind kind;
  op code;
  float lo, hi;  // the random inputs' range
  // Relative tolerance in units of u at input x (exact ops: the oracle rounds once, so does the kernel).
  double (*rel)(double x);
};

const unary_case unary_cases[] = {
    {unary_kind::neg, op::neg, -1e3f, 1e3f, [](double) { return 0.0; }},
    {unary_kind::abs, op::abs, -1e3f, 1e3f, [](double) { return 0.0; }},
    // Vector exp: Cephes, 2 ulp (4 u).
    {unary_kind::exp, op::exp, -110.0f, 95.0f, [](double) { return 4.0; }},
    {unary_kind::log, op::log, 0.0f, 1e4f, [](double) { return 4.0; }},
    {unary_kind::sqrt, op::sqrt, 0.0f, 1e6f, [](double) { return 1.0; }},
    // sqrt then divide: two roundings, and the oracle rounds its own result once.
    {unary_kind::rsqrt, op::rsqrt, 1e-6f, 1e6f, [](double) { return 3.0; }},
    {unary_kind::recip, op::recip, -1e3f, 1e3f, [](double) { return 1.0; }},
    // tanh: odd polynomial near 0, 1 - 2 / (exp(2|x|) + 1) beyond: 4 ulp (8 u).
    {unary_kind::tanh, op::tanh, -12.0f, 12.0f, [](double) { return 8.0; }},
    // erf: the Eigen / XLA rational approximation, 2e-7 absolute (3.4 u), which stays below 8 u relative.
    {unary_kind::erf, op::erf, -5.0f, 5.0f, [](double) { return 8.0; }},
    // x / (1 + exp(-z)): exp's 4 u, the sum and the quotient 2 u, and the rounding of z itself moves
    // the result by u |z| relative where exp(-z) dominates.
    {unary_kind::sigmoid, op::sigmoid, -100.0f, 100.0f, [](double x) { return 8.0 + std::fabs(x); }},
    {unary_kind::silu, op::silu, -100.0f, 100.0f, [](double x) { return 8.0 + std::fabs(x); }},
    // gelu_tanh: z = 2 sqrt(2/pi) (x + 0.044715 x^3) takes 4 roundings: 4 u |z| relative.
    {unary_kind::gelu_tanh, op::gelu_tanh, -12.0f, 12.0f,
     [](double x) { return 8.0 + 4.0 * std::fabs(1.5957691216 * (x + 0.044715 * x * x * x)); }},
};

std::string unary_name(unary_kind k) {
  static const char* names[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "tanh", "erf", "sigmoid", "silu", "gelu_tanh"};
  return names[static_cast<int>(k)];
}

TEST_P(kernels, unary_matches_oracle) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& uc : unary_cases) {
    for (const std::int64_t n : {1, 5, 16, 1001}) {
      auto x = uniform(static_cast<std::size_t>(n), uc.lo, uc.hi);
      if (n > 100) {
        // Small magnitudes (the polynomial branches), denormals and specials.
        const float extra[] = {0.0f, -0.0f, 1e-5f, -3e-4f, 0.6f, -0.65f, 1e-40f, 1.0f, inf, -inf, std::nanf("")};
        for (std::size_t i = 0; i < std::size(extra); ++i) x[i * 7] = extra[i];
        for (std::int64_t i = 100; i < 200; ++i) x[i] = std::ldexp(x[i], -20);
      }
      if (uc.kind == unary_kind::log)
        for (std::int64_t i = 200; i < std::min<std::int64_t>(n, 400); ++i) x[i] = std::exp(static_cast<float>(i - 300) * 0.4f);
      const auto want = oracle({f32s({n}, x)}, [&](builder& b, const std::vector<value_id>& in) { return b.unary(uc.code, in[0]); });
      std::vector<double> tol(want.size());
      for (std::size_t i = 0; i < tol.size(); ++i) {
        if (!std::isfinite(x[i])) continue;  // infinite and NaN inputs have exact results
        tol[i] = uc.rel(x[i]) * u * std::fabs(want[i]) + tiny;
        if (uc.kind == unary_kind::gelu_tanh) tol[i] += oracle_gelu_error(x[i]);
      }
      std::vector<float> y(x.size());
      unary(uc.kind, x.data(), n, y.data(), level());
      expect_close(y, want, tol, tag(unary_name(uc.kind) + " n=" + std::to_string(n)));
    }
  }
}

TEST_P(kernels, gated_matches_oracle) {
  for (const auto& act : {std::pair{unary_kind::silu, op::silu}, std::pair{unary_kind::gelu_tanh, op::gelu_tanh},
                         std::pair{unary_kind::tanh, op::tanh}}) {
    for (const std::int64_t n : {1, 9, 4864}) {
      const auto g = uniform(static_cast<std::size_t>(n), -10.0f, 10.0f), up = normal(static_cast<std::size_t>(n));
      const auto want = oracle({f32s({n}, g), f32s({n}, up)}, [&](builder& b, const std::vector<value_id>& in) {
        return b.mul(b.unary(act.second, in[0]), in[1]);
      });
      // The activation's bound (as in unary_matches_oracle, at most 8 u + 4 u |z|) plus the product
      // and the oracle's own rounding of the activation: 2 u.
      std::vector<double> tol(want.size());
      for (std::int64_t i = 0; i < n; ++i) {
        const double z = 1.5957691216 * (g[i] + 0.044715 * g[i] * g[i] * g[i]);
        tol[i] = (10.0 + 4.0 * std::max<double>(std::fabs(z), std::fabs(g[i]))) * u * std::fabs(want[i]) + tiny;
        if (act.first == unary_kind::gelu_tanh) tol[i] += oracle_gelu_error(g[i]) * std::fabs(up[i]);
      }
      std::vector<float> y(static_cast<std::size_t>(n));
      gated(act.first, g.data(), up.data(), n, y.data(), level());
      expect_close(y, want, tol, tag("gated " + unary_name(act.first) + " n=" + std::to_string(n)));
    }
  }
}

// A level the CPU lacks falls back to the best one it has, rather than faulting.
TEST(kernels_dispatch, unusable_level_falls_back) {
  const std::vector<float> x = {-1.0f, 0.0f, 2.0f};
  std::vector<float> y(3);
  unary(unary_kind::exp, x.data(), 3, y.data(), isa::avx512);
  EXPECT_NEAR(y[0], std::exp(-1.0), 1e-6);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_NEAR(y[2], std::exp(2.0), 1e-5);
}

// ---- recurrent mixers -----------------------------------------------------------------------------

// The vector scan and delta rule against their meaning (recurrent_math.hpp) in double, on widths with
// and without a vector tail, a padding token in the middle, from a carried state and from zeros.
TEST_P(kernels, recurrent_heads_match_the_double_recurrence) {
  for (const std::int64_t width : {16, 37}) {
    for (const bool carried : {false, true}) {
      const std::int64_t T = 5, H = 4, G = 2, P = 6, N = width;  // P: a block of four state rows and two alone
      const std::vector<std::int32_t> write = {0, 1, -1, 2, 3};
      auto x = normal(T * H * P), dt = normal(T * H), A = uniform(H, -2.0f, -0.1f), B = normal(T * G * N, 0.3f), C = normal(T * G * N, 0.3f);
      auto st = normal(H * P * N);
      std::vector<float> out(T * H * P + H * P * N);
      ssm_scan_heads({x.data(), dt.data(), A.data(), B.data(), C.data(), carried ? st.data() : nullptr, write.data(), T, H, P, G, N, out.data()}, 0, H,
                     level());
      auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
      const auto xd = d(x), dtd = d(dt), Ad = d(A), Bd = d(B), Cd = d(C), sd = d(st);
      std::vector<double> want(out.size());
      graph::recurrent::ssm_scan_row<double>(xd.data(), dtd.data(), Ad.data(), Bd.data(), Cd.data(), carried ? sd.data() : nullptr, write.data(), T,
                                             H, P, G, N, want.data(), 0, H);
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-5 * (1.0 + std::fabs(want[i]))) << tag("scan") << " at " << i;

      const std::int64_t Hk = 2, Hv = 4, Dk = width, Dv = 6;
      auto q = normal(T * Hk * Dk, 0.2f), k = normal(T * Hk * Dk, 0.2f), v = normal(T * Hv * Dv), g = uniform(T * Hv, -2.0f, 0.0f),
           beta = uniform(T * Hv, 0.0f, 1.0f), s2 = normal(Hv * Dv * Dk);
      std::vector<float> o(T * Hv * Dv + Hv * Dv * Dk);
      delta_rule_heads({q.data(), k.data(), v.data(), g.data(), beta.data(), carried ? s2.data() : nullptr, write.data(), T, Hk, Dk, Hv, Dv, o.data()},
                       0, Hv, level());
      const auto qd = d(q), kd = d(k), vd = d(v), gd = d(g), bd = d(beta), s2d = d(s2);
      std::vector<double> want2(o.size());
      graph::recurrent::delta_rule_row<double>(qd.data(), kd.data(), vd.data(), gd.data(), bd.data(), carried ? s2d.data() : nullptr, write.data(), T,
                                               Hk, Dk, Hv, Dv, want2.data(), 0, Hv);
      for (std::size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], want2[i], 2e-5 * (1.0 + std::fabs(want2[i]))) << tag("delta rule") << " at " << i;
    }
  }
}

// The vector causal convolution against its meaning in double, per channel range as the lowering
// splits it: kernel widths 2, 3, 4 and 10 (past the register ring), channel counts with a vector tail,
// a padding token in the middle, from a carried window and from zeros.
TEST_P(kernels, causal_conv_matches_the_double_convolution) {
  for (const std::int64_t K : {2, 3, 4, 10}) {
    for (const std::int64_t C : {16, 37, 130}) {
      for (const bool carried : {false, true}) {
        const std::int64_t T = 7;
        const std::vector<std::int32_t> write = {0, 1, 2, -1, 3, 4, 5};
        auto x = normal(T * C), st = normal((K - 1) * C), w = normal(C * K);
        std::vector<float> w_t(static_cast<std::size_t>(K * C));
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t k = 0; k < K; ++k) w_t[static_cast<std::size_t>(k * C + c)] = w[static_cast<std::size_t>(c * K + k)];
        std::vector<float> out(static_cast<std::size_t>(T * C + (K - 1) * C), 0.0f);
        const ssm_conv_args a{x.data(), carried ? st.data() : nullptr, w_t.data(), write.data(), T, C, K, out.data()};
        for (std::int64_t c0 = 0; c0 < C; c0 += 64) ssm_conv_channels(a, c0, std::min(C, c0 + 64), level());
        auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
        const auto xd = d(x), sd = d(st), wd = d(w);
        std::vector<double> want(out.size()), window(static_cast<std::size_t>(K * C));
        graph::recurrent::ssm_conv_row<double>(xd.data(), carried ? sd.data() : nullptr, wd.data(), write.data(), T, C, K, want.data(), window.data());
        for (std::size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << tag("conv K=" + std::to_string(K) + " C=" + std::to_string(C)) << " at " << i;
      }
    }
  }
}

// Every binary kind over runs with a vector tail, each side contiguous or one value, against the f32
// operation (one rounding: equal); maximum and minimum give NaN when either side is NaN.
TEST_P(kernels, binary_runs_match_the_f32_operation) {
  const std::vector<std::pair<binary_kind, std::string>> kinds = {{binary_kind::add, "add"}, {binary_kind::sub, "sub"}, {binary_kind::mul, "mul"},
                                                                  {binary_kind::div, "div"}, {binary_kind::maximum, "max"}, {binary_kind::minimum, "min"}};
  auto apply = [](binary_kind k, float a, float b) -> float {
    switch (k) {
      case binary_kind::add: return a + b;
      case binary_kind::sub: return a - b;
      case binary_kind::mul: return a * b;
      case binary_kind::div: return a / b;
      case binary_kind::maximum: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
      case binary_kind::minimum: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    }
    return 0.0f;
  };
  for (const std::int64_t n : {1, 5, 16, 37, 100}) {
    auto a = normal(n), b = normal(n);
    a[static_cast<std::size_t>(n / 2)] = NAN;
    if (n > 3) b[1] = NAN;
    for (const auto& [k, name] : kinds)
      for (const bool sa : {false, true})
        for (const bool sb : {false, true}) {
          std::vector<float> y(static_cast<std::size_t>(n), -7.0f);
          binary(k, a.data(), sa, b.data(), sb, n, y.data(), level());
          for (std::int64_t i = 0; i < n; ++i) {
            const float want = apply(k, a[static_cast<std::size_t>(sa ? 0 : i)], b[static_cast<std::size_t>(sb ? 0 : i)]);
            const float got = y[static_cast<std::size_t>(i)];
            ASSERT_TRUE((std::isnan(want) && std::isnan(got)) || want == got)
                << tag(name) << " n=" << n << " sides " << sa << sb << " at " << i << ": " << got << " want " << want;
          }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(levels, kernels, ::testing::ValuesIn(usable_levels()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace troupe::exec::cpu

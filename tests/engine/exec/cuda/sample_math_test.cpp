// The device sampler's algorithm (sample_math.hpp), run on the host, against exec::sample_row: the same
// token and non-finite flag exactly, logprobs within 1e-5, the same top entries. serial_block runs it
// the way the emulation does; threaded_block runs it with several threads, barriers and atomics, the
// way a thread block does, and must give the very same bits (a wrong barrier or a shared-state race
// in the passes turns that red where no GPU is at hand).
#include "engine/exec/cuda/sample_math.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/exec/sampling.hpp"

namespace troupe::exec::cuda::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct row_case {
  std::vector<float> logits;
  sample_params p;
  std::optional<token_history> history;
  std::vector<std::uint32_t> mask;
  std::uint64_t draw = 0;
};

// The dense history the executor uploads, and the device's row parameters.
struct dense_row {
  std::vector<std::int32_t> counts;
  std::vector<std::uint8_t> prompt;
  std::vector<float> bias;
  std::vector<float> work;
  sample_row_input in{};
};

void make_input(const row_case& c, dense_row& d) {
  const auto V = static_cast<std::int64_t>(c.logits.size());
  device_sample_row row;
  row.temperature = c.p.temperature;
  row.top_p = c.p.top_p;
  row.min_p = c.p.min_p;
  row.repetition_penalty = c.p.repetition_penalty;
  row.presence_penalty = c.p.presence_penalty;
  row.frequency_penalty = c.p.frequency_penalty;
  row.top_k = c.p.top_k;
  row.top_logprobs = c.p.top_logprobs;
  row.seed = c.p.seed;
  row.draw = c.draw;
  row.history = c.history ? 0 : -1;
  row.masked = c.mask.empty() ? 0 : 1;
  history_row h{nullptr, nullptr, nullptr};
  if (c.history) {
    d.counts.assign(static_cast<std::size_t>(V), 0);
    d.prompt.assign(static_cast<std::size_t>(V), 0);
    d.bias.assign(static_cast<std::size_t>(V), 0.0f);
    for (std::int32_t t = 0; t < V; ++t) {
      d.counts[static_cast<std::size_t>(t)] = c.history->count(t);
      d.prompt[static_cast<std::size_t>(t)] = c.history->in_prompt(t) ? 1 : 0;
    }
    for (const auto& [t, b] : c.history->bias()) d.bias[static_cast<std::size_t>(t)] += b;
    h = history_row{d.counts.data(), d.prompt.data(), d.bias.data()};
  }
  d.work.assign(static_cast<std::size_t>(V), 0.0f);
  d.in = sample_row_input{c.logits.data(), V, row, h, c.mask.empty() ? nullptr : c.mask.data(), d.work.data()};
}

device_sample_out emulate(const row_case& c) {
  dense_row d;
  make_input(c, d);
  return emulate_sample_row(d.in);
}

// A block of host threads: barriers for sync(), slot-per-thread reductions combined in thread order,
// std::atomic_ref for the shared-memory atomics.
struct threaded_block {
  struct shared_state {
    explicit shared_state(int n) : bar(n), f(n), u(n), m(n), i(n), b(n) {}
    std::barrier<> bar;
    std::vector<float> f;
    std::vector<std::uint32_t> u;
    std::vector<mass128> m;
    std::vector<std::int64_t> i;
    std::vector<char> b;
  };
  shared_state* s;
  int id;
  int n;

  int thread() const { return id; }
  int threads() const { return n; }
  void sync() { s->bar.arrive_and_wait(); }
  template <class T, class Op>
  T reduce(std::vector<T>& slots, T v, Op op) {
    slots[static_cast<std::size_t>(id)] = v;
    sync();
    T r = slots[0];
    for (int k = 1; k < n; ++k) r = op(r, slots[static_cast<std::size_t>(k)]);
    sync();
    return r;
  }
  bool any(bool v) { return reduce(s->b, static_cast<char>(v), [](char a, char b) { return static_cast<char>(a || b); }) != 0; }
  float max(float v) { return reduce(s->f, v, [](float a, float b) { return b > a ? b : a; }); }
  std::uint32_t sum(std::uint32_t v) { return reduce(s->u, v, [](std::uint32_t a, std::uint32_t b) { return a + b; }); }
  mass128 sum(mass128 v) { return reduce(s->m, v, [](mass128 a, mass128 b) { return mass_add(a, b); }); }
  std::int64_t min(std::int64_t v) { return reduce(s->i, v, [](std::int64_t a, std::int64_t b) { return b < a ? b : a; }); }
  std::uint32_t atomic_add(std::uint32_t* p, std::uint32_t v) { return std::atomic_ref<std::uint32_t>(*p).fetch_add(v); }
  std::uint64_t atomic_add(std::uint64_t* p, std::uint64_t v) { return std::atomic_ref<std::uint64_t>(*p).fetch_add(v); }
};

device_sample_out emulate_threaded(const row_case& c, int n) {
  dense_row d;
  make_input(c, d);
  threaded_block::shared_state st(n);
  sample_shared sh{};
  device_sample_out out{};
  std::vector<std::thread> pool;
  for (int id = 0; id < n; ++id)
    pool.emplace_back([&, id] {
      threaded_block blk{&st, id, n};
      sample_row_run(blk, sh, d.in, out);
    });
  for (auto& t : pool) t.join();
  return out;
}

bool close(float a, float b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-5f * std::max(1.0f, std::fabs(b));
}

std::string describe(const row_case& c) {
  std::string s = "V=" + std::to_string(c.logits.size()) + " T=" + std::to_string(c.p.temperature) + " k=" + std::to_string(c.p.top_k) +
                  " p=" + std::to_string(c.p.top_p) + " min_p=" + std::to_string(c.p.min_p) + " rep=" + std::to_string(c.p.repetition_penalty) +
                  " pres=" + std::to_string(c.p.presence_penalty) + " freq=" + std::to_string(c.p.frequency_penalty) +
                  " n=" + std::to_string(c.p.top_logprobs) + " seed=" + std::to_string(c.p.seed) + " draw=" + std::to_string(c.draw) +
                  (c.history ? " history" : "") + (c.mask.empty() ? "" : " mask");
  return s;
}

// The device algorithm agrees with the host sampler on this row.
void expect_same(const row_case& c) {
  sample_scratch scratch;
  const auto host = sample_row(c.logits, c.p, c.history ? &*c.history : nullptr, c.draw, c.mask, scratch);
  ASSERT_TRUE(host) << host.error().message();
  const device_sample_out dev = emulate(c);
  const std::string what = describe(c);
  EXPECT_EQ(dev.token, host->token) << what;
  EXPECT_EQ(dev.non_finite != 0, host->non_finite) << what;
  EXPECT_TRUE(close(dev.logprob, host->logprob)) << what << ": " << dev.logprob << " vs " << host->logprob;
  ASSERT_EQ(static_cast<std::size_t>(dev.top_count), host->top.size()) << what;
  for (std::size_t i = 0; i < host->top.size(); ++i) {
    EXPECT_EQ(dev.top_tokens[i], host->top[i].token) << what << " top " << i;
    EXPECT_TRUE(close(dev.top_logprobs[i], host->top[i].logprob)) << what << " top " << i;
  }
}

// ---- random rows ----------------------------------------------------------------------------------

struct gen {
  std::mt19937_64 rng;
  explicit gen(std::uint64_t seed) : rng(seed) {}

  double uni() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }
  int below(int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); }
  template <class T>
  T pick(std::initializer_list<T> xs) {
    return xs.begin()[below(static_cast<int>(xs.size()))];
  }

  std::vector<float> logits(int V) {
    std::vector<float> v(static_cast<std::size_t>(V));
    const int kind = below(6);
    std::normal_distribution<float> normal(0.0f, pick({1.0f, 3.0f, 12.0f}));
    for (auto& x : v) {
      switch (kind) {
        case 0:
        case 1: x = normal(rng); break;
        case 2: x = pick({0.0f, -0.0f, 1.0f, 2.5f, -3.0f}); break;  // ties, signed zeros
        case 3: x = normal(rng) * 1e-30f; break;                     // weights that round to ties
        case 4: x = pick({-1.0f, 1.0f}) * static_cast<float>(uni()) * 3e38f; break;  // near saturation
        default: x = std::round(normal(rng) * 2.0f) / 2.0f; break;   // coarse values: ties among many
      }
    }
    if (below(4) == 0) {  // non-finite logits
      const int bad = 1 + below(3);
      for (int i = 0; i < bad; ++i) v[static_cast<std::size_t>(below(V))] = pick({kNaN, kInf, -kInf});
    }
    if (below(40) == 0)
      for (auto& x : v) x = pick({kNaN, kInf, -kInf});
    return v;
  }

  sample_params params(int V) {
    sample_params p;
    p.temperature = pick({0.0f, 0.0f, 0.05f, 0.5f, 1.0f, 1.0f, 1.7f, 1e-30f, 1e30f});
    p.top_k = pick({0, 0, 1, 3, 1 + below(V), V, V + 5});
    p.top_p = pick({1.0f, 1.0f, 0.5f, 0.9f, 1e-6f, static_cast<float>(0.01 + 0.99 * uni())});
    p.min_p = pick({0.0f, 0.0f, 0.01f, 1.0f, static_cast<float>(0.5 * uni())});
    p.repetition_penalty = pick({1.0f, 1.0f, 1.3f, 0.7f, 2.0f});
    p.presence_penalty = pick({0.0f, 0.0f, 0.5f, -0.5f, 2.0f, 1e38f});
    p.frequency_penalty = pick({0.0f, 0.0f, 0.5f, -0.5f, 3e38f});
    p.top_logprobs = pick({0, 0, 1, 5, 20});
    p.seed = rng();
    return p;
  }

  token_history history(int V) {
    std::vector<std::int32_t> prompt;
    for (int i = below(2 * V + 1); i > 0; --i) prompt.push_back(below(V));
    std::vector<std::pair<std::int32_t, float>> bias;
    std::vector<char> used(static_cast<std::size_t>(V), 0);
    for (int i = below(V + 1); i > 0; --i) {
      const int t = below(V);
      if (used[static_cast<std::size_t>(t)]) continue;
      used[static_cast<std::size_t>(t)] = 1;
      bias.emplace_back(t, pick({1.0f, -1.0f, 5.0f, -100.0f, 3e38f, -3e38f, static_cast<float>(uni() * 10 - 5)}));
    }
    auto h = token_history::create(V, prompt, bias);
    EXPECT_TRUE(h);
    for (int i = below(2 * V + 1); i > 0; --i) h->record(below(V));
    return std::move(*h);
  }

  std::vector<std::uint32_t> mask(int V) {
    const std::size_t words = (static_cast<std::size_t>(V) + 31) / 32;
    std::vector<std::uint32_t> m(words, 0);
    const int kind = below(3);
    for (int t = 0; t < V; ++t) {
      const bool allow = kind == 0 ? uni() < 0.5 : kind == 1 ? uni() < 0.05 : false;
      if (allow) m[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    }
    const int t = below(V);  // at least one allowed token
    m[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    if (below(2) == 0) m.back() |= ~0u << (V % 32 == 0 ? 31 : V % 32);  // bits past the vocabulary are ignored
    return m;
  }

  row_case any_case(int V) {
    row_case c;
    c.logits = logits(V);
    c.p = params(V);
    if (below(2) == 0) c.history = history(V);
    if (below(3) == 0) c.mask = mask(V);
    c.draw = rng() % 1000;
    return c;
  }
};

TEST(SampleMath, UniformDrawIsTheHostsBitForBit) {
  std::mt19937_64 rng(7);
  const std::uint64_t edges[] = {0, 1, 2, ~std::uint64_t{0}, ~std::uint64_t{0} - 1, std::uint64_t{1} << 63};
  for (auto s : edges)
    for (auto d : edges) ASSERT_EQ(bits_of(uniform_draw(s, d)), bits_of(exec::uniform_draw(s, d))) << s << " " << d;
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t s = rng(), d = i % 2 ? rng() : rng() % 4096;
    const double u = uniform_draw(s, d);
    ASSERT_EQ(bits_of(u), bits_of(exec::uniform_draw(s, d))) << s << " " << d;
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
  }
}

// A slip in the transcribed polynomials would show as error far beyond the host's stated bounds
// (2 ulp for exp, 1 ulp for expf, plus the reference's own half ulp).
TEST(SampleMath, ExponentialsStayWithinTheirBounds) {
  std::mt19937_64 rng(13);
  for (int i = 0; i < 100000; ++i) {
    const double x = -std::uniform_real_distribution<double>(0.0, i % 2 ? 1.0 : 708.0)(rng);
    const double e = exp_nonpositive(x), ref = std::exp(x);
    ASSERT_LE(std::fabs(e - ref), 3 * (std::nextafter(ref, 2.0) - ref)) << x;
    const float xf = static_cast<float>(x / 8.2);
    const float ef = expf_nonpositive(xf), reff = static_cast<float>(std::exp(static_cast<double>(xf)));
    ASSERT_LE(std::fabs(ef - reff), 2 * (std::nextafter(reff, 2.0f) - reff)) << xf;
  }
  EXPECT_EQ(exp_nonpositive(0.0), 1.0);
  EXPECT_EQ(exp_nonpositive(-709.0), 0.0);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(expf_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(expf_nonpositive(-kInf), 0.0f);
}

TEST(SampleMath, LogitKeysOrderByValueDescendingThenId) {
  const float values[] = {-kInf, -FLT_MAX, -3.5f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, 2.0f, FLT_MAX};
  for (float a : values)
    for (float b : values)
      for (std::uint32_t i : {0u, 5u})
        for (std::uint32_t j : {0u, 5u}) {
          const bool before = a > b || (a == b && i <= j);
          EXPECT_EQ(key_le(logit_key(a, i), logit_key(b, j)), before) << a << "#" << i << " " << b << "#" << j;
        }
  // Digits read the key most significant first and rebuild it.
  const key96 k = logit_key(-2.75f, 123456789u);
  key96 r{0, 0};
  for (int level = 0; level < key_levels; ++level) {
    EXPECT_TRUE(key_prefix_equal(k, r, level));
    r = key_with_digit(r, level, key_digit(k, level));
  }
  EXPECT_TRUE(key_le(k, r) && key_le(r, k));
}

TEST(SampleMath, WeightKeysAndMassesAreExact) {
  EXPECT_TRUE(key_le(weight_key(1.0, 9), weight_key(0.5, 0)));
  EXPECT_TRUE(key_le(weight_key(0.5, 1), weight_key(0.5, 2)));
  EXPECT_TRUE(key_le(weight_key(1e-300, 0), weight_key(0.0, 0)));
  EXPECT_TRUE(key_le(weight_key(0.25, 7), weight_floor_key(0.25)));
  EXPECT_FALSE(key_le(weight_key(0.2499, 0), weight_floor_key(0.25)));
  // Weights down to 2^-41 are held exactly; sums are exact in any order.
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const double w = std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng), -static_cast<int>(rng() % 41));
    ASSERT_EQ(mass_value(mass_of(w)), w);
  }
  EXPECT_EQ(mass_value(mass_of(1.0)), 1.0);
  EXPECT_EQ(mass_value(mass_of(0.0)), 0.0);
  mass128 up{0, 0}, down{0, 0};
  std::vector<double> ws;
  for (int i = 0; i < 1000; ++i) ws.push_back(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
  for (double w : ws) up = mass_add(up, mass_of(w));
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) down = mass_add(down, mass_of(*it));
  EXPECT_EQ(up.lo, down.lo);
  EXPECT_EQ(up.hi, down.hi);
  mass128 many{0, 0};
  for (int i = 0; i < 151936; ++i) many = mass_add(many, mass_of(1.0));
  EXPECT_EQ(mass_value(many), 151936.0);
}

// Each rule on its own, over the vocabulary sizes the brief names (1 and 7 hit the edges of the
// strided and bucketed walks, 1000 a realistic head).
TEST(SampleMath, EachRuleAloneMatchesTheHost) {
  gen g(11);
  enum rule { greedy, plain, top_k, top_p, min_p, bias, repetition, frequency, presence, mask, logprobs, rules };
  for (int V : {1, 7, 1000}) {
    for (int r = 0; r < rules; ++r) {
      for (int i = 0; i < (V == 1000 ? 25 : 40); ++i) {
        row_case c;
        c.logits = g.logits(V);
        c.p.temperature = r == greedy ? 0.0f : g.pick({0.3f, 1.0f, 2.0f});
        c.p.seed = g.rng();
        c.draw = g.rng() % 100;
        switch (r) {
          case top_k: c.p.top_k = 1 + g.below(V + 2); break;
          case top_p: c.p.top_p = static_cast<float>(0.01 + 0.99 * g.uni()); break;
          case min_p: c.p.min_p = static_cast<float>(g.uni()); break;
          case bias:
          case repetition:
          case frequency:
          case presence: {
            c.history = g.history(V);
            if (r == repetition) c.p.repetition_penalty = g.pick({0.5f, 1.5f, 3.0f});
            if (r == frequency) c.p.frequency_penalty = g.pick({-1.0f, 0.7f, 3e38f});
            if (r == presence) c.p.presence_penalty = g.pick({-1.0f, 0.7f, 3e38f});
            break;
          }
          case mask: c.mask = g.mask(V); break;
          case logprobs: c.p.top_logprobs = 1 + g.below(20); break;
          default: break;
        }
        expect_same(c);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(SampleMath, RandomRowsMatchTheHost) {
  gen g(2024);
  for (int i = 0; i < 3000; ++i) {
    const int V = g.pick({1, 7, 1000, 1 + g.below(300), 33, 64});
    expect_same(g.any_case(V));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SampleMath, TiesFollowTheWeightsThenTheIds) {
  gen g(5);
  for (int i = 0; i < 400; ++i) {
    const int V = g.pick({7, 100, 1000});
    row_case c;
    c.logits.assign(static_cast<std::size_t>(V), 1.0f);
    for (int j = g.below(V); j > 0; --j) c.logits[static_cast<std::size_t>(g.below(V))] = g.pick({0.0f, 0.5f, 1.0f, 1e-7f, -0.0f});
    // A huge temperature turns every weight into 1 (pure id order); a tiny one leaves only the maxima.
    c.p.temperature = g.pick({1e30f, 1e-30f, 1.0f, 1e20f});
    c.p.top_k = g.pick({0, 1, 3, V / 2});
    c.p.top_p = g.pick({1.0f, 0.5f, 0.25f, static_cast<float>(g.uni())});
    c.p.min_p = g.pick({0.0f, 0.5f, 1.0f});
    c.p.top_logprobs = g.pick({0, 3, 20});
    c.p.seed = g.rng();
    c.draw = static_cast<std::uint64_t>(i);
    expect_same(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SampleMath, NonFiniteRowsAndFullMasksMatchTheHost) {
  gen g(9);
  for (int V : {1, 7, 1000}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      row_case all;
      all.logits.assign(static_cast<std::size_t>(V), bad);
      all.p.temperature = 1.0f;
      all.p.top_logprobs = 5;
      expect_same(all);
      all.p.temperature = 0.0f;
      expect_same(all);
    }
    // The only allowed token is non-finite: token 0, logprob -inf.
    row_case c;
    c.logits = g.logits(V);
    c.logits[static_cast<std::size_t>(V - 1)] = kNaN;
    c.mask.assign((static_cast<std::size_t>(V) + 31) / 32, 0);
    c.mask[static_cast<std::size_t>(V - 1) / 32] = 1u << ((V - 1) % 32);
    c.p.temperature = 0.7f;
    expect_same(c);
    // A finite token survives among non-finite ones.
    row_case one;
    one.logits.assign(static_cast<std::size_t>(V), kNaN);
    one.logits[static_cast<std::size_t>(g.below(V))] = -3.0f;
    one.p.temperature = g.pick({0.0f, 1.0f});
    one.p.top_logprobs = 20;
    expect_same(one);
  }
}

TEST(SampleMath, FullVocabularyRowsMatchTheHost) {
  gen g(151936);
  constexpr int V = 151936;
  for (int i = 0; i < 8; ++i) {
    row_case c;
    c.logits = g.logits(V);
    c.p.temperature = g.pick({0.0f, 0.7f, 1.0f, 1e30f});
    c.p.top_k = i % 4 == 1 ? 40 : 0;
    c.p.top_p = i % 4 == 2 ? 0.95f : 1.0f;
    c.p.min_p = i % 4 == 3 ? 0.05f : 0.0f;
    c.p.top_logprobs = i % 2 ? 20 : 0;
    c.p.seed = g.rng();
    if (i % 3 == 0) {
      c.history = g.history(V);
      c.p.repetition_penalty = 1.2f;
      c.p.frequency_penalty = 0.3f;
    }
    if (i == 5) c.mask = g.mask(V);
    c.draw = g.rng() % 100;
    expect_same(c);
  }
}

// Several threads, barriers and atomics give what one thread gives, bit for bit.
TEST(SampleMath, ThreadedBlocksGiveTheSerialBits) {
  gen g(77);
  for (int i = 0; i < 120; ++i) {
    const int V = g.pick({1, 7, 100, 1000, 3000});
    const row_case c = g.any_case(V);
    const device_sample_out one = emulate(c);
    const device_sample_out many = emulate_threaded(c, g.pick({2, 3, 4}));
    const std::string what = describe(c);
    EXPECT_EQ(many.token, one.token) << what;
    EXPECT_EQ(bits_of(many.logprob), bits_of(one.logprob)) << what;
    EXPECT_EQ(many.non_finite, one.non_finite) << what;
    ASSERT_EQ(many.top_count, one.top_count) << what;
    for (int k = 0; k < one.top_count; ++k) {
      EXPECT_EQ(many.top_tokens[k], one.top_tokens[k]) << what;
      EXPECT_EQ(bits_of(many.top_logprobs[k]), bits_of(one.top_logprobs[k])) << what;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace troupe::exec::cuda::sampling

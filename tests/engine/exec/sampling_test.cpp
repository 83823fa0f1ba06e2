// The sampling head (engine/exec/sampling.hpp) against a plain reference written here: every rule on
// real logits rows from the oracle (a tiny fixture model), the fast head selection against a full
// sort on a 151936-token row, the draw's distribution (chi-square), and every typed refusal.
#include "engine/exec/sampling.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "apps/oracle_runner.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"

namespace troupe::exec {
namespace {

namespace fs = std::filesystem;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------------
// The reference: the header's rules written plainly, in double, with full sorts.

struct ref_history {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> output;
  std::vector<std::pair<std::int32_t, float>> bias;
};

struct ref_dist {
  bool non_finite = false;
  bool none = false;                 // no finite candidate is left
  std::int32_t greedy = 0;
  std::vector<double> logprob;       // adjusted log_softmax, -inf where excluded
  std::vector<std::int32_t> ranked;  // candidates by logprob descending, id ascending
  std::vector<std::int32_t> kept;    // sampled rows: the kept tokens, probability descending, id ascending
  std::vector<double> kept_prob;     // their probabilities before renormalisation
  double kept_mass = 0;
};

float clamp_float(float v) { return std::min(std::max(v, -FLT_MAX), FLT_MAX); }

ref_dist reference(std::span<const float> logits, const sample_params& p, const ref_history* h, std::span<const std::uint32_t> mask) {
  ref_dist d;
  const std::size_t V = logits.size();
  std::vector<float> l(logits.begin(), logits.end());
  std::vector<bool> out(V, false);
  for (std::size_t t = 0; t < V; ++t) {
    if (!std::isfinite(l[t])) {
      d.non_finite = true;
      out[t] = true;
    }
  }
  if (h) {
    for (auto [t, b] : h->bias)
      if (!out[t]) l[t] = clamp_float(l[t] + b);
    std::map<std::int32_t, int> count;
    for (auto t : h->output) ++count[t];
    std::set<std::int32_t> seen(h->prompt.begin(), h->prompt.end());
    seen.insert(h->output.begin(), h->output.end());
    for (auto t : seen) {
      if (out[t]) continue;
      float v = l[t];
      if (p.repetition_penalty != 1.0f) v = clamp_float(v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty);
      if (count[t] > 0) v = clamp_float(v - (p.frequency_penalty * static_cast<float>(count[t]) + p.presence_penalty));
      l[t] = v;
    }
  }
  if (!mask.empty())
    for (std::size_t t = 0; t < V; ++t)
      if (!((mask[t / 32] >> (t % 32)) & 1u)) out[t] = true;

  std::vector<std::int32_t> cand;
  for (std::size_t t = 0; t < V; ++t)
    if (!out[t]) cand.push_back(static_cast<std::int32_t>(t));
  d.logprob.assign(V, -kInf);
  if (cand.empty()) {
    d.none = true;
    return d;
  }
  const double T = p.temperature;
  std::vector<double> z(V, -kInf);
  double zmax = -kInf;
  for (auto t : cand) {
    z[t] = T == 0 ? l[t] : l[t] / T;
    zmax = std::max(zmax, z[t]);
  }
  double s = 0;
  for (auto t : cand) s += std::exp(z[t] - zmax);
  const double lse = zmax + std::log(s);
  for (auto t : cand) d.logprob[t] = z[t] - lse;
  d.ranked = cand;
  std::sort(d.ranked.begin(), d.ranked.end(), [&](auto x, auto y) { return d.logprob[x] > d.logprob[y] || (d.logprob[x] == d.logprob[y] && x < y); });
  float best = -FLT_MAX;
  d.greedy = cand[0];
  for (auto t : cand) {
    if (l[t] > best) {
      best = l[t];
      d.greedy = t;
    }
  }
  if (T == 0) return d;

  std::vector<double> prob(V, 0);
  for (auto t : cand) prob[t] = std::exp(d.logprob[t]);
  std::vector<std::int32_t> order = cand;
  std::sort(order.begin(), order.end(), [&](auto x, auto y) { return prob[x] > prob[y] || (prob[x] == prob[y] && x < y); });
  std::size_t L = order.size();
  if (p.top_k > 0) L = std::min(L, static_cast<std::size_t>(p.top_k));
  double mass = 0;
  for (std::size_t i = 0; i < L; ++i) mass += prob[order[i]];
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (std::size_t i = 0; i < L; ++i) {
      cum += prob[order[i]];
      if (cum / mass >= p.top_p) {
        L = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double highest = prob[order[0]];
    for (std::size_t i = 0; i < L; ++i) {
      if (prob[order[i]] < p.min_p * highest) {
        L = i;
        break;
      }
    }
  }
  for (std::size_t i = 0; i < L; ++i) {
    d.kept.push_back(order[i]);
    d.kept_prob.push_back(prob[order[i]]);
    d.kept_mass += prob[order[i]];
  }
  return d;
}

// Inverse CDF: the first kept token whose cumulative renormalised mass exceeds u.
std::int32_t reference_pick(const ref_dist& d, double u) {
  double cum = 0;
  for (std::size_t i = 0; i < d.kept.size(); ++i) {
    cum += d.kept_prob[i];
    if (cum / d.kept_mass > u) return d.kept[i];
  }
  for (std::size_t i = d.kept.size(); i-- > 0;)
    if (d.kept_prob[i] > 0) return d.kept[i];
  return d.kept.front();
}

// ---------------------------------------------------------------------------------------------------
// Real logits: a tiny llama fixture evaluated by the oracle over a prompt, one row per position.

const std::vector<std::vector<float>>& oracle_rows() {
  static const std::vector<std::vector<float>> rows = [] {
    std::vector<std::vector<float>> out;
    families::fixture_dims d;
    d.vocab = 512;
    d.hidden = 128;
    d.ffn = 256;
    d.heads = 2;
    d.kv_heads = 1;
    d.head_dim = 64;
    d.layers = 2;
    const auto dir = fs::temp_directory_path() / ("troupe-sampling-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const auto path = dir / "llama";
    auto w = families::write_fixture("llama", d, path, false);
    if (!w) {
      ADD_FAILURE() << w.error().message();
      return out;
    }
    auto h = families::model_handle::load(path, families::registry::builtin());
    if (!h) {
      ADD_FAILURE() << families::message(h.error());
      return out;
    }
    app::oracle_runner oracle(*h, 64);
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < 12; ++i) prompt.push_back(3 + (i * 97 + 11) % 500);
    auto l = oracle.feed(prompt, true);
    if (!l) {
      ADD_FAILURE() << l.error();
      return out;
    }
    for (std::size_t r = 0; r < prompt.size(); ++r)
      out.emplace_back(l->begin() + static_cast<std::ptrdiff_t>(r * 512), l->begin() + static_cast<std::ptrdiff_t>((r + 1) * 512));
    std::error_code ec;
    fs::remove_all(dir, ec);
    return out;
  }();
  return rows;
}

std::vector<std::uint32_t> mask_where(std::size_t V, auto&& allowed) {
  std::vector<std::uint32_t> m((V + 31) / 32, 0);
  for (std::size_t t = 0; t < V; ++t)
    if (allowed(static_cast<std::int32_t>(t))) m[t / 32] |= 1u << (t % 32);
  return m;
}

token_history make_history(std::int64_t vocab, const ref_history& r) {
  auto h = token_history::create(vocab, r.prompt, r.bias);
  EXPECT_TRUE(h) << (h ? "" : h.error().message());
  for (auto t : r.output) h->record(t);
  return std::move(*h);
}

double logprob_tolerance(double want) { return 2e-5 + 2e-6 * std::fabs(want); }

// sample_row against the reference for `draws` draws (one for a greedy row): the pick, its logprob,
// the non-finite flag and the top-n entries.
void expect_matches_reference(std::span<const float> row, const sample_params& p, const ref_history* rh,
                              std::span<const std::uint32_t> mask = {}, int draws = 200) {
  const ref_dist d = reference(row, p, rh, mask);
  std::optional<token_history> h;
  if (rh) h = make_history(static_cast<std::int64_t>(row.size()), *rh);
  sample_scratch s;
  if (p.temperature == 0) draws = 1;
  for (int draw = 0; draw < draws; ++draw) {
    auto got = sample_row(row, p, h ? &*h : nullptr, static_cast<std::uint64_t>(draw), mask, s);
    ASSERT_TRUE(got) << got.error().message();
    EXPECT_EQ(got->non_finite, d.non_finite);
    ASSERT_FALSE(d.none);
    const std::int32_t want = p.temperature == 0 ? d.greedy : reference_pick(d, uniform_draw(p.seed, static_cast<std::uint64_t>(draw)));
    ASSERT_EQ(got->token, want) << "draw " << draw;
    EXPECT_NEAR(got->logprob, d.logprob[want], logprob_tolerance(d.logprob[want]));
    const auto n = std::min<std::size_t>(static_cast<std::size_t>(p.top_logprobs), d.ranked.size());
    ASSERT_EQ(got->top.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(got->top[i].token, d.ranked[i]) << "top " << i;
      EXPECT_NEAR(got->top[i].logprob, d.logprob[d.ranked[i]], logprob_tolerance(d.logprob[d.ranked[i]])) << "top " << i;
    }
  }
}

class sampling_oracle : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(oracle_rows().empty()) << "no oracle logits"; }
  static const std::vector<std::vector<float>>& rows() { return oracle_rows(); }
  static std::int32_t argmax(std::span<const float> r) { return static_cast<std::int32_t>(std::max_element(r.begin(), r.end()) - r.begin()); }
};

// ---------------------------------------------------------------------------------------------------
// Each rule on the oracle's logits.

TEST_F(sampling_oracle, logits_are_a_usable_spread) {
  // Not a rule: guards the other tests against a degenerate fixture (flat or tied logits).
  for (const auto& r : rows()) {
    ASSERT_EQ(r.size(), 512u);
    const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    EXPECT_GT(*hi - *lo, 2.0f);
    EXPECT_EQ(std::set<float>(r.begin(), r.end()).size(), r.size());
  }
}

TEST_F(sampling_oracle, greedy_with_top_logprobs_matches_reference) {
  for (int n : {0, 1, 5, max_top_logprobs}) {
    sample_params p;
    p.top_logprobs = n;
    for (const auto& r : rows()) expect_matches_reference(r, p, nullptr);
  }
}

TEST_F(sampling_oracle, greedy_ties_pick_the_lowest_id_and_report_ties_by_id) {
  std::vector<float> r = rows()[0];
  const float top = *std::max_element(r.begin(), r.end());
  r[300] = top + 1;
  r[40] = top + 1;
  r[41] = top + 0.5f;
  r[7] = top + 0.5f;
  sample_params p;
  p.top_logprobs = 4;
  sample_scratch s;
  auto got = sample_row(r, p, nullptr, 0, {}, s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->token, 40);
  ASSERT_EQ(got->top.size(), 4u);
  EXPECT_EQ(got->top[0].token, 40);
  EXPECT_EQ(got->top[1].token, 300);
  EXPECT_EQ(got->top[2].token, 7);
  EXPECT_EQ(got->top[3].token, 41);
  EXPECT_EQ(got->top[0].logprob, got->top[1].logprob);
  expect_matches_reference(r, p, nullptr);
}

TEST_F(sampling_oracle, sampled_ties_order_by_id) {
  // Equal probabilities sit in id order in the cumulative mass, and top-k keeps the lowest ids.
  std::vector<float> r = rows()[6];
  const float top = *std::max_element(r.begin(), r.end());
  for (std::int32_t t : {450, 12, 260, 13}) r[static_cast<std::size_t>(t)] = top + 2;
  for (auto p : {sample_params{.temperature = 1.0f, .seed = 3}, sample_params{.temperature = 1.0f, .top_k = 2, .seed = 4},
                 sample_params{.temperature = 0.5f, .top_p = 0.5f, .seed = 5}}) {
    expect_matches_reference(r, p, nullptr, {}, 400);
    const ref_dist d = reference(r, p, nullptr, {});
    EXPECT_EQ(d.kept[0], 12);
    EXPECT_EQ(d.kept[1], 13);
  }
  EXPECT_EQ(reference(r, sample_params{.temperature = 1.0f, .top_k = 2}, nullptr, {}).kept, (std::vector<std::int32_t>{12, 13}));
}

TEST_F(sampling_oracle, logit_bias_matches_reference) {
  for (const auto& r : rows()) {
    const std::int32_t top = argmax(r);
    ref_history h;
    h.bias = {{top, -30.0f}, {17, 12.5f}, {400, 3.0f}, {400, 2.0f}, {511, -1e30f}};  // a repeated id adds up
    sample_params p;
    p.top_logprobs = 8;
    expect_matches_reference(r, p, &h);
    EXPECT_NE(reference(r, p, &h, {}).greedy, top);  // the rule moved the pick
    p.temperature = 0.9f;
    expect_matches_reference(r, p, &h);
  }
}

TEST_F(sampling_oracle, bias_saturates_instead_of_overflowing) {
  std::vector<float> r = rows()[1];
  r[5] = 3e38f;
  r[6] = -3e38f;
  ref_history h;
  h.bias = {{5, 3e38f}, {6, -3e38f}};
  sample_params p;
  p.top_logprobs = 1;  // below a logit of FLT_MAX every other logprob rounds to the same double
  expect_matches_reference(r, p, &h);
  sample_scratch s;
  auto hist = make_history(512, h);
  auto got = sample_row(r, p, &hist, 0, {}, s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->token, 5);
  EXPECT_FALSE(got->non_finite);
  p.temperature = 1.0f;
  expect_matches_reference(r, p, &h, {}, 20);
}

TEST_F(sampling_oracle, repetition_penalty_matches_reference) {
  for (float rp : {1.3f, 0.7f, 4.0f}) {
    for (const auto& r : rows()) {
      ref_history h;
      // The prompt holds the top tokens (positive logits get divided) and some negative ones.
      std::vector<std::int32_t> ids(512);
      std::iota(ids.begin(), ids.end(), 0);
      std::sort(ids.begin(), ids.end(), [&](auto a, auto b) { return r[a] > r[b]; });
      h.prompt = {ids[0], ids[1], ids[2], ids[500], ids[0], ids[300]};
      h.output = {ids[3], ids[3], ids[450]};
      sample_params p;
      p.repetition_penalty = rp;
      p.top_logprobs = 10;
      expect_matches_reference(r, p, &h);
      p.temperature = 0.8f;
      expect_matches_reference(r, p, &h);
      if (rp == 4.0f) {
        EXPECT_NE(reference(r, sample_params{.repetition_penalty = rp}, &h, {}).greedy, ids[0]);
      }
    }
  }
}

TEST_F(sampling_oracle, presence_and_frequency_penalties_match_reference_and_skip_prompt_tokens) {
  for (const auto& r : rows()) {
    const std::int32_t top = argmax(r);
    ref_history h;
    h.prompt = {top, 9, 10};  // prompt only: untouched by frequency and presence
    h.output = {11, 11, 11, 12, 200, 9};
    for (auto [f, pr] : {std::pair{0.5f, 0.0f}, {0.0f, 1.5f}, {0.8f, -0.4f}, {-1.0f, 2.0f}}) {
      sample_params p;
      p.frequency_penalty = f;
      p.presence_penalty = pr;
      p.top_logprobs = 12;
      expect_matches_reference(r, p, &h);
      // A prompt-only token keeps its logit: its gap to an untouched token is unchanged.
      const std::int32_t other = top == 300 ? 301 : 300;
      const ref_dist plain = reference(r, sample_params{}, nullptr, {}), pen = reference(r, p, &h, {});
      EXPECT_NEAR(pen.logprob[top] - pen.logprob[other], plain.logprob[top] - plain.logprob[other], 1e-9);
      EXPECT_NE(pen.logprob[11] - pen.logprob[other], plain.logprob[11] - plain.logprob[other]);
      p.temperature = 1.2f;
      expect_matches_reference(r, p, &h);
    }
    // Frequency scales with the count: 11 (three times) drops by three times f.
    sample_params p;
    p.frequency_penalty = 1.0f;
    const ref_dist plain = reference(r, sample_params{}, nullptr, {});
    const ref_dist pen = reference(r, p, &h, {});
    EXPECT_NEAR((plain.logprob[11] - pen.logprob[11]) - (plain.logprob[12] - pen.logprob[12]), 2.0, 1e-4);
  }
}

TEST_F(sampling_oracle, all_rules_together_match_reference) {
  for (const auto& r : rows()) {
    ref_history h;
    h.prompt = {argmax(r), 5, 6, 7};
    h.output = {argmax(r), 8, 8, 100};
    h.bias = {{8, 2.0f}, {101, 4.0f}};
    const auto mask = mask_where(512, [](std::int32_t t) { return t % 7 != 3; });
    sample_params p;
    p.temperature = 0.75f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.3f;
    p.frequency_penalty = 0.2f;
    p.top_logprobs = 6;
    p.seed = 1234;
    expect_matches_reference(r, p, &h, mask);
  }
}

TEST_F(sampling_oracle, guided_mask_matches_reference) {
  for (const auto& r : rows()) {
    const std::int32_t top = argmax(r);
    const auto mask = mask_where(512, [&](std::int32_t t) { return t != top && (t % 3 == 0 || t > 480); });
    sample_params p;
    p.top_logprobs = max_top_logprobs;
    expect_matches_reference(r, p, nullptr, mask);
    const ref_dist d = reference(r, p, nullptr, mask);
    EXPECT_NE(d.greedy, top);
    p.temperature = 1.0f;
    sample_scratch s;
    for (std::uint64_t draw = 0; draw < 300; ++draw) {
      auto got = sample_row(r, p, nullptr, draw, mask, s);
      ASSERT_TRUE(got);
      EXPECT_TRUE(got->token != top && (got->token % 3 == 0 || got->token > 480));
      for (const auto& e : got->top) EXPECT_TRUE(e.token % 3 == 0 || e.token > 480);
    }
    expect_matches_reference(r, p, nullptr, mask);
  }
  // A mask allowing a single token picks it at any temperature; its logprob is 0.
  const auto one = mask_where(512, [](std::int32_t t) { return t == 77; });
  for (float T : {0.0f, 1.0f}) {
    sample_params p;
    p.temperature = T;
    p.top_logprobs = 3;
    sample_scratch s;
    auto got = sample_row(rows()[0], p, nullptr, 5, one, s);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->token, 77);
    EXPECT_EQ(got->logprob, 0.0f);
    ASSERT_EQ(got->top.size(), 1u);
  }
}

TEST_F(sampling_oracle, temperature_scales_the_logprobs_and_the_draw) {
  for (float T : {0.05f, 0.5f, 1.0f, 1.7f, 25.0f}) {
    sample_params p;
    p.temperature = T;
    p.top_logprobs = 10;
    p.seed = 99;
    for (const auto& r : rows()) expect_matches_reference(r, p, nullptr);
  }
}

TEST_F(sampling_oracle, top_k_matches_reference) {
  for (int k : {1, 2, 10, 100, 511, 512, 5000}) {
    sample_params p;
    p.temperature = 1.3f;
    p.top_k = k;
    p.top_logprobs = 3;
    p.seed = 5;
    for (const auto& r : rows()) {
      expect_matches_reference(r, p, nullptr);
      const ref_dist d = reference(r, p, nullptr, {});
      EXPECT_EQ(d.kept.size(), std::min<std::size_t>(static_cast<std::size_t>(k), 512));
    }
  }
}

TEST_F(sampling_oracle, top_p_matches_reference) {
  for (float tp : {0.01f, 0.3f, 0.6f, 0.9f, 0.99f, 0.99999f}) {
    sample_params p;
    p.temperature = 0.9f;
    p.top_p = tp;
    p.seed = 6;
    for (const auto& r : rows()) {
      expect_matches_reference(r, p, nullptr);
      p.top_k = 20;  // top-p over the renormalised top-k
      expect_matches_reference(r, p, nullptr);
      p.top_k = 0;
    }
  }
}

TEST_F(sampling_oracle, min_p_matches_reference) {
  for (float mp : {1e-6f, 0.01f, 0.1f, 0.5f, 1.0f}) {
    sample_params p;
    p.temperature = 1.1f;
    p.min_p = mp;
    p.seed = 7;
    for (const auto& r : rows()) {
      expect_matches_reference(r, p, nullptr);
      p.top_p = 0.8f;
      expect_matches_reference(r, p, nullptr);
      p.top_p = 1.0f;
    }
  }
  // min_p = 1 keeps only the maximum.
  sample_params p;
  p.temperature = 1.0f;
  p.min_p = 1.0f;
  EXPECT_EQ(reference(rows()[2], p, nullptr, {}).kept.size(), 1u);
}

TEST_F(sampling_oracle, every_draw_is_the_inverse_cdf_pick) {
  sample_params p;
  p.temperature = 1.0f;
  p.seed = 0xfeedULL;
  const auto& r = rows()[4];
  const ref_dist d = reference(r, p, nullptr, {});
  sample_scratch s;
  std::set<std::int32_t> distinct;
  for (std::uint64_t draw = 0; draw < 5000; ++draw) {
    auto got = sample_row(r, p, nullptr, draw, {}, s);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->token, reference_pick(d, uniform_draw(p.seed, draw))) << "draw " << draw;
    distinct.insert(got->token);
  }
  EXPECT_GT(distinct.size(), 20u);  // the draws do spread over the distribution
}

TEST_F(sampling_oracle, non_finite_logits_are_flagged_and_skipped) {
  std::vector<float> r = rows()[3];
  const std::int32_t top = argmax(r);
  r[top] = std::numeric_limits<float>::quiet_NaN();
  r[10] = std::numeric_limits<float>::infinity();
  r[11] = -std::numeric_limits<float>::infinity();
  ref_history h;
  h.bias = {{10, 1.0f}};
  h.prompt = {11, 10};
  for (float T : {0.0f, 1.0f}) {
    sample_params p;
    p.temperature = T;
    p.top_logprobs = 5;
    p.repetition_penalty = 1.5f;
    expect_matches_reference(r, p, &h);
    sample_scratch s;
    auto got = sample_row(r, p, nullptr, 3, {}, s);
    ASSERT_TRUE(got);
    EXPECT_TRUE(got->non_finite);
    EXPECT_NE(got->token, top);
    EXPECT_NE(got->token, 10);
    EXPECT_NE(got->token, 11);
  }
  // Nothing finite: token 0, flagged, logprob -inf, no top entries.
  std::vector<float> bad(512, std::numeric_limits<float>::quiet_NaN());
  bad[3] = std::numeric_limits<float>::infinity();
  // ...and a mask that only allows non-finite tokens leaves nothing either.
  std::vector<float> partly = rows()[0];
  partly[9] = std::numeric_limits<float>::quiet_NaN();
  const auto only9 = mask_where(512, [](std::int32_t t) { return t == 9; });
  for (float T : {0.0f, 0.7f}) {
    sample_params p;
    p.temperature = T;
    p.top_logprobs = 3;
    sample_scratch s;
    for (auto [row, mask] : {std::pair{std::span<const float>(bad), std::span<const std::uint32_t>()},
                             std::pair{std::span<const float>(partly), std::span<const std::uint32_t>(only9)}}) {
      auto got = sample_row(row, p, nullptr, 0, mask, s);
      ASSERT_TRUE(got);
      EXPECT_TRUE(got->non_finite);
      EXPECT_EQ(got->token, 0);
      EXPECT_EQ(got->logprob, -std::numeric_limits<float>::infinity());
      EXPECT_TRUE(got->top.empty());
    }
  }
  // Finite rows are not flagged.
  sample_scratch s;
  auto fine = sample_row(rows()[0], sample_params{}, nullptr, 0, {}, s);
  ASSERT_TRUE(fine);
  EXPECT_FALSE(fine->non_finite);
}

TEST_F(sampling_oracle, a_draw_depends_on_seed_and_draw_only) {
  const auto& r = rows()[5];
  sample_params p;
  p.temperature = 1.5f;
  p.top_p = 0.95f;
  p.seed = 77;
  sample_params other = p;
  other.seed = 78;
  other.top_k = 3;
  sample_scratch a, b;
  std::vector<std::int32_t> forward, backward(64);
  for (std::uint64_t draw = 0; draw < 64; ++draw) forward.push_back(sample_row(r, p, nullptr, draw, {}, a)->token);
  for (std::uint64_t draw = 64; draw-- > 0;) {
    // Other rows in between, through the same scratch, change nothing.
    ASSERT_TRUE(sample_row(rows()[draw % rows().size()], other, nullptr, draw * 3, {}, b));
    backward[draw] = sample_row(r, p, nullptr, draw, {}, b)->token;
  }
  EXPECT_EQ(forward, backward);
  sample_scratch fresh;
  EXPECT_EQ(sample_row(r, p, nullptr, 17, {}, fresh)->token, forward[17]);
  // A different seed gives a different stream.
  sample_params reseed = p;
  reseed.seed = 78;
  std::vector<std::int32_t> reseeded;
  for (std::uint64_t draw = 0; draw < 64; ++draw) reseeded.push_back(sample_row(r, reseed, nullptr, draw, {}, a)->token);
  EXPECT_NE(reseeded, forward);
}

// ---------------------------------------------------------------------------------------------------
// The fast head selection on a full-size vocabulary against a full sort.

std::vector<float> large_row(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 2.5f);
  std::vector<float> r(151936);
  for (auto& v : r) v = n(g);
  for (int i = 0; i < 30; ++i) r[g() % r.size()] += 6.0f + static_cast<float>(i % 5);  // a peaked head
  return r;
}

TEST(sampling_large_vocab, fast_paths_match_a_full_sort) {
  const std::vector<float> r = large_row(11);
  const std::pair<std::uint64_t, std::uint64_t> keys[] = {{1, 0}, {1, 1}, {1, 2}, {2, 7}, {3, 1000}, {99, 123456}, {0xabcdef, 42}, {5, 9}};
  std::vector<sample_params> configs;
  for (float T : {0.7f, 1.0f, 1.6f})
    for (float tp : {0.2f, 0.8f, 0.9f, 0.95f, 0.99f}) configs.push_back({.temperature = T, .top_p = tp, .top_logprobs = 5});
  configs.push_back({.temperature = 1.0f});                              // the whole distribution
  configs.push_back({.temperature = 0.8f, .top_k = 40});
  configs.push_back({.temperature = 0.8f, .top_k = 40, .top_p = 0.9f});
  configs.push_back({.temperature = 1.0f, .min_p = 0.05f});
  configs.push_back({.temperature = 1.0f, .min_p = 1e-4f});
  configs.push_back({.temperature = 1.0f, .top_k = 100000});
  configs.push_back({.temperature = 0.0f, .top_logprobs = 20});
  sample_scratch s;
  for (const auto& base : configs) {
    SCOPED_TRACE(::testing::Message() << "T " << base.temperature << " top_k " << base.top_k << " top_p " << base.top_p << " min_p "
                                      << base.min_p);
    const ref_dist d = reference(r, base, nullptr, {});
    for (auto [seed, draw] : keys) {
      sample_params p = base;
      p.seed = seed;
      auto got = sample_row(r, p, nullptr, draw, {}, s);
      ASSERT_TRUE(got);
      const std::int32_t want = p.temperature == 0 ? d.greedy : reference_pick(d, uniform_draw(seed, draw));
      ASSERT_EQ(got->token, want) << "seed " << seed << " draw " << draw;
      EXPECT_NEAR(got->logprob, d.logprob[want], logprob_tolerance(d.logprob[want]));
      ASSERT_EQ(got->top.size(), static_cast<std::size_t>(p.top_logprobs));
      for (std::size_t i = 0; i < got->top.size(); ++i) EXPECT_EQ(got->top[i].token, d.ranked[i]);
    }
  }
}

TEST(sampling_large_vocab, a_flat_distribution_still_matches) {
  // Every weight lands in one histogram bin: the head collection degenerates to the whole row.
  std::vector<float> r(151936);
  std::mt19937_64 g(3);
  std::uniform_real_distribution<float> u(0.0f, 1e-3f);
  for (auto& v : r) v = u(g);
  sample_scratch s;
  for (auto p : {sample_params{.temperature = 1.0f}, sample_params{.temperature = 1.0f, .top_p = 0.5f}}) {
    const ref_dist d = reference(r, p, nullptr, {});
    for (std::uint64_t draw : {0u, 1u, 2u}) {
      auto got = sample_row(r, p, nullptr, draw, {}, s);
      ASSERT_TRUE(got);
      EXPECT_EQ(got->token, reference_pick(d, uniform_draw(0, draw)));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The draw's distribution.

// Upper 0.001 critical values of the chi-square distribution for 1..15 degrees of freedom, from the
// NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4 ("Critical Values of the
// Chi-Square Distribution"), column 0.999.
constexpr double kChi2Critical999[16] = {0,      10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322,
                                         26.124, 27.877, 29.588, 31.264, 32.909, 34.528, 36.123, 37.697};

TEST(sampling_draw, counts_follow_the_kept_distribution) {
  const std::vector<float> logits = {1.1f, 2.0f, -0.4f, 0.3f, 1.6f, -1.0f, 0.0f, 0.9f};
  const sample_params configs[] = {
      {.temperature = 0.7f, .seed = 2024},
      {.temperature = 0.7f, .top_k = 5, .seed = 2025},
      {.temperature = 0.7f, .top_p = 0.8f, .seed = 2026},
      {.temperature = 1.3f, .top_k = 6, .top_p = 0.9f, .min_p = 0.1f, .seed = 2027},
  };
  constexpr int N = 20000;
  sample_scratch s;
  for (const auto& p : configs) {
    SCOPED_TRACE(::testing::Message() << "top_k " << p.top_k << " top_p " << p.top_p);
    const ref_dist d = reference(logits, p, nullptr, {});
    ASSERT_GE(d.kept.size(), 3u);
    std::vector<int> count(logits.size(), 0);
    for (int draw = 0; draw < N; ++draw) {
      auto got = sample_row(logits, p, nullptr, static_cast<std::uint64_t>(draw), {}, s);
      ASSERT_TRUE(got);
      ++count[static_cast<std::size_t>(got->token)];
    }
    double chi2 = 0;
    int drawn_outside = N;
    for (std::size_t i = 0; i < d.kept.size(); ++i) {
      const double expected = N * d.kept_prob[i] / d.kept_mass;
      ASSERT_GT(expected, 5.0);  // the test's own validity
      const double diff = count[static_cast<std::size_t>(d.kept[i])] - expected;
      chi2 += diff * diff / expected;
      drawn_outside -= count[static_cast<std::size_t>(d.kept[i])];
    }
    EXPECT_EQ(drawn_outside, 0);  // truncated tokens are never drawn
    const std::size_t dof = d.kept.size() - 1;
    EXPECT_LT(chi2, kChi2Critical999[dof]) << "dof " << dof;
    std::printf("[ draw ] kept %zu: chi-square %.2f (0.999 critical %.3f)\n", d.kept.size(), chi2, kChi2Critical999[dof]);
  }
}

TEST(sampling_draw, uniform_draw_is_uniform_over_draws_and_over_seeds) {
  constexpr int N = 160000, bins = 16;
  auto chi2_of = [&](auto&& u_of) {
    std::vector<int> count(bins, 0);
    for (int i = 0; i < N; ++i) {
      const double u = u_of(static_cast<std::uint64_t>(i));
      EXPECT_GE(u, 0.0);
      EXPECT_LT(u, 1.0);
      ++count[static_cast<std::size_t>(u * bins)];
    }
    double chi2 = 0;
    for (int c : count) chi2 += (c - N / bins) * (c - N / bins) / (N / static_cast<double>(bins));
    return chi2;
  };
  for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) EXPECT_LT(chi2_of([&](std::uint64_t i) { return uniform_draw(seed, i); }), kChi2Critical999[15]);
  EXPECT_LT(chi2_of([](std::uint64_t i) { return uniform_draw(i, 0); }), kChi2Critical999[15]);      // across seeds
  EXPECT_LT(chi2_of([](std::uint64_t i) { return uniform_draw(i, i); }), kChi2Critical999[15]);      // along the diagonal
  // Pure function of (seed, draw).
  EXPECT_EQ(uniform_draw(5, 6), uniform_draw(5, 6));
  EXPECT_NE(uniform_draw(5, 6), uniform_draw(6, 5));
  EXPECT_NE(uniform_draw(5, 6), uniform_draw(5, 7));
}

// ---------------------------------------------------------------------------------------------------
// Seeded random rows and parameters (ties, NaNs, masks, histories, every rule at once) against the
// reference.

TEST(sampling_random, rows_and_parameters_match_reference) {
  std::mt19937_64 g(12345);
  sample_scratch s;
  int checked = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    const std::size_t V = 1 + g() % (iter % 10 == 0 ? 40000 : 700);
    std::vector<float> row(V);
    const int style = static_cast<int>(g() % 4);
    std::normal_distribution<float> nd(0.0f, 0.5f + static_cast<float>(g() % 100) / 10.0f);
    for (auto& v : row) {
      v = nd(g);
      if (style == 1) v = std::round(v);          // many ties
      if (style == 2) v = std::round(v * 4) / 4;  // ties
      if (style == 3 && g() % 50 == 0) v = std::numeric_limits<float>::quiet_NaN();
    }
    sample_params p;
    p.temperature = g() % 5 == 0 ? 0.0f : std::ldexp(1.0f + static_cast<float>(g() % 100) / 100.0f, static_cast<int>(g() % 8) - 4);
    if (g() % 2) p.top_k = static_cast<std::int32_t>(g() % (V + 5));
    if (g() % 2) p.top_p = static_cast<float>(1 + g() % 1000) / 1000.0f;
    if (g() % 3 == 0) p.min_p = static_cast<float>(g() % 1000) / 1000.0f;
    p.top_logprobs = static_cast<std::int32_t>(g() % 21);
    p.seed = g();
    std::vector<std::uint32_t> mask;
    if (g() % 3 == 0) {
      mask = mask_where(V, [&](std::int32_t) { return g() % 3 != 0; });
      mask[0] |= 1u;
    }
    ref_history rh;
    const bool with_h = g() % 2;
    if (with_h) {
      p.repetition_penalty = 0.5f + static_cast<float>(g() % 20) / 10.0f;
      p.presence_penalty = static_cast<float>(g() % 5) - 2.0f;
      p.frequency_penalty = static_cast<float>(g() % 5) / 4.0f;
      for (int i = 0; i < 10; ++i) rh.prompt.push_back(static_cast<std::int32_t>(g() % V));
      for (int i = 0; i < 10; ++i) rh.output.push_back(static_cast<std::int32_t>(g() % V));
      for (int i = 0; i < 3; ++i) rh.bias.push_back({static_cast<std::int32_t>(g() % V), static_cast<float>(g() % 11) - 5.0f});
    }
    const ref_dist d = reference(row, p, with_h ? &rh : nullptr, mask);
    std::optional<token_history> h;
    if (with_h) h = make_history(static_cast<std::int64_t>(V), rh);
    for (int k = 0; k < 3; ++k) {
      const std::uint64_t draw = g() % 1000;
      auto got = sample_row(row, p, h ? &*h : nullptr, draw, mask, s);
      ASSERT_TRUE(got) << got.error().message();
      if (d.none) {
        EXPECT_EQ(got->token, 0);
        continue;
      }
      const std::int32_t want = p.temperature == 0 ? d.greedy : reference_pick(d, uniform_draw(p.seed, draw));
      ASSERT_EQ(got->token, want) << "iter " << iter << " V " << V << " T " << p.temperature << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p;
      const auto n = std::min<std::size_t>(static_cast<std::size_t>(p.top_logprobs), d.ranked.size());
      ASSERT_EQ(got->top.size(), n);
      EXPECT_NEAR(got->logprob, d.logprob[want], logprob_tolerance(d.logprob[want])) << "iter " << iter;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got->top[i].token, d.ranked[i]) << "iter " << iter;
        EXPECT_NEAR(got->top[i].logprob, d.logprob[d.ranked[i]], logprob_tolerance(d.logprob[d.ranked[i]])) << "iter " << iter;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 3000);
}

// ---------------------------------------------------------------------------------------------------
// Histories and refusals.

TEST(sampling_history, record_counts_output_and_keeps_seen_sorted) {
  const std::int32_t prompt[] = {9, 3, 9, 200};
  auto h = token_history::create(256, prompt);
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->vocab(), 256);
  EXPECT_EQ(h->seen(), (std::vector<std::int32_t>{3, 9, 200}));
  EXPECT_TRUE(h->in_prompt(9));
  EXPECT_FALSE(h->in_prompt(4));
  EXPECT_EQ(h->count(9), 0);  // prompt tokens are not output counts
  for (std::int32_t t : {4, 9, 4, 255, 0, -1, 256, 100000}) h->record(t);
  EXPECT_EQ(h->seen(), (std::vector<std::int32_t>{0, 3, 4, 9, 200, 255}));
  EXPECT_EQ(h->count(4), 2);
  EXPECT_EQ(h->count(9), 1);
  EXPECT_EQ(h->count(0), 1);
  EXPECT_EQ(h->count(-1), 0);
  EXPECT_EQ(h->count(256), 0);
  EXPECT_FALSE(h->in_prompt(-1));
  EXPECT_FALSE(h->in_prompt(256));
  const std::pair<std::int32_t, float> bias[] = {{1, 0.5f}, {1, 0.25f}};
  auto b = token_history::create(4, {}, bias);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->bias().size(), 2u);
  EXPECT_TRUE(b->seen().empty());
}

TEST(sampling_history, create_refuses_ids_outside_the_vocabulary) {
  const std::int32_t neg[] = {1, -1};
  const std::int32_t big[] = {64};
  const std::pair<std::int32_t, float> bias_big[] = {{64, 1.0f}};
  const std::pair<std::int32_t, float> bias_neg[] = {{-3, 1.0f}};
  const std::pair<std::int32_t, float> bias_nan[] = {{3, std::numeric_limits<float>::quiet_NaN()}};
  const std::pair<std::int32_t, float> bias_inf[] = {{3, -std::numeric_limits<float>::infinity()}};
  const result<token_history, sample_error> bad[] = {
      token_history::create(64, neg),      token_history::create(64, big),      token_history::create(64, {}, bias_big),
      token_history::create(64, {}, bias_neg), token_history::create(64, {}, bias_nan), token_history::create(64, {}, bias_inf),
      token_history::create(0, {}),        token_history::create(-5, {}),       token_history::create(std::int64_t{1} << 32, {}),
  };
  for (const auto& r : bad) {
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, sample_error_code::bad_history) << r.error().message();
  }
}

TEST(sampling_refusals, every_bad_parameter_is_refused_by_check_and_sample_row) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(check(sample_params{}));
  EXPECT_TRUE(check(sample_params{.temperature = 2.0f, .top_k = 5, .top_p = 1.0f, .min_p = 1.0f, .repetition_penalty = 0.01f,
                                  .presence_penalty = -2.0f, .frequency_penalty = 2.0f, .top_logprobs = max_top_logprobs}));
  const sample_params bad[] = {
      {.temperature = -0.1f}, {.temperature = nan}, {.temperature = inf},
      {.top_k = -1},
      {.top_p = 0.0f}, {.top_p = -0.5f}, {.top_p = 1.01f}, {.top_p = nan},
      {.min_p = -0.01f}, {.min_p = 1.5f}, {.min_p = nan},
      {.repetition_penalty = 0.0f}, {.repetition_penalty = -1.0f}, {.repetition_penalty = nan}, {.repetition_penalty = inf},
      {.presence_penalty = nan}, {.presence_penalty = inf}, {.frequency_penalty = nan}, {.frequency_penalty = -inf},
      {.top_logprobs = -1}, {.top_logprobs = max_top_logprobs + 1},
  };
  const std::vector<float> row(40, 0.5f);
  sample_scratch s;
  for (const auto& p : bad) {
    auto c = check(p);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, sample_error_code::bad_parameter) << c.error().message();
    auto r = sample_row(row, p, nullptr, 0, {}, s);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, sample_error_code::bad_parameter);
  }
}

TEST(sampling_refusals, bad_history_and_bad_mask) {
  std::vector<float> row(500, 0.0f);
  row[7] = 1.0f;
  sample_scratch s;
  auto h = token_history::create(499, {});
  ASSERT_TRUE(h);
  auto r = sample_row(row, sample_params{}, &*h, 0, {}, s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sample_error_code::bad_history);
  r = sample_row(std::span<const float>(), sample_params{}, nullptr, 0, {}, s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sample_error_code::bad_history);

  const std::vector<std::uint32_t> short_mask(15, ~0u), long_mask(17, ~0u), none(16, 0u);
  std::vector<std::uint32_t> only_padding(16, 0u);
  only_padding[15] = 1u << 25;  // 500 = 15 x 32 + 20: bit 25 of the last word is past the vocabulary
  for (const auto& m : {short_mask, long_mask, none, only_padding}) {
    for (float T : {0.0f, 1.0f}) {
      auto got = sample_row(row, sample_params{.temperature = T}, nullptr, 0, m, s);
      ASSERT_FALSE(got);
      EXPECT_EQ(got.error().code, sample_error_code::bad_mask) << got.error().message();
    }
  }
  std::vector<std::uint32_t> last_bit(16, 0u);
  last_bit[15] = 1u << 19;  // token 499
  auto got = sample_row(row, sample_params{}, nullptr, 0, last_bit, s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->token, 499);
}

TEST(sampling_refusals, names_and_messages) {
  EXPECT_EQ(name(sample_error_code::bad_parameter), "bad_parameter");
  EXPECT_EQ(name(sample_error_code::bad_history), "bad_history");
  EXPECT_EQ(name(sample_error_code::bad_mask), "bad_mask");
  const sample_error e{sample_error_code::bad_mask, "the mask allows no token"};
  EXPECT_EQ(e.message(), "sampling: the mask allows no token (bad_mask)");
  auto c = check(sample_params{.top_p = 2.0f});
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace troupe::exec

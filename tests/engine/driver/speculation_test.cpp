// Speculative decoding through the driver (engine/driver/speculation.cpp, scheduler.cpp run_verify):
// prompt lookup and a draft model give, on every family's fixture, the tokens the target gives
// without them, greedy and seeded-sampled alike, with drafts actually accepted; the window honours
// max_tokens, stop ids and the capacity; rows that cannot speculate (guided, opted out) share rounds
// with rows that do; and the table refuses what cannot compose.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "engine/driver/driver.hpp"
#include "engine/driver/speculation.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const families::model_handle> fixture(std::string_view family, dtype format = dtype::f32) {
  return test::small_fixture(family, format);
}

driver_options options(draft_kind k = draft_kind::none) {
  driver_options o;
  o.max_rows = 4;
  o.capacity = 160;
  o.block_size = 8;
  o.prefill_chunk = 32;
  o.token_budget = 64;
  o.speculation.kind = k;
  o.speculation.tokens = 4;
  return o;
}

using test::serve;

// A prompt that repeats a short phrase, so prompt lookup has something to find.
std::vector<std::int32_t> repetitive(std::int32_t salt, std::int64_t n = 40) {
  std::vector<std::int32_t> p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(5 + ((i % 7) * 31 + salt * 13) % 500));
  return p;
}

using test::request;

using test::run_all;

std::vector<seq_request> workload(float temperature) {
  std::vector<seq_request> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(request(repetitive(i, 20 + 9 * i), 24 + 3 * i, i % 2 ? temperature : 0.0f, 77 + static_cast<std::uint64_t>(i)));
  return reqs;
}

TEST(speculation, prompt_lookup_finds_the_latest_earlier_occurrence_of_the_longest_suffix) {
  const std::vector<std::int32_t> t = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3};
  // Suffix (5?) no; n = 3: {5, 2, 3} never earlier; n = 2: {2, 3} latest at 5 -> 7, 8, 5.
  EXPECT_EQ(ngram_draft(t, 1, 3, 3), (std::vector<std::int32_t>{7, 8, 5}));
  EXPECT_EQ(ngram_draft(t, 1, 3, 1), (std::vector<std::int32_t>{7}));
  EXPECT_EQ(ngram_draft(t, 3, 3, 4), (std::vector<std::int32_t>{}));  // no earlier {5, 2, 3}
  const std::vector<std::int32_t> run = {4, 4, 4, 4};
  EXPECT_EQ(ngram_draft(run, 1, 2, 5), (std::vector<std::int32_t>{4}));  // what follows the latest earlier {4, 4}
  EXPECT_EQ(ngram_draft(std::vector<std::int32_t>{6}, 1, 3, 4), (std::vector<std::int32_t>{}));
  EXPECT_EQ(ngram_draft(t, 1, 3, 0), (std::vector<std::int32_t>{}));
}

TEST(speculation, every_family_gives_its_own_tokens_with_prompt_lookup) {
  for (auto family : families::fixture_families()) {
    SCOPED_TRACE(std::string(family));
    auto h = fixture(family);
    exec::cpu::cpu_executor plain_ex, spec_ex;
    auto plain = serve(h, plain_ex, options());
    auto spec = serve(h, spec_ex, options(draft_kind::ngram));
    const auto reqs = workload(0.9f);
    const auto want = run_all(plain, reqs);
    const auto got = run_all(spec, reqs);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      EXPECT_EQ(got[i].finished, finish_reason::length);
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
      for (std::size_t t = 0; t < want[i].logprobs.size(); ++t) EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4);
    }
    const auto c = spec.counters();
    EXPECT_GT(c.verify_steps, 0);
    EXPECT_GT(c.draft_tokens, 0);
    EXPECT_LE(c.accepted_tokens, c.draft_tokens);
  }
}

// A verify window's tokens are computed as decode tokens (the CPU attention runs an all-token-logits
// entry per token, over key ranges fixed by the capacity), and every other op is row-wise or
// batch-invariant, so drafts change no bit of the log-probabilities. That matters most for block
// formats: their activations are rounded to 8 bits before each product, and a one-ulp difference in
// an attention sum became 0.05 of log-probability and a different greedy token on a q8_0 file.
TEST(speculation, drafts_change_no_bit_of_a_quantized_models_log_probabilities) {
  for (const dtype format : {dtype::q8_0, dtype::q4_0}) {
    SCOPED_TRACE(std::string(troupe::name(format)));
    auto h = fixture("llama", format);
    exec::cpu::cpu_executor plain_ex, spec_ex;
    auto plain = serve(h, plain_ex, options());
    auto spec = serve(h, spec_ex, options(draft_kind::ngram));
    const auto reqs = workload(0.0f);
    const auto want = run_all(plain, reqs);
    const auto got = run_all(spec, reqs);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
      EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "sequence " << i;
    }
    EXPECT_GT(spec.counters().accepted_tokens, 0);
  }
}

TEST(speculation, a_draft_model_is_rolled_back_with_the_target_and_changes_nothing) {
  for (auto family : families::fixture_families()) {
    SCOPED_TRACE(std::string(family));
    auto target = fixture(family);
    auto draft = fixture(family, dtype::q8_0);  // the same weights, quantized: a draft that mostly agrees
    exec::cpu::cpu_executor plain_ex, spec_ex;
    auto plain = serve(target, plain_ex, options());
    auto o = options(draft_kind::model);
    o.speculation.draft_model = draft;
    auto spec = serve(target, spec_ex, o);
    const auto reqs = workload(0.8f);
    const auto want = run_all(plain, reqs);
    const auto got = run_all(spec, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    const auto c = spec.counters();
    EXPECT_GT(c.draft_steps, 0);
    EXPECT_GT(c.draft_tokens, 0);
    // Greedy rows of a q8_0 copy agree with the f32 target most of the time.
    EXPECT_GT(static_cast<double>(c.accepted_tokens) / static_cast<double>(c.draft_tokens), 0.3);
    if (family == "llama") {
      // A second run reuses the mirrors' rows: the draft's sequences were released with the target's.
      const auto again = run_all(spec, reqs);
      for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].tokens, want[i].tokens);
    }
  }
}

// A draft model prefills a prompt in the round the target does, before the first token is reported,
// so the first decode round drafts by decoding alone (a long prompt's draft prefill stalled the first
// verify, counted as decode time).
TEST(speculation, a_draft_model_prefills_the_prompt_with_the_target) {
  auto target = fixture("llama");
  exec::cpu::cpu_executor ex;
  auto o = options(draft_kind::model);
  o.speculation.draft_model = fixture("llama", dtype::q8_0);
  auto spec = serve(target, ex, o);
  ASSERT_TRUE(spec.open(request(repetitive(3, 30), 12, 0.0f, 5)));
  // The prompt (30 tokens) fits one chunk: the first round prefills it and reports the first token.
  auto first = spec.step();
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_EQ(first->updates.size(), 1u);
  ASSERT_EQ(first->updates[0].tokens.size(), 1u);
  const auto primed = spec.counters();
  EXPECT_GT(primed.draft_steps, 0) << "the draft model ran no step beside the target's prefill";
  EXPECT_EQ(primed.verify_steps, 0);
  // The first decode round: its drafts cost the draft model decode steps only (at most K of them, and
  // the catch-up of the first token), not a prefill of the 30-token prompt in chunks.
  auto second = spec.step();
  ASSERT_TRUE(second) << second.error().message();
  const auto after = spec.counters();
  EXPECT_EQ(after.verify_steps, 1);
  EXPECT_LE(after.draft_steps - primed.draft_steps, o.speculation.tokens);
}

TEST(speculation, seeded_sampling_draws_the_same_tokens_with_drafts_on_or_off) {
  // The sampled distribution is unchanged because every seed's draw is: 40 seeds, each the same
  // tokens with and without drafts (a stronger statement than equal histograms).
  auto h = fixture("qwen2");
  exec::cpu::cpu_executor plain_ex, spec_ex;
  auto plain = serve(h, plain_ex, options());
  auto spec = serve(h, spec_ex, options(draft_kind::ngram));
  std::vector<seq_request> reqs;
  for (std::uint64_t seed = 0; seed < 40; ++seed) reqs.push_back(request(repetitive(3, 24), 12, 0.7f, seed));
  reqs[0].sampling.repetition_penalty = 1.3f;  // penalties read the history as it stands at each draft
  reqs[1].sampling.frequency_penalty = 0.5f;
  const auto want = run_all(plain, reqs);
  const auto got = run_all(spec, reqs);
  std::map<std::int32_t, int> first_plain, first_spec;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "seed " << i;
    ++first_plain[want[i].tokens.at(0)];
    ++first_spec[got[i].tokens.at(0)];
  }
  EXPECT_EQ(first_plain, first_spec);
  EXPECT_GT(first_plain.size(), 1u);  // the rows really sample
}

TEST(speculation, the_window_honours_max_tokens_stop_ids_and_rows_that_do_not_speculate) {
  auto h = fixture("llama");
  exec::cpu::cpu_executor plain_ex, spec_ex;
  auto plain = serve(h, plain_ex, options());
  auto spec = serve(h, spec_ex, options(draft_kind::ngram));
  std::vector<seq_request> reqs = workload(0.0f);
  const auto free_run = run_all(plain, {reqs[2]}).front();
  // A stop id taken from the middle of the free run: the speculating row stops on it exactly.
  reqs[2].stop_ids = {free_run.tokens.at(9)};
  reqs[2].ignore_eos = false;
  reqs[3].speculate = false;  // opted out: decodes one token a round beside the others
  for (auto max : {1, 2, 5}) reqs.push_back(request(repetitive(8), max));
  const auto want = run_all(plain, reqs);
  const auto got = run_all(spec, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].finished, want[i].finished);
  }
  EXPECT_EQ(got[2].finished, finish_reason::eos);
  EXPECT_EQ(got[2].tokens.back(), free_run.tokens.at(9));
  EXPECT_EQ(got[5].tokens.size(), 1u);
  EXPECT_EQ(got[6].tokens.size(), 2u);
}

TEST(speculation, prefix_cache_and_preemption_compose_with_drafts) {
  auto h = fixture("llama");
  auto tight = options();
  tight.pool_blocks = 20;  // 4 rows of 50-90 positions do not fit at once: preemption by recompute
  exec::cpu::cpu_executor plain_ex;
  auto plain = serve(h, plain_ex, tight);
  const auto reqs = workload(0.9f);
  const auto want = run_all(plain, reqs);
  for (auto kind : {draft_kind::ngram, draft_kind::model}) {
    SCOPED_TRACE(std::string(name(kind)));
    exec::cpu::cpu_executor spec_ex;
    auto o = tight;
    o.speculation.kind = kind;
    if (kind == draft_kind::model) o.speculation.draft_model = fixture("llama", dtype::q8_0);
    auto spec = serve(h, spec_ex, o);
    const auto first = run_all(spec, reqs);
    const auto second = run_all(spec, reqs);  // prompts now in the prefix cache
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(first[i].tokens, want[i].tokens) << "sequence " << i;
      EXPECT_EQ(second[i].tokens, want[i].tokens) << "sequence " << i;
    }
    EXPECT_GT(spec.counters().prefix_hit_tokens, 0);
    EXPECT_GT(spec.counters().preemptions, 0);
  }
}

TEST(speculation, refusals_are_typed) {
  auto h = fixture("llama");
  exec::cpu::cpu_executor ex;
  auto bad = options(draft_kind::ngram);
  bad.speculation.tokens = 0;
  auto r = driver<unprepared>(h, ex, bad).prepare();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().second.code, driver_error_code::bad_options);
  auto no_model = options(draft_kind::model);
  auto r2 = driver<unprepared>(h, ex, no_model).prepare();
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().second.code, driver_error_code::bad_options);
  // A draft of another vocabulary is refused at prepare, naming both.
  auto other = [&] {
    families::fixture_dims d;
    d.vocab = 384;
    d.hidden = 64;
    d.ffn = 128;
    d.heads = 2;
    d.kv_heads = 1;
    d.head_dim = 32;
    d.layers = 1;
    const auto path = fs::temp_directory_path() / ("troupe-driver-test-" + std::to_string(::getpid())) / "other.gguf";
    auto w = families::write_fixture("llama", d, path, true);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
    auto m = families::model_handle::load(path, families::registry::builtin());
    EXPECT_TRUE(m);
    return m ? *m : nullptr;
  }();
  auto mismatched = options(draft_kind::model);
  mismatched.speculation.draft_model = other;
  auto r3 = driver<unprepared>(h, ex, mismatched).prepare();
  ASSERT_FALSE(r3);
  EXPECT_EQ(r3.error().second.code, driver_error_code::prepare_failed);
  EXPECT_NE(r3.error().second.message().find("vocabulary"), std::string::npos) << r3.error().second.message();
  // Beams and drafts are one pair of the table.
  auto d = serve(h, ex, options(draft_kind::ngram));
  auto req = request(repetitive(1), 4);
  req.beams = 2;
  auto o = d.open(req);
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code, driver_error_code::incompatible);
  ASSERT_TRUE(o.error().pair);
  EXPECT_TRUE(o.error().pair->a == feature::draft_policy || o.error().pair->b == feature::draft_policy);
}

}  // namespace
}  // namespace troupe::driver

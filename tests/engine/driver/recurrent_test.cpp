// Recurrent models through the driver (engine/driver: state rows; families/mamba2, nemotron_h, qwen3_next): each sequence
// owns a row of every state pool while it holds blocks, so sequences batched together, queued behind
// a full batch (their rows reused), preempted and recomputed, chained, or resumed from prior output
// give the tokens each gives alone; drafts are taken back out of the state; beams each carry their own
// state row, reordered with the beams; the table turns the prefix cache off.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"
#include "tests/support/beam_reference.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

// A recurrent fixture: mamba2, or the hybrids nemotron_h (Mamba2, attention, Mamba2, MLP: KV blocks and
// state rows in one step) and qwen3_next (Gated DeltaNet, gated attention, each with routed experts).
std::shared_ptr<const families::model_handle> recurrent_model(std::string_view family, bool gguf = true, dtype format = dtype::f32) {
  families::fixture_dims d;
  d.vocab = 512;
  d.hidden = 128;
  d.layers = family.starts_with("nemotron_h") ? 4 : family.starts_with("lfm2") ? 3 : 2;  // lfm2: conv, conv, attention
  d.head_dim = 32;
  d.heads = 4;
  d.kv_heads = 2;
  d.ffn = 256;
  d.ssm_groups = 2;
  d.matrix_type = format;
  const auto dir = fs::temp_directory_path() / ("troupe-recurrent-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = dir / (std::string(family) + "_" + std::string(troupe::name(format)) + (gguf ? ".gguf" : ""));
  if (!fs::exists(path)) {
    auto w = families::write_fixture(family, d, path, gguf);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

driver_options options() {
  driver_options o;
  o.max_rows = 3;
  o.capacity = 128;
  o.block_size = 8;
  o.prefill_chunk = 16;
  o.token_budget = 40;
  return o;
}

std::vector<std::int32_t> prompt(std::int32_t salt, std::int64_t n) {
  std::vector<std::int32_t> p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(3 + (i * 131 + salt * 17) % 500));
  return p;
}

std::vector<seq_request> workload() {
  std::vector<seq_request> reqs;
  // Prompts of 1 token to several prefill chunks, greedy and seeded, more than max_rows of them.
  for (int i = 0; i < 6; ++i)
    reqs.push_back(test::request(prompt(i, 1 + 11 * i), 12 + 3 * i, i % 2 ? 0.9f : 0.0f, 100 + static_cast<std::uint64_t>(i)));
  return reqs;
}

// Each request alone on a fresh driver.
std::vector<test::run_result> alone(const std::shared_ptr<const families::model_handle>& h, const std::vector<seq_request>& reqs) {
  std::vector<test::run_result> out;
  for (const auto& r : reqs) {
    exec::cpu::cpu_executor ex;
    auto d = test::serve(h, ex, options());
    out.push_back(test::run_all(d, {r}).front());
  }
  return out;
}

class recurrent : public ::testing::TestWithParam<std::string_view> {};

TEST_P(recurrent, batched_and_queued_sequences_give_their_tokens_alone) {
  for (bool gguf : {true, false}) {
    SCOPED_TRACE(gguf ? "gguf" : "hf");
    auto h = recurrent_model(GetParam(), gguf);
    const auto reqs = workload();
    const auto want = alone(h, reqs);
    exec::cpu::cpu_executor ex;
    auto d = test::serve(h, ex, options());
    const auto got = test::run_all(d, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
      EXPECT_EQ(got[i].finished, finish_reason::length);
    }
    // The same prompts again: the prefix cache is off for a recurrent model (nothing shared).
    const auto again = test::run_all(d, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].tokens, want[i].tokens) << "again, sequence " << i;
    EXPECT_EQ(d.counters().prefix_hit_tokens, 0);
    EXPECT_FALSE(d.options().prefix_cache);
  }
}

TEST_P(recurrent, preempted_sequences_recompute_their_state) {
  auto h = recurrent_model(GetParam());
  auto o = options();
  o.pool_blocks = 12;  // 96 slots for three rows of up to ~70 tokens: preemption
  const auto reqs = workload();
  const auto want = alone(h, reqs);
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, o);
  const auto got = test::run_all(d, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
  EXPECT_GT(d.counters().preemptions, 0);
}

TEST_P(recurrent, chained_decode_and_resumed_output_continue_the_same_state) {
  auto h = recurrent_model(GetParam());
  const auto reqs = workload();
  const auto want = alone(h, reqs);
  {
    auto o = options();
    o.chain_steps = 8;
    exec::cpu::cpu_executor ex;
    auto d = test::serve(h, ex, o);
    const std::vector<seq_request> two(reqs.begin(), reqs.begin() + 2);
    const auto got = test::run_all(d, two);
    for (std::size_t i = 0; i < two.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "chained, sequence " << i;
    EXPECT_GT(d.counters().chained_steps, 0);
  }
  // A job resumed elsewhere: its delivered output is computed like its prompt, and it goes on.
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, options());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto r = reqs[i];
    const std::size_t kept = want[i].tokens.size() / 2;
    r.prior_output.assign(want[i].tokens.begin(), want[i].tokens.begin() + static_cast<std::ptrdiff_t>(kept));
    const auto got = test::run_all(d, {r}).front();
    std::vector<std::int32_t> whole = r.prior_output;
    whole.insert(whole.end(), got.tokens.begin(), got.tokens.end());
    EXPECT_EQ(whole, want[i].tokens) << "resumed, sequence " << i;
  }
}

// Drafts over recurrent state: before a verify window each drafting row's state is kept in a spare row,
// and a rejection restores it and runs the committed tokens again, so prompt lookup and a draft model
// (a dense one of the same vocabulary: its drafts are mostly wrong, which exercises the restore) give
// the tokens, log-probabilities and finishes of the model without drafts, greedy and seeded-sampled,
// with several sequences sharing the rounds.
std::vector<std::int32_t> looping(std::int32_t salt, std::int64_t n) {
  std::vector<std::int32_t> p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(5 + ((i % 5) * 37 + salt * 11) % 500));
  return p;
}

TEST_P(recurrent, drafts_are_taken_back_out_of_the_state_and_change_nothing) {
  auto h = recurrent_model(GetParam());
  const auto draft = [] {
    families::fixture_dims d;
    d.vocab = 512, d.hidden = 64, d.ffn = 128, d.heads = 2, d.kv_heads = 1, d.head_dim = 32, d.layers = 1;
    const auto path = fs::temp_directory_path() / ("troupe-recurrent-test-" + std::to_string(::getpid())) / "draft.gguf";
    if (!fs::exists(path)) {
      EXPECT_TRUE(families::write_fixture("llama", d, path, true));
    }
    auto m = families::model_handle::load(path, families::registry::builtin());
    EXPECT_TRUE(m);
    return m ? *m : nullptr;
  }();
  std::vector<seq_request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(test::request(looping(i, 12 + 5 * i), 20 + 2 * i, i % 2 ? 0.8f : 0.0f, 31 + static_cast<std::uint64_t>(i)));
  exec::cpu::cpu_executor plain_ex;
  auto plain = test::serve(h, plain_ex, options());
  const auto want = test::run_all(plain, reqs);
  for (const auto kind : {draft_kind::ngram, draft_kind::model}) {
    SCOPED_TRACE(kind == draft_kind::ngram ? "ngram" : "draft model");
    exec::cpu::cpu_executor ex;
    auto o = options();
    o.speculation.kind = kind;
    o.speculation.tokens = 3;
    if (kind == draft_kind::model) o.speculation.draft_model = draft;
    auto spec = test::serve(h, ex, o);
    const auto got = test::run_all(spec, reqs);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      EXPECT_EQ(got[i].finished, want[i].finished);
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
      for (std::size_t t = 0; t < want[i].logprobs.size(); ++t) EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4);
    }
    const auto c = spec.counters();
    EXPECT_GT(c.verify_steps, 0);
    EXPECT_GT(c.draft_tokens, c.accepted_tokens);  // some drafts were rejected: the restore ran
  }
}

// A recurrent draft model has no earlier state to cut its mirror back to: refused at prepare, by name.
TEST_P(recurrent, a_recurrent_draft_model_is_refused) {
  auto h = recurrent_model(GetParam());
  exec::cpu::cpu_executor ex;
  auto o = options();
  o.speculation.kind = draft_kind::model;
  o.speculation.draft_model = h;
  auto spec = driver<unprepared>(h, ex, o).prepare();
  ASSERT_FALSE(spec);
  EXPECT_EQ(spec.error().second.code, driver_error_code::prepare_failed);
  EXPECT_NE(spec.error().second.message().find("recurrent draft model"), std::string::npos) << spec.error().second.message();
}

// Beam search over state rows: each beam owns a row, a continuation takes its parent's state (copied in
// an order that never overwrites a row still to be read, a cycle through the search's spare row), and
// the beams, scores and finish reasons equal the definition's over full recomputation of every prefix
// (tests/support/beam_reference.hpp), widths 2 to 4, alone and beside a plain sequence, whose tokens do
// not move. A reorder that skips the copies, or copies in place without the order, fails it.
TEST_P(recurrent, beams_carry_their_state_rows_and_equal_the_definition) {
  auto h = recurrent_model(GetParam());
  exec::cpu::cpu_executor ex;
  auto o = options();
  o.max_rows = 6;  // four beams, the staging row, and a plain sequence
  auto d = test::serve(h, ex, o);
  for (int W : {2, 4}) {
    SCOPED_TRACE("width " + std::to_string(W));
    auto r = test::request(prompt(W, 9), 6);
    r.beams = W;
    auto g = d.generate(r);
    ASSERT_TRUE(g) << g.error().message();
    const auto want = test::reference(h, prompt(W, 9), W, 6, {}, 1.0, false);
    test::expect_same(g->beams, want);
    EXPECT_EQ(g->tokens, want.front().tokens);
  }
  auto beams = test::request(prompt(7, 9), 6);
  beams.beams = 3;
  const std::vector<seq_request> reqs = {test::request(prompt(8, 12), 10), beams};
  std::vector<std::vector<std::int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(d.generate(r)->tokens);
  const auto together = test::run_all(d, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i]) << "request " << i;
  EXPECT_TRUE(d.idle());
  // As many beams as rows leaves no spare: refused when opened, never left waiting for a row.
  auto all = test::request(prompt(9, 9), 4);
  all.beams = static_cast<int>(o.max_rows);
  auto id = d.open(all);
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().code, driver_error_code::bad_request) << id.error().message();
}

INSTANTIATE_TEST_SUITE_P(families, recurrent, ::testing::ValuesIn(families::recurrent_fixture_families()),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace troupe::driver

// Beam search through the driver (engine/driver/beam.cpp) against a reference written here from the
// definition: every prefix recomputed from scratch on its own runner (no KV sharing, no forks), its
// log-softmax in double, the same ranking rules. The beams, their scores and finish reasons must agree,
// with and without end tokens, length penalties and early stopping, alone and beside other sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "apps/exec_runner.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "tests/support/beam_reference.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

using test::expect_same;
using test::reference;
using test::ref_beam;

driver_options beam_options() {
  driver_options o;
  o.max_rows = 8;
  o.capacity = 96;
  o.block_size = 4;  // small blocks: forks land mid-block often, so copy-on-write is exercised
  o.prefill_chunk = 32;
  o.token_budget = 64;
  return o;
}

seq_request beam_request(std::vector<std::int32_t> prompt, int W, std::int64_t max_tokens) {
  seq_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.beams = W;
  return r;
}

std::vector<std::int32_t> prompt_of(int salt, int n = 11) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 53 + salt * 17) % 500);
  return p;
}

TEST(beam_search, equals_the_definition_over_full_recomputation) {
  auto h = test::small_fixture("llama");
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, beam_options());
  for (int W : {2, 4}) {
    SCOPED_TRACE("width " + std::to_string(W));
    auto g = d.generate(beam_request(prompt_of(W), W, 7));
    ASSERT_TRUE(g) << g.error().message();
    const auto want = reference(h, prompt_of(W), W, 7, {}, 1.0, false);
    expect_same(g->beams, want);
    EXPECT_EQ(g->tokens, want.front().tokens);
    EXPECT_EQ(g->finished, finish_reason::length);
  }
  EXPECT_TRUE(d.idle());
  EXPECT_EQ(d.counters().pool_available, d.counters().pool_blocks) << "every fork's block returned";
}

TEST(beam_search, end_tokens_make_hypotheses_ranked_by_length_penalty_and_early_stopping_ends_the_search) {
  auto h = test::small_fixture("qwen2");
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, beam_options());
  // End tokens that the search meets: the second and third ranked first tokens of the plain search.
  const auto free_run = reference(h, prompt_of(9), 4, 3, {}, 1.0, false);
  std::vector<std::int32_t> stop;
  for (const auto& b : free_run) stop.push_back(b.tokens.at(1));
  stop.resize(2);
  int ended = 0;
  for (auto [penalty, early] : {std::pair{1.0, false}, std::pair{0.0, false}, std::pair{2.0, true}}) {
    SCOPED_TRACE("length_penalty " + std::to_string(penalty) + (early ? " early" : ""));
    auto r = beam_request(prompt_of(9), 4, 8);
    r.stop_ids = stop;
    r.length_penalty = static_cast<float>(penalty);
    r.early_stopping = early;
    auto g = d.generate(r);
    ASSERT_TRUE(g) << g.error().message();
    const auto want = reference(h, prompt_of(9), 4, 8, stop, penalty, early);
    expect_same(g->beams, want);
    ended += static_cast<int>(std::count_if(want.begin(), want.end(), [](const ref_beam& b) { return b.ended; }));
  }
  EXPECT_GT(ended, 0) << "the end tokens were met";
}

TEST(beam_search, a_search_beside_other_sequences_changes_neither) {
  auto h = test::small_fixture("llama");
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, beam_options());
  std::vector<seq_request> reqs = {test::request(prompt_of(1, 20), 9), beam_request(prompt_of(2), 3, 6), test::request(prompt_of(3, 5), 12, 0.8f, 4),
                                   beam_request(prompt_of(4), 2, 5)};
  std::vector<std::vector<std::int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(d.generate(r)->tokens);
  const auto together = test::run_all(d, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i]) << "request " << i;
  EXPECT_EQ(d.counters().pool_available, d.counters().pool_blocks);
}

TEST(beam_search, refusals_are_typed) {
  auto h = test::small_fixture("llama");
  exec::cpu::cpu_executor ex;
  auto d = test::serve(h, ex, beam_options());
  auto sampled = beam_request(prompt_of(1), 4, 4);
  sampled.sampling.temperature = 0.7f;
  auto wide = beam_request(prompt_of(1), 11, 4);
  auto stops = beam_request(prompt_of(1), 2, 4);
  stops.stop = {"x"};
  for (const auto& r : {sampled, wide, stops}) {
    auto o = d.open(r);
    ASSERT_FALSE(o);
    EXPECT_EQ(o.error().code, driver_error_code::bad_request) << o.error().message();
  }
  // A cancelled search returns its rows and blocks.
  auto id = d.open(beam_request(prompt_of(5), 4, 40));
  ASSERT_TRUE(id);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d.step());
  ASSERT_TRUE(d.cancel(*id));
  while (!d.idle()) ASSERT_TRUE(d.step());
  ASSERT_TRUE(d.release(*id));
  EXPECT_EQ(d.counters().pool_available, d.counters().pool_blocks);
  EXPECT_EQ(d.counters().running, 0);
}

}  // namespace
}  // namespace troupe::driver

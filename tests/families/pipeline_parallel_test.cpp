// Pipeline parallelism on simulated CPU devices in one process: a replica's layers split into stages
// (model_handle::stage, composed with model_handle::shard for tensor x pipeline), each stage a thread
// with its own executor over its part; a later stage receives the residual stream from the one before
// (op::pipe_recv) over an in-process pipe (troupe::local_group), and only the last stage holds the final
// norm and the head. The last stage must give the whole model's logits within 1e-3 in log-probability
// (f32 weights: the stages compute the same ops in the same order; with a tensor-parallel split inside
// each stage only the order of the partial sums differs) and the same greedy tokens, for 2 stages and
// 2 x 2, across llama (also GGUF q8_0), qwen3, gemma2 and phi3. The driver serves a batch on a
// 2 x 2 replica (driver::cpu_replica) with the tokens of one device, and splits that cannot be made are
// typed refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include "tests/support/logprobs.hpp"
#include "tests/support/serve_batch.hpp"
#include "tests/support/tp_fixture.hpp"
#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/core/collective.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

struct pp_case {
  std::string_view family;
  int tp, pp;
  bool gguf = false;
  dtype type = dtype::f32;
  int layers = 4;
};
std::string case_name(const pp_case& c) {
  return std::string(c.family) + "_tp" + std::to_string(c.tp) + "_pp" + std::to_string(c.pp) + (c.gguf ? "_gguf" : "") +
         (c.type != dtype::f32 ? "_" + std::string(name(c.type)) : "") + "_l" + std::to_string(c.layers);
}
void PrintTo(const pp_case& c, std::ostream* os) { *os << case_name(c); }

using troupe::testing::log_softmax;

using troupe::testing::argmax;

constexpr int prompt_len = 12, steps = 12;

std::shared_ptr<const model_handle> load(const pp_case& c) {
  auto d = troupe::testing::tp_dims(c.type);
  d.layers = c.layers;
  return troupe::testing::load_split_fixture(c.family, d, "troupe-pp-" + case_name(c), c.gguf);
}

std::vector<std::int32_t> prompt(std::int64_t vocab) { return troupe::testing::split_prompt(vocab, prompt_len); }

// Feeds the prompt, then `forced` one token at a time (the whole model's greedy tokens, so every stage
// sees the same sequence without waiting on the last stage's choice); the logits after each feed
// (empty on a stage before the last).
template <class Runner>
result<std::vector<std::vector<float>>, std::string> run_forced(Runner& run, const std::vector<std::int32_t>& p,
                                                                 const std::vector<std::int32_t>& forced) {
  std::vector<std::vector<float>> out;
  auto l = run.feed(p);
  if (!l) return unexpected(l.error());
  out.push_back(*l);
  for (std::size_t s = 0; s + 1 < forced.size(); ++s) {
    const std::int32_t next[] = {forced[s]};
    l = run.feed(next);
    if (!l) return unexpected(l.error());
    out.push_back(*l);
  }
  return out;
}

class pipeline_parallel : public ::testing::TestWithParam<pp_case> {};

TEST_P(pipeline_parallel, stages_give_the_whole_models_logits_and_tokens) {
  const auto c = GetParam();
  const auto whole = load(c);
  ASSERT_TRUE(whole);
  const auto p = prompt(whole->model().config().vocab);
  exec::cpu::cpu_executor one({1, std::nullopt});
  auto single = app::exec_runner::create(whole, one, 64);
  ASSERT_TRUE(single) << single.error();
  // The whole model's greedy run: its logits and tokens.
  std::vector<std::vector<float>> want;
  std::vector<std::int32_t> want_tokens;
  {
    auto l = single->feed(p);
    for (int s = 0; s < steps && l; ++s) {
      want.push_back(*l);
      want_tokens.push_back(argmax(*l));
      const std::int32_t next[] = {want_tokens.back()};
      if (s + 1 < steps) l = single->feed(next);
    }
    ASSERT_TRUE(l) << l.error();
  }

  const int world = c.tp * c.pp;
  std::vector<std::vector<std::unique_ptr<collective>>> groups, pipes;
  for (int s = 0; s < c.pp; ++s) groups.push_back(local_group(c.tp, std::chrono::seconds(30)));
  for (int t = 0; t < c.tp; ++t) pipes.push_back(local_group(c.pp, std::chrono::seconds(30)));
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(world));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int s = 0; s < c.pp; ++s)
    for (int t = 0; t < c.tp; ++t)
      ranks.emplace_back([&, s, t] {
        const int w = s * c.tp + t;
        auto part = whole->part(t, c.tp, s, c.pp);
        if (!part) return void(errors[w] = message(part.error()));
        exec::cpu::cpu_executor ex({1, std::nullopt, c.tp > 1 ? groups[s][t].get() : nullptr, pipes[t][s].get()});
        auto run = app::exec_runner::create(*part, ex, 64);
        if (!run) return void(errors[w] = run.error());
        auto r = run_forced(*run, p, want_tokens);
        if (!r) return void(errors[w] = r.error());
        got[w] = std::move(*r);
      });
  for (auto& t : ranks) t.join();
  for (int w = 0; w < world; ++w) ASSERT_TRUE(errors[w].empty()) << "rank " << w << ": " << errors[w];

  // Only the last stage's ranks hold logits; they agree bit for bit.
  for (int w = 0; w < world; ++w) {
    const bool last = w / c.tp == c.pp - 1;
    ASSERT_EQ(got[w].size(), want.size()) << "rank " << w;
    for (const auto& l : got[w]) EXPECT_EQ(l.empty(), !last) << "rank " << w;
  }
  const auto& head = got[static_cast<std::size_t>((c.pp - 1) * c.tp)];
  double worst = 0;
  int compared = 0;
  for (int s = 0; s < steps; ++s) {
    for (int t = 1; t < c.tp; ++t) EXPECT_EQ(got[(c.pp - 1) * c.tp + t][s], head[s]) << "the last stage's ranks disagree at step " << s;
    const auto a = log_softmax(want[s]), b = log_softmax(head[s]);
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    if (argmax(head[s]) != want_tokens[s]) {
      std::vector<double> sorted = a;
      std::sort(sorted.rbegin(), sorted.rend());
      EXPECT_LT(sorted[0] - sorted[1], 1e-3) << "greedy tokens part at step " << s << " without a near-tie";
      break;
    }
    ++compared;
  }
  if (c.tp == 1) {
    EXPECT_EQ(worst, 0.0) << "stages alone compute the whole model's ops in its order";
  }
  EXPECT_LT(worst, 1e-3);
  EXPECT_GE(compared, steps / 2);
  std::printf("[ pp ] %s: %d/%d greedy tokens as one device, worst |dlogprob| %.2e\n", case_name(c).c_str(), compared, steps, worst);
}

INSTANTIATE_TEST_SUITE_P(families, pipeline_parallel,
                         ::testing::Values(pp_case{"llama", 1, 2}, pp_case{"llama", 2, 2}, pp_case{"llama", 1, 4},
                                           pp_case{"llama", 1, 3, false, dtype::f32, 5}, pp_case{"llama", 2, 2, true, dtype::q8_0},
                                           pp_case{"qwen3", 1, 2}, pp_case{"qwen3", 2, 2}, pp_case{"gemma2", 1, 2},
                                           pp_case{"gemma2", 2, 2}, pp_case{"phi3", 1, 2}, pp_case{"phi3", 2, 2},
                                           pp_case{"qwen3_moe", 1, 2}, pp_case{"mixtral", 2, 2, true}, pp_case{"qwen2_moe", 2, 2},
                                           pp_case{"deepseek_v3", 2, 2, true}),
                         [](const auto& info) { return case_name(info.param); });

// The oracle runs a stage's graph too (pipe_send and pipe_recv over the same pipe): the reference for
// any backend's pipeline path. Two stages give the whole model's logits exactly.
TEST(pipeline_parallel_oracle, two_oracle_stages_give_the_whole_models_logits) {
  const auto whole = load({"llama", 1, 2});
  ASSERT_TRUE(whole);
  const auto p = prompt(whole->model().config().vocab);
  app::oracle_runner single(whole, 32);
  auto want = single.feed(p);
  ASSERT_TRUE(want) << want.error();
  auto pipe = local_group(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> stages;
  for (int s = 0; s < 2; ++s)
    stages.emplace_back([&, s] {
      auto part = whole->stage(s, 2);
      if (!part) return void(errors[s] = message(part.error()));
      app::oracle_runner run(*part, 32, nullptr, pipe[static_cast<std::size_t>(s)].get());
      auto l = run.feed(p);
      if (!l) return void(errors[s] = l.error());
      got[s] = *l;
    });
  for (auto& t : stages) t.join();
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(errors[s].empty()) << errors[s];
  EXPECT_TRUE(got[0].empty());
  EXPECT_EQ(got[1], *want);
}

TEST(pipeline_parallel_refusals, stages_that_cannot_be_made_are_typed_refusals) {
  const auto whole = load({"llama", 1, 2});
  ASSERT_TRUE(whole);
  auto five = whole->stage(0, 5);  // 4 layers do not make 5 stages
  ASSERT_FALSE(five);
  EXPECT_NE(message(five.error()).find("pipeline_parallel"), std::string::npos) << message(five.error());
  EXPECT_FALSE(whole->stage(2, 2));
  EXPECT_FALSE(whole->stage(0, 0));
  EXPECT_FALSE(whole->part(0, 1, 0, 1));  // 1 x 1 is the handle itself
  // A stage holds its layers, renumbered, and only its end's weights: the embedding on the first, the
  // final norm and the (tied) head on the last.
  auto first = whole->stage(0, 2), last = whole->stage(1, 2);
  ASSERT_TRUE(first && last);
  const auto& w0 = (*first)->model().weights();
  const auto& w1 = (*last)->model().weights();
  EXPECT_EQ((*first)->model().config().layers, 2);
  EXPECT_TRUE(w0.has({troupe::graph::tensor_role::token_embd, -1}));
  EXPECT_FALSE(w0.has({troupe::graph::tensor_role::output_norm, -1}));
  EXPECT_FALSE(w0.has({troupe::graph::tensor_role::attn_q, 2}));
  EXPECT_TRUE(w1.has({troupe::graph::tensor_role::output_norm, -1}));
  EXPECT_FALSE(w1.has({troupe::graph::tensor_role::attn_q, 2}));
  EXPECT_EQ(w1.view({troupe::graph::tensor_role::attn_q, 0})->data(), whole->model().weights().view({troupe::graph::tensor_role::attn_q, 2})->data());  // layer 2, a view
  EXPECT_EQ((*last)->model().schema().states(program::step).size(), 4u);  // k and v of its 2 layers
  // A stage is not split further (shard first, then stage the shard).
  EXPECT_FALSE((*first)->shard(0, 2));
  EXPECT_FALSE((*first)->stage(0, 2));
  // A stage's graph on an executor with no pipe is refused when its entry is compiled, not run.
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto run = app::exec_runner::create(*last, ex, 32);
  ASSERT_TRUE(run);
  auto l = run->feed(prompt(whole->model().config().vocab));
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().find("pipe"), std::string::npos) << l.error();
  // cpu_replica refuses what the parts refuse, before making any executor.
  EXPECT_FALSE(driver::cpu_replica::make(whole, 3, 1));  // 4 query heads do not split 3 ways
  EXPECT_FALSE(driver::cpu_replica::make(whole, 1, 5));
}

// The driver of a 2 x 2 replica (driver::cpu_replica): the driver runs on the last stage's rank 0,
// which samples; every other rank is in driver_options::other_ranks. Four sampled sequences of
// different prompt lengths (batched decode, chunked prefill) give the same tokens as one device.
TEST(pipeline_parallel_driver, a_staged_replica_serves_a_batch_like_one_device) {
  for (auto [tp, pp] : {std::pair{1, 2}, std::pair{2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    const auto whole = load({"qwen3", tp, pp});
    ASSERT_TRUE(whole);
    const auto opt = troupe::testing::serve_batch_options();
    const auto serve = troupe::testing::serve_batch;
    exec::cpu::cpu_executor one({1, std::nullopt});
    const auto want = serve(whole, one, opt);
    ASSERT_EQ(want.size(), 4u);
    auto replica = driver::cpu_replica::make(whole, tp, pp, 1);
    ASSERT_TRUE(replica) << replica.error();
    EXPECT_EQ((*replica)->ranks(), tp * pp);
    auto staged = opt;
    (*replica)->attach(staged);
    EXPECT_EQ(staged.other_ranks.size(), static_cast<std::size_t>(tp * pp - 1));
    const auto got = serve((*replica)->head(), (*replica)->head_executor(), staged);
    EXPECT_EQ(got, want);
    for (const auto& [id, toks] : want) EXPECT_EQ(toks.size(), 10u) << "sequence " << id;
  }
}

}  // namespace
}  // namespace troupe::families

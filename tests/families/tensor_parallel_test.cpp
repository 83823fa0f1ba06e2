// Tensor parallelism on simulated CPU devices in one process: each rank is a thread with its own CPU
// executor over its shard (model_handle::shard: its attention heads and feed-forward columns, the
// embeddings, norms and head whole), and the shard's all_reduce ops sum over an in-process group
// (troupe::local_group). Every rank must give the whole model's logits within 1e-3 in log-probability
// (f32 weights; only the summation order of the split projections differs) and the same greedy tokens,
// for 2 and 4 ranks (4 ranks share each of the 2 key/value heads), across the families' distinct
// layers: GQA (llama, also from GGUF with llama.cpp's permuted rows, and q8_0), per-head q/k norms
// (qwen3), sandwich norms and softcaps (gemma2), fused qkv and gate_up projections (phi3), and the
// recurrent layers (mamba2, the hybrids nemotron_h and qwen3_next: heads split, states with them), and
// ALiBi (bloom: each rank's heads keep their slopes; HF's per-head QKV split by heads; mpt: a fused
// [q | k | v] over grouped KV heads, bias-free LayerNorms, clamped q, k and v), and granite_hybrid's
// Mamba2 layers followed by routed feed-forwards (GGUF: its gated norm per B/C group; HF's spans the
// whole inner width, which a rank cannot hold, and is refused by name), and falcon_h1's attention and
// Mamba2 side by side (HF: the mup multipliers in the graph, per rank's segment widths).
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
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

struct tp_case {
  std::string_view family;
  int size;
  bool gguf = false;
  dtype type = dtype::f32;
  bool experts_whole = false;  // expert parallel: each rank holds E / size whole experts (model::expert_parallel)
  std::int64_t ssm_groups = 4;  // Mamba2 B/C groups (1: every rank holds the one group; its gated norm spans the ranks)
};
std::string case_name(const tp_case& c) {
  return std::string(c.family) + (c.experts_whole ? "_ep" : "_tp") + std::to_string(c.size) + (c.gguf ? "_gguf" : "") +
         (c.ssm_groups != 4 ? "_g" + std::to_string(c.ssm_groups) : "") +
         (c.type != dtype::f32 ? "_" + std::string(name(c.type)) : "");
}
void PrintTo(const tp_case& c, std::ostream* os) { *os << case_name(c); }

using troupe::testing::log_softmax;

using troupe::testing::argmax;

constexpr int prompt_len = 12, steps = 12;

std::shared_ptr<const model_handle> load(const tp_case& c) {
  auto d = troupe::testing::tp_dims(c.type);
  // Recurrent layers split by heads (Mamba2: 8 heads of 32 in 4 B/C groups; Qwen3-Next's linear
  // attention: 4 key heads, 8 value heads of 16), their states with them; the hybrids keep their
  // attention (and MLP) layers in the split too.
  if (c.family == "mamba2" || c.family == "nemotron_h" || c.family == "qwen3_next" || c.family == "granite_hybrid" || c.family == "falcon_h1")
    d.ssm_groups = c.ssm_groups;
  if (c.family == "nemotron_h" || c.family == "qwen3_next" || c.family == "granite_hybrid") d.layers = 4;
  return troupe::testing::load_split_fixture(c.family, d, "troupe-tp-" + case_name(c), c.gguf);
}

std::vector<std::int32_t> prompt(std::int64_t vocab) { return troupe::testing::split_prompt(vocab, prompt_len); }

// Greedy generation on one handle: the logits before every generated token.
template <class Runner>
std::vector<std::vector<float>> run_greedy(Runner& run, const std::vector<std::int32_t>& p, std::vector<std::int32_t>& tokens) {
  std::vector<std::vector<float>> out;
  auto l = run.feed(p);
  for (int s = 0; s < steps && l; ++s) {
    out.push_back(*l);
    const std::int32_t next[] = {argmax(*l)};
    tokens.push_back(next[0]);
    l = run.feed(next);
  }
  EXPECT_TRUE(l) << (l ? "" : l.error());
  return out;
}

class tensor_parallel : public ::testing::TestWithParam<tp_case> {};

TEST_P(tensor_parallel, ranks_give_the_whole_models_logits_and_tokens) {
  const auto c = GetParam();
  const auto whole = load(c);
  ASSERT_TRUE(whole);
  const auto p = prompt(whole->model().config().vocab);
  exec::cpu::cpu_executor one({1, std::nullopt});
  auto single = app::exec_runner::create(whole, one, 64);
  ASSERT_TRUE(single) << single.error();
  std::vector<std::int32_t> want_tokens;
  const auto want = run_greedy(*single, p, want_tokens);
  ASSERT_EQ(want.size(), static_cast<std::size_t>(steps));

  auto group = local_group(c.size, std::chrono::seconds(30));
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(c.size));
  std::vector<std::vector<std::int32_t>> got_tokens(static_cast<std::size_t>(c.size));
  std::vector<std::string> errors(static_cast<std::size_t>(c.size));
  std::vector<std::thread> ranks;
  for (int r = 0; r < c.size; ++r)
    ranks.emplace_back([&, r] {
      auto split = c.experts_whole ? whole->expert_parallel() : result<std::shared_ptr<const model_handle>, model_error>(whole);
      if (!split) {
        errors[r] = message(split.error());
        return;
      }
      auto shard = (*split)->shard(r, c.size);
      if (!shard) {
        errors[r] = message(shard.error());
        return;
      }
      exec::cpu::cpu_executor ex({1, std::nullopt, group[static_cast<std::size_t>(r)].get()});
      auto run = app::exec_runner::create(*shard, ex, 64);
      if (!run) {
        errors[r] = run.error();
        return;
      }
      got[r] = run_greedy(*run, p, got_tokens[r]);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < c.size; ++r) ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];

  double worst = 0;
  int compared = 0;
  for (int s = 0; s < steps; ++s) {
    const auto a = log_softmax(want[s]);
    for (int r = 0; r < c.size; ++r) {
      ASSERT_EQ(got[r].size(), want.size()) << "rank " << r;
      EXPECT_EQ(got[r][s], got[0][s]) << "ranks disagree at step " << s;  // the same reduced bits everywhere
      const auto b = log_softmax(got[r][s]);
      for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    }
    if (got_tokens[0][s] != want_tokens[s]) {
      std::vector<double> sorted = a;
      std::sort(sorted.rbegin(), sorted.rend());
      EXPECT_LT(sorted[0] - sorted[1], 1e-3) << "greedy tokens part at step " << s << " without a near-tie";
      break;
    }
    ++compared;
  }
  // q8_0 too: the split falls on block boundaries, so each rank's 8-bit activation blocks are the whole
  // model's; only the order of the partial sums differs, as for f32.
  EXPECT_LT(worst, 1e-3);
  EXPECT_GE(compared, steps / 2);
  std::printf("[ tp ] %s: %d/%d greedy tokens as one device, worst |dlogprob| %.2e\n", case_name(c).c_str(), compared, steps, worst);
}

INSTANTIATE_TEST_SUITE_P(families, tensor_parallel,
                         ::testing::Values(tp_case{"llama", 2}, tp_case{"llama", 4}, tp_case{"llama", 2, true},
                                           tp_case{"llama", 4, true, dtype::q8_0}, tp_case{"qwen3", 2}, tp_case{"qwen3", 4},
                                           tp_case{"gemma2", 2}, tp_case{"gemma2", 4}, tp_case{"phi3", 2}, tp_case{"phi3", 4},
                                           tp_case{"qwen3_moe", 2}, tp_case{"qwen3_moe", 4, true, dtype::q8_0}, tp_case{"mixtral", 2, true},
                                           tp_case{"qwen2_moe", 2}, tp_case{"deepseek_v2", 2}, tp_case{"deepseek_v3", 4, true},
                                           tp_case{"qwen3_moe", 2, true, dtype::f32, true}, tp_case{"qwen3_moe", 4, true, dtype::q8_0, true},
                                           tp_case{"mixtral", 2, true, dtype::f32, true}, tp_case{"qwen2_moe", 2, false, dtype::f32, true},
                                           tp_case{"deepseek_v3", 2, true, dtype::f32, true}, tp_case{"gpt_oss", 2, true},
                                           tp_case{"gpt_oss", 2, false, dtype::f32, true}, tp_case{"mamba2", 2},
                                           tp_case{"mamba2", 4, true, dtype::q8_0}, tp_case{"nemotron_h", 2, true},
                                           tp_case{"nemotron_h", 4}, tp_case{"qwen3_next", 2}, tp_case{"qwen3_next", 2, true, dtype::f16},
                                           tp_case{"qwen3_next", 4, true}, tp_case{"bloom", 2}, tp_case{"bloom", 4, true},
                                           tp_case{"mpt", 2}, tp_case{"mpt", 4, true}, tp_case{"granite_hybrid", 2, true},
                                           tp_case{"falcon_h1", 2}, tp_case{"falcon_h1", 4, true},
                                           // One B/C group, as Mamba2, Granite 4 and Falcon-H1 ship: every rank holds it, and the
                                           // gated norm's sum of squares is all-reduced (HF Granite's spans the width at any groups).
                                           tp_case{"mamba2", 2, true, dtype::f32, false, 1}, tp_case{"mamba2", 4, false, dtype::f32, false, 1},
                                           tp_case{"granite_hybrid", 2, true, dtype::f32, false, 1}, tp_case{"granite_hybrid", 2},
                                           tp_case{"falcon_h1", 2, true, dtype::f32, false, 1}),
                         [](const auto& info) { return case_name(info.param); });

// The oracle runs a shard's graph too (its all_reduce over the same group): the reference for any
// backend's tensor-parallel path.
// A dense model has no experts to place: expert parallelism is a typed refusal.
TEST(expert_parallel, a_dense_model_is_refused_with_a_typed_error) {
  const auto h = load(tp_case{"llama", 2});
  ASSERT_TRUE(h);
  auto ep = h->expert_parallel();
  ASSERT_FALSE(ep);
  const auto* e = std::get_if<config_error>(&ep.error());
  ASSERT_NE(e, nullptr) << message(ep.error());
  EXPECT_EQ(e->field, "expert_parallel");
}

TEST(tensor_parallel_oracle, two_oracle_ranks_give_the_whole_models_logits) {
  const auto whole = load({"llama", 2});
  ASSERT_TRUE(whole);
  const auto p = prompt(whole->model().config().vocab);
  app::oracle_runner single(whole, 32);
  auto want = single.feed(p);
  ASSERT_TRUE(want) << want.error();
  auto group = local_group(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto shard = whole->shard(r, 2);
      if (!shard) return void(errors[r] = message(shard.error()));
      app::oracle_runner run(*shard, 32, group[static_cast<std::size_t>(r)].get());
      auto l = run.feed(p);
      if (!l) return void(errors[r] = l.error());
      got[r] = *l;
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(errors[r].empty()) << errors[r];
  const auto a = log_softmax(*want), b = log_softmax(got[0]);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LT(worst, 1e-5);  // the oracle rounds each op once; only the split sums' f32 rounding differs
  EXPECT_EQ(got[0], got[1]);
}

TEST(tensor_parallel_refusals, splits_that_do_not_divide_are_typed_refusals) {
  const auto whole = load({"llama", 3});
  ASSERT_TRUE(whole);
  auto three = whole->shard(0, 3);  // 4 query heads do not split 3 ways
  ASSERT_FALSE(three);
  EXPECT_NE(message(three.error()).find("tensor_parallel"), std::string::npos) << message(three.error());
  EXPECT_FALSE(whole->shard(2, 2));
  EXPECT_FALSE(whole->shard(0, 0));
  // Two Mamba2 B/C groups over four ranks: each gated-norm group would span two of the ranks, a subgroup
  // the all-reduce does not have: refused by name. Three groups over two ranks neither split nor divide.
  auto gd = troupe::testing::tp_dims();
  gd.ssm_groups = 2;
  const auto two_groups = troupe::testing::load_split_fixture("mamba2", gd, "troupe-tp-mamba2-two-groups", true);
  ASSERT_TRUE(two_groups);
  auto m = two_groups->shard(0, 4);
  ASSERT_FALSE(m);
  EXPECT_NE(message(m.error()).find("gated norm"), std::string::npos) << message(m.error());
  EXPECT_TRUE(two_groups->shard(0, 2));
  // A shard holds its slices: half the query heads, one of the two key/value heads, half the
  // feed-forward rows and columns, half the head's vocabulary rows; the embedding whole.
  auto shard = whole->shard(1, 2);
  ASSERT_TRUE(shard);
  const auto& w = (*shard)->model().weights();
  EXPECT_EQ(w.view({troupe::graph::tensor_role::attn_q, 0})->shape(), (troupe::shape{64, 128}));
  EXPECT_EQ(w.view({troupe::graph::tensor_role::attn_k, 0})->shape(), (troupe::shape{32, 128}));
  EXPECT_EQ(w.view({troupe::graph::tensor_role::attn_output, 1})->shape(), (troupe::shape{128, 64}));
  EXPECT_EQ(w.view({troupe::graph::tensor_role::ffn_down, 1})->shape(), (troupe::shape{128, 128}));
  EXPECT_EQ(w.view({troupe::graph::tensor_role::output, -1})->shape(), (troupe::shape{192, 128}));
  EXPECT_EQ(w.view({troupe::graph::tensor_role::token_embd, -1})->shape(), (troupe::shape{384, 128}));
  // Row slices are views into the checkpoint's bytes, not copies.
  EXPECT_EQ(w.view({troupe::graph::tensor_role::attn_q, 0})->data(), whole->model().weights().view({troupe::graph::tensor_role::attn_q, 0})->data() + 64 * 128 * sizeof(float));
  // A shard's graph on an executor with no group is refused when its entry is compiled, not run.
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto run = app::exec_runner::create(*shard, ex, 32);
  ASSERT_TRUE(run);
  auto l = run->feed(prompt(whole->model().config().vocab));
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().find("group"), std::string::npos) << l.error();
}

// The driver of a sharded replica: the driver's own executor is rank 0, the others are given in
// driver_options::other_ranks; every entry is prepared on every rank and each step (batched decode,
// chunked prefill) runs on all of them. Four sampled sequences of different prompt lengths give the same
// tokens as a driver on one device.
// The hybrids carry their state rows to every rank with the step.
TEST(tensor_parallel_driver, a_sharded_replica_serves_a_batch_like_one_device) {
  for (auto [family, size] : {std::pair{"qwen3", 2}, {"qwen3", 4}, {"nemotron_h", 2}, {"qwen3_next", 2}}) {
    SCOPED_TRACE(std::string(family) + ", ranks " + std::to_string(size));
    const auto whole = load({family, size});
    ASSERT_TRUE(whole);
    const auto opt = troupe::testing::serve_batch_options();
    const auto serve = troupe::testing::serve_batch;
    exec::cpu::cpu_executor one({1, std::nullopt});
    const auto want = serve(whole, one, opt);
    ASSERT_EQ(want.size(), 4u);
    auto group = local_group(size);
    std::vector<std::unique_ptr<exec::cpu::cpu_executor>> exs;
    for (int r = 0; r < size; ++r) exs.push_back(std::make_unique<exec::cpu::cpu_executor>(exec::cpu::cpu_options{1, std::nullopt, group[r].get()}));
    auto tp = opt;
    for (int r = 1; r < size; ++r) {
      auto shard = whole->shard(r, size);
      ASSERT_TRUE(shard);
      tp.other_ranks.push_back({*shard, exs[r].get()});
    }
    auto rank0 = whole->shard(0, size);
    ASSERT_TRUE(rank0);
    const auto got = serve(*rank0, *exs[0], tp);
    EXPECT_EQ(got, want);
    for (const auto& [id, toks] : want) EXPECT_EQ(toks.size(), 10u) << "sequence " << id;
  }
}

}  // namespace
}  // namespace troupe::families

// MTP speculation (engine/driver/mtp.cpp; families/components/mtp.hpp): DeepSeek-V3 and Qwen3-Next
// fixtures with a multi-token-prediction layer offer the draft program, from HF and GGUF alike;
// drafting with it gives the target's own tokens (greedy and seeded-sampled, through prefill
// catch-ups, verify rollbacks, preemption and the prefix cache; Qwen3-Next's recurrent state through
// its snapshots); and after every round the drafts the drafter holds are the ones a from-scratch pass
// of the model's step and draft programs over the sequence gives, so its KV catch-up and rollback lose
// nothing (DeepSeek-V3: the reference below binds no recurrent state).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "engine/driver/driver_state.hpp"
#include "engine/driver/weight_source.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view mtp_families[] = {"deepseek_v3", "qwen3_next"};

std::shared_ptr<const families::model_handle> mtp_fixture(bool gguf, std::string_view family = "deepseek_v3") {
  auto d = test::small_dims();
  d.mtp_layers = 1;
  if (family == "qwen3_next") d.ssm_groups = 2;
  const auto dir = fs::temp_directory_path() / ("troupe-mtp-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = dir / (std::string(family) + (gguf ? ".gguf" : ""));
  if (!fs::exists(path)) {
    auto w = families::write_fixture(family, d, path, gguf);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

driver_options options(bool mtp, std::int64_t K = 3) {
  driver_options o;
  o.max_rows = 4;
  o.capacity = 160;
  o.block_size = 8;
  o.prefill_chunk = 32;
  o.token_budget = 64;
  if (mtp) {
    o.speculation.kind = draft_kind::mtp;
    o.speculation.tokens = K;
  }
  return o;
}

std::vector<std::int32_t> prompt(std::int32_t salt, std::int64_t n) {
  std::vector<std::int32_t> p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(5 + (i * 37 + salt * 101) % 500));
  return p;
}

TEST(mtp, the_draft_program_is_offered_from_both_forms_and_only_with_its_layer) {
  for (const auto family : mtp_families)
    for (bool gguf : {false, true}) {
      auto h = mtp_fixture(gguf, family);
      ASSERT_TRUE(h);
      EXPECT_TRUE(h->model().schema().offers(families::program::draft)) << family << (gguf ? " gguf" : " hf");
      EXPECT_EQ(h->model().config().layers, 2);  // the MTP layer is not one of the stack's
    }
  auto plain = test::small_fixture("deepseek_v3");
  EXPECT_FALSE(plain->model().schema().offers(families::program::draft));
  exec::cpu::cpu_executor ex;
  auto d = driver<unprepared>(plain, ex, options(true)).prepare();
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().second.code, driver_error_code::program_not_offered);
}

TEST(mtp, greedy_and_seeded_output_is_the_targets_own) {
  for (const auto family : mtp_families)
  for (bool gguf : {false, true}) {
    SCOPED_TRACE(std::string(family) + (gguf ? " gguf" : " hf"));
    auto h = mtp_fixture(gguf, family);
    exec::cpu::cpu_executor plain_ex, spec_ex;
    auto plain = test::serve(h, plain_ex, options(false));
    auto spec = test::serve(h, spec_ex, options(true));
    std::vector<seq_request> reqs;
    // Prompts shorter and longer than a verify window and than a prefill chunk, greedy and sampled.
    for (int i = 0; i < 6; ++i)
      reqs.push_back(test::request(prompt(i, 3 + 19 * i), 20 + 4 * i, i % 2 ? 0.8f : 0.0f, 40 + static_cast<std::uint64_t>(i)));
    const auto want = test::run_all(plain, reqs);
    const auto got = test::run_all(spec, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    const auto c = spec.counters();
    EXPECT_GT(c.verify_steps, 0);
    EXPECT_GT(c.draft_tokens, 0);
    EXPECT_GT(c.draft_steps, 0);
    // Again on the same driver: the prefix cache now serves the prompts' blocks.
    const auto again = test::run_all(spec, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].tokens, want[i].tokens) << "again, sequence " << i;
  }
}

TEST(mtp, a_small_pool_preempts_and_the_output_stays_the_same) {
  for (const auto family : mtp_families) {
  SCOPED_TRACE(std::string(family));
  auto h = mtp_fixture(true, family);
  auto o = options(true);
  o.pool_blocks = 24;  // 192 slots for 4 rows of up to ~90 tokens: preemption
  exec::cpu::cpu_executor plain_ex, spec_ex;
  auto plain = test::serve(h, plain_ex, options(false));
  auto spec = test::serve(h, spec_ex, o);
  std::vector<seq_request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(test::request(prompt(i + 7, 30 + 5 * i), 40));
  const auto want = test::run_all(plain, reqs);
  const auto got = test::run_all(spec, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
  EXPECT_GT(spec.counters().preemptions, 0);
  }
}

// ---- the drafts against a from-scratch pass ----------------------------------------------------------

// The model's step program over tokens [0, P) (one row, hidden carried), then its draft program over
// positions [0, P) with the tokens that followed each, then K - 1 chained draft steps: the argmax chain
// and, per draft, the gap between its best and second-best logit.
struct reference_drafts {
  std::vector<std::int32_t> tokens;
  std::vector<float> margins;
};

reference_drafts from_scratch(const families::model_handle& h, std::span<const std::int32_t> seq, std::int64_t K, std::int64_t C) {
  const auto& m = h.model();
  const auto P = static_cast<std::int64_t>(seq.size()) - 1;  // seq[P] is the pending token
  const auto H = m.config().hidden;
  exec::cpu::cpu_executor ex;
  weight_map_source src(m.weights());
  auto exe = ex.load(src);
  EXPECT_TRUE(exe);
  // A recurrent target (Qwen3-Next) runs its step program over state row 0 of a one-row pool.
  const auto& states = m.schema().states(families::program::step);
  const bool recurrent = std::any_of(states.begin(), states.end(), [](const families::state_decl& d) { return d.per_row; });
  tensor row0(dtype::i32, {1});
  auto run = [&](families::program prog, std::int64_t T, std::int64_t first, const std::int32_t* ids, const float* hidden) {
    families::step_spec spec;
    spec.program = prog;
    spec.shape = families::step_shape(1, T, C).with_hidden_carry(prog == families::program::step);
    if (recurrent && prog == families::program::step) spec.shape.with_state_rows(1);
    auto g = m.trace(spec, {});
    EXPECT_TRUE(g) << (g ? "" : g.error().message());
    auto e = ex.add_entry(*exe, *g);
    EXPECT_TRUE(e) << (e ? "" : e.error().message());
    tensor tid(dtype::i32, {T}), pos(dtype::i32, {T}), wr(dtype::i32, {T}), rd(dtype::i32, {1, C}), hid(dtype::f32, {T, H});
    std::fill_n(rd.as<std::int32_t>(), C, -1);
    for (std::int64_t t = 0; t < T; ++t) {
      tid.as<std::int32_t>()[t] = ids[t];
      pos.as<std::int32_t>()[t] = static_cast<std::int32_t>(first + t);
      wr.as<std::int32_t>()[t] = static_cast<std::int32_t>(first + t);
    }
    for (std::int64_t j = 0; j < first + T; ++j) rd.as<std::int32_t>()[j] = static_cast<std::int32_t>(j);
    if (hidden) std::copy_n(hidden, T * H, hid.as<float>());
    exec::step_inputs in;
    in.slots["token_ids"] = tid.view();
    in.slots["positions"] = pos.view();
    in.slots["kv_write_map"] = wr.view();
    in.slots["kv_read_map"] = rd.view();
    if (prog == families::program::draft) in.slots["hidden_states"] = hid.view();
    if (recurrent && prog == families::program::step) in.slots["state_rows"] = row0.view();
    auto out = ex.step(*e, in);
    EXPECT_TRUE(out) << (out ? "" : out.error().message());
    return std::move(out->outputs);
  };
  reference_drafts r;
  auto target = run(families::program::step, P, 0, seq.data(), nullptr);
  auto draft = run(families::program::draft, P, 0, seq.data() + 1, target.at("hidden").as<float>());
  for (std::int64_t k = 0; k < K; ++k) {
    const auto& lg = draft.at("logits");
    const auto V = lg.shape()[1];
    std::vector<float> row(lg.as<float>(), lg.as<float>() + V);
    const auto best = std::max_element(row.begin(), row.end()) - row.begin();
    const float top = row[static_cast<std::size_t>(best)];
    row[static_cast<std::size_t>(best)] = -1e30f;
    r.tokens.push_back(static_cast<std::int32_t>(best));
    r.margins.push_back(top - *std::max_element(row.begin(), row.end()));
    if (k + 1 == K) break;
    const auto& hd = draft.at("hidden");
    const float* last = hd.as<float>() + (hd.shape()[0] - 1) * H;
    std::vector<float> h1(last, last + H);
    const std::int32_t tok = r.tokens.back();
    draft = run(families::program::draft, 1, P + k, &tok, h1.data());
  }
  return r;
}

TEST(mtp, the_drafters_drafts_after_every_round_are_a_from_scratch_pass_over_the_sequence) {
  for (const auto family : mtp_families) {
  SCOPED_TRACE(std::string(family));
  auto h = mtp_fixture(true, family);
  constexpr std::int64_t K = 3;
  exec::cpu::cpu_executor ex;
  driver_state st;
  st.handle = h;
  st.ex = &ex;
  st.options = options(true, K);
  st.options.speculation.adaptive = false;  // K drafts every time
  ASSERT_TRUE(st.prepare());
  // Three sequences (one a multi-chunk prefill), opened as the driver opens them.
  for (int i = 0; i < 3; ++i) {
    sequence s;
    s.id = st.next_id++;
    s.req = test::request(prompt(i + 3, i == 2 ? 70 : 5 + 6 * i), 30);
    s.tokens = s.req.prompt;
    s.prompt_len = static_cast<std::int64_t>(s.tokens.size());
    st.seqs.emplace(s.id, std::move(s));
    st.waiting.push_back(st.seqs.rbegin()->first);
  }
  std::int64_t compared = 0;
  for (int round = 0; round < 200 && (!st.running.empty() || !st.waiting.empty()); ++round) {
    auto r = st.round();
    ASSERT_TRUE(r) << r.error().message();
    std::vector<sequence*> rows;
    for (auto id : st.running) {
      auto& s = st.seqs.at(id);
      if (s.phase == seq_phase::running && static_cast<std::int64_t>(s.tokens.size()) == s.computed + 1) rows.push_back(&s);
    }
    if (rows.empty()) continue;
    auto drafts = st.draft_for(rows);  // what the next round verifies (the drafter keeps them for it)
    ASSERT_TRUE(drafts) << drafts.error().message();
    if (drafts->empty()) continue;  // no row may draft (each is one token short of its end)
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& s = *rows[i];
      const auto& got = (*drafts)[i];
      if (got.empty()) continue;
      const auto want = from_scratch(*h, s.tokens, static_cast<std::int64_t>(got.size()), st.options.capacity);
      for (std::size_t k = 0; k < got.size(); ++k) {
        if (want.margins[k] < 1e-3f) break;  // a near-tie: rounding may pick either; later drafts follow it
        EXPECT_EQ(got[k], want.tokens[k]) << "sequence " << s.id << " at " << s.computed << ", draft " << k;
        ++compared;
        if (got[k] != want.tokens[k]) break;
      }
    }
  }
  EXPECT_GT(compared, 60);
  EXPECT_GT(st.counters.verify_steps, 0);
  }
}

// The HF and GGUF forms of one MTP layer (the names each keeps it under, HF's 1 + w norms against the
// GGUF's stored sums) give the same from-scratch drafts, logit margins included.
TEST(mtp, both_forms_give_the_same_draft_logits) {
  for (const auto family : mtp_families) {
    SCOPED_TRACE(std::string(family));
    const auto seq = prompt(9, 21);
    const auto hf = from_scratch(*mtp_fixture(false, family), seq, 3, 64);
    const auto gg = from_scratch(*mtp_fixture(true, family), seq, 3, 64);
    EXPECT_EQ(hf.tokens, gg.tokens);
    ASSERT_EQ(hf.margins.size(), gg.margins.size());
    for (std::size_t k = 0; k < hf.margins.size(); ++k) EXPECT_NEAR(hf.margins[k], gg.margins[k], 1e-4f) << "draft " << k;
  }
}

}  // namespace
}  // namespace troupe::driver

// The driver on the CPU executor over a fixture model: batched decode against each sequence alone,
// paged against contiguous KV (and against the plain contiguous runner), prefix-cache hits, preemption,
// stop conditions, guided rows, encode, and every typed refusal.
#include "engine/driver/driver.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <regex>

#include "apps/exec_runner.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/driver_fixture.hpp"
#include "families/families.hpp"
#include "families/model.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const families::model_handle> fixture(std::string_view family = "llama", dtype format = dtype::f32) {
  return test::small_fixture(family, format);
}

driver_options small_options() {
  driver_options o;
  o.max_rows = 4;
  o.capacity = 128;
  o.block_size = 8;
  o.prefill_chunk = 32;
  o.token_budget = 64;
  return o;
}

using test::serve;

std::vector<std::int32_t> prompt(std::int64_t n, std::int32_t salt) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(3 + (i * 37 + salt * 101) % 500);
  return p;
}

using test::request;

using test::run_all;
using test::run_result;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<seq_request> mixed_requests(bool logits) {
  std::vector<seq_request> reqs;
  const std::int64_t lens[] = {3, 17, 40, 1, 70, 9};
  for (int i = 0; i < 6; ++i) {
    auto r = request(prompt(lens[i], i), 10 + i, i % 2 ? 0.8f : 0.0f, 1000 + static_cast<std::uint64_t>(i));
    if (logits) r.head = head_kind::logits;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(driver, batched_decode_gives_each_sequence_its_tokens_alone) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto o = small_options();
  o.logits_head = true;
  auto d = serve(h, ex, o);
  const auto reqs = mixed_requests(true);
  std::vector<run_result> alone;
  for (const auto& r : reqs) alone.push_back(run_all(d, {r}).front());
  const auto together = run_all(d, reqs);  // 6 sequences over 4 rows: admission waits for free rows
  ASSERT_EQ(together.size(), alone.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_EQ(together[i].tokens, alone[i].tokens);
    EXPECT_EQ(together[i].tokens.size(), static_cast<std::size_t>(reqs[i].max_tokens));
    EXPECT_EQ(together[i].finished, finish_reason::length);
    ASSERT_EQ(together[i].logits.size(), alone[i].logits.size());
    for (std::size_t t = 0; t < alone[i].logits.size(); ++t) EXPECT_LT(max_abs_diff(together[i].logits[t], alone[i].logits[t]), 1e-3);
  }
  EXPECT_GT(d.counters().decode_tokens, 0);
}

TEST(driver, paged_equals_contiguous_and_the_plain_runner) {
  auto h = fixture();
  exec::cpu::cpu_executor ex1, ex2, ex3;
  auto paged = small_options();
  paged.logits_head = true;
  paged.prefix_cache = false;
  auto contiguous = paged;
  contiguous.paged = false;
  auto dp = serve(h, ex1, paged);
  auto dc = serve(h, ex2, contiguous);
  // Scatter the paged pool first so block tables are not in order.
  (void)run_all(dp, {request(prompt(20, 9), 5), request(prompt(50, 8), 3)});
  auto req = request(prompt(45, 3), 8);
  req.head = head_kind::logits;
  const auto a = run_all(dp, {req}).front();
  const auto b = run_all(dc, {req}).front();
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (std::size_t t = 0; t < a.logits.size(); ++t) EXPECT_LT(max_abs_diff(a.logits[t], b.logits[t]), 1e-3);

  // The runner of `troupe generate` feeds the same tokens through a contiguous rows=1 layout.
  auto runner = app::exec_runner::create(h, ex3, 128);
  ASSERT_TRUE(runner);
  auto first = runner->feed(req.prompt);
  ASSERT_TRUE(first);
  EXPECT_LT(max_abs_diff(*first, a.logits[0]), 1e-3);
  for (std::size_t t = 0; t + 1 < a.tokens.size(); ++t) {
    auto next = runner->feed(std::span(&a.tokens[t], 1));
    ASSERT_TRUE(next);
    EXPECT_LT(max_abs_diff(*next, a.logits[t + 1]), 1e-3);
  }
}

TEST(driver, prefix_cache_hit_skips_the_cached_prefill_and_changes_nothing) {
  auto h = fixture();
  exec::cpu::cpu_executor ex1, ex2;
  auto with = small_options();
  auto without = with;
  without.prefix_cache = false;
  auto dw = serve(h, ex1, with);
  auto dn = serve(h, ex2, without);
  auto shared = prompt(48, 5);
  auto first = request(shared, 6);
  auto second_prompt = shared;
  second_prompt.resize(40);  // 5 full blocks of 8 shared
  for (int i = 0; i < 11; ++i) second_prompt.push_back(100 + i);
  auto second = request(second_prompt, 6, 0.7f, 77);

  (void)run_all(dw, {first});
  const auto before = dw.counters();
  const auto hit = run_all(dw, {second}).front();
  const auto after = dw.counters();
  EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, 40);
  EXPECT_EQ(after.prefill_tokens - before.prefill_tokens, 51 - 40);

  (void)run_all(dn, {first});
  const auto miss = run_all(dn, {second}).front();
  EXPECT_EQ(dn.counters().prefix_hit_tokens, 0);
  EXPECT_EQ(hit.tokens, miss.tokens);

  // The whole prompt cached except its last token: a prompt equal to the first one hits 40 of 48.
  const auto c0 = dw.counters().prefix_hit_tokens;
  (void)run_all(dw, {first});
  EXPECT_EQ(dw.counters().prefix_hit_tokens - c0, 40);
}

TEST(driver, preemption_by_recompute_finishes_every_sequence_with_its_own_tokens) {
  auto h = fixture();
  exec::cpu::cpu_executor ex1, ex2, ex3;
  auto o = small_options();
  o.prefix_cache = false;
  auto tight = o;
  tight.pool_blocks = 12;  // 96 slots for 4 sequences of up to 50
  auto roomy = serve(h, ex1, o);
  auto d = serve(h, ex2, tight);
  std::vector<seq_request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(request(prompt(20 + 4 * i, 20 + i), 20));
  std::vector<run_result> alone;
  for (const auto& r : reqs) alone.push_back(run_all(roomy, {r}).front());
  const auto together = run_all(d, reqs);
  EXPECT_GT(d.counters().preemptions, 0);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].finished, finish_reason::length);
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "sequence " << i;
  }
  EXPECT_EQ(d.counters().pool_available, 12);

  // Without preemption the pool runs dry and a sequence says so instead of waiting forever.
  auto off = tight;
  off.preempt = false;
  auto dn = serve(h, ex3, off);
  const auto res = run_all(dn, reqs);
  int exhausted = 0;
  for (const auto& r : res) exhausted += r.finished == finish_reason::pool_exhausted;
  EXPECT_GT(exhausted, 0);
  EXPECT_TRUE(dn.idle());
}

TEST(driver, stop_conditions_and_cancellation) {
  auto h = fixture();
  ASSERT_NE(h->text(), nullptr);
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  // Word pieces only (no byte tokens), so the streamed text is plain UTF-8 and equals a batch decode.
  auto base = request(prompt(12, 1), 12, 0.9f, 3);
  base.guide = [](std::span<const std::int32_t>, std::span<std::uint32_t> mask) {
    for (std::int32_t t = 259; t < 511; ++t) mask[static_cast<std::size_t>(t / 32)] |= 1u << (t % 32);
  };
  auto g = d.generate(base);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(g->finished, finish_reason::length);
  ASSERT_EQ(g->tokens.size(), 12u);
  EXPECT_EQ(g->text, h->text()->decode(g->tokens, true));

  // A stop id: the sequence ends on its first occurrence.
  auto by_id = base;
  by_id.stop_ids = {g->tokens[4]};
  auto gi = d.generate(by_id);
  ASSERT_TRUE(gi);
  EXPECT_EQ(gi->finished, finish_reason::eos);
  const auto first = std::find(g->tokens.begin(), g->tokens.end(), g->tokens[4]) - g->tokens.begin();
  EXPECT_EQ(gi->tokens.size(), static_cast<std::size_t>(first + 1));

  // A stop string from the middle of the text: the text ends right before it.
  const auto piece = h->text()->decode(std::span(&g->tokens[6], 1), true);
  auto by_text = base;
  by_text.stop = {piece};
  auto gs = d.generate(by_text);
  ASSERT_TRUE(gs);
  EXPECT_EQ(gs->finished, finish_reason::stop_string);
  EXPECT_EQ(gs->text, g->text.substr(0, g->text.find(piece)));

  // The model's eos ends a sequence unless ignored.
  auto eos_bias = base;
  eos_bias.ignore_eos = false;
  eos_bias.guide = nullptr;
  eos_bias.logit_bias = {{2, 100.0f}};
  auto ge = d.generate(eos_bias);
  ASSERT_TRUE(ge);
  EXPECT_EQ(ge->finished, finish_reason::eos);
  EXPECT_EQ(ge->tokens, std::vector<std::int32_t>{2});

  // Cancellation.
  auto id = d.open(request(prompt(30, 2), 50));
  ASSERT_TRUE(id);
  ASSERT_TRUE(d.step());
  ASSERT_TRUE(d.cancel(*id));
  auto r = d.step();
  ASSERT_TRUE(r);
  bool seen = false;
  for (const auto& u : r->updates) seen = seen || (u.id == *id && u.finished == finish_reason::cancelled);
  EXPECT_TRUE(seen);
  EXPECT_TRUE(d.idle());
  EXPECT_TRUE(d.release(*id));
  EXPECT_EQ(d.release(*id).error().code, driver_error_code::unknown_sequence);
  EXPECT_EQ(d.counters().pool_available, d.counters().pool_blocks);
}

TEST(driver, a_resumed_sequence_continues_exactly_where_it_stopped) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  for (float temperature : {0.0f, 0.9f}) {
    auto r = request(prompt(20, 6), 12, temperature, 42);
    r.sampling.frequency_penalty = 0.5f;  // the resumed history must count the prior output
    auto whole = d.generate(r);
    ASSERT_TRUE(whole);
    auto resumed = r;
    resumed.prior_output.assign(whole->tokens.begin(), whole->tokens.begin() + 5);
    auto rest = d.generate(resumed);
    ASSERT_TRUE(rest) << rest.error().message();
    EXPECT_EQ(rest->tokens, std::vector<std::int32_t>(whole->tokens.begin() + 5, whole->tokens.end()));
    EXPECT_EQ(rest->finished, finish_reason::length);
  }
  auto full = request(prompt(4, 1), 3);
  full.prior_output = {5, 6, 7};
  EXPECT_EQ(d.open(full).error().code, driver_error_code::bad_request);
}

TEST(driver, guided_rows_draw_only_allowed_tokens) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  auto r = request(prompt(10, 4), 16, 1.0f, 5);
  r.guide = [](std::span<const std::int32_t> out, std::span<std::uint32_t> mask) {
    const std::int32_t allowed = out.size() % 2 ? 7 : 300;
    mask[static_cast<std::size_t>(allowed / 32)] |= 1u << (allowed % 32);
    mask[5 / 32] |= 1u << 5;
  };
  auto g = d.generate(r);
  ASSERT_TRUE(g) << g.error().message();
  for (std::size_t i = 0; i < g->tokens.size(); ++i) {
    const auto t = g->tokens[i];
    EXPECT_TRUE(t == 5 || t == (i % 2 ? 7 : 300)) << "token " << i << " = " << t;
  }
}

// A guide spec compiled by the driver against the model's own vocabulary (the GGUF's SentencePiece
// pieces with byte fallback): the decoded text is a sentence of the guide whatever the sampling, the
// sequence ends at the end-of-generation id once the guide is complete, and a guide that does not
// compile is a bad_request naming it. The HF fixture ships no tokenizer: a guide is refused by name
// there (the vocabularies of real tokenizer.json files are held in troupe_guide_vocab_test).
TEST(driver, guide_specs_shape_the_decoded_text_in_both_forms) {
  for (const bool gguf : {true, false}) {
    families::fixture_dims dims;
    dims.vocab = 512;
    dims.hidden = 64;
    dims.ffn = 128;
    dims.heads = 2;
    dims.kv_heads = 1;
    dims.head_dim = 32;
    dims.layers = 1;
    const auto path = fs::temp_directory_path() / (gguf ? "troupe-driver-guide-" + std::to_string(::getpid()) + ".gguf" : "troupe-driver-guide-hf-" + std::to_string(::getpid()));
    ASSERT_TRUE(families::write_fixture("llama", dims, path, gguf));
    auto h = families::model_handle::load(path, families::registry::builtin());
    ASSERT_TRUE(h) << families::message(h.error());
    exec::cpu::cpu_executor ex;
    auto d = serve(*h, ex, small_options());
    if (!gguf) {
      auto r = request(prompt(6, 1), 4);
      r.guided = {guide::guide_kind::choice, R"(["a"])"};
      auto e = d.open(r);
      ASSERT_FALSE(e);
      EXPECT_EQ(e.error().code, driver_error_code::bad_request);
      EXPECT_NE(e.error().message().find("tokenizer"), std::string::npos) << e.error().message();
      continue;
    }
    const std::vector<std::pair<guide::guide_spec, std::string>> cases = {
        {{guide::guide_kind::regex, "[a-c]{2,4}( [0-9]{1,3})?"}, "[a-c]{2,4}( [0-9]{1,3})?"},
        {{guide::guide_kind::choice, R"(["red", "green", "blue sky"])"}, "red|green|blue sky"},
        {{guide::guide_kind::json_schema, R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]}}, "required": ["ok", "n"], "additionalProperties": false})"},
         R"(\{\s*"ok"\s*:\s*(true|false)\s*,\s*"n"\s*:\s*(1|22|333)\s*\}\s*)"},
        {{guide::guide_kind::grammar, "root ::= \"<\" [\u00e0-\u00ff]{1,3} \">\""}, "<[\\s\\S]{2,6}>"},
    };
    for (const auto& [spec, pattern] : cases)
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        auto r = request(prompt(6, static_cast<std::int32_t>(seed)), 60, seed == 1 ? 0.0f : 1.0f, seed);
        r.ignore_eos = false;
        r.guided = spec;
        auto g = d.generate(r);
        ASSERT_TRUE(g) << g.error().message();
        EXPECT_TRUE(std::regex_match(g->text, std::regex(pattern))) << guide::name(spec.kind) << " " << (gguf ? "gguf" : "hf") << ": '" << g->text << "'";
        EXPECT_EQ(g->finished, finish_reason::eos) << g->text;
      }
    // A guided job resumed elsewhere after k delivered tokens (prior_output) continues exactly as the
    // uninterrupted run: the guide replays the delivered tokens before its next mask.
    {
      auto r = request(prompt(6, 9), 60, 1.0f, 77);
      r.ignore_eos = false;
      r.guided = cases[2].first;  // the JSON schema
      auto whole = d.generate(r);
      ASSERT_TRUE(whole);
      ASSERT_GT(whole->tokens.size(), 4u);
      auto resumed = r;
      resumed.prior_output.assign(whole->tokens.begin(), whole->tokens.begin() + 4);
      auto rest = d.generate(resumed);
      ASSERT_TRUE(rest) << rest.error().message();
      EXPECT_EQ(rest->tokens, std::vector<std::int32_t>(whole->tokens.begin() + 4, whole->tokens.end()));
    }
    auto bad = request(prompt(6, 1), 4);
    bad.guided = {guide::guide_kind::grammar, "root ::= nothing"};
    auto e = d.open(bad);
    ASSERT_FALSE(e);
    EXPECT_EQ(e.error().code, driver_error_code::bad_request);
    EXPECT_NE(e.error().message().find("nothing"), std::string::npos) << e.error().message();
  }
}

// Embeddings: rows of different lengths run several to a step (entries added on first use, no
// options.encode) and equal each row alone; each pooling mode is its reduction of the row's encode
// hidden states; normalized vectors have unit length.
TEST(driver, embeddings_batch_rows_and_pool_as_declared) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  const std::vector<std::vector<std::int32_t>> rows{prompt(5, 1), prompt(9, 2), prompt(3, 3), prompt(14, 4), prompt(32, 5), prompt(7, 6)};
  auto together = d.embed(rows, {families::pooling_mode::last, true, "test"});
  ASSERT_TRUE(together) << together.error().message();
  ASSERT_EQ(together->size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto alone = d.embed(std::span(&rows[i], 1), {families::pooling_mode::last, true, "test"});
    ASSERT_TRUE(alone);
    ASSERT_EQ((*alone)[0].size(), 128u);
    double norm = 0;
    for (std::size_t c = 0; c < 128; ++c) {
      EXPECT_NEAR((*together)[i][c], (*alone)[0][c], 1e-4) << "row " << i << " component " << c;
      norm += static_cast<double>((*alone)[0][c]) * (*alone)[0][c];
    }
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
  auto hidden = d.encode(rows);
  ASSERT_TRUE(hidden);
  for (auto mode : {families::pooling_mode::mean, families::pooling_mode::cls, families::pooling_mode::last}) {
    auto e = d.embed(rows, {mode, false, "test"});
    ASSERT_TRUE(e);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& hs = (*hidden)[i];
      const auto n = hs.shape().dims()[0];
      for (std::int64_t c = 0; c < 128; ++c) {
        double want = 0;
        if (mode == families::pooling_mode::mean) {
          for (std::int64_t t = 0; t < n; ++t) want += hs.as<float>()[t * 128 + c];
          want /= static_cast<double>(n);
        } else {
          want = hs.as<float>()[(mode == families::pooling_mode::cls ? 0 : n - 1) * 128 + c];
        }
        EXPECT_NEAR((*e)[i][static_cast<std::size_t>(c)], want, 1e-4);
      }
    }
  }
  std::vector<std::vector<std::int32_t>> too_long{prompt(33, 1)};
  EXPECT_EQ(d.embed(too_long, {}).error().code, driver_error_code::bad_request);
}

TEST(driver, encode_pads_rows_without_changing_their_hidden_states) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto o = small_options();
  o.encode = true;
  auto d = serve(h, ex, o);
  const std::vector<std::vector<std::int32_t>> rows{prompt(5, 1), prompt(32, 2)};
  auto hs = d.encode(rows);
  ASSERT_TRUE(hs) << hs.error().message();
  ASSERT_EQ(hs->size(), 2u);
  EXPECT_EQ((*hs)[0].shape().dims()[0], 5);
  // The unpadded 5-token row through its own exact-size entry.
  families::step_spec spec;
  spec.program = families::program::encode;
  spec.shape = families::step_shape(1, 5, 5);
  auto gr = h->model().trace(spec);
  ASSERT_TRUE(gr);
  app::weight_map_weights w(h->model().weights());
  exec::cpu::cpu_executor ex2;
  auto exe = ex2.load(w);
  ASSERT_TRUE(exe);
  auto e = ex2.add_entry(*exe, *gr);
  ASSERT_TRUE(e);
  tensor ids(dtype::i32, {5}), pos(dtype::i32, {5}), mask(dtype::i32, {5});
  for (int i = 0; i < 5; ++i) {
    ids.as<std::int32_t>()[i] = rows[0][static_cast<std::size_t>(i)];
    pos.as<std::int32_t>()[i] = i;
    mask.as<std::int32_t>()[i] = 1;
  }
  exec::step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"token_mask", mask.view()}};
  auto out = ex2.step(*e, in);
  ASSERT_TRUE(out);
  const auto& ref = out->outputs.at("hidden");
  double m = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) m = std::max(m, std::abs(static_cast<double>(ref.as<float>()[i]) - (*hs)[0].as<float>()[i]));
  EXPECT_LT(m, 1e-3);
}

// ---- typed refusals ---------------------------------------------------------------------------------

TEST(driver, prepare_refusals_hand_the_driver_back) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto o = small_options();
  o.max_entries = 3;
  auto r = driver<unprepared>(h, ex, o).prepare();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().second.code, driver_error_code::entry_limit);
  EXPECT_EQ(r.error().first.options().max_entries, 3);

  auto b = small_options();
  b.max_retained_bytes = 1;
  auto rb = driver<unprepared>(h, ex, b).prepare();
  ASSERT_FALSE(rb);
  EXPECT_EQ(rb.error().second.code, driver_error_code::byte_limit);

  auto bad = small_options();
  bad.block_size = 0;
  auto rbad = driver<unprepared>(h, ex, bad).prepare();
  ASSERT_FALSE(rbad);
  EXPECT_EQ(rbad.error().second.code, driver_error_code::bad_options);

  auto big = small_options();
  big.capacity = 1 << 20;
  auto rbig = driver<unprepared>(h, ex, big).prepare();
  ASSERT_FALSE(rbig);
  EXPECT_EQ(rbig.error().second.code, driver_error_code::bad_options);
}

TEST(driver, prepare_warms_a_finite_entry_set) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  // Decode rows 1, 2, 4 and prefill chunks 16, 32.
  EXPECT_EQ(d.entries().size(), 5u);
  for (const auto& e : d.entries()) EXPECT_EQ(e.head, head_kind::sample);
}

TEST(driver, admission_refusals_are_typed_and_take_nothing) {
  auto h = fixture();
  exec::cpu::cpu_executor ex;
  auto d = serve(h, ex, small_options());
  auto code = [&](seq_request r) {
    auto id = d.open(std::move(r));
    return id ? std::optional<driver_error_code>{} : std::optional{id.error().code};
  };
  EXPECT_EQ(code(request({}, 4)), driver_error_code::bad_request);
  EXPECT_EQ(code(request({1, 2, 512}, 4)), driver_error_code::bad_request);
  EXPECT_EQ(code(request({1, 2, -1}, 4)), driver_error_code::bad_request);
  EXPECT_EQ(code(request(prompt(100, 1), 29)), driver_error_code::too_long);
  auto hot = request(prompt(4, 1), 4);
  hot.sampling.temperature = -1;
  EXPECT_EQ(code(hot), driver_error_code::bad_request);
  auto bias = request(prompt(4, 1), 4);
  bias.logit_bias = {{600, 1.0f}};
  EXPECT_EQ(code(bias), driver_error_code::bad_request);
  auto logits = request(prompt(4, 1), 4);
  logits.head = head_kind::logits;
  EXPECT_EQ(code(logits), driver_error_code::no_head);
  auto adapter = request(prompt(4, 1), 4);
  adapter.adapter = "sql-lora";
  EXPECT_EQ(code(adapter), driver_error_code::unknown_adapter);  // this driver loaded no adapter
  auto beams = request(prompt(4, 1), 4, 0.7f);
  beams.beams = 4;
  EXPECT_EQ(code(beams), driver_error_code::bad_request);  // beams rank by log-probability: temperature 0
  auto inputs = request(prompt(4, 1), 4);
  inputs.inputs["image"] = request_input_value{tensor(dtype::f32, {4, 8}), {}};
  auto ri = d.open(inputs);
  ASSERT_FALSE(ri);
  EXPECT_EQ(ri.error().code, driver_error_code::bad_input);
  EXPECT_EQ(ri.error().input->code, input_error_code::undeclared);
  auto pair = inputs;
  pair.resume = true;
  auto rp = d.open(pair);
  ASSERT_FALSE(rp);
  EXPECT_EQ(rp.error().code, driver_error_code::incompatible);
  EXPECT_EQ(rp.error().pair->a, feature::request_inputs);
  EXPECT_EQ(rp.error().pair->b, feature::resume);
  EXPECT_TRUE(d.idle());
  EXPECT_EQ(d.counters().pool_available, d.counters().pool_blocks);

  auto tight = small_options();
  tight.pool_blocks = 4;
  exec::cpu::cpu_executor ex2;
  auto dt = serve(h, ex2, tight);
  auto too_big = dt.open(request(prompt(30, 1), 10));
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code, driver_error_code::pool_too_small);
}

TEST(driver, request_inputs_are_checked_against_the_schema) {
  families::model_schema schema;
  ASSERT_TRUE(schema.declare({"embeds", dtype::f32, families::input_extent::per_position, {8}, 0.0, families::input_presence::optional}));
  ASSERT_TRUE(schema.declare({"segment", dtype::i32, families::input_extent::per_position, {1}, 0.0, families::input_presence::required}));
  ASSERT_TRUE(schema.declare({"style", dtype::f32, families::input_extent::per_row, {4}, 0.0, families::input_presence::defaulted, 1.0}));
  auto code = [&](const request_inputs& in) {
    auto r = check_inputs(schema, 6, in);
    return r ? std::optional<input_error_code>{} : std::optional{r.error().code};
  };
  request_inputs ok;
  ok["segment"] = {tensor(dtype::i32, {6, 1}), {}};
  EXPECT_EQ(code(ok), std::nullopt);
  auto sparse = ok;
  sparse["embeds"] = {tensor(dtype::f32, {2, 8}), {0, 5}};
  EXPECT_EQ(code(sparse), std::nullopt);
  sparse["style"] = {tensor(dtype::f32, {1, 4}), {}};
  EXPECT_EQ(code(sparse), std::nullopt);

  EXPECT_EQ(code({}), input_error_code::missing_required);
  auto extra = ok;
  extra["pixels"] = {tensor(dtype::f32, {1, 1}), {}};
  EXPECT_EQ(code(extra), input_error_code::undeclared);
  request_inputs type;
  type["segment"] = {tensor(dtype::f32, {6, 1}), {}};
  EXPECT_EQ(code(type), input_error_code::wrong_type);
  request_inputs width;
  width["segment"] = {tensor(dtype::i32, {6, 2}), {}};
  EXPECT_EQ(code(width), input_error_code::wrong_width);
  request_inputs cover;
  cover["segment"] = {tensor(dtype::i32, {5, 1}), {}};
  EXPECT_EQ(code(cover), input_error_code::not_covering_prompt);
  auto outside = ok;
  outside["embeds"] = {tensor(dtype::f32, {2, 8}), {0, 6}};
  EXPECT_EQ(code(outside), input_error_code::position_outside);
  auto repeat = ok;
  repeat["embeds"] = {tensor(dtype::f32, {2, 8}), {3, 3}};
  EXPECT_EQ(code(repeat), input_error_code::position_outside);
  auto row_positions = ok;
  row_positions["style"] = {tensor(dtype::f32, {1, 4}), {0}};
  EXPECT_EQ(code(row_positions), input_error_code::position_outside);
}

TEST(driver, the_compatibility_table_is_the_one_place_pairs_are_refused) {
  const feature ok[] = {feature::paged_pool, feature::prefix_cache, feature::request_inputs};
  EXPECT_EQ(check_compatible(ok), std::nullopt);
  const feature bad[] = {feature::paged_pool, feature::recurrent_state, feature::prefix_cache};
  auto c = check_compatible(bad);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->a, feature::recurrent_state);
  EXPECT_EQ(c->b, feature::prefix_cache);
  EXPECT_FALSE(c->reason.empty());
  EXPECT_TRUE(implemented(feature::paged_pool));
  EXPECT_TRUE(implemented(feature::beam_search));
  EXPECT_TRUE(implemented(feature::adapter));
  EXPECT_FALSE(implemented(feature::resume));
}

}  // namespace
}  // namespace troupe::driver

namespace troupe::driver {
namespace {

// Chained decode (options.chain_steps): the executor runs several decode steps per round with one
// wait, and every sequence still gets the tokens, logprobs and finish of one step at a time, with stop
// ids met mid-chain, max_tokens, sampled rows, and a sequence arriving while others chain.
TEST(driver, chained_decode_gives_the_tokens_of_one_step_at_a_time) {
  auto h = fixture("qwen2");
  exec::cpu::cpu_executor plain_ex, chain_ex;
  auto plain = serve(h, plain_ex, small_options());
  auto o = small_options();
  o.chain_steps = 8;
  auto chained = serve(h, chain_ex, o);
  std::vector<seq_request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(request(prompt(5 + 7 * i, i), 13 + 5 * i, i % 2 ? 0.9f : 0.0f, 40 + static_cast<std::uint64_t>(i)));
  const auto free_run = run_all(plain, {reqs[0]}).front();
  reqs[0].stop_ids = {free_run.tokens.at(10)};  // met inside a chain
  reqs[0].ignore_eos = false;
  const auto want = run_all(plain, reqs);
  const auto got = run_all(chained, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].finished, want[i].finished);
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (std::size_t t = 0; t < want[i].logprobs.size(); ++t) EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-5);
  }
  EXPECT_EQ(got[0].finished, finish_reason::eos);
  const auto c = chained.counters();
  EXPECT_GT(c.chained_steps, 0);
  EXPECT_LT(c.rounds, plain.counters().rounds) << "chains take fewer rounds";
  EXPECT_GT(c.executor_seconds, 0.0);
  EXPECT_LE(c.executor_seconds, c.round_seconds);
  EXPECT_EQ(c.pool_available, c.pool_blocks);

  // A sequence opened between rounds of a chaining batch: the batch stops chaining for its prefill.
  auto first = chained.open(reqs[1]);
  ASSERT_TRUE(first);
  ASSERT_TRUE(chained.step());
  ASSERT_TRUE(chained.step());
  auto late = chained.open(reqs[2]);
  ASSERT_TRUE(late);
  std::map<seq_id, std::vector<std::int32_t>> out;
  while (!chained.idle()) {
    auto r = chained.step();
    ASSERT_TRUE(r);
    for (const auto& u : r->updates) out[u.id].insert(out[u.id].end(), u.tokens.begin(), u.tokens.end());
  }
  EXPECT_EQ(out[*late], want[2].tokens);
}

}  // namespace
}  // namespace troupe::driver

namespace troupe::driver {
namespace {

// A llama whose step program also declares a recurrent-state slot (`state_rows`) no driver input
// binds yet: the driver refuses it when the entry is added, naming the slot, instead of failing a step.
// Names model::trace_into publicly so a wrapper can run the wrapped model's tracer body.
struct open_model : families::model {
  using families::model::trace_into;
};

class with_state_rows final : public families::model {
 public:
  explicit with_state_rows(std::unique_ptr<families::model> m) : m_(std::move(m)) {}
  const families::model_config& config() const override { return m_->config(); }
  const families::model_schema& schema() const override { return m_->schema(); }
  const families::weight_map& weights() const override { return m_->weights(); }
  void trace_into(const families::step_spec& spec, graph::builder& b) const override {
    (m_.get()->*(&open_model::trace_into))(spec, b);
    b.output("rows", b.slot(graph::slot_kind::state_rows, {dtype::i32, troupe::shape{spec.shape.rows()}}));
  }

 private:
  std::unique_ptr<families::model> m_;
};

result<std::unique_ptr<families::model>, families::model_error> build_with_state_rows(const load::raw_config& c, const load::weight_store& s) {
  auto m = families::llama_entry.build(c, s);
  if (!m) return unexpected(m.error());
  return std::unique_ptr<families::model>(std::make_unique<with_state_rows>(std::move(*m)));
}

TEST(driver, a_slot_no_input_binds_is_refused_at_prepare) {
  static const families::family_key keys[] = {{load::config_source::gguf, "llama"}};
  static const families::family_entry entry{"llama-with-state-rows", keys, build_with_state_rows};
  auto reg = families::registry::from(std::span(&entry, 1));
  ASSERT_TRUE(reg);
  const auto path = fixture()->path();
  auto h = families::model_handle::load(path, *reg);
  ASSERT_TRUE(h) << families::message(h.error());
  exec::cpu::cpu_executor ex;
  auto d = driver<unprepared>(*h, ex, small_options()).prepare();
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().second.code, driver_error_code::unbound_slot);
  EXPECT_NE(d.error().second.message().find("state_rows"), std::string::npos) << d.error().second.message();
}

}  // namespace
}  // namespace troupe::driver

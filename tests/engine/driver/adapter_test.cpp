// LoRA adapters through the driver (docs/adapters.md): rows with different adapters and rows with none
// share one step, and each gives the tokens and log-probabilities of the base model with its adapter
// merged into the weights (a checkpoint written merged, run by a driver without adapters).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/load/peft.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  const auto dir = fs::temp_directory_path() / ("troupe-adapter-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// An HF fixture of `family` (f32), written once per process.
fs::path base_dir(std::string_view family) {
  const auto dir = scratch() / (std::string(family) + "-hf");
  if (!fs::exists(dir / "config.json")) {
    auto w = families::write_fixture(family, test::small_dims(), dir, false);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  return dir;
}

// Adapter i over `base`: rank 2..8, its own modules and seed.
families::lora_fixture adapter_spec(int i) {
  families::lora_fixture l;
  l.rank = 2 + 2 * i;
  l.alpha = 4.0 + i;
  l.seed = 100 + static_cast<std::uint64_t>(i);
  l.rslora = i == 3;
  if (i == 1) l.modules = {"q_proj", "v_proj"};
  if (i == 2) l.modules = {"o_proj", "gate_proj", "up_proj", "down_proj"};
  return l;
}

fs::path adapter_dir(const fs::path& base, int i) {
  const auto dir = base.parent_path() / (base.filename().string() + "-lora" + std::to_string(i));
  if (!fs::exists(dir / "adapter_config.json")) {
    auto w = families::write_lora_adapter(base, adapter_spec(i), dir);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  return dir;
}

fs::path merged_dir(const fs::path& base, int i) {
  const auto dir = base.parent_path() / (base.filename().string() + "-merged" + std::to_string(i));
  if (!fs::exists(dir / "model.safetensors")) {
    auto w = families::write_lora_merged(base, adapter_dir(base, i), dir);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  return dir;
}

std::shared_ptr<const families::model_handle> load(const fs::path& p) {
  auto h = families::model_handle::load(p, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

driver_options options(std::int64_t slots) {
  driver_options o;
  o.max_rows = 8;
  o.capacity = 96;
  o.block_size = 8;
  o.prefill_chunk = 32;
  o.token_budget = 64;
  o.adapters.slots = slots;
  o.adapters.max_rank = 8;
  return o;
}

std::vector<std::int32_t> prompt(std::int32_t salt) {
  std::vector<std::int32_t> p(12);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(5 + (i * 29 + static_cast<std::size_t>(salt) * 53) % 480);
  return p;
}

void expect_same(const test::run_result& got, const test::run_result& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (std::size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-4) << what << " token " << i;
}

class adapters : public ::testing::TestWithParam<std::string_view> {};

// Four adapters and the base, batched: every row equals its merged checkpoint (the base row the base).
TEST_P(adapters, rows_with_different_adapters_in_one_step_give_their_merged_models) {
  const auto base = base_dir(GetParam());
  exec::cpu::cpu_executor ex;
  auto d = test::serve(load(base), ex, options(4));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(d.load_adapter("a" + std::to_string(i), adapter_dir(base, i))) << i;
  std::vector<seq_request> reqs;
  for (int i = 0; i < 5; ++i) {
    auto r = test::request(prompt(i % 2), 10, i == 2 ? 0.8f : 0.0f, 7);
    if (i < 4) r.adapter = "a" + std::to_string(i);
    reqs.push_back(r);
  }
  const auto got = test::run_all(d, reqs);
  // The adapters change the model: row 0 (adapter a0) and row 4 (the base) share a prompt and greedy rules.
  double moved = 0;
  for (std::size_t i = 0; i < std::min(got[0].logprobs.size(), got[4].logprobs.size()); ++i)
    moved = std::max(moved, static_cast<double>(std::fabs(got[0].logprobs[i] - got[4].logprobs[i])));
  EXPECT_TRUE(moved > 1e-2 || got[0].tokens != got[4].tokens) << "adapter a0 left the base model's output as it was";
  const auto c = d.counters();
  EXPECT_LT(c.executor_steps, 5 * 11) << "the rows must share steps";
  for (int i = 0; i < 5; ++i) {
    exec::cpu::cpu_executor ref_ex;
    auto ref = test::serve(load(i < 4 ? merged_dir(base, i) : base), ref_ex, options(0));
    auto r = reqs[static_cast<std::size_t>(i)];
    r.adapter.clear();
    const auto want = test::run_all(ref, {r});
    expect_same(got[static_cast<std::size_t>(i)], want[0], std::string(GetParam()) + (i < 4 ? " adapter a" + std::to_string(i) : " base row"));
  }
}

INSTANTIATE_TEST_SUITE_P(families, adapters, ::testing::Values("llama", "qwen2", "qwen3", "gemma2"),
                         [](const auto& p) { return std::string(p.param); });

// Fewer slots than adapters: sequences wait for a slot, the least recently used idle adapter is
// evicted, and every output still equals its merged model; adapters load and unload while serving.
TEST(adapters_registry, slots_are_shared_by_recency_and_adapters_load_and_unload_while_serving) {
  const auto base = base_dir("llama");
  exec::cpu::cpu_executor ex;
  auto d = test::serve(load(base), ex, options(2));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d.load_adapter("a" + std::to_string(i), adapter_dir(base, i)));
  std::vector<seq_request> reqs;
  for (int i = 0; i < 6; ++i) {
    auto r = test::request(prompt(i), 6);
    r.adapter = "a" + std::to_string(i % 3);
    reqs.push_back(r);
  }
  const auto got = test::run_all(d, reqs);
  for (int i = 0; i < 6; ++i) {
    exec::cpu::cpu_executor ref_ex;
    auto ref = test::serve(load(merged_dir(base, i % 3)), ref_ex, options(0));
    auto r = reqs[static_cast<std::size_t>(i)];
    r.adapter.clear();
    expect_same(got[static_cast<std::size_t>(i)], test::run_all(ref, {r})[0], "request " + std::to_string(i));
  }
  // Unloading: refused while a sequence holds the adapter, then done; a new one loads under a new name.
  auto r = test::request(prompt(1), 4);
  r.adapter = "a0";
  auto id = d.open(r);
  ASSERT_TRUE(id);
  auto busy = d.unload_adapter("a0");
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code, driver_error_code::adapter_busy);
  while (!d.idle()) ASSERT_TRUE(d.step());
  ASSERT_TRUE(d.release(*id));
  ASSERT_TRUE(d.unload_adapter("a0"));
  auto gone = d.open(r);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, driver_error_code::unknown_adapter);
  ASSERT_TRUE(d.load_adapter("a3", adapter_dir(base, 3)));
  EXPECT_EQ(d.adapters().size(), 3u);
  r.adapter = "a3";
  const auto after = test::run_all(d, {r});
  exec::cpu::cpu_executor ref_ex;
  auto ref = test::serve(load(merged_dir(base, 3)), ref_ex, options(0));
  r.adapter.clear();
  expect_same(after[0], test::run_all(ref, {r})[0], "a3 loaded while serving");
}

// What the driver refuses, each by its code.
TEST(adapters_registry, refusals_are_typed) {
  const auto base = base_dir("llama");
  exec::cpu::cpu_executor ex;
  auto none = test::serve(load(base), ex, options(0));
  EXPECT_EQ(none.load_adapter("x", adapter_dir(base, 0)).error().code, driver_error_code::bad_adapter);
  auto r = test::request(prompt(0), 2);
  r.adapter = "x";
  EXPECT_EQ(none.open(r).error().code, driver_error_code::unknown_adapter);

  exec::cpu::cpu_executor ex2;
  auto o = options(2);
  o.adapters.max_rank = 4;
  auto d = test::serve(load(base), ex2, o);
  EXPECT_EQ(d.load_adapter("big", adapter_dir(base, 3)).error().code, driver_error_code::bad_adapter);  // rank 8 > 4
  EXPECT_EQ(d.load_adapter("none", scratch() / "no-such-adapter").error().code, driver_error_code::bad_adapter);
  ASSERT_TRUE(d.load_adapter("a0", adapter_dir(base, 0)));
  EXPECT_EQ(d.load_adapter("a0", adapter_dir(base, 0)).error().code, driver_error_code::bad_adapter);  // name taken
  EXPECT_EQ(d.unload_adapter("nope").error().code, driver_error_code::unknown_adapter);
  // An adapter of another model's shapes.
  families::fixture_dims wide = test::small_dims();
  wide.hidden = 192;
  const auto wide_base = scratch() / "llama-wide-hf";
  if (!fs::exists(wide_base / "config.json")) {
    ASSERT_TRUE(families::write_fixture("llama", wide, wide_base, false));
  }
  const auto wide_adapter = scratch() / "llama-wide-lora";
  if (!fs::exists(wide_adapter / "adapter_config.json")) {
    ASSERT_TRUE(families::write_lora_adapter(wide_base, adapter_spec(0), wide_adapter));
  }
  EXPECT_EQ(d.load_adapter("wide", wide_adapter).error().code, driver_error_code::bad_adapter);
}

// PEFT configs troupe does not implement are refused by their field.
TEST(adapters_registry, peft_configs_are_read_or_refused_by_field) {
  auto ok = load::parse_peft_config(R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none"})", "c.json");
  ASSERT_TRUE(ok);
  EXPECT_DOUBLE_EQ(ok->scale(), 2.0);
  auto rs = load::parse_peft_config(R"({"r": 16, "lora_alpha": 16, "use_rslora": true})", "c.json");
  ASSERT_TRUE(rs);
  EXPECT_DOUBLE_EQ(rs->scale(), 4.0);
  for (const char* cfg : {R"({"r": 8, "use_dora": true})", R"({"r": 8, "fan_in_fan_out": true})", R"({"r": 8, "bias": "all"})",
                          R"({"r": 8, "rank_pattern": {"q_proj": 4}})", R"({"r": 8, "modules_to_save": ["lm_head"]})",
                          R"({"peft_type": "IA3", "r": 8})"}) {
    auto e = load::parse_peft_config(cfg, "c.json");
    ASSERT_FALSE(e) << cfg;
    EXPECT_EQ(e.error().code, load::load_error_code::unsupported_adapter) << cfg;
  }
  EXPECT_EQ(load::parse_peft_config(R"({"lora_alpha": 8})", "c.json").error().code, load::load_error_code::missing_key);
  EXPECT_EQ(load::parse_peft_config("{not json", "c.json").error().code, load::load_error_code::bad_header);
}

}  // namespace
}  // namespace troupe::driver

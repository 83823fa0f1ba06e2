// The CPU executor against the oracle: every shipped family, every weight format the CPU target packs,
// a prefill then decode steps, on every isa level this machine runs; and its typed refusals.
#include "engine/exec/cpu/cpu_executor.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "tests/support/exec_cases.hpp"
#include "tests/support/logprobs.hpp"
#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/core/quant.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/graph/builder.hpp"
#include "families/fixtures/fixture.hpp"

namespace troupe::exec::cpu {
namespace {

namespace fs = std::filesystem;

using troupe::testing::case_name;
using troupe::testing::model_case;

// How far each format's CPU path may move log-probabilities from the oracle: the executor's stated
// bound (logprob_bound, with the reasons for each figure).
double tolerance(dtype t) { return logprob_bound(t); }

using troupe::testing::log_softmax;

std::shared_ptr<const families::model_handle> load_case(const model_case& c) { return troupe::testing::load_case(c, "troupe-cpu-test"); }

// The f32 llama case's step entry of one row of `tokens` over `capacity` KV slots on `ex`.
struct one_entry {
  std::shared_ptr<const families::model_handle> h;
  std::unique_ptr<app::weight_map_weights> w;
  executable_id exe{};
  entry_id e{};
};
one_entry llama_entry(cpu_executor& ex, std::int64_t tokens, std::int64_t capacity) {
  one_entry o;
  o.h = load_case({"llama", dtype::f32, true});
  EXPECT_TRUE(o.h);
  o.w = std::make_unique<app::weight_map_weights>(o.h->model().weights());
  auto exe = ex.load(*o.w);
  EXPECT_TRUE(exe);
  o.exe = *exe;
  families::step_spec spec;
  spec.shape = families::step_shape(1, tokens, capacity);
  auto g = o.h->model().trace(spec);
  EXPECT_TRUE(g);
  auto e = ex.add_entry(o.exe, *g);
  EXPECT_TRUE(e) << e.error().message();
  o.e = *e;
  return o;
}

// The oracle's steps of `h` and the CPU executor's on every isa level this CPU runs, each within `bound`
// (worst top-10 |dlogprob|); `name` labels the printed figures.
void expect_every_level_matches_the_oracle(const std::shared_ptr<const families::model_handle>& h, double bound, const std::string& name) {
  const auto ref = troupe::testing::oracle_reference(h);
  ASSERT_EQ(ref.logprobs.size(), 5u);
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    cpu_executor ex({2, level});
    const auto got = troupe::testing::executor_steps(h, ex, ref);
    ASSERT_FALSE(got.empty());
    const double worst = troupe::testing::worst_top10(ref, got, 2 * bound);
    EXPECT_LT(worst, bound) << "worst top-10 |dlogprob| " << worst;
    std::printf("[ cpu ] %s %s: worst top-10 |dlogprob| vs oracle %.2e\n", name.c_str(), std::string(isa_name(level)).c_str(), worst);
  }
}

class cpu_vs_oracle : public ::testing::TestWithParam<model_case> {};

TEST_P(cpu_vs_oracle, prefill_and_decode_match_the_oracle_on_every_isa_level) {
  const auto c = GetParam();
  auto h = load_case(c);
  ASSERT_TRUE(h);
  expect_every_level_matches_the_oracle(h, tolerance(c.format), case_name(c));
}

std::vector<model_case> all_cases() {
  std::vector<model_case> v;
  for (auto f : families::fixture_families()) {
    v.push_back({f, dtype::f32, false});
    v.push_back({f, dtype::f32, true});
  }
  for (dtype t : {dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    v.push_back({"llama", t, true});
    v.push_back({"qwen2", t, true});
  }
  for (dtype t : {dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q2_k, dtype::q3_k, dtype::q5_k}) v.push_back({"llama", t, true});
  v.push_back({"gemma2", dtype::q8_0, true});
  v.push_back({"phi3", dtype::q4_k, true});
  v.push_back({"qwen3", dtype::bf16, false});
  // Routed families with f16 experts (exact products). With block formats the CPU path quantizes its
  // activations, which moves router scores across the top-k boundary now and then, so a token takes
  // other experts than in the oracle: those files are held to the f32 truth against llama.cpp instead
  // (llama_cpp_routed_quantized in tests/families/llama_cpp_parity_test.cpp).
  v.push_back({"qwen3_moe", dtype::f16, true});
  v.push_back({"mixtral", dtype::bf16, true});
  v.push_back({"qwen2_moe", dtype::f16, false});
  v.push_back({"deepseek_v3", dtype::f16, true});
  for (auto f : families::recurrent_fixture_families()) v.push_back({f, dtype::f32, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(families, cpu_vs_oracle, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- KV cache element types (model::with_kv_type) --------------------------------------------------

struct kv_case {
  std::string_view family;
  dtype kv;
};
std::string kv_case_name(const kv_case& c) { return std::string(c.family) + "_kv_" + std::string(troupe::name(c.kv)); }

// How far a KV cache type may move the top-10 log-probabilities from the f32 cache's, on these
// fixtures (random weights, 20 + 4 positions). Measured worst over the families below, then about 3x:
// f16 keeps 11 significant bits of each key and value, bf16 8, q8_0 7 bits plus a shared scale per 32.
double kv_bound(dtype t) { return t == dtype::f16 ? 5e-3 : t == dtype::bf16 ? 4e-2 : 4e-2; }

// The oracle's log-probabilities of `h` along the prompt and tokens of `ref` (another model's path).
std::vector<std::vector<double>> oracle_along(const std::shared_ptr<const families::model_handle>& h,
                                              const troupe::testing::oracle_steps& ref) {
  std::vector<std::vector<double>> out;
  app::oracle_runner o(h, 32);
  auto l = o.feed(ref.prompt);
  EXPECT_TRUE(l) << (l ? "" : l.error());
  if (!l) return out;
  out.push_back(log_softmax(*l));
  for (auto t : ref.decoded) {
    auto d = o.feed(std::span(&t, 1));
    EXPECT_TRUE(d) << (d ? "" : d.error());
    if (!d) return out;
    out.push_back(log_softmax(*d));
  }
  return out;
}

class cpu_kv_types : public ::testing::TestWithParam<kv_case> {};

// A model whose KV cache is f16, bf16 or q8_0: its states are of that type and take that many bytes;
// the CPU executor, reading the cache in place on every isa level, matches the oracle of the same model
// (both round the new rows by the same rule); and the cache type moves the logits from the f32 cache's
// by no more than its bound.
TEST_P(cpu_kv_types, read_in_place_match_the_oracle_and_stay_within_the_type_bound) {
  const auto c = GetParam();
  auto h32 = load_case({c.family, dtype::f32, true});
  ASSERT_TRUE(h32);
  auto typed = families::with_kv_type(h32, c.kv);
  ASSERT_TRUE(typed) << families::message(typed.error());
  auto h = *typed;
  EXPECT_EQ(h->model().kv_type(), c.kv);
  std::int64_t kv_states = 0;
  for (const auto& st : h->model().schema().states(families::program::step))
    if (st.name.starts_with("kv.")) {
      EXPECT_EQ(st.element, c.kv) << st.name;
      ++kv_states;
    }
  EXPECT_GT(kv_states, 0);
  EXPECT_EQ(families::kv_bytes_per_token_per_layer(h->model()),
            static_cast<std::int64_t>(*storage_bytes(c.kv, static_cast<std::uint64_t>(h->model().config().kv_elems_per_token_per_layer))));

  // Both round the new rows the same way, but from f32 values that differ in their last bits: a value
  // at a rounding boundary (or a q8_0 block's largest, which sets its scale) may land one step apart,
  // so the bound is the f32 one plus a tenth of the type's own.
  expect_every_level_matches_the_oracle(h, tolerance(dtype::f32) + kv_bound(c.kv) / 10, kv_case_name(c));
  const auto ref32 = troupe::testing::oracle_reference(h32);
  const auto along = oracle_along(h, ref32);
  ASSERT_EQ(along.size(), ref32.logprobs.size());
  const double moved = troupe::testing::worst_top10(ref32, along, 2 * kv_bound(c.kv));
  EXPECT_LT(moved, kv_bound(c.kv));
  std::printf("[ cpu ] %s: KV %lld bytes/token/layer, worst top-10 |dlogprob| vs the f32 cache %.2e (bound %.0e)\n",
              kv_case_name(c).c_str(), static_cast<long long>(families::kv_bytes_per_token_per_layer(h->model())), moved, kv_bound(c.kv));
}

std::vector<kv_case> kv_cases() {
  std::vector<kv_case> v;
  // Grouped-query attention (llama, qwen2 with biases), a softcap and sliding windows (gemma2), latent
  // attention's shared [c, k_pe] cache (deepseek_v3) and a hybrid with gated attention (qwen3_next).
  for (auto f : {"llama", "qwen2", "gemma2", "deepseek_v3", "qwen3_next"})
    for (dtype t : {dtype::f16, dtype::bf16, dtype::q8_0}) v.push_back({f, t});
  return v;
}

INSTANTIATE_TEST_SUITE_P(types, cpu_kv_types, ::testing::ValuesIn(kv_cases()), [](const auto& info) { return kv_case_name(info.param); });

TEST(cpu_executor, a_kv_type_the_model_cannot_hold_is_refused_by_name) {
  auto h = load_case({"llama", dtype::f32, true});
  ASSERT_TRUE(h);
  auto bad = h->with_kv_type(dtype::q4_0);
  ASSERT_FALSE(bad);
  EXPECT_NE(families::message(bad.error()).find("kv_type"), std::string::npos) << families::message(bad.error());
  // q8_0 needs head rows of whole 32-value blocks: a head dim of 16 is refused, naming the layer.
  families::fixture_dims d;
  d.vocab = 300, d.hidden = 64, d.ffn = 96, d.heads = 4, d.kv_heads = 2, d.head_dim = 16, d.layers = 2;
  const auto path = fs::temp_directory_path() / ("troupe-cpu-test-" + std::to_string(::getpid())) / "llama_d16.gguf";
  fs::create_directories(path.parent_path());
  ASSERT_TRUE(families::write_fixture("llama", d, path, true));
  auto small = families::model_handle::load(path, families::registry::builtin());
  ASSERT_TRUE(small);
  auto q = (*small)->with_kv_type(dtype::q8_0);
  ASSERT_FALSE(q);
  EXPECT_NE(families::message(q.error()).find("layer 0"), std::string::npos) << families::message(q.error());
  EXPECT_TRUE((*small)->with_kv_type(dtype::f16));
}

TEST(cpu_executor, refuses_bad_steps_without_touching_state) {
  cpu_executor ex;
  const auto one = llama_entry(ex, 2, 8);
  const auto* exe = &one.exe;
  const auto* e = &one.e;
  tensor ids(dtype::i32, {2}), pos(dtype::i32, {2}), read(dtype::i32, {1, 8});
  ids.as<std::int32_t>()[0] = 5;
  ids.as<std::int32_t>()[1] = 512;  // outside the vocabulary
  pos.as<std::int32_t>()[1] = 1;
  for (int j = 0; j < 8; ++j) read.as<std::int32_t>()[j] = j < 2 ? j : -1;
  step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", pos.view()}, {"kv_read_map", read.view()}};
  auto r = ex.step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);
  auto k = ex.read_state(*exe, "kv.k.0");
  ASSERT_TRUE(k);
  for (std::int64_t i = 0; i < k->numel(); ++i) ASSERT_EQ(k->as<float>()[i], 0.0f);

  ids.as<std::int32_t>()[1] = 6;
  pos.as<std::int32_t>()[1] = 9;  // a KV slot outside the cache
  r = ex.step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);
  pos.as<std::int32_t>()[1] = 0;  // two tokens into one slot
  r = ex.step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);

  step_inputs missing;
  EXPECT_EQ(ex.step(*e, missing).error().code, exec_error_code::bad_binding);
  EXPECT_EQ(ex.step(entry_id{99}, in).error().code, exec_error_code::unknown_id);
  EXPECT_GT(ex.memory().weight_bytes, 0u);
  EXPECT_GT(ex.memory().state_bytes, 0u);
}

// Copying state rows (beam forks) copies every state's row and refuses a row outside any state whole;
// a chain with the wrong count of positions or write slots is refused before anything runs.
TEST(cpu_executor, copies_state_rows_and_refuses_bad_chains) {
  cpu_executor ex;
  const auto one = llama_entry(ex, 1, 8);
  const auto* exe = &one.exe;
  const auto* e = &one.e;
  tensor ids(dtype::i32, {1}), pos(dtype::i32, {1}), read(dtype::i32, {1, 8});
  ids.as<std::int32_t>()[0] = 5;
  pos.as<std::int32_t>()[0] = 0;
  for (int j = 0; j < 8; ++j) read.as<std::int32_t>()[j] = j == 0 ? 0 : -1;
  step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", pos.view()}, {"kv_read_map", read.view()}};
  ASSERT_TRUE(ex.step(*e, in));
  const std::pair<std::int64_t, std::int64_t> copy[] = {{0, 3}};
  ASSERT_TRUE(ex.copy_state_rows(*exe, copy));
  auto k = ex.read_state(*exe, "kv.k.0");
  ASSERT_TRUE(k);
  const auto row = k->numel() / k->shape()[0];
  bool nonzero = false;
  for (std::int64_t i = 0; i < row; ++i) {
    ASSERT_EQ(k->as<float>()[3 * row + i], k->as<float>()[i]);
    nonzero = nonzero || k->as<float>()[i] != 0.0f;
  }
  EXPECT_TRUE(nonzero);
  const std::pair<std::int64_t, std::int64_t> outside[] = {{0, 2}, {1, 8}};
  auto refused = ex.copy_state_rows(*exe, outside);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, exec_error_code::bad_binding);
  auto k2 = ex.read_state(*exe, "kv.k.0");
  for (std::int64_t i = 0; i < row; ++i) ASSERT_EQ(k2->as<float>()[2 * row + i], 0.0f) << "nothing copied";

  chain_request bad;
  bad.steps = 3;
  bad.positions = {1, 2};  // 3 steps need 3 positions for the one row
  bad.write_slots = {1, 2, 3};
  const sample_row_request row0{7, {}, 0, false};
  auto c = ex.step_chain(*e, in, std::span(&row0, 1), bad);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, exec_error_code::bad_binding);
}

// A graph without weights over `slots`: the oracle's outputs, and one CPU executor step's.
struct no_weights : weight_source {
  std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
};
eval::evaluation oracle_outputs(const graph::graph& g, const std::map<std::string, tensor_view>& slots) {
  eval::eval_inputs ei;
  ei.slots = slots;
  eval::map_const_source none;
  ei.weights = &none;
  auto want = eval::evaluate(g, ei);
  EXPECT_TRUE(want) << want.error().message();
  return want ? std::move(*want) : eval::evaluation{};
}
std::optional<step_outputs> cpu_outputs(const graph::graph& g, const std::map<std::string, tensor_view>& slots, cpu_options opt = {}) {
  const no_weights w;
  cpu_executor ex(opt);
  auto exe = ex.load(w);
  auto en = ex.add_entry(*exe, g);
  EXPECT_TRUE(en) << en.error().message();
  if (!en) return std::nullopt;
  step_inputs si;
  si.slots = slots;
  auto got = ex.step(*en, si);
  EXPECT_TRUE(got) << got.error().message();
  if (!got) return std::nullopt;
  return std::move(*got);
}

// A column broadcast over a square matrix (b [4, 1] against [4, 4]: the row fast path must not take
// it) and maximum / minimum with NaN (NaN when either side is, as the oracle), against the oracle.
TEST(cpu_executor, broadcast_columns_and_nan_extremes_match_the_oracle) {
  graph::builder b;
  const auto x = b.slot(graph::slot_kind::request_input, {dtype::f32, {4, 4}}, "x");
  const auto c = b.slot(graph::slot_kind::request_input, {dtype::f32, {4, 1}}, "c");
  const auto r = b.slot(graph::slot_kind::request_input, {dtype::f32, {4}}, "r");
  b.output("col", b.add(x, c));
  b.output("max", b.binary(graph::op::maximum, x, r));
  b.output("min", b.binary(graph::op::minimum, x, r));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  tensor xt(dtype::f32, {4, 4}), ct(dtype::f32, {4, 1}), rt(dtype::f32, {4});
  for (int i = 0; i < 16; ++i) xt.as<float>()[i] = static_cast<float>(i) - 7.5f;
  xt.as<float>()[5] = NAN;
  for (int i = 0; i < 4; ++i) ct.as<float>()[i] = 100.0f * static_cast<float>(i + 1);
  for (int i = 0; i < 4; ++i) rt.as<float>()[i] = i == 2 ? NAN : 0.0f;
  const std::map<std::string, tensor_view> slots = {{"x", xt.view()}, {"c", ct.view()}, {"r", rt.view()}};
  const auto want = oracle_outputs(*g, slots);
  const auto got = cpu_outputs(*g, slots);
  ASSERT_TRUE(got);
  for (const auto& [name, t] : want.outputs)
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float a = t.as<float>()[i], b2 = got->outputs.at(name).as<float>()[i];
      EXPECT_TRUE((std::isnan(a) && std::isnan(b2)) || a == b2) << name << "[" << i << "]: oracle " << a << ", cpu " << b2;
    }
}

// The graph run by the executor on every isa level this CPU has (2 threads), its outputs given to f.
template <class F>
void outputs_on_every_level(const graph::graph& g, const std::map<std::string, tensor_view>& slots, F&& f) {
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    const auto got = cpu_outputs(g, slots, {2, level});
    ASSERT_TRUE(got);
    f(*got);
  }
}

// The vector elementwise paths against the oracle on every isa level, with 2 threads so the long ones
// split: every binary kind over broadcasts that collapse to runs of a contiguous side and one value
// ([N, H, P] with [H, 1], [N, 1, P], [P], [1], the broadcast on the left side too, a same-shape pair),
// a sum and a mean over a middle axis, and slices and a concat long enough to spread over the pool.
// One f32 operation rounds the same as the oracle's double rounded to f32, so the binary outputs are
// equal; the sums are f32 additions in another order, within a few ulps.
TEST(cpu_executor, vector_elementwise_broadcasts_reductions_and_copies_match_the_oracle) {
  const std::int64_t N = 96, H = 12, Pd = 40;
  graph::builder b;
  const auto x = b.slot(graph::slot_kind::request_input, {dtype::f32, {N, H, Pd}}, "x");
  const auto y = b.slot(graph::slot_kind::request_input, {dtype::f32, {N, H, Pd}}, "y");
  const auto col = b.slot(graph::slot_kind::request_input, {dtype::f32, {H, 1}}, "col");
  const auto mid = b.slot(graph::slot_kind::request_input, {dtype::f32, {N, 1, Pd}}, "mid");
  const auto row = b.slot(graph::slot_kind::request_input, {dtype::f32, {Pd}}, "row");
  const auto one = b.slot(graph::slot_kind::request_input, {dtype::f32, {1}}, "one");
  const std::vector<std::pair<graph::op, std::string>> kinds = {{graph::op::add, "add"}, {graph::op::sub, "sub"}, {graph::op::mul, "mul"},
                                                                {graph::op::div, "div"}, {graph::op::maximum, "max"}, {graph::op::minimum, "min"}};
  for (const auto& [o, name] : kinds) {
    b.output(name + "_same", b.binary(o, x, y));
    b.output(name + "_col", b.binary(o, x, col));
    b.output(name + "_col_left", b.binary(o, col, x));
    b.output(name + "_mid", b.binary(o, x, mid));
    b.output(name + "_row", b.binary(o, row, x));
    b.output(name + "_one", b.binary(o, x, one));
  }
  b.output("sum_mid", b.reduce(graph::op::reduce_sum, x, 1));
  b.output("mean_mid", b.reduce(graph::op::reduce_mean, y, 1));
  b.output("slice", b.slice(x, 1, 3, 9));
  b.output("concat", b.concat({x, y}, 2));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  auto fill = [&](std::vector<std::int64_t> dims) {
    tensor t(dtype::f32, troupe::shape(dims));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = nd(rng);
    return t;
  };
  auto xt = fill({N, H, Pd}), yt = fill({N, H, Pd}), ct = fill({H, 1}), mt = fill({N, 1, Pd}), rt = fill({Pd}), ot = fill({1});
  xt.as<float>()[77] = NAN;
  yt.as<float>()[1234] = NAN;
  ct.as<float>()[3] = 0.0f;  // a division by zero
  const std::map<std::string, tensor_view> slots = {{"x", xt.view()},   {"y", yt.view()},   {"col", ct.view()},
                                                     {"mid", mt.view()}, {"row", rt.view()}, {"one", ot.view()}};
  const auto want = oracle_outputs(*g, slots);
  outputs_on_every_level(*g, slots, [&](const step_outputs& got) {
    for (const auto& [name, t] : want.outputs) {
      const auto& o = got.outputs.at(name);
      ASSERT_EQ(o.numel(), t.numel()) << name;
      const bool summed = name == "sum_mid" || name == "mean_mid";
      int bad = 0;
      for (std::int64_t i = 0; i < t.numel() && bad < 5; ++i) {
        const float a = t.as<float>()[i], b2 = o.as<float>()[i];
        const bool same = (std::isnan(a) && std::isnan(b2)) || a == b2 || (summed && std::fabs(a - b2) <= 1e-5f * (1.0f + std::fabs(a)));
        if (!same) ++bad;
        EXPECT_TRUE(same) << name << "[" << i << "]: oracle " << a << ", cpu " << b2;
      }
    }
  });
}

// Comparisons and minimum/maximum over i32, i64 and boolean operands (a causal mask's ops: positions
// against key positions, then AND with the present keys) take the typed path over broadcast runs, with
// 2 threads so the long ones split; every output equals the oracle's, including booleans stored as a
// byte other than 1 and the extremes of each integer type.
TEST(cpu_executor, integer_and_boolean_compares_and_extremes_match_the_oracle) {
  const std::int64_t T = 300, C = 310;
  graph::builder b;
  const auto qpos = b.slot(graph::slot_kind::request_input, {dtype::i32, {1, T, 1}}, "qpos");
  const auto kpos = b.slot(graph::slot_kind::request_input, {dtype::i32, {C}}, "kpos");
  const auto valid = b.slot(graph::slot_kind::request_input, {dtype::boolean, {1, 1, C}}, "valid");
  const auto wide = b.slot(graph::slot_kind::request_input, {dtype::i64, {T, 1}}, "wide");
  const auto wrow = b.slot(graph::slot_kind::request_input, {dtype::i64, {C}}, "wrow");
  const auto le = b.binary(graph::op::less_equal, kpos, qpos);
  b.output("le", le);
  b.output("lt", b.binary(graph::op::less, qpos, kpos));
  b.output("eq", b.binary(graph::op::equal, kpos, qpos));
  b.output("gt", b.binary(graph::op::greater, kpos, qpos));
  b.output("and", b.binary(graph::op::minimum, le, valid));
  b.output("or", b.binary(graph::op::maximum, valid, le));
  b.output("min32", b.binary(graph::op::minimum, qpos, kpos));
  b.output("max32", b.binary(graph::op::maximum, kpos, qpos));
  b.output("min64", b.binary(graph::op::minimum, wide, wrow));
  b.output("gt64", b.binary(graph::op::greater, wrow, wide));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  std::mt19937 rng(11);
  tensor qt(dtype::i32, {1, T, 1}), kt(dtype::i32, {C}), vt(dtype::boolean, {1, 1, C}), wt(dtype::i64, {T, 1}), rt(dtype::i64, {C});
  for (std::int64_t t = 0; t < T; ++t) qt.as<std::int32_t>()[t] = static_cast<std::int32_t>(rng() % 400) - 50;
  qt.as<std::int32_t>()[0] = std::numeric_limits<std::int32_t>::min();
  qt.as<std::int32_t>()[1] = std::numeric_limits<std::int32_t>::max();
  for (std::int64_t c = 0; c < C; ++c) kt.as<std::int32_t>()[c] = static_cast<std::int32_t>(c) - 5;
  for (std::int64_t c = 0; c < C; ++c) reinterpret_cast<std::uint8_t*>(vt.data())[c] = static_cast<std::uint8_t>(c % 7 == 3 ? 0 : c % 5 == 1 ? 2 : 1);
  for (std::int64_t t = 0; t < T; ++t) wt.as<std::int64_t>()[t] = (static_cast<std::int64_t>(rng()) << 20) - (std::int64_t{1} << 40);
  for (std::int64_t c = 0; c < C; ++c) rt.as<std::int64_t>()[c] = (static_cast<std::int64_t>(rng()) << 20) - (std::int64_t{1} << 40);
  const std::map<std::string, tensor_view> slots = {{"qpos", qt.view()}, {"kpos", kt.view()}, {"valid", vt.view()}, {"wide", wt.view()}, {"wrow", rt.view()}};
  const auto want = oracle_outputs(*g, slots);
  outputs_on_every_level(*g, slots, [&](const step_outputs& got) {
    for (const auto& [name, t] : want.outputs) {
      const auto& o = got.outputs.at(name);
      ASSERT_EQ(o.type(), t.type()) << name;
      ASSERT_EQ(o.numel(), t.numel()) << name;
      int bad = 0;
      for (std::int64_t i = 0; i < t.numel() && bad < 5; ++i) {
        const double a = load_element(t.type(), t.data(), i), c = load_element(o.type(), o.data(), i);
        if (t.type() == dtype::boolean ? (a != 0) != (c != 0) : a != c) {
          ++bad;
          ADD_FAILURE() << name << "[" << i << "]: oracle " << a << ", cpu " << c;
        }
      }
    }
  });
}

// The executor's weights from an oracle const source.
struct map_weights : weight_source {
  explicit map_weights(const eval::map_const_source& m) : m_(m) {}
  std::optional<tensor_view> find(const graph::weight_role& r) const override { return m_.find(r); }
  const eval::map_const_source& m_;
};

// The routing ops against the oracle: top_k with ties (the lower index first) and NaN (last),
// take_along, and linear_id over experts stored as f32, f16, q8_0 and q4_k, with x shared by the picks
// or one row per pick, on every isa level; then a witness that fails (a NaN routing weight) refuses the
// step before any output is read, a negative expert id gives zeros, and one at or past E is a typed
// step error.
TEST(cpu_executor, routing_ops_match_the_oracle_and_refuse_bad_selections) {
  constexpr std::int64_t T = 5, E = 6, k = 2, N = 64, K = 256;
  for (dtype wt : {dtype::f32, dtype::f16, dtype::q8_0, dtype::q4_k}) {
    SCOPED_TRACE(std::string(troupe::name(wt)));
    graph::builder b;
    const auto x = b.slot(graph::slot_kind::request_input, {dtype::f32, {T, K}}, "x");
    const auto s = b.slot(graph::slot_kind::request_input, {dtype::f32, {T, E}}, "scores");
    const auto w = b.weight({troupe::graph::tensor_role::ffn_up, 0}, {wt, {E, N, K}});
    const auto w2 = b.weight({troupe::graph::tensor_role::ffn_down, 0}, {wt, {E, K, N * 4}});
    const auto ids = b.top_k(s, k);
    const auto picked = b.take_along(s, ids);
    const auto y = b.linear_id(x, w, ids);                         // [T, k, N]
    const auto h = b.reshape(b.concat({y, y, y, y}, 2), {T, k, N * 4});
    b.output("ids", ids);
    b.witness("picked", picked, graph::witness_check::finite);
    b.output("y", y);
    b.output("z", b.linear_id(h, w2, ids));  // one row per pick
    auto g = std::move(b).finish();
    ASSERT_TRUE(g) << g.error().message();

    std::uint64_t state = 7;
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<double>(state >> 40) / static_cast<double>(1ull << 24) - 0.5);
    };
    tensor xt(dtype::f32, {T, K}), st(dtype::f32, {T, E});
    for (std::int64_t i = 0; i < xt.numel(); ++i) xt.as<float>()[i] = next();
    for (std::int64_t i = 0; i < st.numel(); ++i) st.as<float>()[i] = next();
    st.as<float>()[0 * E + 1] = st.as<float>()[0 * E + 4] = 2.0f;  // a tie: expert 1 before expert 4
    st.as<float>()[1 * E + 0] = NAN;                                // NaN ranks last
    st.as<float>()[2 * E + 3] = st.as<float>()[2 * E + 5] = st.as<float>()[2 * E + 2] = 1.5f;
    auto make = [&](std::int64_t rows, std::int64_t cols) {
      tensor f(dtype::f32, {E * rows, cols});
      for (std::int64_t i = 0; i < f.numel(); ++i) f.as<float>()[i] = next() * 0.2f;
      tensor q(wt, {E, rows, cols});
      for (std::int64_t r = 0; r < E * rows; ++r)
        EXPECT_TRUE(quantize_row(wt, f.as<float>() + r * cols, q.data() + r * q.view().row_bytes(), cols));
      return q;
    };
    eval::map_const_source src;
    src.add({troupe::graph::tensor_role::ffn_up, 0}, make(N, K));
    src.add({troupe::graph::tensor_role::ffn_down, 0}, make(K, N * 4));
    const map_weights ws(src);
    eval::eval_inputs ei;
    ei.slots = {{"x", xt.view()}, {"scores", st.view()}};
    ei.weights = &src;
    auto want = eval::evaluate(*g, ei);
    ASSERT_TRUE(want) << want.error().message();
    const auto& wi = want->outputs.at("ids");
    EXPECT_EQ(wi.as<std::int32_t>()[0], 1);
    EXPECT_EQ(wi.as<std::int32_t>()[1], 4);
    EXPECT_NE(wi.as<std::int32_t>()[2], 0);
    EXPECT_NE(wi.as<std::int32_t>()[3], 0);
    EXPECT_EQ(wi.as<std::int32_t>()[4], 2);
    EXPECT_EQ(wi.as<std::int32_t>()[5], 3);
    for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
      if (!usable(level)) continue;
      SCOPED_TRACE(std::string(isa_name(level)));
      cpu_executor ex({2, level});
      auto exe = ex.load(ws);
      ASSERT_TRUE(exe);
      auto en = ex.add_entry(*exe, *g);
      ASSERT_TRUE(en) << en.error().message();
      step_inputs si;
      si.slots = ei.slots;
      auto got = ex.step(*en, si);
      ASSERT_TRUE(got) << got.error().message();
      for (std::int64_t i = 0; i < T * k; ++i) EXPECT_EQ(got->outputs.at("ids").as<std::int32_t>()[i], wi.as<std::int32_t>()[i]);
      // The products: the oracle in double over the stored weights; the CPU path quantizes its
      // activations for the block formats (the matmul bounds), so compare relative to the row scale.
      const double bound = wt == dtype::f32 || wt == dtype::f16 ? 1e-4 : wt == dtype::q8_0 ? 2e-2 : 4e-2;
      for (const char* o : {"y", "z"}) {
        const auto& a = want->outputs.at(o);
        const auto& c = got->outputs.at(o);
        double scale = 0, worst = 0;
        for (std::int64_t i = 0; i < a.numel(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(a.as<float>()[i])));
        for (std::int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a.as<float>()[i] - c.as<float>()[i])));
        EXPECT_LT(worst, bound * scale) << o;
      }
    }
    if (wt != dtype::f32) continue;
    // A witness that fails: a NaN where a routing weight is picked.
    cpu_executor ex;
    auto exe = ex.load(ws);
    auto en = ex.add_entry(*exe, *g);
    ASSERT_TRUE(en);
    tensor bad = tensor::copy_of(st.view());
    bad.as<float>()[3 * E + 0] = NAN;
    for (std::int64_t j = 1; j < E; ++j) bad.as<float>()[3 * E + j] = -INFINITY;  // NaN is picked second
    step_inputs si;
    si.slots = {{"x", xt.view()}, {"scores", bad.view()}};
    auto r = ex.step(*en, si);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, exec_error_code::invalid_witness) << r.error().message();
    ei.slots = si.slots;
    auto ro = eval::evaluate(*g, ei);
    ASSERT_FALSE(ro);
    EXPECT_EQ(ro.error().code, eval::eval_error_code::invalid_witness);
  }

  // Expert ids from outside the graph (a slot): one out of range is index_out_of_range, in both.
  graph::builder b;
  const auto x = b.slot(graph::slot_kind::request_input, {dtype::f32, {2, 32}}, "x");
  const auto ids = b.slot(graph::slot_kind::request_input, {dtype::i32, {2, 1}}, "ids");
  b.output("y", b.linear_id(x, b.weight({troupe::graph::tensor_role::ffn_up, 0}, {dtype::f32, {3, 8, 32}}), ids));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  eval::map_const_source src;
  tensor w3(dtype::f32, {3, 8, 32});
  for (std::int64_t i = 0; i < w3.numel(); ++i) w3.as<float>()[i] = 0.5f;
  src.add({troupe::graph::tensor_role::ffn_up, 0}, std::move(w3));
  const map_weights ws(src);
  tensor xt(dtype::f32, {2, 32}), it(dtype::i32, {2, 1});
  for (std::int64_t i = 0; i < xt.numel(); ++i) xt.as<float>()[i] = 1.0f;
  // A negative id selects nothing: zeros, in both.
  it.as<std::int32_t>()[0] = -1;
  it.as<std::int32_t>()[1] = -5;
  cpu_executor ex;
  auto exe = ex.load(ws);
  auto en = ex.add_entry(*exe, *g);
  ASSERT_TRUE(en) << en.error().message();
  step_inputs si;
  si.slots = {{"x", xt.view()}, {"ids", it.view()}};  // views of `it`: each step below reads its ids as set
  auto r = ex.step(*en, si);
  ASSERT_TRUE(r) << r.error().message();
  for (std::int64_t i = 0; i < 16; ++i) EXPECT_EQ(r->outputs.at("y").as<float>()[i], 0.0f);
  it.as<std::int32_t>()[1] = 1;  // one real pick beside a skipped one
  r = ex.step(*en, si);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->outputs.at("y").as<float>()[0], 0.0f);
  EXPECT_EQ(r->outputs.at("y").as<float>()[8], 16.0f);
  it.as<std::int32_t>()[0] = 2;
  it.as<std::int32_t>()[1] = 3;
  r = ex.step(*en, si);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);
  eval::eval_inputs ei;
  ei.slots = si.slots;
  ei.weights = &src;
  auto ro = eval::evaluate(*g, ei);
  ASSERT_FALSE(ro);
  EXPECT_EQ(ro.error().code, eval::eval_error_code::index_out_of_range);
}

// Runs f(executor, executable) on a 2-thread executor of every isa level this CPU has, `ws` loaded.
template <class F>
void on_every_level(const weight_source& ws, F&& f) {
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    cpu_executor ex(cpu_options{.threads = 2, .level = level});
    auto exe = ex.load(ws);
    ASSERT_TRUE(exe);
    f(ex, *exe);
  }
}

// A router stored in a block format (ffn_gate_inp in q8_0 or q4_k) scores the experts from unrounded
// activations: its output is the exact product with the stored router's values, to f32 rounding, on
// every isa level, while the same bytes as any other linear take the 8-bit activation rounding (which
// moves the scores by a thousand times more here: what turns a near tie the other way).
TEST(cpu_executor, a_quantized_router_scores_from_unrounded_activations) {
  constexpr std::int64_t M = 7, E = 16, K = 512;
  std::uint64_t state = 11;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(state >> 40) / static_cast<double>(1ull << 24) - 0.5);
  };
  tensor x(dtype::f32, {M, K});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = next() * (i % 97 == 0 ? 40.0f : 1.0f);  // outliers set the block scales
  for (dtype wt : {dtype::q8_0, dtype::q4_k}) {
    SCOPED_TRACE(std::string(troupe::name(wt)));
    tensor q(wt, {E, K});
    std::vector<float> f(static_cast<std::size_t>(E * K)), back(static_cast<std::size_t>(E * K));
    for (auto& v : f) v = next() * 0.1f;
    for (std::int64_t r = 0; r < E; ++r) {
      ASSERT_TRUE(quantize_row(wt, f.data() + r * K, q.data() + r * q.view().row_bytes(), K));
      ASSERT_TRUE(dequantize_row(wt, q.data() + r * q.view().row_bytes(), back.data() + r * K, K));
    }
    eval::map_const_source src;
    src.add({troupe::graph::tensor_role::ffn_gate_inp, 0}, tensor(q));
    src.add({troupe::graph::tensor_role::ffn_up, 0}, tensor(q));
    const map_weights ws(src);
    graph::builder b;
    const auto xv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, K}}, "x");
    b.output("router", b.linear(xv, b.weight({troupe::graph::tensor_role::ffn_gate_inp, 0}, {wt, {E, K}})));
    b.output("other", b.linear(xv, b.weight({troupe::graph::tensor_role::ffn_up, 0}, {wt, {E, K}})));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g) << g.error().message();
    on_every_level(ws, [&](cpu_executor& ex, executable_id exe) {
      auto e = ex.add_entry(exe, *g);
      ASSERT_TRUE(e) << e.error().message();
      step_inputs in;
      in.slots = {{"x", x.view()}};
      auto o = ex.step(*e, in);
      ASSERT_TRUE(o) << o.error().message();
      double router_err = 0, other_err = 0;
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < E; ++n) {
          double want = 0, scale = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            want += static_cast<double>(x.as<float>()[m * K + k]) * back[static_cast<std::size_t>(n * K + k)];
            scale += std::fabs(static_cast<double>(x.as<float>()[m * K + k]) * back[static_cast<std::size_t>(n * K + k)]);
          }
          router_err = std::max(router_err, std::fabs(o->outputs.at("router").as<float>()[m * E + n] - want) / scale);
          other_err = std::max(other_err, std::fabs(o->outputs.at("other").as<float>()[m * E + n] - want) / scale);
        }
      EXPECT_LT(router_err, 1e-5);  // f32 sums of exact products
      EXPECT_GT(other_err, 1e-4);   // the 8-bit activations' rounding
    });
  }
}

TEST(cpu_executor, refuses_at_prepare_what_it_cannot_lower) {
  graph::builder b;
  const auto x = b.slot(graph::slot_kind::request_input, {dtype::f16, {4}}, "x");
  b.output("y", b.add(x, x));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  struct none : weight_source {
    std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
  } w;
  cpu_executor ex;
  auto exe = ex.load(w);
  auto e = ex.add_entry(*exe, *g);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, exec_error_code::unsupported);
}

TEST(cpu_executor, fuses_a_residual_add_into_the_preceding_linear) {
  constexpr std::int64_t M = 3, K = 40, N = 37;  // N leaves a partial panel
  tensor w(dtype::f32, {N, K});
  for (std::int64_t i = 0; i < w.numel(); ++i) w.as<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  struct one : weight_source {
    const tensor* t;
    std::optional<tensor_view> find(const graph::weight_role& r) const override {
      return r.kind == troupe::graph::tensor_role::ffn_up ? std::optional<tensor_view>(t->view()) : std::nullopt;
    }
  } ws;
  ws.t = &w;
  tensor x(dtype::f32, {M, K}), r(dtype::f32, {M, N});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
  for (std::int64_t i = 0; i < r.numel(); ++i) r.as<float>()[i] = static_cast<float>(0.5 - 0.013 * static_cast<double>(i));
  // 0: add(linear, r); 1: add(r, linear); 2: the linear also an output, so the add stays separate.
  auto build = [&](int form) {
    graph::builder b;
    const auto xv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, K}}, "x");
    const auto rv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, N}}, "r");
    const auto l = b.linear(xv, b.weight({troupe::graph::tensor_role::ffn_up}, {dtype::f32, {N, K}}));
    b.output("y", form == 1 ? b.add(rv, l) : b.add(l, rv));
    if (form == 2) b.output("l", l);
    return std::move(b).finish();
  };
  on_every_level(ws, [&](cpu_executor& ex, executable_id exe) {
    step_inputs in;
    in.slots = {{"x", x.view()}, {"r", r.view()}};
    std::vector<tensor> ys;
    for (int form = 0; form < 3; ++form) {
      auto g = build(form);
      ASSERT_TRUE(g);
      auto e = ex.add_entry(exe, *g);
      ASSERT_TRUE(e) << e.error().message();
      EXPECT_EQ(ex.kernel_calls(*e), form == 2 ? 2u : 1u) << "form " << form;
      auto o = ex.step(*e, in);
      ASSERT_TRUE(o) << o.error().message();
      ys.push_back(o->outputs.at("y"));
    }
    for (std::int64_t i = 0; i < M * N; ++i) {
      EXPECT_EQ(ys[0].as<float>()[i], ys[2].as<float>()[i]) << i;
      EXPECT_EQ(ys[1].as<float>()[i], ys[2].as<float>()[i]) << i;
      double want = r.as<float>()[i];
      for (std::int64_t k = 0; k < K; ++k) want += static_cast<double>(x.as<float>()[(i / N) * K + k]) * w.as<float>()[(i % N) * K + k];
      EXPECT_NEAR(ys[0].as<float>()[i], want, 1e-4) << i;
    }
  });
}

// Consecutive linears of one input (a layer's q, k and v) run as one batch of products with one
// preparation of x; a k-quant file may store one of them in another format, which the batch runs on
// its own. The batch must give exactly what the products give one by one (here: separated by another
// equation, which keeps them apart).
// Three weights of the given roles, for the sibling tests.
struct three_weights : weight_source {
  three_weights(const std::vector<tensor>* t, const troupe::graph::tensor_role* r) : ts(t), rs(r) {}
  const std::vector<tensor>* ts;
  const troupe::graph::tensor_role* rs;
  std::optional<tensor_view> find(const graph::weight_role& r) const override {
    for (int j = 0; j < 3; ++j)
      if (r.kind == rs[j]) return (*ts)[static_cast<std::size_t>(j)].view();
    return std::nullopt;
  }
};

// The graph build(together) and build(apart) as entries of exe, each checked for its instruction count
// and stepped on `in`: their outputs, together's first (fewer than two where a step failed).
template <class Build>
std::vector<step_outputs> together_and_apart(cpu_executor& ex, executable_id exe, Build& build, const step_inputs& in,
                                             std::size_t calls_together, std::size_t calls_apart) {
  std::vector<step_outputs> outs;
  for (const bool together : {true, false}) {
    auto g = build(together);
    EXPECT_TRUE(g);
    if (!g) return outs;
    auto e = ex.add_entry(exe, *g);
    EXPECT_TRUE(e) << e.error().message();
    if (!e) return outs;
    EXPECT_EQ(ex.kernel_calls(*e), together ? calls_together : calls_apart);
    auto o = ex.step(*e, in);
    EXPECT_TRUE(o) << o.error().message();
    if (!o) return outs;
    outs.push_back(std::move(*o));
  }
  return outs;
}

TEST(cpu_executor, runs_sibling_linears_of_one_input_as_one_batch) {
  constexpr std::int64_t K = 96;
  const std::int64_t Ns[3] = {37, 20, 33};  // partial panels
  const dtype types[3] = {dtype::q8_0, dtype::q8_0, dtype::q4_0};
  const troupe::graph::tensor_role roles[3] = {troupe::graph::tensor_role::attn_q, troupe::graph::tensor_role::attn_k,
                                              troupe::graph::tensor_role::attn_v};
  std::vector<tensor> ws;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> f(static_cast<std::size_t>(Ns[j] * K));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + j));
    tensor t(types[j], {Ns[j], K});
    ASSERT_TRUE(quantize_row(types[j], f.data(), t.data(), static_cast<std::int64_t>(f.size())));
    ws.push_back(std::move(t));
  }
  const three_weights src{&ws, roles};
  for (const std::int64_t M : {1, 3, 16, 70}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    tensor x(dtype::f32, {M, K});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
    // together: three linears in a row; apart: an add after the first keeps them from one batch.
    auto build = [&](bool together) {
      graph::builder b;
      const auto xv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, K}}, "x");
      std::vector<graph::value_id> ys;
      for (int j = 0; j < 3; ++j) {
        ys.push_back(b.linear(xv, b.weight({roles[j]}, {types[j], {Ns[j], K}})));
        if (!together && j == 0) b.output("extra", b.add(ys[0], ys[0]));
      }
      for (int j = 0; j < 3; ++j) b.output("y" + std::to_string(j), ys[static_cast<std::size_t>(j)]);
      return std::move(b).finish();
    };
    on_every_level(src, [&](cpu_executor& ex, executable_id exe) {
      step_inputs in;
      in.slots = {{"x", x.view()}};
      // together: one batch; apart: the first linear, the add, then the other two as one batch.
      const auto outs = together_and_apart(ex, exe, build, in, 1, 3);
      ASSERT_EQ(outs.size(), 2u);
      for (int j = 0; j < 3; ++j) {
        const auto& a = outs[0].outputs.at("y" + std::to_string(j));
        const auto& c = outs[1].outputs.at("y" + std::to_string(j));
        ASSERT_EQ(a.bytes(), c.bytes());
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.bytes()), 0) << "linear " << j;
        // And near the products of the decoded weights (8-bit activations: a loose bound).
        std::vector<float> wf(static_cast<std::size_t>(Ns[j] * K));
        ASSERT_TRUE(dequantize_row(types[j], ws[static_cast<std::size_t>(j)].data(), wf.data(), Ns[j] * K));
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < Ns[j]; ++n) {
            double want = 0;
            for (std::int64_t k = 0; k < K; ++k) want += static_cast<double>(x.as<float>()[m * K + k]) * wf[static_cast<std::size_t>(n * K + k)];
            EXPECT_NEAR(a.as<float>()[m * Ns[j] + n], want, 0.05 + 0.02 * std::fabs(want)) << "linear " << j << " m " << m << " n " << n;
          }
      }
    });
  }
}

// Expert products of one x and one set of picks (a routed layer's gate and up) run as one batch over
// one grouping of the picks; a third of another stored type runs on its own. Picks repeat (an expert
// with several tokens gathers them) and include -1 (another rank's expert: zeros). Together and apart
// (an add between them) give the same bits, near the products of the decoded weights.
TEST(cpu_executor, runs_sibling_expert_products_of_one_input_as_one_batch) {
  constexpr std::int64_t K = 64, E = 5, k = 2;
  const std::int64_t Ns[3] = {40, 24, 33};
  const dtype types[3] = {dtype::q8_0, dtype::q8_0, dtype::q4_0};
  const troupe::graph::tensor_role roles[3] = {troupe::graph::tensor_role::ffn_gate_exps, troupe::graph::tensor_role::ffn_up_exps,
                                              troupe::graph::tensor_role::ffn_down_exps};
  std::vector<tensor> ws;
  std::vector<std::vector<float>> decoded;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> f(static_cast<std::size_t>(E * Ns[j] * K));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(std::sin(0.29 * static_cast<double>(i) + 3 * j));
    tensor t(types[j], {E, Ns[j], K});
    ASSERT_TRUE(quantize_row(types[j], f.data(), t.data(), static_cast<std::int64_t>(f.size())));
    std::vector<float> back(f.size());
    ASSERT_TRUE(dequantize_row(types[j], t.data(), back.data(), static_cast<std::int64_t>(back.size())));
    decoded.push_back(std::move(back));
    ws.push_back(std::move(t));
  }
  const three_weights src{&ws, roles};
  for (const std::int64_t Tn : {1, 7}) {
    SCOPED_TRACE("tokens " + std::to_string(Tn));
    tensor x(dtype::f32, {Tn, K}), ids(dtype::i32, {Tn, k});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = static_cast<float>(std::cos(0.13 * static_cast<double>(i)));
    for (std::int64_t p = 0; p < Tn * k; ++p) ids.as<std::int32_t>()[p] = p % 5 == 4 ? -1 : static_cast<std::int32_t>((p * 3) % E);
    auto build = [&](bool together) {
      graph::builder b;
      const auto xv = b.slot(graph::slot_kind::request_input, {dtype::f32, {Tn, K}}, "x");
      const auto iv = b.slot(graph::slot_kind::request_input, {dtype::i32, {Tn, k}}, "ids");
      std::vector<graph::value_id> ys;
      for (int j = 0; j < 3; ++j) {
        ys.push_back(b.linear_id(xv, b.weight({roles[j]}, {types[j], {E, Ns[j], K}}), iv));
        if (!together && j == 0) b.output("extra", b.add(ys[0], ys[0]));
      }
      for (int j = 0; j < 3; ++j) b.output("y" + std::to_string(j), ys[static_cast<std::size_t>(j)]);
      return std::move(b).finish();
    };
    on_every_level(src, [&](cpu_executor& ex, executable_id exe) {
      step_inputs in;
      in.slots = {{"x", x.view()}, {"ids", ids.view()}};
      // together: gate and up as one batch, the q4_0 product alone; apart: each on its own, the add.
      const auto outs = together_and_apart(ex, exe, build, in, 2, 4);
      ASSERT_EQ(outs.size(), 2u);
      for (int j = 0; j < 3; ++j) {
        const auto& a = outs[0].outputs.at("y" + std::to_string(j));
        const auto& c = outs[1].outputs.at("y" + std::to_string(j));
        ASSERT_EQ(a.bytes(), c.bytes());
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.bytes()), 0) << "product " << j;
        const auto& wf = decoded[static_cast<std::size_t>(j)];
        for (std::int64_t p = 0; p < Tn * k; ++p) {
          const std::int32_t id = ids.as<std::int32_t>()[p];
          for (std::int64_t n = 0; n < Ns[j]; ++n) {
            double want = 0;
            if (id >= 0)
              for (std::int64_t q = 0; q < K; ++q)
                want += static_cast<double>(x.as<float>()[(p / k) * K + q]) * wf[static_cast<std::size_t>((id * Ns[j] + n) * K + q)];
            EXPECT_NEAR(a.as<float>()[p * Ns[j] + n], want, 0.05 + 0.02 * std::fabs(want)) << "product " << j << " pick " << p << " n " << n;
          }
        }
      }
    });
  }
}

TEST(cpu_executor, fuses_a_gated_feed_forward_middle_without_running_the_activation) {
  constexpr std::int64_t M = 3, N = 37;
  tensor x(dtype::f32, {M, N}), u(dtype::f32, {M, N});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = static_cast<float>(3.0 * std::sin(0.37 * static_cast<double>(i)));
  for (std::int64_t i = 0; i < u.numel(); ++i) u.as<float>()[i] = static_cast<float>(0.5 - 0.013 * static_cast<double>(i));
  struct none : weight_source {
    std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
  } ws;
  // g = x + x; a = act(g); t = u + u (planned after the activation, so it would take g's bytes were g
  // not kept alive for the fused mul); y = a * t (t * a for gelu_tanh). Unfused: a is also an output.
  auto build = [&](graph::op act, bool unfused) {
    graph::builder b;
    const auto xv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, N}}, "x");
    const auto uv = b.slot(graph::slot_kind::request_input, {dtype::f32, {M, N}}, "u");
    const auto gv = b.add(xv, xv);
    const auto a = b.unary(act, gv);
    const auto tv = b.add(uv, uv);
    b.output("y", act == graph::op::silu ? b.mul(a, tv) : b.mul(tv, a));
    if (unfused) b.output("a", a);
    return std::move(b).finish();
  };
  on_every_level(ws, [&](cpu_executor& ex, executable_id exe) {
    step_inputs in;
    in.slots = {{"x", x.view()}, {"u", u.view()}};
    for (auto act : {graph::op::silu, graph::op::gelu_tanh}) {
      SCOPED_TRACE(std::string(graph::op_name(act)));
      std::vector<tensor> ys;
      std::vector<std::size_t> calls;
      for (bool unfused : {false, true}) {
        auto g = build(act, unfused);
        ASSERT_TRUE(g);
        auto e = ex.add_entry(exe, *g);
        ASSERT_TRUE(e) << e.error().message();
        calls.push_back(ex.kernel_calls(*e));
        auto o = ex.step(*e, in);
        ASSERT_TRUE(o) << o.error().message();
        ys.push_back(o->outputs.at("y"));
      }
      EXPECT_EQ(calls[0], 3u);  // add, add, gated
      EXPECT_EQ(calls[0] + 1, calls[1]);
      for (std::int64_t i = 0; i < M * N; ++i) {
        const double gd = 2.0 * x.as<float>()[i];
        const double ad = act == graph::op::silu ? gd / (1 + std::exp(-gd))
                                                 : 0.5 * gd * (1 + std::tanh(0.7978845608028654 * (gd + 0.044715 * gd * gd * gd)));
        const double want = ad * 2.0 * u.as<float>()[i];
        const double tol = 1e-5 * std::max(1.0, std::fabs(want));
        EXPECT_NEAR(ys[0].as<float>()[i], ys[1].as<float>()[i], tol) << i;
        EXPECT_NEAR(ys[0].as<float>()[i], want, tol) << i;
      }
    }
  });
}

}  // namespace
}  // namespace troupe::exec::cpu

namespace troupe::exec::cpu {
namespace {

// The resident bytes of this process's mappings of `path` (/proc/self/smaps).
std::size_t resident_of(const fs::path& path) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool mine = false;
  std::size_t kb = 0;
  const auto want = fs::canonical(path).string();
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') != std::string::npos) {
      mine = line.size() >= want.size() && line.compare(line.size() - want.size(), want.size(), want) == 0;
    } else if (mine && line.rfind("Rss:", 0) == 0) {
      kb += std::stoull(line.substr(4));
    }
  }
  return kb * 1024;
}

void evict_from_page_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Loading packs each weight into the executor's own layout and gives the file's pages back as it goes:
// what stays resident of the mapped GGUF is its header and the embedding rows the steps looked up, not
// a second copy of the weights.
TEST(cpu_executor, loading_gives_the_mapped_files_pages_back_as_it_packs) {
  for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::f16}) {
    SCOPED_TRACE(std::string(name(t)));
    auto d = troupe::testing::case_dims("llama", t);
    d.vocab = 1024;
    d.hidden = 512;
    d.ffn = 1536;
    d.layers = 4;
    d.heads = 8;
    d.kv_heads = 4;
    const auto dir = fs::temp_directory_path() / ("troupe-cpu-release-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const auto path = dir / ("llama-" + std::string(name(t)) + ".gguf");
    ASSERT_TRUE(families::write_fixture("llama", d, path, true));
    // Out of the page cache, so the load reads the file the way a first run does: by readahead into
    // large folios, which a stray touch of a PMD-aligned mapping would map 2 MiB at a time.
    evict_from_page_cache(path);
    auto h = families::model_handle::load(path, families::registry::builtin());
    ASSERT_TRUE(h);
    cpu_executor ex({2, std::nullopt});
    auto run = app::exec_runner::create(*h, ex, 32);
    ASSERT_TRUE(run) << run.error();
    const std::int32_t prompt[] = {5, 9, 300, 17};
    ASSERT_TRUE(run->feed(prompt));
    const std::int32_t next[] = {42};
    ASSERT_TRUE(run->feed(next));
    const auto size = fs::file_size(path);
    const auto resident = resident_of(path);
    std::printf("[ cpu ] %s: %zu of the file's %zu bytes resident after loading\n", std::string(name(t)).c_str(), resident,
                static_cast<std::size_t>(size));
    // The header and the fault-around windows (64 KiB) of the embedding rows looked up: here rows 5..42
    // share one, 300 has another. The norms the steps read are the executor's own copies; read from the
    // file, their windows came to 330 KiB here, and to 2 MiB a norm where the kernel maps a large
    // page-cache folio whole.
    EXPECT_LT(resident, std::size_t{256} << 10);
  }
}

}  // namespace
}  // namespace troupe::exec::cpu

// The CPU executor against the oracle: every shipped family, every weight format the CPU target packs,
// a prefill then decode steps, on every isa level this machine runs; and its typed refusals.
#include "engine/exec/cpu/cpu_executor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "tests/support/exec_cases.hpp"
#include "tests/support/logprobs.hpp"
#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
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

class cpu_vs_oracle : public ::testing::TestWithParam<model_case> {};

TEST_P(cpu_vs_oracle, prefill_and_decode_match_the_oracle_on_every_isa_level) {
  const auto c = GetParam();
  auto h = load_case(c);
  ASSERT_TRUE(h);
  const auto ref = troupe::testing::oracle_reference(h);
  ASSERT_EQ(ref.logprobs.size(), 5u);
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    cpu_executor ex({2, level});
    const auto got = troupe::testing::executor_steps(h, ex, ref);
    ASSERT_FALSE(got.empty());
    const double worst = troupe::testing::worst_top10(ref, got, 2 * tolerance(c.format));
    EXPECT_LT(worst, tolerance(c.format)) << "worst top-10 |dlogprob| " << worst;
    std::printf("[ cpu ] %s %s: worst top-10 |dlogprob| vs oracle %.2e\n", case_name(c).c_str(), std::string(isa_name(level)).c_str(), worst);
  }
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
  for (dtype t : {dtype::q4_1, dtype::q5_0, dtype::q5_1}) v.push_back({"llama", t, true});
  v.push_back({"gemma2", dtype::q8_0, true});
  v.push_back({"phi3", dtype::q4_k, true});
  v.push_back({"qwen3", dtype::bf16, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(families, cpu_vs_oracle, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(cpu_executor, refuses_bad_steps_without_touching_state) {
  auto h = load_case({"llama", dtype::f32, true});
  ASSERT_TRUE(h);
  cpu_executor ex;
  app::weight_map_weights w(h->model().weights());
  auto exe = ex.load(w);
  ASSERT_TRUE(exe);
  families::step_spec spec;
  spec.shape = families::step_shape(1, 2, 8);
  auto g = h->model().trace(spec);
  ASSERT_TRUE(g);
  auto e = ex.add_entry(*exe, *g);
  ASSERT_TRUE(e) << e.error().message();
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
  eval::eval_inputs ei;
  ei.slots = {{"x", xt.view()}, {"c", ct.view()}, {"r", rt.view()}};
  eval::map_const_source none;
  ei.weights = &none;
  auto want = eval::evaluate(*g, ei);
  ASSERT_TRUE(want) << want.error().message();
  struct no_weights : weight_source {
    std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
  } w;
  cpu_executor ex;
  auto exe = ex.load(w);
  auto en = ex.add_entry(*exe, *g);
  ASSERT_TRUE(en) << en.error().message();
  step_inputs si;
  si.slots = ei.slots;
  auto got = ex.step(*en, si);
  ASSERT_TRUE(got) << got.error().message();
  for (const auto& [name, t] : want->outputs)
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float a = t.as<float>()[i], b2 = got->outputs.at(name).as<float>()[i];
      EXPECT_TRUE((std::isnan(a) && std::isnan(b2)) || a == b2) << name << "[" << i << "]: oracle " << a << ", cpu " << b2;
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
      return r.name == "w" ? std::optional<tensor_view>(t->view()) : std::nullopt;
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
    const auto l = b.linear(xv, b.weight({"w"}, {dtype::f32, {N, K}}));
    b.output("y", form == 1 ? b.add(rv, l) : b.add(l, rv));
    if (form == 2) b.output("l", l);
    return std::move(b).finish();
  };
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    cpu_executor ex(cpu_options{.threads = 2, .level = level});
    auto exe = ex.load(ws);
    ASSERT_TRUE(exe);
    step_inputs in;
    in.slots = {{"x", x.view()}, {"r", r.view()}};
    std::vector<tensor> ys;
    for (int form = 0; form < 3; ++form) {
      auto g = build(form);
      ASSERT_TRUE(g);
      auto e = ex.add_entry(*exe, *g);
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
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!usable(level)) continue;
    SCOPED_TRACE(std::string(isa_name(level)));
    cpu_executor ex(cpu_options{.threads = 2, .level = level});
    auto exe = ex.load(ws);
    ASSERT_TRUE(exe);
    step_inputs in;
    in.slots = {{"x", x.view()}, {"u", u.view()}};
    for (auto act : {graph::op::silu, graph::op::gelu_tanh}) {
      SCOPED_TRACE(std::string(graph::op_name(act)));
      std::vector<tensor> ys;
      std::vector<std::size_t> calls;
      for (bool unfused : {false, true}) {
        auto g = build(act, unfused);
        ASSERT_TRUE(g);
        auto e = ex.add_entry(*exe, *g);
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
  }
}

}  // namespace
}  // namespace troupe::exec::cpu

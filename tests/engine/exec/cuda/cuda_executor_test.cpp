// The CUDA executor against the oracle and the CPU target. Every test but the first needs a device:
// without one (CI, this project's build machine) each skips and says why.
#include "engine/exec/cuda/cuda_executor.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>

#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"
#include "engine/driver/driver.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cuda/linear_kernels.hpp"
#include "engine/graph/builder.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/exec_cases.hpp"
#include "tests/support/logprobs.hpp"

namespace troupe::exec::cuda {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> no_device() {
  auto d = devices();
  if (!d) return d.error();
  return std::nullopt;
}
#define SKIP_WITHOUT_DEVICE()                                                          \
  do {                                                                                 \
    if (auto why = no_device()) GTEST_SKIP() << "needs a CUDA device: " << *why;       \
  } while (0)

std::unique_ptr<executor> make(cuda_options o = {}) {
  auto ex = make_executor(o);
  EXPECT_TRUE(ex) << (ex ? "" : ex.error().message());
  return ex ? std::move(*ex) : nullptr;
}

TEST(cuda_executor, says_why_when_it_cannot_run) {
  auto d = devices();
  auto ex = make_executor({});
  if (d) {
    EXPECT_TRUE(ex) << ex.error().message();
    EXPECT_FALSE(d->empty());
    std::printf("[ cuda ] %s, %zu MiB, sm_%d%d\n", (*d)[0].name.c_str(), (*d)[0].memory_bytes >> 20, (*d)[0].major, (*d)[0].minor);
  } else {
    ASSERT_FALSE(ex);
    EXPECT_EQ(ex.error().code, exec_error_code::device_error);
    EXPECT_FALSE(ex.error().reason.empty());
    std::printf("[ cuda ] no device: %s\n", ex.error().reason.c_str());
  }
}

// ---- single ops against the oracle, awkward sizes ----

struct op_case {
  std::string name;
  graph::graph g;
  std::map<std::string, tensor> slots;
};

tensor random_tensor(dtype t, troupe::shape s, std::mt19937& rng, double lo = -2, double hi = 2) {
  tensor x(t, s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t i = 0; i < x.numel(); ++i) store_element(t, x.data(), i, t == dtype::boolean ? (u(rng) > 0) : u(rng));
  return x;
}

void expect_matches_oracle(const op_case& c, double tol) {
  SCOPED_TRACE(c.name);
  eval::eval_inputs ei;
  step_inputs si;
  for (const auto& [n, t] : c.slots) {
    ei.slots.emplace(n, t.view());
    si.slots.emplace(n, t.view());
  }
  eval::map_const_source none;
  ei.weights = &none;
  auto want = eval::evaluate(c.g, ei);
  ASSERT_TRUE(want) << want.error().message();
  struct no_weights : weight_source {
    std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
  } w;
  auto ex = make();
  ASSERT_TRUE(ex);
  auto exe = ex->load(w);
  ASSERT_TRUE(exe);
  auto en = ex->add_entry(*exe, c.g);
  ASSERT_TRUE(en) << en.error().message();
  auto got = ex->step(*en, si);
  ASSERT_TRUE(got) << got.error().message();
  for (const auto& [n, t] : want->outputs) {
    const auto& g = got->outputs.at(n);
    ASSERT_EQ(g.type(), t.type());
    ASSERT_EQ(g.shape(), t.shape());
    double worst = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const double a = troupe::load_element(t.type(), t.data(), i);
      const double b = troupe::load_element(g.type(), g.data(), i);
      if (std::isnan(a) || std::isnan(b)) {
        EXPECT_EQ(std::isnan(a), std::isnan(b)) << n << "[" << i << "]";
        continue;
      }
      worst = std::max(worst, std::fabs(a - b) / std::max(1.0, std::fabs(a)));
    }
    EXPECT_LE(worst, tol) << n;
  }
}

TEST(cuda_executor, each_op_matches_the_oracle) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(7);
  using graph::op;
  auto slot = [](graph::builder& b, const char* name, dtype t, troupe::shape s) {
    return b.slot(graph::slot_kind::request_input, {t, std::move(s)}, name);
  };
  std::vector<op_case> cases;
  {
    graph::builder b;
    const auto x = slot(b, "x", dtype::f32, {3, 37});
    const auto y = slot(b, "y", dtype::f32, {37});
    const auto s = slot(b, "s", dtype::f32, {3, 1});
    for (op o : {op::neg, op::abs, op::exp, op::tanh, op::erf, op::sigmoid, op::silu, op::gelu_tanh})
      b.output("u" + std::string(graph::op_name(o)), b.unary(o, x));
    for (op o : {op::add, op::sub, op::mul, op::div, op::maximum, op::minimum}) {
      b.output("row" + std::string(graph::op_name(o)), b.binary(o, x, y));
      b.output("col" + std::string(graph::op_name(o)), b.binary(o, x, s));
    }
    b.output("less", b.binary(op::less, x, y));
    b.output("where", b.where(b.binary(op::greater, x, y), x, s));
    b.output("gated", b.mul(b.unary(op::silu, x), b.unary(op::abs, x)));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor xv = random_tensor(dtype::f32, {3, 37}, rng), yv = random_tensor(dtype::f32, {37}, rng);
    xv.as<float>()[5] = NAN;  // maximum / minimum give NaN when either side is (the oracle's rule)
    yv.as<float>()[9] = NAN;
    cases.push_back({"elementwise", std::move(*g), {{"x", std::move(xv)}, {"y", std::move(yv)}, {"s", random_tensor(dtype::f32, {3, 1}, rng)}}});
  }
  {
    graph::builder b;
    const auto x = slot(b, "x", dtype::f32, {4, 5, 33});
    const auto i = slot(b, "i", dtype::i32, {4, 5});
    b.output("sum1", b.reduce(op::reduce_sum, x, 1));
    b.output("max2", b.reduce(op::reduce_max, x, 2, true));
    b.output("mean0", b.reduce(op::reduce_mean, x, 0));
    b.output("soft", b.softmax(x, -1));
    b.output("lsoft1", b.log_softmax(x, 1));
    b.output("amax", b.arg_max(x, -1));
    b.output("t", b.transpose(x, {2, 0, 1}));
    b.output("sl", b.slice(x, 2, 3, 20));
    b.output("cat", b.concat({x, b.slice(x, 2, 0, 7)}, 2));
    b.output("bc", b.broadcast(b.slice(x, 0, 1, 2), {3, 5, 33}));
    b.output("cast", b.cast(x, dtype::i32));
    b.output("idiv", b.div(i, b.scalar(3, dtype::i32)));
    b.output("isum", b.reduce(op::reduce_sum, i, 1));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    cases.push_back({"reductions_and_movement", std::move(*g),
                     {{"x", random_tensor(dtype::f32, {4, 5, 33}, rng, -9, 9)}, {"i", random_tensor(dtype::i32, {4, 5}, rng, -100, 100)}}});
  }
  {
    graph::builder b;
    const auto a = slot(b, "a", dtype::f32, {2, 7, 19});
    const auto m = slot(b, "m", dtype::f32, {2, 19, 11});
    const auto x = slot(b, "x", dtype::f32, {5, 3, 40});
    const auto w = slot(b, "w", dtype::f32, {40});
    const auto bias = slot(b, "b", dtype::f32, {40});
    const auto pos = slot(b, "pos", dtype::i32, {5});
    const auto inv = slot(b, "inv", dtype::f32, {16});
    b.output("mm", b.matmul(a, m));
    b.output("rms", b.rms_norm(x, w, 1e-5));
    b.output("ln", b.layer_norm(x, w, bias, 1e-5));
    b.output("rope", b.rope(x, pos, inv, false, 1.0));
    b.output("ropex", b.rope(x, pos, inv, true, 0.5));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor p(dtype::i32, {5});
    for (int k = 0; k < 5; ++k) p.as<std::int32_t>()[k] = k * 997 + 3;
    tensor iv(dtype::f32, {16});
    for (int k = 0; k < 16; ++k) iv.as<float>()[k] = static_cast<float>(std::pow(10000.0, -k / 16.0));
    cases.push_back({"matmul_norms_rope", std::move(*g),
                     {{"a", random_tensor(dtype::f32, {2, 7, 19}, rng)}, {"m", random_tensor(dtype::f32, {2, 19, 11}, rng)},
                      {"x", random_tensor(dtype::f32, {5, 3, 40}, rng)}, {"w", random_tensor(dtype::f32, {40}, rng)},
                      {"b", random_tensor(dtype::f32, {40}, rng)}, {"pos", std::move(p)}, {"inv", std::move(iv)}}});
  }
  for (auto [D, softcap] : {std::pair{72, 0.0}, std::pair{256, 30.0}, std::pair{16, 0.0}}) {
    // Attention over a KV map: 2 rows of 5 queries, 6 query heads over 2 KV heads, 37 columns of a
    // 50-row pool, a random mask with one query allowed nothing.
    graph::builder b;
    const std::int64_t R = 2, T = 5, C = 37, S = 50, Hq = 6, Hkv = 2;
    const auto q = slot(b, "q", dtype::f32, {R * T, Hq, D});
    const auto k = slot(b, "k", dtype::f32, {S, Hkv, D});
    const auto v = slot(b, "v", dtype::f32, {S, Hkv, D});
    const auto ix = slot(b, "ix", dtype::i32, {R, C});
    const auto al = slot(b, "al", dtype::boolean, {R, T, C});
    b.output("att", b.attention(q, k, v, ix, al, 1.0 / std::sqrt(static_cast<double>(D)), softcap));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor index(dtype::i32, {R, C});
    tensor allow = random_tensor(dtype::boolean, {R, T, C}, rng);
    for (std::int64_t c = 0; c < C; ++c) allow.as<std::uint8_t>()[(0 * T + 2) * C + c] = 0;
    std::uniform_int_distribution<int> row(0, static_cast<int>(S) - 1);
    for (std::int64_t j = 0; j < R * C; ++j) index.as<std::int32_t>()[j] = row(rng);
    cases.push_back({"attention_d" + std::to_string(D), std::move(*g),
                     {{"q", random_tensor(dtype::f32, {R * T, Hq, D}, rng)}, {"k", random_tensor(dtype::f32, {S, Hkv, D}, rng)},
                      {"v", random_tensor(dtype::f32, {S, Hkv, D}, rng)}, {"ix", std::move(index)}, {"al", std::move(allow)}}});
  }
  {
    // Routing: top_k over scores with ties and a NaN, take_along of the picked scores, and attention
    // with a sink per head (gpt-oss).
    graph::builder b;
    const auto x = slot(b, "x", dtype::f32, {9, 40});
    const auto picks = b.top_k(x, 6);
    b.output("top", picks);
    b.output("taken", b.take_along(x, picks));
    const auto q = slot(b, "q", dtype::f32, {4, 4, 32});
    const auto k = slot(b, "k", dtype::f32, {12, 2, 32});
    const auto v = slot(b, "v", dtype::f32, {12, 2, 32});
    const auto ix = slot(b, "ix", dtype::i32, {1, 12});
    const auto al = slot(b, "al", dtype::boolean, {1, 4, 12});
    const auto sinks = slot(b, "sinks", dtype::f32, {4});
    b.output("att_sinks", b.attention(q, k, v, ix, al, 0.25, 0.0, sinks));
    auto g = std::move(b).finish();
    ASSERT_TRUE(g);
    tensor xv = random_tensor(dtype::f32, {9, 40}, rng);
    for (int j = 0; j < 40; j += 3) xv.as<float>()[40 + j] = 0.5f;  // row 1: ties, broken by the lower index
    xv.as<float>()[2 * 40 + 7] = NAN;                                // row 2: a NaN ranks last
    tensor index(dtype::i32, {1, 12});
    for (int j = 0; j < 12; ++j) index.as<std::int32_t>()[j] = j;
    tensor allow = random_tensor(dtype::boolean, {1, 4, 12}, rng);
    for (int c = 0; c < 12; ++c) allow.as<std::uint8_t>()[3 * 12 + c] = 0;  // query 3 allowed nothing: zeros
    tensor sk = random_tensor(dtype::f32, {4}, rng, -3, 3);
    sk.as<float>()[1] = 40.0f;  // a sink far above every score
    cases.push_back({"routing_and_sinks", std::move(*g),
                     {{"x", std::move(xv)}, {"q", random_tensor(dtype::f32, {4, 4, 32}, rng)}, {"k", random_tensor(dtype::f32, {12, 2, 32}, rng)},
                      {"v", random_tensor(dtype::f32, {12, 2, 32}, rng)}, {"ix", std::move(index)}, {"al", std::move(allow)},
                      {"sinks", std::move(sk)}}});
  }
  for (const auto& c : cases) expect_matches_oracle(c, 2e-5);
}

// The recurrent mixers and ALiBi attention over three step rows: one carrying its state (a padding
// token at its end), one fresh (its first real token at position 0, after a padding token) and a
// padding row; state widths past one warp's 32 lanes (N 40, Dk 48).
TEST(cuda_executor, recurrent_ops_and_alibi_match_the_oracle) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(11);
  using graph::op;
  auto slot = [](graph::builder& b, const char* name, dtype t, troupe::shape s) {
    return b.slot(graph::slot_kind::request_input, {t, std::move(s)}, name);
  };
  constexpr std::int64_t R = 3, Tn = 5, S = 4;
  tensor rows(dtype::i32, {R}), pos(dtype::i32, {R * Tn}), write(dtype::i32, {R * Tn});
  const std::int32_t row_of[R] = {2, 0, -1};
  for (std::int64_t r = 0; r < R; ++r) {
    rows.as<std::int32_t>()[r] = row_of[r];
    for (std::int64_t t = 0; t < Tn; ++t) {
      const bool real = (r == 0 && t < 4) || (r == 1 && t > 0);
      pos.as<std::int32_t>()[r * Tn + t] = r == 0 ? static_cast<std::int32_t>(7 + t) : static_cast<std::int32_t>(t > 0 ? t - 1 : 0);
      write.as<std::int32_t>()[r * Tn + t] = real ? static_cast<std::int32_t>(r * Tn + t) : -1;
    }
  }
  graph::builder b;
  const auto rs = slot(b, "rows", dtype::i32, {R}), ps = slot(b, "pos", dtype::i32, {R * Tn}), ws = slot(b, "write", dtype::i32, {R * Tn});
  std::map<std::string, tensor> in;
  auto rnd = [&](const char* name, troupe::shape sh, double lo = -1, double hi = 1) {
    in.emplace(name, random_tensor(dtype::f32, sh, rng, lo, hi));
    return slot(b, name, dtype::f32, std::move(sh));
  };
  constexpr std::int64_t C = 40, K = 4;
  b.output("conv", b.apply(op::ssm_conv, {rnd("cx", {R, Tn, C}), rnd("cs", {S, (K - 1) * C}), rs, ps, ws, rnd("cw", {C, K})}));
  constexpr std::int64_t H = 4, Pd = 3, G = 2, N = 40;
  b.output("scan", b.apply(op::ssm_scan, {rnd("sx", {R, Tn, H, Pd}), rnd("sdt", {R, Tn, H}), rnd("sa", {H}, -2, -0.1), rnd("sb", {R, Tn, G, N}),
                                          rnd("sc", {R, Tn, G, N}), rnd("ss", {S, H * Pd * N}), rs, ps, ws}));
  constexpr std::int64_t Hk = 2, Dk = 48, Hv = 4, Dv = 6;
  b.output("delta", b.apply(op::delta_rule, {rnd("dq", {R, Tn, Hk, Dk}, -0.2, 0.2), rnd("dk", {R, Tn, Hk, Dk}, -0.2, 0.2),
                                             rnd("dv", {R, Tn, Hv, Dv}), rnd("dg", {R, Tn, Hv}, -1, 0), rnd("db", {R, Tn, Hv}, 0, 1),
                                             rnd("ds", {S, Hv * Dv * Dk}), rs, ps, ws}));
  // ALiBi: 6 heads on 2 KV heads, one row of 4 queries over 12 keys; distances key minus query.
  tensor ix(dtype::i32, {1, 12}), dist(dtype::f32, {1, 4, 12}), slopes(dtype::f32, {6});
  for (int c = 0; c < 12; ++c) ix.as<std::int32_t>()[c] = c;
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 12; ++c) dist.as<float>()[t * 12 + c] = static_cast<float>(c - (8 + t));
  for (int h = 0; h < 6; ++h) slopes.as<float>()[h] = std::pow(2.0f, -static_cast<float>(h + 1));
  graph::op_attrs a;
  a.scale = 0.2;
  const auto att = b.apply(op::attention, {rnd("aq", {4, 6, 32}), rnd("ak", {12, 2, 32}), rnd("av", {12, 2, 32}), slot(b, "aix", dtype::i32, {1, 12}),
                                           slot(b, "aal", dtype::boolean, {1, 4, 12}), slot(b, "asl", dtype::f32, {6}),
                                           slot(b, "adi", dtype::f32, {1, 4, 12})},
                           a);
  b.output("alibi", att);
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  tensor allow(dtype::boolean, {1, 4, 12});
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 12; ++c) allow.as<std::uint8_t>()[t * 12 + c] = c <= 8 + t;  // causal
  in.emplace("rows", std::move(rows));
  in.emplace("pos", std::move(pos));
  in.emplace("write", std::move(write));
  in.emplace("aix", std::move(ix));
  in.emplace("aal", std::move(allow));
  in.emplace("asl", std::move(slopes));
  in.emplace("adi", std::move(dist));
  // f32 sums of up to 48 products along 5 tokens against the oracle's double.
  expect_matches_oracle({"recurrent_and_alibi", std::move(*g), std::move(in)}, 1e-4);
}

// ---- weight formats: the GEMV and the f16 decode against the host dequantizer ----

TEST(cuda_kernels, gemv_and_decode_match_the_host_dequantizer) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(11);
  const std::int64_t N = 37, K = 512;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    SCOPED_TRACE(std::string(troupe::name(t)));
    ASSERT_TRUE(weight_format_supported(t));
    tensor wf = random_tensor(dtype::f32, {N, K}, rng, -1, 1);
    const std::size_t wbytes = *storage_bytes(t, static_cast<std::uint64_t>(N * K));
    std::vector<std::byte> w(wbytes);
    ASSERT_TRUE(quantize_row(t, wf.as<float>(), w.data(), N * K));
    std::vector<float> dec(static_cast<std::size_t>(N * K));
    ASSERT_TRUE(dequantize_row(t, w.data(), dec.data(), N * K));
    for (std::int64_t M : {1, 3, 8, 9}) {
      tensor x = random_tensor(dtype::f32, {M, K}, rng, -1, 1), r = random_tensor(dtype::f32, {M, N}, rng, -1, 1);
      void *dw, *dx, *dy, *dr, *dh;
      ASSERT_EQ(cudaMalloc(&dw, wbytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dx, x.bytes()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dy, r.bytes()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dr, r.bytes()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dh, static_cast<std::size_t>(N * K) * 2), cudaSuccess);
      cudaMemcpy(dw, w.data(), wbytes, cudaMemcpyHostToDevice);
      cudaMemcpy(dx, x.data(), x.bytes(), cudaMemcpyHostToDevice);
      cudaMemcpy(dr, r.data(), r.bytes(), cudaMemcpyHostToDevice);
      launch_gemv(t, dw, N, K, static_cast<const float*>(dx), M, static_cast<float*>(dy), static_cast<const float*>(dr), nullptr);
      launch_decode_f16(t, dw, N, K, dh, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> y(static_cast<std::size_t>(M * N));
      std::vector<std::uint16_t> h(static_cast<std::size_t>(N * K));
      cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(h.data(), dh, h.size() * 2, cudaMemcpyDeviceToHost);
      for (auto* p : {dw, dx, dy, dr, dh}) cudaFree(p);
      // f32 accumulation of K = 512 products of magnitude <= 1: well inside 1e-4 of the double sum.
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double want = r.as<float>()[m * N + n];
          for (std::int64_t k = 0; k < K; ++k) want += static_cast<double>(x.as<float>()[m * K + k]) * dec[static_cast<std::size_t>(n * K + k)];
          ASSERT_NEAR(y[static_cast<std::size_t>(m * N + n)], want, 1e-4 * std::max(1.0, std::fabs(want))) << "m " << m << " n " << n;
        }
      for (std::size_t j = 0; j < h.size(); ++j) ASSERT_EQ(h[j], f32_to_f16(dec[j])) << j;
    }
  }
}

// ---- whole models against the oracle ----

using troupe::testing::case_name;
using troupe::testing::model_case;

// How far a log-probability may move from the oracle. Decode steps (<= 8 rows) run the GEMV over the
// stored weights with f32 activations: f32 accumulation order only. Prefill (20 rows) goes through
// cuBLASLt with activations rounded to the weight's half type (f16: 2^-11 relative per product, bf16:
// 2^-8) and block formats decoded to f16 (2^-11 relative per weight): the CPU target's bf16 bound.
double tolerance(dtype t) {
  switch (t) {
    case dtype::f32: return 2e-4;
    case dtype::bf16: return 5e-2;
    default: return 2e-2;
  }
}

std::shared_ptr<const families::model_handle> load_case(const model_case& c) { return troupe::testing::load_case(c, "troupe-cuda-test"); }

using troupe::testing::log_softmax;

class cuda_vs_oracle : public ::testing::TestWithParam<model_case> {};

TEST_P(cuda_vs_oracle, prefill_and_decode_match_the_oracle) {
  SKIP_WITHOUT_DEVICE();
  const auto c = GetParam();
  auto h = load_case(c);
  ASSERT_TRUE(h);
  const auto ref = troupe::testing::oracle_reference(h);
  ASSERT_EQ(ref.logprobs.size(), 5u);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "launches");
    cuda_options o;
    o.graphs = graphs;
    auto ex = make(o);
    ASSERT_TRUE(ex);
    const auto got = troupe::testing::executor_steps(h, *ex, ref);
    ASSERT_FALSE(got.empty());
    const double worst = troupe::testing::worst_top10(ref, got, 2 * tolerance(c.format));
    EXPECT_LT(worst, tolerance(c.format)) << "worst top-10 |dlogprob| " << worst;
    std::printf("[ cuda ] %s %s: worst top-10 |dlogprob| vs oracle %.2e\n", case_name(c).c_str(), graphs ? "graphs" : "launches", worst);
  }
}

std::vector<model_case> all_cases() {
  std::vector<model_case> v;
  for (auto f : families::fixture_families()) v.push_back({f, dtype::f32, true});
  // Routed experts in a block format: linear_id's GEMV reads them as stored.
  v.push_back({"qwen3_moe", dtype::q8_0, true});
  v.push_back({"qwen3_moe", dtype::q4_k, true});
  v.push_back({"gpt_oss", dtype::mxfp4, true});  // MXFP4 experts read as stored by linear_id's GEMV
  for (dtype t : {dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k, dtype::q5_0, dtype::q4_1, dtype::q5_1,
                  dtype::q5_k, dtype::q2_k, dtype::q3_k, dtype::iq4_nl, dtype::iq4_xs})
    v.push_back({"llama", t, true});
  v.push_back({"qwen2", dtype::q8_0, true});
  v.push_back({"gemma2", dtype::q8_0, true});
  v.push_back({"qwen3", dtype::bf16, false});
  for (auto f : families::recurrent_fixture_families()) v.push_back({f, dtype::f32, true});  // conv, scan and delta-rule kernels
  return v;
}

INSTANTIATE_TEST_SUITE_P(families, cuda_vs_oracle, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- the executor's own behaviour ----

TEST(cuda_executor, refuses_bad_steps_without_touching_state) {
  SKIP_WITHOUT_DEVICE();
  auto h = load_case({"llama", dtype::f32, true});
  ASSERT_TRUE(h);
  auto ex = make();
  ASSERT_TRUE(ex);
  app::weight_map_weights w(h->model().weights());
  auto exe = ex->load(w);
  ASSERT_TRUE(exe);
  families::step_spec spec;
  spec.shape = families::step_shape(1, 2, 8);
  auto g = h->model().trace(spec);
  ASSERT_TRUE(g);
  auto e = ex->add_entry(*exe, *g);
  ASSERT_TRUE(e) << e.error().message();
  tensor ids(dtype::i32, {2}), pos(dtype::i32, {2}), read(dtype::i32, {1, 8});
  ids.as<std::int32_t>()[0] = 5;
  ids.as<std::int32_t>()[1] = 512;  // outside the vocabulary
  pos.as<std::int32_t>()[1] = 1;
  for (int j = 0; j < 8; ++j) read.as<std::int32_t>()[j] = j < 2 ? j : -1;
  step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", pos.view()}, {"kv_read_map", read.view()}};
  auto r = ex->step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range) << r.error().message();
  auto k = ex->read_state(*exe, "kv.k.0");
  ASSERT_TRUE(k);
  for (std::int64_t i = 0; i < k->numel(); ++i) ASSERT_EQ(k->as<float>()[i], 0.0f);
  ids.as<std::int32_t>()[1] = 6;
  pos.as<std::int32_t>()[1] = 9;  // a KV slot outside the cache
  r = ex->step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);
  pos.as<std::int32_t>()[1] = 0;  // two tokens into one slot
  r = ex->step(*e, in);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, exec_error_code::index_out_of_range);
  k = ex->read_state(*exe, "kv.k.0");
  ASSERT_TRUE(k);
  for (std::int64_t i = 0; i < k->numel(); ++i) ASSERT_EQ(k->as<float>()[i], 0.0f);
  pos.as<std::int32_t>()[1] = 1;  // a good step after the refusals: the executor is not poisoned
  EXPECT_TRUE(ex->step(*e, in));
  step_inputs missing;
  EXPECT_EQ(ex->step(*e, missing).error().code, exec_error_code::bad_binding);
  EXPECT_EQ(ex->step(entry_id{99}, in).error().code, exec_error_code::unknown_id);
  EXPECT_GT(ex->memory().weight_bytes, 0u);
  EXPECT_GT(ex->memory().state_bytes, 0u);
}

TEST(cuda_executor, refuses_at_prepare_what_it_cannot_lower) {
  SKIP_WITHOUT_DEVICE();
  graph::builder b;
  const auto x = b.slot(graph::slot_kind::request_input, {dtype::f16, {4}}, "x");
  b.output("y", b.add(x, x));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  struct none : weight_source {
    std::optional<tensor_view> find(const graph::weight_role&) const override { return std::nullopt; }
  } w;
  auto ex = make();
  ASSERT_TRUE(ex);
  auto exe = ex->load(w);
  auto e = ex->add_entry(*exe, *g);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, exec_error_code::unsupported);
}

// The device head against the host rules on the very same logits: an entry's logits read back, then
// sampled on the host with a mirrored history, equal the device's picks.
TEST(cuda_executor, samples_on_the_device_as_the_host_rules_do) {
  SKIP_WITHOUT_DEVICE();
  auto h = load_case({"llama", dtype::f32, true});
  ASSERT_TRUE(h);
  auto ex = make();
  ASSERT_TRUE(ex);
  app::weight_map_weights w(h->model().weights());
  auto exe = ex->load(w);
  ASSERT_TRUE(exe);
  const std::int64_t rows = 6;
  families::step_spec spec;
  spec.shape = families::step_shape(rows, 1, 8);
  auto g = h->model().trace(spec);
  ASSERT_TRUE(g);
  auto e = ex->add_entry(*exe, *g);
  ASSERT_TRUE(e) << e.error().message();
  tensor ids(dtype::i32, {rows}), pos(dtype::i32, {rows}), read(dtype::i32, {rows, 8});
  for (int r = 0; r < rows; ++r) {
    ids.as<std::int32_t>()[r] = 10 + 31 * r;
    pos.as<std::int32_t>()[r] = r * 8;
    for (int j = 0; j < 8; ++j) read.as<std::int32_t>()[r * 8 + j] = j == 0 ? r * 8 : -1;
  }
  step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", pos.view()}, {"kv_read_map", read.view()}};
  std::vector<sample_params> params(rows);
  params[1].temperature = 0.8f;
  params[1].seed = 42;
  params[2].temperature = 1.2f;
  params[2].top_k = 40;
  params[2].top_p = 0.9f;
  params[2].seed = 7;
  params[3].temperature = 1.0f;
  params[3].min_p = 0.05f;
  params[3].repetition_penalty = 1.3f;
  params[3].frequency_penalty = 0.5f;
  params[3].presence_penalty = 0.25f;
  params[3].top_logprobs = 5;
  params[4].top_logprobs = 20;
  params[5].temperature = 0.7f;
  params[5].seed = 99;
  const std::int64_t vocab = 512;
  std::vector<std::int32_t> prompt = {1, 5, 9, 200, 201};
  std::vector<std::pair<std::int32_t, float>> bias = {{3, 2.5f}, {17, -100.0f}};
  std::vector<token_history> mirror;
  for (int r = 0; r < rows; ++r) {
    ASSERT_TRUE(ex->open_history(static_cast<std::uint64_t>(r), vocab, prompt, r == 3 ? std::span(bias) : std::span<const std::pair<std::int32_t, float>>{}));
    mirror.push_back(*token_history::create(vocab, prompt, r == 3 ? std::span(bias) : std::span<const std::pair<std::int32_t, float>>{}));
  }
  sample_scratch scratch;
  for (int step = 0; step < 12; ++step) {
    auto plain = ex->step(*e, in);
    ASSERT_TRUE(plain) << plain.error().message();
    const auto& logits = plain->outputs.at("logits");
    std::vector<sample_row_request> req(rows);
    for (int r = 0; r < rows; ++r) req[r] = {static_cast<std::uint64_t>(r), params[r], static_cast<std::uint64_t>(step), r == 5};
    // Row 4 is guided: only even tokens.
    mask_hook masks = [&](std::vector<std::vector<std::uint32_t>>& m) { m[4].assign(vocab / 32, 0x55555555u); };
    auto picks = ex->step_sample(*e, in, req, masks);
    ASSERT_TRUE(picks) << picks.error().message();
    for (int r = 0; r < rows; ++r) {
      std::vector<std::uint32_t> mask;
      if (r == 4) mask.assign(vocab / 32, 0x55555555u);
      auto want = sample_row(std::span(logits.as<float>() + r * vocab, static_cast<std::size_t>(vocab)), params[r], &mirror[r],
                             static_cast<std::uint64_t>(step), mask, scratch);
      ASSERT_TRUE(want);
      const auto& got = (*picks)[r].pick;
      EXPECT_EQ(got.token, want->token) << "row " << r << " step " << step;
      EXPECT_NEAR(got.logprob, want->logprob, 1e-5) << "row " << r;
      EXPECT_EQ(got.non_finite, want->non_finite);
      ASSERT_EQ(got.top.size(), want->top.size()) << "row " << r;
      for (std::size_t k = 0; k < got.top.size(); ++k) {
        EXPECT_EQ(got.top[k].token, want->top[k].token);
        EXPECT_NEAR(got.top[k].logprob, want->top[k].logprob, 1e-5);
      }
      if (r == 5) {
        EXPECT_EQ((*picks)[r].logits.size(), static_cast<std::size_t>(vocab));
      }
      mirror[r].record(want->token);
    }
  }
}

// The tokens the driver generates for `reqs` on `ex`, after `setup` on the prepared driver.
std::vector<std::vector<std::int32_t>> driver_tokens(const std::shared_ptr<const families::model_handle>& h, executor& ex,
                                                     const driver::driver_options& opt, std::vector<driver::seq_request> reqs,
                                                     const std::function<void(driver::driver<driver::serving>&)>& setup) {
  auto d = driver::driver<driver::unprepared>(h, ex, opt).prepare();
  EXPECT_TRUE(d);
  std::vector<std::vector<std::int32_t>> out;
  if (!d) return out;
  if (setup) setup(*d);
  for (auto& req : reqs) {
    auto g = d->generate(std::move(req));
    EXPECT_TRUE(g) << (g ? "" : g.error().message());
    out.push_back(g ? g->tokens : std::vector<std::int32_t>{});
  }
  return out;
}

// The same requests through the driver on the device and on the CPU target give the same tokens.
void expect_the_cpu_targets_tokens(const std::shared_ptr<const families::model_handle>& h, driver::driver_options opt,
                                   const std::vector<driver::seq_request>& reqs,
                                   const std::function<void(driver::driver<driver::serving>&)>& setup = {}) {
  opt.max_rows = 4;
  opt.capacity = 64;
  opt.prefill_chunk = 32;
  cpu::cpu_executor cpu_ex({2, std::nullopt});
  auto ex = make();
  ASSERT_TRUE(ex);
  EXPECT_EQ(driver_tokens(h, *ex, opt, reqs, setup), driver_tokens(h, cpu_ex, opt, reqs, setup));
}

driver::seq_request prompt_request(int s, int length, int max_tokens) {
  driver::seq_request req;
  for (int i = 0; i < length; ++i) req.prompt.push_back(5 + (i * 37 + s) % 500);
  req.max_tokens = max_tokens;
  return req;
}

TEST(cuda_executor, the_driver_generates_the_cpu_targets_tokens) {
  SKIP_WITHOUT_DEVICE();
  auto h = load_case({"qwen2", dtype::f32, true});
  ASSERT_TRUE(h);
  std::vector<driver::seq_request> reqs;
  for (int s = 0; s < 3; ++s) {
    auto req = prompt_request(s, 12 + s, 16);
    req.sampling.temperature = s == 0 ? 0.0f : 0.9f;
    req.sampling.seed = 1234 + static_cast<std::uint64_t>(s);
    reqs.push_back(std::move(req));
  }
  expect_the_cpu_targets_tokens(h, {}, reqs);
}

// LoRA adapters on the device: the driver writes each loaded adapter into its slot of the pools and
// asks the executor to re-read that expert (reload_expert); rows with different adapters and none
// give the CPU target's tokens. Three adapters share two slots, so a slot is rewritten after the
// pools were first uploaded.
TEST(cuda_executor, rows_with_adapters_give_the_cpu_targets_tokens) {
  SKIP_WITHOUT_DEVICE();
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("troupe-cuda-lora-" + std::to_string(::getpid()));
  const auto base = dir / "qwen2-hf";
  ASSERT_TRUE(families::write_fixture("qwen2", troupe::testing::case_dims("qwen2"), base, false));
  std::vector<fs::path> adapters;
  for (int i = 0; i < 3; ++i) {
    families::lora_fixture l;
    l.rank = 2 + 2 * i;
    l.alpha = 4.0 + i;
    l.seed = 300 + static_cast<std::uint64_t>(i);
    adapters.push_back(dir / ("lora" + std::to_string(i)));
    ASSERT_TRUE(families::write_lora_adapter(base, l, adapters.back()));
  }
  auto h = families::model_handle::load(base, families::registry::builtin());
  ASSERT_TRUE(h);
  driver::driver_options opt;
  opt.adapters.slots = 2;
  opt.adapters.max_rank = 8;
  std::vector<driver::seq_request> reqs;
  for (int s = 0; s < 4; ++s) {  // a0, a1, then a2 evicts the idle a0 from its slot; the last row is the base
    reqs.push_back(prompt_request(s, 12, 12));
    if (s < 3) reqs.back().adapter = "a" + std::to_string(s);
  }
  expect_the_cpu_targets_tokens(*h, opt, reqs, [&](driver::driver<driver::serving>& d) {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(d.load_adapter("a" + std::to_string(i), adapters[static_cast<std::size_t>(i)]));
  });
}

}  // namespace
}  // namespace troupe::exec::cuda

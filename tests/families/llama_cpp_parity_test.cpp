// Parity with llama.cpp, a reference no one here wrote: node-llama-cpp 3.21.1 (CPU build, f32 KV cache,
// flash attention off) runs each family's GGUF fixture on a 40-token prompt and generates 32 greedy
// tokens; troupe's oracle runs the same GGUF and the same fixture's safetensors form. Position by
// position the greedy ids must be identical, except where llama.cpp's top-2 log-probability gap is
// under 0.05 (a near-tie: the comparison stops there), and the top-5 log-probabilities must agree
// within 1e-3. Why 1e-3: the weights are f32 and both sides compute in f32 or better; llama.cpp's f32
// dot products over at most 1024 terms carry ~1e-6 relative error each, and two layers plus a
// softmax amplify that to ~1e-4 in log-probabilities, so 1e-3 leaves a tenfold margin while any
// real difference (a wrong rope pairing, a missing norm offset) moves them by 1e-1 or more.
//
// Every family llama.cpp runs is here. Mistral's GGUF form is architecture `llama` (llama.cpp's
// converter writes it so) and is covered by the llama rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <nlohmann/json.hpp>

#include "tests/support/logprobs.hpp"
#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

struct parity_case {
  std::string_view family;
  std::int64_t head_dim;
  bool legacy = false;  // the GGUF layout of older converters (DeepSeek: attn_kv_b, llama.cpp's non-MLA path)
};

std::string case_name(const parity_case& c) {
  return std::string(c.family) + "_hd" + std::to_string(c.head_dim) + (c.legacy ? "_legacy" : "");
}
void PrintTo(const parity_case& c, std::ostream* os) { *os << case_name(c); }

fixture_dims dims_for(const parity_case& c) {
  fixture_dims d;
  d.vocab = 512;
  d.heads = 4;
  d.kv_heads = 2;  // GQA
  d.head_dim = c.head_dim;
  d.hidden = d.heads * c.head_dim;  // llama.cpp's qwen2 and phi3 take no separate head width
  d.ffn = c.head_dim == 64 ? 512 : 768;
  d.layers = c.family == "gemma3" ? 6 : c.family == "smollm3" ? 4 : 2;  // smollm3's layer 3 is NoPE
  if (c.family.ends_with("moe") || c.family == "mixtral" || c.family.starts_with("deepseek") || c.family == "gpt_oss") {  // olmoe too
    d.experts = 8;
    d.experts_used = 2;
    d.expert_ffn = 256;
    d.shared_ffn = 384;
  }
  if (c.family == "olmoe") d.kv_heads = d.heads;
  if (c.family.starts_with("nemotron_h")) {  // layers Mamba2, attention, Mamba2, MLP (moe: routed); scan and attention heads head_dim wide
    d.hidden = 128;
    d.layers = 4;
    d.ffn = 256;
    d.ssm_groups = 2;
    d.expert_ffn = 128;
    d.shared_ffn = 192;
  }
  if (c.family == "mamba2") {  // the scan's heads are head_dim wide; two B/C groups at head_dim 32
    d.hidden = 128;
    d.ssm_groups = c.head_dim == 32 ? 2 : 1;
    d.ssm_state = c.head_dim == 32 ? 32 : 16;
    d.ssm_conv = c.head_dim == 32 ? 3 : 4;
  }
  if (c.family == "bloom") {  // ALiBi: 6 heads at head_dim 64 take both slope series (4 and 2 past the power of two)
    d.heads = d.kv_heads = c.head_dim == 64 ? 6 : 4;
    d.hidden = d.heads * c.head_dim;
    d.ffn = 4 * d.hidden;
  }
  if (c.family == "mpt") {  // ALiBi: 6 heads at head_dim 64 (both slope series, one KV head each); 4 heads on 2 KV heads at 128
    d.heads = c.head_dim == 64 ? 6 : 4;
    d.kv_heads = c.head_dim == 64 ? 6 : 2;
    d.hidden = d.heads * c.head_dim;
    d.ffn = (c.head_dim == 64 ? 4 : 3) * d.hidden;  // expansion_ratio 4 and 3
  }
  if (c.family == "granite_hybrid") {  // M * M M; hd64 routed (8 experts, 2 a token, a shared expert), hd32 dense
    d.hidden = 128;
    d.layers = 4;
    d.ssm_groups = 1;  // HF's gated norm spans the inner width; llama.cpp's a group: the same for one
    d.ssm_state = c.head_dim == 64 ? 16 : 32;
    d.ssm_conv = c.head_dim == 64 ? 4 : 3;
    d.experts = c.head_dim == 64 ? 8 : 0;
    d.experts_used = 2;
    d.expert_ffn = 128;
    d.shared_ffn = 192;
  }
  if (c.family == "falcon_h1") {  // attention and Mamba2 side by side in every layer; hd64: 2 B/C groups, hd32: 1
    d.hidden = 128;
    d.layers = 3;
    d.ssm_groups = c.head_dim == 64 ? 2 : 1;
    d.ssm_state = c.head_dim == 64 ? 16 : 32;
    d.ssm_conv = c.head_dim == 64 ? 4 : 3;
  }
  if (c.family.starts_with("lfm2")) {  // conv, conv, attention (q/k norms, NeoX rope), conv, conv, attention; kernel 3 and 4
    d.layers = 6;                          // lfm2_moe: the first layer dense, the others routed
    d.ssm_conv = c.head_dim == 64 ? 3 : 4;
    d.expert_ffn = 128;
  }
  if (c.family == "qwen3_next") {  // linear and full attention alternating, routed with a gated shared expert
    d.layers = 4;
    d.experts = 8;
    d.experts_used = 2;
    d.expert_ffn = 256;
    d.shared_ffn = 384;
    // hd64: 2 key heads, 4 value heads of 32; hd32: 1 key head, 4 value heads of 16, kernel 3.
    d.ssm_groups = c.head_dim == 64 ? 2 : 1;
    d.ssm_expand = c.head_dim == 64 ? 2 : 4;
    d.ssm_state = c.head_dim == 64 ? 32 : 16;
    d.ssm_conv = c.head_dim == 64 ? 4 : 3;
  }
  d.legacy_gguf = c.legacy;  // llama.cpp's olmoe norms k over the whole hidden width
  return d;
}

struct reference_step {
  std::int32_t token;
  std::vector<std::pair<std::int32_t, double>> top;
};

std::vector<reference_step> run_llama_cpp(const fs::path& gguf, const std::vector<std::int32_t>& prompt, int steps, int topk = 5,
                                          const std::vector<std::int32_t>& forced = {}, const std::string& kv_type = "") {
  std::string cmd = (kv_type.empty() ? "" : "TROUPE_KV_TYPE=" + kv_type + " ") + "node tests/reference/llama_logprobs.mjs '" + gguf.string() + "' '" + nlohmann::json(prompt).dump() +
                    "' " + std::to_string(steps) + " " + std::to_string(topk);
  if (!forced.empty()) cmd += " '" + nlohmann::json(forced).dump() + "'";
  std::vector<reference_step> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[8192];
  while (std::fgets(line, sizeof line, p)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    reference_step s{j["token"].get<std::int32_t>(), {}};
    for (const auto& t : j["top"]) s.top.emplace_back(t[0].get<std::int32_t>(), t[1].get<double>());
    out.push_back(std::move(s));
  }
  ::pclose(p);
  return out;
}

using troupe::testing::log_softmax;

// llama.cpp's CPU GELU reads a table indexed by the input rounded to f16 (GGML_GELU_FP16), a relative
// error of up to 4.9e-4 per activation; through the GeGLU families' feed-forwards that measured 9.7e-4
// in log-probabilities, so they (and StarCoder 2's, BLOOM's and MPT's GELU MLPs) get 3e-3. Everything else computes in
// f32: 1e-3.
double tolerance(const parity_case& c) {
  return c.family == "gemma" || c.family == "gemma2" || c.family == "gemma3" || c.family == "starcoder2" || c.family == "bloom" || c.family == "mpt" ? 3e-3 : 1e-3;
}
// A checkpoint form's bound against llama.cpp: MPT's two forms follow two definitions of its MLP's GELU
// (families/mpt: HF's MptMLP the exact erf form, llama.cpp's the tanh form), so against llama.cpp the
// HF form carries that gap too (3.7e-3 over three layers at sweep seed 13, against 2.9e-3 for the GGUF).
double form_tolerance(std::string_view family, bool hf, double tol) { return family == "mpt" && hf ? tol + 2e-3 : tol; }

// A runner (the oracle's or an executor's) greedily along llama.cpp's run `ref` of `prompt`: every top-5
// log-probability within `tol`, the greedy ids equal until a near-tie (llama.cpp's top-2 gap under 0.05,
// where the sequences may part). Returns the positions compared and the worst |dlogprob| seen.
template <class Runner>
std::pair<int, double> follow_llama_cpp_on(Runner& run, const std::vector<std::int32_t>& prompt, const std::vector<reference_step>& ref,
                                           double tol) {
  auto logits = run.feed(prompt);
  int compared = 0;
  double worst = 0;
  for (std::size_t step = 0; step < ref.size(); ++step) {
    EXPECT_TRUE(logits) << logits.error();
    if (!logits) break;
    const auto lp = log_softmax(*logits);
    const auto& r = ref[step];
    for (const auto& [id, ref_lp] : r.top) {
      worst = std::max(worst, std::fabs(lp[id] - ref_lp));
      EXPECT_NEAR(lp[id], ref_lp, tol) << "position " << prompt.size() + step << " token " << id;
    }
    const auto ours = static_cast<std::int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    if (ours != r.token) {
      EXPECT_LT(r.top[0].second - r.top[1].second, 0.05)
          << "greedy ids differ at position " << prompt.size() + step << ": troupe " << ours << ", llama.cpp " << r.token;
      break;
    }
    ++compared;
    const std::int32_t next[] = {ours};
    logits = run.feed(next);
  }
  return {compared, worst};
}

// The oracle on `h` along llama.cpp's run, as above.
std::pair<int, double> follow_llama_cpp(const std::shared_ptr<const model_handle>& h, const std::vector<std::int32_t>& prompt,
                                        const std::vector<reference_step>& ref, double tol, std::int64_t capacity) {
  app::oracle_runner run(h, capacity);
  return follow_llama_cpp_on(run, prompt, ref, tol);
}

class llama_cpp_parity : public ::testing::TestWithParam<parity_case> {};

TEST_P(llama_cpp_parity, greedy_ids_and_top5_logprobs_match) {
  const auto c = GetParam();
  const auto d = dims_for(c);
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / (case_name(c) + ".gguf");
  const auto hf = dir / (case_name(c) + "-hf");
  ASSERT_TRUE(write_fixture(c.family, d, gguf, true));
  ASSERT_TRUE(write_fixture(c.family, d, hf, false));

  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 131 + 17) % (d.vocab - 3));
  constexpr int steps = 32;
  const auto ref = run_llama_cpp(gguf, prompt, steps);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps)) << "llama.cpp produced no output for " << gguf;

  for (const auto& form : {gguf, hf}) {
    SCOPED_TRACE(form.string());
    auto h = model_handle::load(form, registry::builtin());
    ASSERT_TRUE(h) << message(h.error());
    const auto [compared, worst] = follow_llama_cpp(*h, prompt, ref, form_tolerance(c.family, form == hf, tolerance(c)), 128);
    std::printf("[ parity ] %s %s: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e\n", case_name(c).c_str(),
                form.extension() == ".gguf" ? "gguf" : "safetensors", compared, steps, worst);
    EXPECT_GE(compared, 8) << "too few positions compared to mean anything";
  }
}

INSTANTIATE_TEST_SUITE_P(families, llama_cpp_parity,
                         ::testing::Values(parity_case{"llama", 64}, parity_case{"llama", 128}, parity_case{"qwen2", 64},
                                           parity_case{"qwen2", 128}, parity_case{"qwen3", 64}, parity_case{"qwen3", 128},
                                           parity_case{"gemma2", 64}, parity_case{"gemma2", 128}, parity_case{"gemma3", 64},
                                           parity_case{"gemma3", 128}, parity_case{"phi3", 64}, parity_case{"phi3", 128},
                                           parity_case{"qwen3_moe", 64}, parity_case{"qwen3_moe", 128}, parity_case{"mixtral", 64},
                                           parity_case{"qwen2_moe", 64}, parity_case{"deepseek_v2", 64},
                                           parity_case{"deepseek_v2", 128}, parity_case{"deepseek_v3", 64}, parity_case{"olmoe", 64},
                                           parity_case{"gpt_oss", 64}, parity_case{"deepseek_v2", 64, true}, parity_case{"olmo2", 64},
                                           parity_case{"olmo2", 128}, parity_case{"granite", 64}, parity_case{"smollm3", 64},
                                           parity_case{"smollm3", 128}, parity_case{"gemma", 64}, parity_case{"gemma", 128},
                                           parity_case{"starcoder2", 64}, parity_case{"starcoder2", 128}, parity_case{"mamba2", 64},
                                           parity_case{"mamba2", 32}, parity_case{"nemotron_h", 32}, parity_case{"nemotron_h", 64},
                                           parity_case{"qwen3_next", 64}, parity_case{"qwen3_next", 32}, parity_case{"bloom", 64},
                                           parity_case{"bloom", 128}, parity_case{"mpt", 64}, parity_case{"mpt", 128},
                                           parity_case{"granite_hybrid", 64}, parity_case{"granite_hybrid", 32},
                                           parity_case{"nemotron_h_moe", 64}, parity_case{"nemotron_h_moe", 32}, parity_case{"falcon_h1", 64},
                                           parity_case{"falcon_h1", 32}, parity_case{"lfm2", 64}, parity_case{"lfm2", 32},
                                           parity_case{"lfm2_moe", 64}),
                         [](const auto& info) { return case_name(info.param); });

// The CPU executor and the exact oracle on a quantized file, both fed llama.cpp's greedy picks, so
// every position is compared even where a near-tie makes troupe's own pick differ. Where troupe's pick
// differs, the two candidates must be closer in llama.cpp than twice what the two sides part by at that
// position (each quantizes activations its own way); a wider margin is a disagreement.
struct quantized_follow {
  int agreed = 0;
  double worst = 0, worst_oracle = 0;
};
quantized_follow follow_quantized(const std::shared_ptr<const model_handle>& h, const std::vector<std::int32_t>& prompt,
                                  const std::vector<reference_step>& ref) {
  quantized_follow out;
  exec::cpu::cpu_executor ex({2, std::nullopt});
  auto run = app::exec_runner::create(h, ex, 128);
  EXPECT_TRUE(run) << run.error();
  if (!run) return out;
  app::oracle_runner oracle(h, 128);
  auto logits = run->feed(prompt);
  auto exact = oracle.feed(prompt);
  for (std::size_t step = 0; step < ref.size(); ++step) {
    EXPECT_TRUE(logits) << logits.error();
    EXPECT_TRUE(exact) << exact.error();
    if (!logits || !exact) return out;
    const auto lp = log_softmax(*logits);
    const auto lo = log_softmax(*exact);
    const auto& r = ref[step];
    double here = 0;
    for (const auto& [id, ref_lp] : r.top) {
      here = std::max(here, static_cast<double>(std::fabs(lp[id] - ref_lp)));
      out.worst_oracle = std::max(out.worst_oracle, static_cast<double>(std::fabs(lo[id] - ref_lp)));
    }
    out.worst = std::max(out.worst, here);
    const auto ours = static_cast<std::int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    if (ours == r.token) {
      ++out.agreed;
    } else {
      double margin = r.top[0].second - r.top.back().second;  // past llama.cpp's top 5: at least its 5th's
      for (const auto& [id, ref_lp] : r.top)
        if (id == ours) margin = r.top[0].second - ref_lp;
      EXPECT_LT(margin, 2 * here + 0.01) << "greedy ids differ at position " << step;
    }
    const std::int32_t next[] = {r.token};
    logits = run->feed(next);
    exact = oracle.feed(next);
  }
  return out;
}

// The CPU executor against llama.cpp on files with f16 and block-quantized matrices. Both quantize
// activations for these matmuls (llama.cpp: to q8_0 / q8_K blocks, or to f16 for f16 weights), each its
// own way, so neither reproduces the other bit for bit: measured, troupe's CPU path and the exact oracle
// both sit 0.05 to 0.15 in log-probability from llama.cpp on these random models (3e-3 for f16, all
// from llama.cpp's f16 activations). The bound, 0.25, says the paths compute the same model; the
// greedy ids must agree up to a near-tie.
struct cpu_case {
  std::string_view family;
  dtype type;
};
std::string cpu_case_name(const cpu_case& c) { return std::string(c.family) + "_" + std::string(troupe::name(c.type)); }
void PrintTo(const cpu_case& c, std::ostream* os) { *os << cpu_case_name(c); }

class llama_cpp_cpu_parity : public ::testing::TestWithParam<cpu_case> {};

TEST_P(llama_cpp_cpu_parity, quantized_greedy_ids_and_top5_logprobs_match) {
  const auto c = GetParam();
  auto d = dims_for({c.family, 64});
  d.matrix_type = c.type;
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / ("cpu-" + cpu_case_name(c) + ".gguf");
  ASSERT_TRUE(write_fixture(c.family, d, gguf, true));
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 131 + 17) % (d.vocab - 3));
  constexpr int steps = 32;
  const auto ref = run_llama_cpp(gguf, prompt, steps);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps));
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  const auto f = follow_quantized(*h, prompt, ref);
  std::printf("[ parity ] cpu %s: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e (the exact oracle: %.2e)\n",
              cpu_case_name(c).c_str(), f.agreed, steps, f.worst, f.worst_oracle);
  EXPECT_LT(f.worst, 0.25);
  EXPECT_GE(f.agreed, steps * 3 / 4);
}

INSTANTIATE_TEST_SUITE_P(formats, llama_cpp_cpu_parity,
                         ::testing::Values(cpu_case{"llama", dtype::f16}, cpu_case{"llama", dtype::q8_0}, cpu_case{"llama", dtype::q4_0},
                                           cpu_case{"llama", dtype::q4_k}, cpu_case{"llama", dtype::q6_k}, cpu_case{"qwen2", dtype::q8_0},
                                           cpu_case{"qwen2", dtype::q4_0}, cpu_case{"gemma2", dtype::q8_0}, cpu_case{"llama", dtype::q4_1},
                                           cpu_case{"llama", dtype::q5_0}, cpu_case{"llama", dtype::q5_1},
                                           cpu_case{"llama", dtype::q5_k}, cpu_case{"qwen2", dtype::q5_0}, cpu_case{"llama", dtype::q3_k}, cpu_case{"llama", dtype::q2_k},
                                           cpu_case{"llama", dtype::iq4_nl}, cpu_case{"llama", dtype::iq4_xs}, cpu_case{"qwen2", dtype::iq4_nl},
                                           cpu_case{"gemma2", dtype::iq4_xs},
                                           cpu_case{"qwen3_moe", dtype::f32}, cpu_case{"mixtral", dtype::f32},
                                           cpu_case{"qwen2_moe", dtype::f32}, cpu_case{"deepseek_v2", dtype::f32},
                                           cpu_case{"deepseek_v3", dtype::f32}, cpu_case{"olmoe", dtype::f32},
                                           cpu_case{"gpt_oss", dtype::f32}, cpu_case{"mamba2", dtype::f32}, cpu_case{"mamba2", dtype::q8_0},
                                           cpu_case{"nemotron_h", dtype::f32}, cpu_case{"qwen3_next", dtype::f32},
                                           cpu_case{"bloom", dtype::f32}, cpu_case{"bloom", dtype::q8_0},
                                           cpu_case{"mpt", dtype::f32}, cpu_case{"mpt", dtype::q8_0},
                                           cpu_case{"granite_hybrid", dtype::f32}, cpu_case{"nemotron_h_moe", dtype::f32},
                                           cpu_case{"falcon_h1", dtype::f32}, cpu_case{"lfm2", dtype::f32}, cpu_case{"lfm2_moe", dtype::f32}),
                         [](const auto& info) { return cpu_case_name(info.param); });

// Routed families on quantized files. Quantizing the router's inputs and weights moves scores across
// the top-k boundary now and then, so a token may take other experts than in the f32 model, in
// llama.cpp as in troupe, and the two quantized runs part by more than the dense bound. What must
// hold instead: troupe's CPU executor on the quantized file is at least as close to the f32 truth (the
// oracle on the f32 file) as llama.cpp's own run of the same quantized file, both teacher-forced along
// the truth's greedy continuation, measured as the mean |dlogprob| over the truth's top 5 per position.
// The f32 truth (the oracle on `h`) along its own greedy continuation of `prompt`: per position its
// log-probabilities, and the ids it picked (the teacher-forced path both contenders then follow).
struct truth_path {
  std::vector<std::vector<double>> logprobs;
  std::vector<std::int32_t> forced;
};
truth_path truth_of(const std::shared_ptr<const model_handle>& h, const std::vector<std::int32_t>& prompt, int steps, std::int64_t capacity) {
  truth_path t;
  app::oracle_runner run(h, capacity);
  auto l = run.feed(prompt);
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(l) << l.error();
    if (!l) return t;
    t.logprobs.push_back(log_softmax(*l));
    const auto& lp = t.logprobs.back();
    t.forced.push_back(static_cast<std::int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin()));
    const std::int32_t next[] = {t.forced.back()};
    l = run.feed(next);
  }
  return t;
}

// Mean |dlogprob| from the truth over its top 5 per position: of troupe's CPU executor on `h`
// (teacher-forced along the truth's path) and of llama.cpp's run `ref` (its top 64 per position; a
// truth token past them counts at the 64th's log-probability, an under-estimate of llama.cpp's error).
template <class Runner>
std::pair<double, double> errors_from_truth_on(const truth_path& truth, Runner& run, const std::vector<std::int32_t>& prompt,
                                               const std::vector<reference_step>& ref) {
  auto logits = run.feed(prompt);
  double ours = 0, theirs = 0;
  const auto steps = truth.logprobs.size();
  for (std::size_t step = 0; step < steps; ++step) {
    EXPECT_TRUE(logits) << logits.error();
    if (!logits) return {INFINITY, 0};
    const auto lp = log_softmax(*logits);
    const auto& t = truth.logprobs[step];
    std::vector<std::int32_t> top(t.size());
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(top.begin(), top.begin() + 5, top.end(), [&](std::int32_t a, std::int32_t b) { return t[a] > t[b]; });
    for (int i = 0; i < 5; ++i) {
      const auto id = top[static_cast<std::size_t>(i)];
      ours += std::fabs(lp[id] - t[id]);
      double r = ref[step].top.back().second;
      for (const auto& [rid, rlp] : ref[step].top)
        if (rid == id) r = rlp;
      theirs += std::fabs(r - t[id]);
    }
    const std::int32_t next[] = {truth.forced[step]};
    logits = run.feed(next);
  }
  return {ours / (5.0 * static_cast<double>(steps)), theirs / (5.0 * static_cast<double>(steps))};
}
std::pair<double, double> errors_from_truth(const truth_path& truth, const std::shared_ptr<const model_handle>& h,
                                            const std::vector<std::int32_t>& prompt, const std::vector<reference_step>& ref,
                                            std::int64_t capacity) {
  exec::cpu::cpu_executor ex({2, std::nullopt});
  auto run = app::exec_runner::create(h, ex, capacity);
  EXPECT_TRUE(run) << run.error();
  if (!run) return {INFINITY, 0};
  return errors_from_truth_on(truth, *run, prompt, ref);
}

// The rule above for one file: `d` written in f32 (the truth) and in `type`, the quantized file run by
// troupe's CPU executor and by llama.cpp, both teacher-forced along the truth's path.
void expect_as_close_as_llama_cpp(std::string_view family, fixture_dims d, dtype type, const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto truth_file = dir / ("routed-" + name + "-f32.gguf");
  ASSERT_TRUE(write_fixture(family, d, truth_file, true));
  d.matrix_type = type;
  const auto gguf = dir / ("routed-" + name + ".gguf");
  ASSERT_TRUE(write_fixture(family, d, gguf, true));
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 131 + 17) % static_cast<std::int32_t>(d.vocab - 3));
  constexpr int steps = 32;

  auto th = model_handle::load(truth_file, registry::builtin());
  ASSERT_TRUE(th) << message(th.error());
  const auto truth = truth_of(*th, prompt, steps, 128);
  ASSERT_EQ(truth.forced.size(), static_cast<std::size_t>(steps));
  const auto ref = run_llama_cpp(gguf, prompt, steps, 64, truth.forced);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps));
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  const auto [ours_err, ref_err] = errors_from_truth(truth, *h, prompt, ref, 128);
  app::oracle_runner exact(*h, 128);
  const auto oracle_err = errors_from_truth_on(truth, exact, prompt, ref).first;
  std::printf("[ parity ] routed %s: mean top-5 |dlogprob| from the f32 truth: troupe cpu %.3e, llama.cpp %.3e (the exact oracle on the file: %.3e)\n",
              name.c_str(), ours_err, ref_err, oracle_err);
  // "At least as close", with 10% for the activation rounding each side does its own way.
  EXPECT_LE(ours_err, 1.1 * ref_err + 1e-3);
}

class llama_cpp_routed_quantized : public ::testing::TestWithParam<cpu_case> {};

TEST_P(llama_cpp_routed_quantized, is_as_close_to_the_f32_truth_as_llama_cpp) {
  const auto c = GetParam();
  expect_as_close_as_llama_cpp(c.family, dims_for({c.family, 64}), c.type, cpu_case_name(c));
}

INSTANTIATE_TEST_SUITE_P(formats, llama_cpp_routed_quantized,
                         ::testing::Values(cpu_case{"qwen3_moe", dtype::q8_0}, cpu_case{"mixtral", dtype::q8_0},
                                           cpu_case{"qwen2_moe", dtype::q8_0}, cpu_case{"qwen3_moe", dtype::q4_k},
                                           cpu_case{"mixtral", dtype::q4_0}, cpu_case{"deepseek_v2", dtype::q8_0},
                                           cpu_case{"deepseek_v3", dtype::q8_0}, cpu_case{"olmoe", dtype::q8_0},
                                           cpu_case{"gpt_oss", dtype::mxfp4}, cpu_case{"gpt_oss", dtype::q8_0},
                                           // Recurrent layers carry a quantized step's rounding forward in their state,
                                           // so they are held to the same rule.
                                           cpu_case{"mamba2", dtype::q8_0}, cpu_case{"mamba2", dtype::q4_0},
                                           cpu_case{"nemotron_h", dtype::q8_0}, cpu_case{"qwen3_next", dtype::q8_0},
                                           cpu_case{"granite_hybrid", dtype::q8_0}, cpu_case{"nemotron_h_moe", dtype::q8_0},
                                           cpu_case{"falcon_h1", dtype::q8_0}, cpu_case{"lfm2", dtype::q8_0}, cpu_case{"lfm2_moe", dtype::q8_0}),
                         [](const auto& info) { return cpu_case_name(info.param); });

// Rotary scaling as llama.cpp reads it from a GGUF (linear and YaRN from rope.scaling.*, Llama 3's from
// the rope_freqs divisors, Phi-3's LongRoPE from rope_factors_long / _short and attn_factor) and as troupe
// reads it from either form (the HF form's rope_scaling): a
// 180-token prompt over a trained context of 64 positions, so most positions lie past it, then 16
// greedy tokens. The oracle on both forms against llama.cpp (f32 cache): greedy ids and top-5 within
// the dense bound, 1e-3. (Dynamic NTK has no GGUF form: llama.cpp's converter drops it; its table is
// checked against HF's formula in tests/families/rope_test.cpp.)
struct rope_case {
  std::string_view family, kind;
  double factor;
  std::int64_t original = 64;  // the trained context
};
std::string rope_case_name(const rope_case& c) {
  return std::string(c.family) + "_" + std::string(c.kind) + "_x" + std::to_string(static_cast<int>(c.factor)) +
         (c.original != 64 ? "_from" + std::to_string(c.original) : "");
}
void PrintTo(const rope_case& c, std::ostream* os) { *os << rope_case_name(c); }

class llama_cpp_rope_scaling : public ::testing::TestWithParam<rope_case> {};

TEST_P(llama_cpp_rope_scaling, long_positions_match_llama_cpp) {
  const auto c = GetParam();
  auto d = dims_for({c.family, 64});
  d.rope_scaling = std::string(c.kind);
  d.rope_factor = c.factor;
  d.rope_original = c.original;
  // LongRoPE's extension is max_position_embeddings over the trained context (Phi-3's 131072 / 4096).
  if (c.kind == "longrope") d.max_positions = c.original * static_cast<std::int64_t>(c.factor);
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / ("rope-" + rope_case_name(c) + ".gguf");
  const auto hf = dir / ("rope-" + rope_case_name(c) + "-hf");
  ASSERT_TRUE(write_fixture(c.family, d, gguf, true));
  ASSERT_TRUE(write_fixture(c.family, d, hf, false));
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 180; ++i) prompt.push_back(3 + (i * 131 + 17) % (d.vocab - 3));
  constexpr int steps = 16;
  const auto ref = run_llama_cpp(gguf, prompt, steps);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps)) << "llama.cpp produced no output for " << gguf;
  for (const auto& form : {gguf, hf}) {
    SCOPED_TRACE(form.string());
    auto h = model_handle::load(form, registry::builtin());
    ASSERT_TRUE(h) << message(h.error());
    const auto [compared, worst] = follow_llama_cpp(*h, prompt, ref, 1e-3, 256);
    std::printf("[ parity ] rope %s %s: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e\n", rope_case_name(c).c_str(),
                form.extension() == ".gguf" ? "gguf" : "safetensors", compared, steps, worst);
    EXPECT_GE(compared, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(rules, llama_cpp_rope_scaling,
                         ::testing::Values(rope_case{"llama", "linear", 4.0}, rope_case{"llama", "yarn", 4.0},
                                           rope_case{"llama", "llama3", 8.0}, rope_case{"qwen2", "yarn", 4.0},
                                           // Phi-3's LongRoPE: llama.cpp's 256-position context and troupe's
                                           // 256-position step are past a trained 64 (the long divisors), and
                                           // within a trained 4096 (the short ones).
                                           rope_case{"phi3", "longrope", 4.0}, rope_case{"phi3", "longrope", 32.0, 4096}),
                         [](const auto& info) { return rope_case_name(info.param); });

// KV cache types against llama.cpp's own (--cache-type-k/-v, flash attention on): on a 200-token
// prompt, teacher-forced along the f32 truth's greedy continuation, troupe's CPU executor with an f16 or
// q8_0 cache is at least as close to the truth (the oracle with an f32 cache) as llama.cpp with the
// same cache type, measured as the mean |dlogprob| over the truth's top 5 per position.
class llama_cpp_kv_types : public ::testing::TestWithParam<cpu_case> {};

TEST_P(llama_cpp_kv_types, a_typed_cache_is_as_close_to_the_truth_as_llama_cpp) {
  const auto c = GetParam();
  auto d = dims_for({c.family, 64});
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / ("kv-" + std::string(c.family) + ".gguf");
  ASSERT_TRUE(write_fixture(c.family, d, gguf, true));
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back(3 + (i * 131 + 17) % (d.vocab - 3));
  constexpr int steps = 24;
  auto th = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(th) << message(th.error());
  const auto truth = truth_of(*th, prompt, steps, 256);
  ASSERT_EQ(truth.forced.size(), static_cast<std::size_t>(steps));
  const std::string kv = c.type == dtype::f16 ? "F16" : c.type == dtype::bf16 ? "BF16" : "Q8_0";
  const auto ref = run_llama_cpp(gguf, prompt, steps, 64, truth.forced, kv);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps));
  auto typed = with_kv_type(*th, c.type);
  ASSERT_TRUE(typed) << message(typed.error());
  const auto [ours_err, ref_err] = errors_from_truth(truth, *typed, prompt, ref, 256);
  std::printf("[ parity ] kv cache %s: mean top-5 |dlogprob| from the f32-cache truth: troupe cpu %.3e, llama.cpp %.3e\n",
              cpu_case_name(c).c_str(), ours_err, ref_err);
  EXPECT_LE(ours_err, 1.1 * ref_err + 1e-4);
}

INSTANTIATE_TEST_SUITE_P(types, llama_cpp_kv_types,
                         ::testing::Values(cpu_case{"llama", dtype::f16}, cpu_case{"llama", dtype::q8_0}, cpu_case{"qwen2", dtype::f16},
                                           cpu_case{"qwen2", dtype::q8_0}, cpu_case{"gemma2", dtype::q8_0}),
                         [](const auto& info) { return cpu_case_name(info.param); });

// Shapes the other suites never use, drawn from a seed per family: head widths 32 to 128 (80 and 96
// too), 1 to 8 heads over any dividing number of KV heads, vocabularies and feed-forward widths off the
// powers of two, 1 to 3 layers where the family's layer pattern allows, and other expert counts,
// experts per token and state sizes. Each case runs the oracle on both forms and the CPU executor on
// the f32 GGUF against llama.cpp, with the dense bounds of the suites above. TROUPE_PARITY_SWEEP=N
// runs N seeds per family instead of the one the suite keeps, from TROUPE_PARITY_SWEEP_FROM (default 1)
// on (an exploration knob, not a CI one; 6 seeds of every family and 4 of the quantized sweep below ran
// clean on 2026-12-07).
struct sweep_case {
  std::string_view family;
  std::uint64_t seed;
};
// The sweeps' seeds: [TROUPE_PARITY_SWEEP_FROM, FROM + TROUPE_PARITY_SWEEP), [1, 1] by default.
std::pair<std::uint64_t, std::uint64_t> sweep_seeds() {
  std::uint64_t n = 1, from = 1;
  if (const char* v = std::getenv("TROUPE_PARITY_SWEEP")) n = std::strtoull(v, nullptr, 10);
  if (const char* v = std::getenv("TROUPE_PARITY_SWEEP_FROM")) from = std::max<std::uint64_t>(1, std::strtoull(v, nullptr, 10));
  return {from, from + n - 1};
}
std::string sweep_case_name(const sweep_case& c) { return std::string(c.family) + "_seed" + std::to_string(c.seed); }
void PrintTo(const sweep_case& c, std::ostream* os) { *os << sweep_case_name(c); }

fixture_dims sweep_dims(const sweep_case& c) {
  std::uint64_t state = c.seed * 0x9e3779b97f4a7c15ull + std::hash<std::string_view>{}(c.family);
  auto pick = [&](std::initializer_list<std::int64_t> xs) {
    state ^= state >> 33;
    state *= 0xff51afd7ed558ccdull;
    state ^= state >> 29;
    return *(xs.begin() + static_cast<std::ptrdiff_t>(state % xs.size()));
  };
  const auto f = c.family;
  const bool recurrent = f == "mamba2" || f.starts_with("nemotron_h") || f == "granite_hybrid" || f == "falcon_h1" || f == "qwen3_next";
  const bool alibi = f == "bloom" || f == "mpt";
  // The family's base dimensions (dims_for's, at head width 64 for a drawn 80 or 96), most of which
  // the draws below replace.
  const auto hd = pick({32, 64, 80, 96, 128});
  auto d = dims_for({f, hd == 80 || hd == 96 ? 64 : hd});
  d.seed = 100 + c.seed;
  d.vocab = pick({300, 512, 777, 1000, 1536});
  if (!recurrent && !f.starts_with("deepseek") && f != "gpt_oss") {
    d.head_dim = hd;
    d.heads = pick({1, 2, 3, 4, 6, 8});
    if (alibi && d.heads == 1) d.heads = 3;
    std::vector<std::int64_t> divisors;
    for (std::int64_t k = 1; k <= d.heads; ++k)
      if (d.heads % k == 0) divisors.push_back(k);
    d.kv_heads = divisors[static_cast<std::size_t>(pick({0, 1, 2, 3, 4, 5, 6, 7})) % divisors.size()];
    if (f == "olmoe" || f == "bloom") d.kv_heads = d.heads;  // llama.cpp's olmoe norms k over the whole width; BLOOM has no GQA
    d.hidden = d.heads * d.head_dim;
    d.ffn = d.hidden * pick({1, 2, 3}) + 32 * pick({0, 1, 3});
    if (f == "bloom" || f == "mpt") d.ffn = 4 * d.hidden;
    if (f == "mpt") d.ffn = pick({3, 4}) * d.hidden;
  }
  if (f != "gemma3" && f != "smollm3" && !recurrent && !f.starts_with("lfm2")) d.layers = pick({1, 2, 3});
  if (d.experts > 0 && (f.ends_with("moe") || f == "mixtral" || f.starts_with("deepseek") || f == "gpt_oss" || f == "qwen3_next" ||
                        f == "granite_hybrid")) {
    if (!(f == "granite_hybrid" && hd == 32)) {
      d.experts = pick({4, 8, 16});
      if (f == "deepseek_v3") d.experts = std::max<std::int64_t>(d.experts, 8);  // 4 groups of at least 2 (the top-2 group score)
      d.experts_used = std::min(d.experts, pick({1, 2, 4}));
      d.expert_ffn = pick({64, 96, 160, 256});
      d.shared_ffn = pick({96, 128, 192});
    }
  }
  if (f == "mamba2" || f == "nemotron_h" || f == "nemotron_h_moe" || f == "granite_hybrid" || f == "falcon_h1") {
    d.hidden = pick({64, 128, 192});
    d.ssm_state = pick({8, 16, 32});
    d.ssm_conv = pick({2, 3, 4});
    d.ssm_groups = f == "granite_hybrid" ? 1 : pick({1, 2});
    // The Mamba2 heads (expand x hidden over head_dim) must split into the groups: a 64-wide model of
    // 128-wide heads has one (nemotron_h_moe seed 10 drew two groups for it).
    const auto mamba_heads = d.ssm_expand * d.hidden / d.head_dim;
    if (mamba_heads % d.ssm_groups != 0) d.ssm_groups = 1;
  }
  return d;
}

// The sweeps' 40-token prompt over a vocabulary of `vocab` (ids past the first three special ones).
std::vector<std::int32_t> sweep_prompt(std::int64_t vocab) {
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 131 + 17) % static_cast<std::int32_t>(vocab - 3));
  return prompt;
}

class llama_cpp_shape_sweep : public ::testing::TestWithParam<sweep_case> {};

TEST_P(llama_cpp_shape_sweep, unseen_shapes_match_llama_cpp) {
  const auto c = GetParam();
  const auto d = sweep_dims(c);
  std::printf("[ sweep ] %s: vocab %lld hidden %lld ffn %lld layers %lld heads %lld/%lld of %lld, experts %lld/%lld of %lld (shared %lld), ssm %lld/%lld/%lld\n",
              sweep_case_name(c).c_str(), (long long)d.vocab, (long long)d.hidden, (long long)d.ffn, (long long)d.layers,
              (long long)d.heads, (long long)d.kv_heads, (long long)d.head_dim, (long long)d.experts_used, (long long)d.experts,
              (long long)d.expert_ffn, (long long)d.shared_ffn, (long long)d.ssm_state, (long long)d.ssm_groups, (long long)d.ssm_conv);
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / ("sweep-" + sweep_case_name(c) + ".gguf");
  const auto hf = dir / ("sweep-" + sweep_case_name(c) + "-hf");
  auto w = write_fixture(c.family, d, gguf, true);
  ASSERT_TRUE(w) << w.error().message();
  w = write_fixture(c.family, d, hf, false);
  ASSERT_TRUE(w) << w.error().message();
  const auto prompt = sweep_prompt(d.vocab);
  constexpr int steps = 24;
  const auto ref = run_llama_cpp(gguf, prompt, steps);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps)) << "llama.cpp produced no output for " << gguf;
  const double tol = tolerance({c.family, 64});
  for (const auto& form : {gguf, hf}) {
    SCOPED_TRACE(form.string());
    auto h = model_handle::load(form, registry::builtin());
    ASSERT_TRUE(h) << message(h.error());
    const auto [compared, worst] = follow_llama_cpp(*h, prompt, ref, form_tolerance(c.family, form == hf, tol), 128);
    std::printf("[ sweep ] %s oracle %s: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e\n", sweep_case_name(c).c_str(),
                form.extension() == ".gguf" ? "gguf" : "safetensors", compared, steps, worst);
    EXPECT_GE(compared, 4);
  }
  // The CPU executor on the f32 file: llama.cpp's bound for f32 weights, widened for the executor's
  // own f32 reassociation (its dot products split and fuse differently from the oracle's).
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  exec::cpu::cpu_executor ex({2, std::nullopt});
  auto run = app::exec_runner::create(*h, ex, 128);
  ASSERT_TRUE(run) << run.error();
  const auto [compared, worst] = follow_llama_cpp_on(*run, prompt, ref, 5 * tol);
  std::printf("[ sweep ] %s cpu f32: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e\n", sweep_case_name(c).c_str(), compared,
              steps, worst);
  EXPECT_GE(compared, 4);
}

std::vector<sweep_case> sweep_cases() {
  const auto [first, last] = sweep_seeds();
  std::vector<sweep_case> out;
  auto families = fixture_families();
  for (const auto f : recurrent_fixture_families())
    if (std::find(families.begin(), families.end(), f) == families.end()) families.push_back(f);
  for (const auto f : families)
    for (std::uint64_t s = first; s <= last; ++s) out.push_back({f, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(shapes, llama_cpp_shape_sweep, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& info) { return sweep_case_name(info.param); });

// The same draw of shapes for the dense families, stored in a block-quantized type drawn from the same
// seed (every type the packed kernels take, K-quants and IQ formats included): the CPU executor and the
// exact oracle on the quantized file against llama.cpp on it, with the bound of llama_cpp_cpu_parity.
// A 256-element super-block type gets widths in whole super-blocks (the quantizers' own rule).
struct quant_sweep_case {
  std::string_view family;
  std::uint64_t seed;
  dtype type;
};
std::string quant_sweep_case_name(const quant_sweep_case& c) {
  return std::string(c.family) + "_seed" + std::to_string(c.seed) + "_" + std::string(troupe::name(c.type));
}
void PrintTo(const quant_sweep_case& c, std::ostream* os) { *os << quant_sweep_case_name(c); }

class llama_cpp_quantized_shape_sweep : public ::testing::TestWithParam<quant_sweep_case> {};

TEST_P(llama_cpp_quantized_shape_sweep, unseen_shapes_match_llama_cpp) {
  const auto c = GetParam();
  auto d = sweep_dims({c.family, c.seed});
  d.matrix_type = c.type;
  if (info(c.type).block_elems == 32 && d.hidden % 32 != 0) {  // head width 80 over an odd number of heads
    d.heads += 1;
    if (d.heads % d.kv_heads != 0) d.kv_heads = 1;
    if (c.family == "bloom" || c.family == "olmoe") d.kv_heads = d.heads;
    d.hidden = d.heads * d.head_dim;
    if (c.family == "bloom") d.ffn = 4 * d.hidden;
    if (c.family == "mpt") d.ffn = (d.ffn / (d.hidden - d.head_dim) <= 3 ? 3 : 4) * d.hidden;
  }
  if (info(c.type).block_elems == 32 && d.ffn % 32 != 0) d.ffn = (d.ffn + 31) / 32 * 32;
  if (info(c.type).block_elems == 256) {
    // Whole super-blocks along every K: the hidden width (heads x head width) and the feed-forward.
    if (d.hidden % 256 != 0) {
      d.head_dim = d.head_dim >= 128 ? 128 : 64;
      d.heads = d.head_dim == 128 ? 2 * ((d.heads + 1) / 2) : 4 * ((d.heads + 3) / 4);
      if (d.heads % d.kv_heads != 0) d.kv_heads = 1;
      if (c.family == "bloom" || c.family == "olmoe") d.kv_heads = d.heads;
      d.hidden = d.heads * d.head_dim;
    }
    if (d.ffn % 256 != 0) d.ffn = (d.ffn + 255) / 256 * 256;
    if (c.family == "bloom") d.ffn = 4 * d.hidden;
    if (c.family == "mpt") d.ffn = (d.ffn / d.hidden <= 3 ? 3 : 4) * d.hidden;
  }
  std::printf("[ sweep ] %s: vocab %lld hidden %lld ffn %lld layers %lld heads %lld/%lld of %lld\n", quant_sweep_case_name(c).c_str(),
              (long long)d.vocab, (long long)d.hidden, (long long)d.ffn, (long long)d.layers, (long long)d.heads, (long long)d.kv_heads,
              (long long)d.head_dim);
  const auto dir = fs::temp_directory_path() / ("troupe-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto gguf = dir / ("qsweep-" + quant_sweep_case_name(c) + ".gguf");
  auto w = write_fixture(c.family, d, gguf, true);
  ASSERT_TRUE(w) << w.error().message();
  const auto prompt = sweep_prompt(d.vocab);
  constexpr int steps = 24;
  const auto ref = run_llama_cpp(gguf, prompt, steps);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps)) << "llama.cpp produced no output for " << gguf;
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  const auto f = follow_quantized(*h, prompt, ref);
  std::printf("[ sweep ] %s cpu: %d/%d greedy positions identical, worst top-5 |dlogprob| %.2e (the exact oracle: %.2e)\n",
              quant_sweep_case_name(c).c_str(), f.agreed, steps, f.worst, f.worst_oracle);
  EXPECT_LT(f.worst, 0.25);
  // The exact oracle keeps f32 activations where llama.cpp rounds them to q8_K blocks; against 2- and
  // 3-bit weights that rounding moves log-probabilities further (measured up to 0.26 on these shapes,
  // while the CPU executor, which rounds as llama.cpp does, stays within 0.15).
  EXPECT_LT(f.worst_oracle, c.type == dtype::q2_k || c.type == dtype::q3_k ? 0.4 : 0.25);
  EXPECT_GE(f.agreed, steps * 3 / 4);
}

std::vector<quant_sweep_case> quant_sweep_cases() {
  const auto [first, last] = sweep_seeds();
  static constexpr dtype types[] = {dtype::q8_0, dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q2_k,
                                    dtype::q3_k, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_nl, dtype::iq4_xs};
  std::vector<quant_sweep_case> out;
  std::size_t k = 0;
  for (const auto f : fixture_families()) {
    if (f.ends_with("moe") || f == "mixtral" || f.starts_with("deepseek") || f == "gpt_oss") continue;  // llama_cpp_routed_quantized's
    for (std::uint64_t s = first; s <= last; ++s) out.push_back({f, s, types[(std::hash<std::string_view>{}(f) + 7 * s + k++) % std::size(types)]});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(quantized_shapes, llama_cpp_quantized_shape_sweep, ::testing::ValuesIn(quant_sweep_cases()),
                         [](const auto& info) { return quant_sweep_case_name(info.param); });

// The routed and recurrent families on the sweep's shapes, stored in q8_0: as close to the f32 truth as
// llama.cpp's own run of the file (llama_cpp_routed_quantized's rule). The suite keeps one seed of the
// families the issues name for unseen shapes (qwen3_moe, mixtral, mamba2, qwen3_next);
// TROUPE_PARITY_SWEEP=N runs N seeds of every routed and recurrent family. On one drawn shape the rule
// is a draw, not a bound: a top expert that flips on a near tie in either run moves that run's distance
// by 1.3x-4x, and the exact oracle itself loses to llama.cpp on 6 to 8 of 180 drawn shapes (12 seeds of 15
// families, bench/results/routed-quantized-accuracy.md); the seeds kept here hold with room.
class llama_cpp_routed_quantized_sweep : public ::testing::TestWithParam<sweep_case> {};

TEST_P(llama_cpp_routed_quantized_sweep, unseen_shapes_are_as_close_to_the_truth_as_llama_cpp) {
  const auto c = GetParam();
  auto d = sweep_dims(c);
  if (d.hidden % 32 != 0) {  // q8_0 stores rows in 32-blocks: the drawn 80- or 96-wide heads become 64 wide
    d.head_dim = 64;
    d.hidden = d.heads * 64;
  }
  std::printf("[ sweep ] %s q8_0: vocab %lld hidden %lld layers %lld heads %lld/%lld of %lld, experts %lld/%lld of %lld, ssm %lld/%lld\n",
              sweep_case_name(c).c_str(), (long long)d.vocab, (long long)d.hidden, (long long)d.layers, (long long)d.heads,
              (long long)d.kv_heads, (long long)d.head_dim, (long long)d.experts_used, (long long)d.experts, (long long)d.expert_ffn,
              (long long)d.ssm_state, (long long)d.ssm_groups);
  expect_as_close_as_llama_cpp(c.family, d, dtype::q8_0, sweep_case_name(c) + "_q8_0");
}

std::vector<sweep_case> routed_sweep_cases() {
  const bool explore = std::getenv("TROUPE_PARITY_SWEEP") != nullptr;
  const auto [first, last] = sweep_seeds();
  std::vector<std::string_view> families = {"qwen3_moe", "mixtral", "mamba2", "qwen3_next"};
  if (explore) {
    families = {"qwen3_moe", "mixtral", "qwen2_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss"};
    for (const auto f : recurrent_fixture_families()) families.push_back(f);
  }
  std::vector<sweep_case> out;
  for (const auto f : families)
    for (std::uint64_t s = first; s <= last; ++s) out.push_back({f, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(routed_shapes, llama_cpp_routed_quantized_sweep, ::testing::ValuesIn(routed_sweep_cases()),
                         [](const auto& info) { return sweep_case_name(info.param); });

// The embedded default model (models/troupe-kjv.gguf, a trained 3.7M-parameter Llama): llama.cpp
// tokenizes each prompt with the GGUF's own tokenizer and generates 64 greedy tokens (past
// end-of-text too); troupe's tokenizer must give the same prompt ids, and troupe's CPU executor and
// oracle the same 64 tokens, every one.
TEST(default_model_parity, llama_cpp_tokenizes_and_generates_the_same_64_tokens) {
  const fs::path gguf = "models/troupe-kjv.gguf";
  ASSERT_TRUE(fs::exists(gguf));
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  ASSERT_NE((*h)->text(), nullptr) << (*h)->text_problem();
  exec::cpu::cpu_executor ex({2, std::nullopt});
  constexpr int steps = 64;
  for (const std::string prompt : {"And God said", "The LORD is my shepherd", "In the beginning", "Blessed are the"}) {
    SCOPED_TRACE(prompt);
    const std::string cmd = "node tests/reference/llama_greedy.mjs '" + gguf.string() + "' '" + prompt + "' " + std::to_string(steps);
    std::string text;
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[8192];
    while (std::fgets(buf, sizeof buf, p)) text += buf;
    ::pclose(p);
    const auto ref = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(ref.is_discarded()) << "llama.cpp produced no output: " << text;
    const auto ref_prompt = ref["prompt"].get<std::vector<std::int32_t>>();
    const auto ref_tokens = ref["tokens"].get<std::vector<std::int32_t>>();
    const auto gaps = ref["gaps"].get<std::vector<double>>();
    ASSERT_EQ(ref_tokens.size(), static_cast<std::size_t>(steps));
    const auto ours_prompt = (*h)->text()->encode(prompt);
    ASSERT_TRUE(ours_prompt);
    ASSERT_EQ(*ours_prompt, ref_prompt);

    auto run = app::exec_runner::create(*h, ex, 256);
    ASSERT_TRUE(run) << run.error();
    app::oracle_runner oracle(*h, 256);
    auto logits = run->feed(ref_prompt);
    auto exact = oracle.feed(ref_prompt);
    std::vector<std::int32_t> ours, ours_exact;
    for (int step = 0; step < steps; ++step) {
      ASSERT_TRUE(logits && exact);
      const auto a = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
      const auto b = static_cast<std::int32_t>(std::max_element(exact->begin(), exact->end()) - exact->begin());
      ours.push_back(a);
      ours_exact.push_back(b);
      // Both continue from llama.cpp's token, so one difference does not hide the rest.
      const std::int32_t next[] = {ref_tokens[static_cast<std::size_t>(step)]};
      logits = run->feed(next);
      exact = oracle.feed(next);
    }
    EXPECT_EQ(ours, ref_tokens);
    EXPECT_EQ(ours_exact, ref_tokens);
    std::printf("[ parity ] troupe-kjv '%s': %d/%d greedy tokens identical, smallest top-2 gap %.3f: %s\n", prompt.c_str(),
                static_cast<int>(std::inner_product(ours.begin(), ours.end(), ref_tokens.begin(), 0, std::plus<>(), std::equal_to<>())),
                steps, *std::min_element(gaps.begin(), gaps.end()), (*h)->text()->decode(ref_tokens, false).c_str());
  }
}

}  // namespace
}  // namespace troupe::families

// `troupe feature-matrix`: docs/feature-matrix.md, generated from the registry. Each shipped family's
// fixture in both forms, each program traced, the oracle and the CPU executor compared; then the llama
// fixture in every weight format.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "apps/exec_runner.hpp"
#include "apps/generate.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/driver/driver.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {

using families::write_fixture;

namespace {

std::vector<double> log_softmax(const std::vector<float>& logits) {
  double m = -INFINITY, s = 0;
  for (float v : logits) m = std::max(m, static_cast<double>(v));
  for (float v : logits) s += std::exp(v - m);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - m - std::log(s);
  return out;
}

// The oracle's and the CPU executor's last-position logits on a 4-token prompt: "yes" when every
// log-probability agrees within the format's bound (the figure is left out so the table is the same on
// every CPU), else why not.
std::pair<std::string, std::string> oracle_and_cpu(const std::shared_ptr<const families::model_handle>& h, dtype format) {
  const std::int32_t ids[] = {5, 6, 7, 8};
  oracle_runner oracle(h, 8);
  auto want = oracle.feed(ids);
  if (!want) return {"no: " + want.error(), "-"};
  exec::cpu::cpu_executor cpu(exec::cpu::cpu_options{1, std::nullopt});
  auto run = exec_runner::create(h, cpu, 8);
  if (!run) return {"yes", "no: " + run.error()};
  auto got = run->feed(ids);
  if (!got) return {"yes", "no: " + got.error()};
  const auto a = log_softmax(*want), b = log_softmax(*got);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  if (worst <= exec::cpu::logprob_bound(format)) return {"yes", "yes"};
  char why[96];
  std::snprintf(why, sizeof why, "no: |dlogprob| %.2e > %.0e", worst, exec::cpu::logprob_bound(format));
  return {"yes", why};
}


class weight_map_consts final : public eval::const_source {
 public:
  explicit weight_map_consts(const families::weight_map& m) : m_(m) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override { return m_.view(role); }

 private:
  const families::weight_map& m_;
};

// An encoder's (encode-only) oracle and CPU executor cells: the hidden states of one 4-token row from
// the oracle, and from the driver's encode on the CPU executor, agree within 2e-4 of their largest
// magnitude.
std::pair<std::string, std::string> encode_oracle_and_cpu(const std::shared_ptr<const families::model_handle>& h) {
  const std::vector<std::int32_t> ids = {2, 5, 6, 3};
  families::step_spec spec;
  spec.program = families::program::encode;
  spec.shape = families::step_shape(1, 4, 4);
  auto g = h->model().trace(spec);
  if (!g) return {"no: " + g.error().message(), "-"};
  tensor tok(dtype::i32, {4}), pos(dtype::i32, {4}), mask(dtype::i32, {4});
  for (std::int32_t i = 0; i < 4; ++i) tok.as<std::int32_t>()[i] = ids[i], pos.as<std::int32_t>()[i] = i, mask.as<std::int32_t>()[i] = 1;
  weight_map_consts w(h->model().weights());
  eval::eval_inputs in;
  in.slots = {{"token_ids", tok.view()}, {"positions", pos.view()}, {"token_mask", mask.view()}};
  in.weights = &w;
  auto want = eval::evaluate(*g, in);
  if (!want) return {"no: " + want.error().message(), "-"};
  exec::cpu::cpu_executor cpu(exec::cpu::cpu_options{1, std::nullopt});
  driver::driver_options o;
  o.capacity = 16;
  o.prefill_chunk = 16;
  o.max_rows = 1;
  o.token_budget = 16;
  auto drv = driver::driver<driver::unprepared>(h, cpu, o).prepare();
  if (!drv) return {"yes", "no: " + drv.error().second.message()};
  const std::vector<std::vector<std::int32_t>> rows = {ids};
  auto got = drv->encode(rows);
  if (!got) return {"yes", "no: " + got.error().message()};
  const auto& a = want->outputs.at("hidden");
  const auto& b = got->front();
  if (a.numel() != b.numel()) return {"yes", "no: the hidden states differ in size"};
  double scale = 0, worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(a.as<float>()[i])));
    worst = std::max(worst, static_cast<double>(std::fabs(a.as<float>()[i] - b.as<float>()[i])));
  }
  if (worst <= 2e-4 * std::max(scale, 1e-30)) return {"yes (encode)", "yes (encode)"};
  char why[96];
  std::snprintf(why, sizeof why, "no: |dhidden| %.2e > 2e-4 of %.2e", worst, scale);
  return {"yes (encode)", why};
}

}  // namespace

int run_feature_matrix() {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("troupe-feature-matrix-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto reg = families::registry::builtin();
  std::printf("# Feature matrix\n\n");
  std::printf("Generated by `troupe feature-matrix` from the registry: each shipped family's fixture is written in\n"
              "both checkpoint forms, loaded, and each program is traced (a 4-token step over a contiguous and a\n"
              "paged cache, and an encode pass). A cell says what traced. The oracle runs a 4-token prompt; the CPU\n"
              "executor runs it too and must give the oracle's log-probabilities within its bound for the weight\n"
              "format (2e-4 for f32, f16 and FP8, 4e-2 for bf16, 0.25 for the block formats, whose activations are\n"
              "quantized as llama.cpp does).\n"
              "The CUDA executor (docs/cuda-executor.md) lowers the same graphs; its parity with the oracle needs a\n"
              "device, so it is checked by tests/engine/exec/cuda/cuda_executor_test.cpp and scripts/gpu-check,\n"
              "not here (this table is the same on every machine). Encoder-only families (bert, nomic_bert) offer the\n"
              "encode program alone: the oracle and the CPU executor (the driver's encode) are compared on the\n"
              "hidden states of a 4-token row, within 2e-4 of their largest magnitude. A recurrent family (mamba2)\n"
              "carries a conv window and a scan state per sequence instead of KV; it offers no encode program, and\n"
              "its recurrent mixers run on the CUDA executor as one warp per state row (never yet on a device).\n\n");
  std::printf("| family | HF model_type | GGUF architecture | form | step (contiguous) | step (paged) | encode | oracle | cpu executor |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  int failures = 0;
  for (const auto& e : reg.entries()) {
    std::string hf_keys, gguf_keys;
    for (const auto& k : e.keys) (k.source == load::config_source::gguf ? gguf_keys : hf_keys) += std::string(k.key) + " ";
    for (bool gguf : {false, true}) {
      const auto path = dir / (std::string(e.family) + (gguf ? ".gguf" : "-hf"));
      families::fixture_dims d;
      d.vocab = 300;
      d.hidden = 64;
      d.ffn = 96;
      d.head_dim = 16;
      auto cell = [&](families::program p, families::step_shape s) {
        auto h = families::model_handle::load(path, reg);
        if (!h) return std::string("no: ") + families::message(h.error());
        families::step_spec spec;
        spec.program = p;
        spec.shape = s;
        auto g = (*h)->model().trace(spec);
        return g ? "yes (" + std::to_string(g->equations().size()) + " eqns)" : "no: " + g.error().message();
      };
      std::string form = gguf ? "GGUF" : "safetensors";
      if (!write_fixture(e.family, d, path, gguf)) {
        std::printf("| %s | %s | %s | %s | no fixture | | | | |\n", std::string(e.family).c_str(), hf_keys.c_str(), gguf_keys.c_str(), form.c_str());
        ++failures;
        continue;
      }
      // A GGUF fixture of a family that has no GGUF key resolves to the family that holds its architecture.
      auto h = families::model_handle::load(path, reg);
      const std::string resolved = h ? std::string((*h)->family().family) : "-";
      if (resolved != e.family) form += " (as " + resolved + ")";
      // An encoder (BERT) offers the encode program only: its step cells say so, and the oracle and the
      // CPU executor are compared on its hidden states instead of logits.
      const bool encoder = h && !(*h)->model().schema().offers(families::program::step);
      const std::string encode_only = "- (encode only)";
      const auto contiguous = encoder ? encode_only : cell(families::program::step, families::step_shape(1, 4, 8));
      const auto paged = encoder ? encode_only : cell(families::program::step, families::step_shape(2, 4, 8).with_kv(families::kv_layout::paged(4, 4)));
      // A recurrent model (mamba2) offers no encode program: its state runs forward only.
      const std::string not_offered = "- (not offered)";
      const auto encode = h && !(*h)->model().schema().offers(families::program::encode) ? not_offered
                                                                                          : cell(families::program::encode, families::step_shape(1, 4, 4));
      std::string oracle = "-", cpu = "-";
      if (h) std::tie(oracle, cpu) = encoder ? encode_oracle_and_cpu(*h) : oracle_and_cpu(*h, d.matrix_type);
      for (const std::string* c : std::initializer_list<const std::string*>{&contiguous, &paged, &encode, &oracle, &cpu})
        failures += c->rfind("yes", 0) != 0 && *c != encode_only && *c != not_offered;
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", std::string(e.family).c_str(), hf_keys.c_str(), gguf_keys.c_str(),
                  form.c_str(), contiguous.c_str(), paged.c_str(), encode.c_str(), oracle.c_str(), cpu.c_str());
    }
  }

  // Weight formats: the llama fixture stored in each format troupe writes.
  std::printf("\n## Weight formats\n\n"
              "The llama fixture with its matrices stored in each format (norms and embeddings as the format's\n"
              "converter keeps them), loaded and run as above. llama.cpp parity of the block formats is checked by\n"
              "tests/families/llama_cpp_parity_test.cpp. The quantized Hugging Face forms (GPTQ, AWQ, FP8,\n"
              "compressed-tensors) are named by method with the row form they run in (docs/checkpoints.md); their\n"
              "logits against the f32 checkpoint of the same values are held by\n"
              "tests/families/quantized_checkpoint_test.cpp.\n\n");
  std::printf("| format | form | loads | oracle | cpu executor |\n| --- | --- | --- | --- | --- |\n");
  // The GGUF and plain safetensors forms by matrix type; the quantized Hugging Face forms by method
  // (fixture_dims::hf_quant), run in their row form (docs/checkpoints.md).
  struct weight_format {
    dtype type;
    bool gguf;
    const char* hf_quant = "";
  };
  const weight_format formats[] = {{dtype::f32, false}, {dtype::f16, false}, {dtype::bf16, false}, {dtype::f32, true},
                                   {dtype::f16, true},  {dtype::bf16, true},  {dtype::q8_0, true},  {dtype::q4_0, true},
                                   {dtype::q4_1, true}, {dtype::q5_0, true},  {dtype::q5_1, true},  {dtype::q2_k, true}, {dtype::q3_k, true}, {dtype::q4_k, true},
                                   {dtype::q5_k, true}, {dtype::q6_k, true}, {dtype::iq4_nl, true}, {dtype::iq4_xs, true},
                                   {dtype::q4_a32, false, "gptq"}, {dtype::q4_a32, false, "gptq-act"}, {dtype::q8_a32, false, "gptq-8bit"},
                                   {dtype::q4_a32, false, "awq"}, {dtype::fp8_s32, false, "fp8-block"}, {dtype::fp8_s32, false, "fp8-channel"},
                                   {dtype::q4_a32, false, "ct-int4"}, {dtype::q8_a32, false, "ct-int8"}};
  for (const auto& [format, gguf, hf_quant] : formats) {
    families::fixture_dims d;
    d.vocab = 300;
    d.hidden = 256;
    d.ffn = 512;
    d.head_dim = 64;
    const bool quantized_hf = *hf_quant != '\0';
    d.matrix_type = quantized_hf ? dtype::f32 : format;
    d.hf_quant = hf_quant;
    const std::string label = quantized_hf ? std::string(hf_quant) + " (" + std::string(name(format)) + ")" : std::string(name(format));
    const auto path = dir / ("llama-" + (quantized_hf ? std::string(hf_quant) : std::string(name(format))) + (gguf ? ".gguf" : "-hf"));
    std::string loads = "yes", oracle = "-", cpu = "-";
    if (auto w = write_fixture("llama", d, path, gguf); !w) {
      loads = "no fixture: " + w.error().message();
    } else if (auto h = families::model_handle::load(path, reg); !h) {
      loads = "no: " + families::message(h.error());
    } else {
      std::tie(oracle, cpu) = oracle_and_cpu(*h, format);
    }
    for (const std::string* c : std::initializer_list<const std::string*>{&loads, &oracle, &cpu}) failures += c->rfind("yes", 0) != 0;
    std::printf("| %s | %s | %s | %s | %s |\n", label.c_str(), gguf ? "GGUF" : "safetensors", loads.c_str(), oracle.c_str(), cpu.c_str());
  }
  fs::remove_all(dir);
  return failures ? 1 : 0;
}

}  // namespace troupe::app

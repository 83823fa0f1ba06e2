// `troupe selfcheck`: writes one generated checkpoint in every storage form troupe reads (safetensors
// f32, GGUF f32, f16, q8_0, q6_k, q4_k), loads each back through the weight store, traces one graph
// (token embedding, a gated feed-forward block with a residual, final norm, vocabulary head) and runs
// it on the CPU oracle. It shows the foundation layers end to end and how far each weight format
// moves the logits from f32.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "apps/inspect.hpp"
#include "engine/core/quant.hpp"
#include "engine/eval/oracle.hpp"
#include "engine/graph/builder.hpp"
#include "engine/load/gguf.hpp"
#include "engine/load/safetensors.hpp"
#include "engine/load/weight_store.hpp"

namespace troupe::app {
namespace {

constexpr std::int64_t vocab = 512, hidden = 256, ffn = 512;

struct named_tensor {
  std::string role;
  tensor data;
};

// Deterministic weights: a fixed seed, normal values scaled like an initialised transformer.
std::vector<named_tensor> make_weights() {
  std::mt19937_64 rng(20261130);
  auto matrix = [&](std::int64_t rows, std::int64_t cols, double scale) {
    std::normal_distribution<float> nd(0.0f, static_cast<float>(scale));
    tensor t(dtype::f32, {rows, cols});
    for (std::int64_t i = 0; i < rows * cols; ++i) t.as<float>()[i] = nd(rng);
    return t;
  };
  auto norm = [&](std::int64_t n) {
    std::uniform_real_distribution<float> ud(0.8f, 1.2f);
    tensor t(dtype::f32, {n});
    for (std::int64_t i = 0; i < n; ++i) t.as<float>()[i] = ud(rng);
    return t;
  };
  std::vector<named_tensor> w;
  w.push_back({"token_embd", matrix(vocab, hidden, 1.0)});
  w.push_back({"ffn_norm", norm(hidden)});
  w.push_back({"ffn_gate", matrix(ffn, hidden, 1.0 / std::sqrt(hidden))});
  w.push_back({"ffn_up", matrix(ffn, hidden, 1.0 / std::sqrt(hidden))});
  w.push_back({"ffn_down", matrix(hidden, ffn, 1.0 / std::sqrt(ffn))});
  w.push_back({"output_norm", norm(hidden)});
  w.push_back({"output", matrix(vocab, hidden, 1.0 / std::sqrt(hidden))});
  return w;
}

tensor quantized(const tensor& t, dtype to) {
  if (to == dtype::f32 || t.shape().rank() != 2) return t;
  tensor out(to, t.shape());
  const auto cols = t.shape()[1];
  const auto row_bytes = out.view().row_bytes();
  for (std::int64_t r = 0; r < t.shape()[0]; ++r)
    (void)quantize_row(to, t.as<float>() + r * cols, out.data() + r * row_bytes, cols);
  return out;
}

// The weight roles the graph uses, bound to the checkpoint's names (here: the role is the name).
class store_source final : public eval::const_source {
 public:
  explicit store_source(const load::weight_store& s) : store_(s) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override { return store_.find(std::string(graph::role_name(role.kind)) + ".weight"); }

 private:
  const load::weight_store& store_;
};

result<graph::graph, graph::trace_error> trace(const load::weight_store& store, std::int64_t tokens) {
  graph::builder b;
  b.admit_tokens(tokens);
  auto weight = [&](graph::tensor_role role) {
    const auto v = store.find(std::string(graph::role_name(role)) + ".weight");
    return b.weight({role}, v ? graph::tensor_type{v->type(), v->shape()} : graph::tensor_type{});
  };
  const auto ids = b.slot(graph::slot_kind::token_ids, {dtype::i32, {tokens}});
  auto x = b.gather_rows(weight(graph::tensor_role::token_embd), ids);
  if (b.type_of(x).type != dtype::f32) x = b.cast(x, dtype::f32);  // the residual stream is f32
  const auto n = b.rms_norm(x, weight(graph::tensor_role::ffn_norm), 1e-5);
  const auto gate = b.unary(graph::op::silu, b.linear(n, weight(graph::tensor_role::ffn_gate)));
  const auto h = b.add(x, b.linear(b.mul(gate, b.linear(n, weight(graph::tensor_role::ffn_up))), weight(graph::tensor_role::ffn_down)));
  const auto logits = b.linear(b.rms_norm(h, weight(graph::tensor_role::output_norm), 1e-5), weight(graph::tensor_role::output));
  b.output("logits", logits);
  b.output("next", b.arg_max(logits));
  return std::move(b).finish();
}

}  // namespace

int run_selfcheck(const selfcheck_options& opt) {
  namespace fs = std::filesystem;
  const fs::path dir = opt.dir.empty() ? fs::temp_directory_path() / ("troupe-selfcheck-" + std::to_string(::getpid())) : fs::path(opt.dir);
  fs::create_directories(dir);
  const auto weights = make_weights();

  struct form { std::string file; dtype type; };
  const std::vector<form> forms = {{"model.safetensors", dtype::f32}, {"model-f32.gguf", dtype::f32},
                                   {"model-f16.gguf", dtype::f16},      {"model-q8_0.gguf", dtype::q8_0},
                                   {"model-q6_k.gguf", dtype::q6_k},    {"model-q4_k.gguf", dtype::q4_k}};
  std::printf("writing a generated checkpoint (vocab %lld, hidden %lld, ffn %lld) to %s\n", static_cast<long long>(vocab),
              static_cast<long long>(hidden), static_cast<long long>(ffn), dir.c_str());
  for (const auto& f : forms) {
    std::vector<tensor> stored;
    std::vector<load::named_view> views;
    for (const auto& w : weights) {
      stored.push_back(f.type == dtype::f16 && w.data.shape().rank() == 2 ? tensor{} : quantized(w.data, f.type));
      if (f.type == dtype::f16 && w.data.shape().rank() == 2) {
        tensor h(dtype::f16, w.data.shape());
        (void)quantize_row(dtype::f16, w.data.as<float>(), h.data(), w.data.numel());
        stored.back() = std::move(h);
      }
    }
    for (std::size_t i = 0; i < weights.size(); ++i) views.push_back({weights[i].role + ".weight", stored[i].view()});
    result<void, load::load_error> r;
    if (f.file.ends_with(".safetensors")) {
      r = load::write_safetensors(dir / f.file, views);
    } else {
      load::gguf_writer w;
      w.add("general.architecture", "troupe-selfcheck");
      w.add("general.name", "selfcheck " + std::string(name(f.type)));
      for (const auto& v : views) w.add_tensor(v.name, v.view);
      r = w.write(dir / f.file);
    }
    if (!r) {
      std::fprintf(stderr, "troupe selfcheck: %s\n", r.error().message().c_str());
      return 1;
    }
  }

  const std::vector<std::int32_t> prompt = {17, 4, 250, 33, 101, 7, 488, 64};
  tensor ids(dtype::i32, {static_cast<std::int64_t>(prompt.size())});
  std::copy(prompt.begin(), prompt.end(), ids.as<std::int32_t>());

  std::printf("\n%-20s %10s %8s %12s %14s %10s\n", "checkpoint", "MiB", "tensors", "next token", "max |dlogit|", "oracle ms");
  std::vector<float> reference;
  int failures = 0;
  for (const auto& f : forms) {
    auto store = load::weight_store::open(dir / f.file);
    if (!store) {
      std::fprintf(stderr, "troupe selfcheck: %s\n", store.error().message().c_str());
      return 1;
    }
    auto g = trace(*store, static_cast<std::int64_t>(prompt.size()));
    if (!g) {
      std::fprintf(stderr, "troupe selfcheck: trace: %s\n", g.error().message().c_str());
      return 1;
    }
    store_source src(*store);
    eval::eval_inputs in;
    in.weights = &src;
    in.slots.emplace("token_ids", ids.view());
    const auto t0 = std::chrono::steady_clock::now();
    auto ev = eval::evaluate(*g, in);
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!ev) {
      std::fprintf(stderr, "troupe selfcheck: oracle: %s\n", ev.error().message().c_str());
      return 1;
    }
    const auto& logits = ev->outputs.at("logits");
    const auto* l = logits.as<float>();
    if (reference.empty()) reference.assign(l, l + logits.numel());
    double diff = 0;
    for (std::int64_t i = 0; i < logits.numel(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(l[i] - reference[i])));
    const auto next = ev->outputs.at("next").as<std::int32_t>()[prompt.size() - 1];
    std::printf("%-20s %10.2f %8zu %12d %14.5f %10.1f\n", f.file.c_str(), static_cast<double>(store->total_bytes()) / (1 << 20),
                store->size(), next, diff, ms);
    // Bounds for this generated model: f32 forms agree exactly; the quantized forms within their
    // formats' precision (measured: f16 0.0014, q8_0 0.036, q6_k 0.13, q4_k 0.49).
    const double bound = f.type == dtype::f32 ? 0.0 : f.type == dtype::f16 ? 0.01 : f.type == dtype::q8_0 ? 0.1 : 1.0;
    if (diff > bound) {
      std::printf("  ^ logits moved more than %.3f from the f32 checkpoint\n", bound);
      ++failures;
    }
  }
  if (!opt.keep && opt.dir.empty()) fs::remove_all(dir);
  std::printf("\n%s\n", failures ? "selfcheck FAILED" : "selfcheck passed: every form loads, traces and evaluates to the f32 logits within its format's precision");
  return failures ? 1 : 0;
}

}  // namespace troupe::app

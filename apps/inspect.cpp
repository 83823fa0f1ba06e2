#include "apps/inspect.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <map>

#include "engine/load/raw_config.hpp"
#include "engine/load/weight_store.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {
namespace {

// The keys that say what a model is, in the order a reader wants them.
constexpr const char* hf_summary_keys[] = {
    "model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps",
    "tie_word_embeddings", "torch_dtype", "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "n_shared_experts", "q_lora_rank", "kv_lora_rank"};

std::string gguf_value_str(const load::gguf_value& v) {
  if (const auto* s = v.get_if<std::string>()) return s->size() > 80 ? s->substr(0, 77) + "..." : *s;
  if (const auto* a = v.get_if<load::gguf_array>())
    return std::string(load::name(a->type)) + "[" + std::to_string(a->size()) + "]";
  if (const auto* b = v.get_if<bool>()) return *b ? "true" : "false";
  if (auto i = v.as_int()) return std::to_string(*i);
  if (auto f = v.as_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *f);
    return buf;
  }
  return "?";
}

}  // namespace

int run_inspect(const inspect_options& opt) {
  auto store = load::weight_store::open(opt.model);
  if (!store) {
    std::fprintf(stderr, "troupe inspect: %s\n", store.error().message().c_str());
    return 2;
  }
  nlohmann::ordered_json out;
  out["path"] = opt.model;
  out["format"] = std::string(load::name(store->format()));
  if (auto cfg = families::read_config(opt.model)) {
    auto family = families::registry::builtin().resolve(*cfg);
    out["family"] = family ? std::string((*family)->family) : families::message(family.error());
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (auto g = store->gguf()) {
    out["gguf_version"] = g->get().version();
    for (const auto& kv : g->get().metadata())
      if (kv.key.rfind("tokenizer.", 0) != 0) config[kv.key] = gguf_value_str(kv.value);
  } else {
    const auto dir = std::filesystem::is_directory(opt.model) ? std::filesystem::path(opt.model)
                                                              : std::filesystem::path(opt.model).parent_path();
    if (auto cfg = load::raw_config::open(dir / "config.json")) {
      for (const char* k : hf_summary_keys) {
        if (!cfg->has(k)) continue;
        if (auto i = cfg->get_int(k)) config[k] = *i;
        else if (auto f = cfg->get_float(k)) config[k] = *f;
        else if (auto b = cfg->get_bool(k)) config[k] = *b;
        else if (auto s = cfg->get_string(k)) config[k] = *s;
        else if (auto a = cfg->get_string_array(k)) config[k] = *a;
      }
    }
  }
  out["config"] = config;
  // What the model holds and what one token's decode reads of it (a routed model: its selected experts).
  if (auto h = families::model_handle::load(opt.model, families::registry::builtin())) {
    const auto& c = (*h)->model().config();
    const auto fp = families::footprint((*h)->model());
    out["parameters"] = fp.params;
    out["active_parameters"] = fp.active_params;
    if (c.experts > 0) {
      out["experts"] = c.experts;
      out["experts_per_token"] = c.experts_per_token;
    }
  }
  std::map<std::string, std::size_t> by_type;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const auto& n : store->names()) {
    const auto v = *store->find(n);
    by_type[std::string(name(v.type()))] += 1;
    nlohmann::ordered_json t;
    t["name"] = n;
    t["dtype"] = std::string(name(v.type()));
    t["shape"] = std::vector<std::int64_t>(v.shape().dims().begin(), v.shape().dims().end());
    t["bytes"] = v.bytes();
    tensors.push_back(t);
  }
  // The quantization: a Hugging Face directory's declared one (and the row form troupe runs it in), or the
  // block formats a GGUF file's tensors are stored in.
  if (const auto& q = store->quantization()) {
    out["quantization"] = q->summary();
  } else {
    std::string blocks;
    for (const auto& [t, n] : by_type)
      if (const auto d = dtype_from_name(t); d && is_quantized(*d)) blocks += (blocks.empty() ? "" : ", ") + t + " x" + std::to_string(n);
    out["quantization"] = blocks.empty() ? std::string("none") : blocks;
  }
  out["tensor_count"] = store->size();
  out["total_bytes"] = store->total_bytes();
  out["dtypes"] = by_type;
  out["tensors"] = tensors;

  if (opt.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (out.contains("family")) std::printf("family:  %s\n", out["family"].get<std::string>().c_str());
  if (out.contains("parameters"))
    std::printf("params:  %.1fM, %.1fM read per decoded token%s\n", out["parameters"].get<double>() / 1e6,
                out["active_parameters"].get<double>() / 1e6,
                out.contains("experts") ? (" (" + std::to_string(out["experts_per_token"].get<std::int64_t>()) + " of " +
                                           std::to_string(out["experts"].get<std::int64_t>()) + " experts)").c_str()
                                        : "");
  std::printf("path:    %s\nformat:  %s\ntensors: %zu (%.2f MiB)\n", opt.model.c_str(), out["format"].get<std::string>().c_str(),
              store->size(), static_cast<double>(store->total_bytes()) / (1 << 20));
  std::printf("quant:   %s\n", out["quantization"].get<std::string>().c_str());
  std::printf("dtypes: ");
  for (const auto& [t, n] : by_type) std::printf(" %s x%zu", t.c_str(), n);
  std::printf("\nconfig:\n");
  for (const auto& [k, v] : config.items()) std::printf("  %-40s %s\n", k.c_str(), v.dump().c_str());
  std::printf("tensors:\n");
  for (const auto& t : tensors)
    std::printf("  %-48s %-6s %-20s %zu\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                t["shape"].dump().c_str(), t["bytes"].get<std::size_t>());
  return 0;
}

}  // namespace troupe::app

#include "engine/load/peft.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/quant.hpp"
#include "engine/load/gguf.hpp"
#include "engine/load/safetensors.hpp"

namespace troupe::load {

namespace {

using json = nlohmann::json;

load_error unsupported(const std::string& file, const std::string& field, const std::string& reason) {
  return load_error{load_error_code::unsupported_adapter, file, field, reason};
}
load_error bad(const std::string& file, const std::string& item, const std::string& reason) {
  return load_error{load_error_code::bad_adapter, file, item, reason};
}

// An absent key, null, false, an empty string, list or object: the field asks for nothing.
bool empty_field(const json& j, const char* key) {
  if (!j.contains(key)) return true;
  const auto& v = j.at(key);
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

// "<...>.layers.<L>.<...>.<module>.lora_<A|B>.weight" -> (module, L, 'A' | 'B'), or false.
bool split_name(std::string_view name, std::string& module, std::int32_t& layer, char& which) {
  constexpr std::string_view tail_a = ".lora_A.weight", tail_b = ".lora_B.weight";
  if (name.ends_with(tail_a)) which = 'A';
  else if (name.ends_with(tail_b)) which = 'B';
  else return false;
  const auto place = layer_linear(name.substr(0, name.size() - tail_a.size()));
  if (!place) return false;
  layer = place->first;
  module = place->second;
  return true;
}

result<tensor, load_error> as_f32(const tensor_view& v, const std::string& file, const std::string& item) {
  if (v.shape().rank() != 2) return unexpected(bad(file, item, "a LoRA matrix must be 2-D, got " + v.shape().str()));
  if (v.type() != dtype::f32 && v.type() != dtype::f16 && v.type() != dtype::bf16)
    return unexpected(unsupported(file, item, "stored as " + std::string(name(v.type())) + "; f32, f16 or bf16 are read"));
  tensor t(dtype::f32, v.shape());
  if (auto d = dequantize_row(v.type(), v.data(), t.as<float>(), v.shape().numel()); !d)
    return unexpected(bad(file, item, d.error().message()));
  return t;
}

}  // namespace

std::optional<std::pair<std::int32_t, std::string>> layer_linear(std::string_view stem) {
  const auto at = stem.find(".layers.");
  if (at == std::string_view::npos) return std::nullopt;
  const auto digits = stem.substr(at + 8);
  int layer = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
  if (ec != std::errc{} || end == digits.data() || (end != digits.data() + digits.size() && *end != '.')) return std::nullopt;
  const auto dot = stem.rfind('.');
  return std::pair{static_cast<std::int32_t>(layer), std::string(stem.substr(dot + 1))};
}

double peft_adapter::scale() const {
  if (rank <= 0) return 0.0;
  if (gguf_layout) return alpha != 0 ? alpha / static_cast<double>(rank) : 1.0;  // llama.cpp's get_scale
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

result<peft_adapter, load_error> parse_peft_config(std::string_view text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return unexpected(load_error{load_error_code::bad_header, file, "", std::string("not JSON: ") + e.what()});
  }
  if (!j.is_object()) return unexpected(load_error{load_error_code::bad_header, file, "", "the config is not a JSON object"});
  if (j.contains("peft_type") && j.at("peft_type") != "LORA")
    return unexpected(unsupported(file, "peft_type", "only LORA adapters are read, not " + j.at("peft_type").dump()));
  for (const char* field : {"use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"})
    if (!empty_field(j, field)) return unexpected(unsupported(file, field, "set to " + j.at(field).dump() + "; troupe reads plain LoRA"));
  if (j.contains("bias") && j.at("bias") != "none")
    return unexpected(unsupported(file, "bias", "trained biases (" + j.at("bias").dump() + ") are not read"));
  peft_adapter a;
  if (!j.contains("r") || !j.at("r").is_number_integer() || j.at("r").get<std::int64_t>() < 1)
    return unexpected(load_error{load_error_code::missing_key, file, "r", "a positive integer rank is needed"});
  a.rank = j.at("r").get<std::int64_t>();
  a.alpha = static_cast<double>(a.rank);
  if (j.contains("lora_alpha")) {
    if (!j.at("lora_alpha").is_number()) return unexpected(load_error{load_error_code::wrong_type, file, "lora_alpha", "not a number"});
    a.alpha = j.at("lora_alpha").get<double>();
  }
  if (j.contains("use_rslora")) {
    if (!j.at("use_rslora").is_boolean()) return unexpected(load_error{load_error_code::wrong_type, file, "use_rslora", "not a boolean"});
    a.rslora = j.at("use_rslora").get<bool>();
  }
  if (j.contains("target_modules")) {
    const auto& t = j.at("target_modules");
    if (t.is_string()) {
      a.target_modules.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& m : t) {
        if (!m.is_string()) return unexpected(load_error{load_error_code::wrong_type, file, "target_modules", "not a list of names"});
        a.target_modules.push_back(m.get<std::string>());
      }
    } else if (!t.is_null()) {
      return unexpected(load_error{load_error_code::wrong_type, file, "target_modules", "not a name or a list of names"});
    }
  }
  return a;
}

result<peft_adapter, load_error> read_peft_adapter(const std::filesystem::path& dir) {
  const auto config_path = dir / "adapter_config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return unexpected(load_error{load_error_code::io, config_path.string(), "", "cannot be read"});
  std::ostringstream text;
  text << in.rdbuf();
  auto a = parse_peft_config(text.str(), config_path.string());
  if (!a) return unexpected(a.error());
  const auto weights_path = dir / "adapter_model.safetensors";
  auto file = safetensors_file::open(weights_path);
  if (!file) return unexpected(file.error());
  const std::string wf = weights_path.string();
  std::map<std::pair<std::int32_t, std::string>, peft_module> by_key;
  for (const auto& t : file->tensors()) {
    std::string module;
    std::int32_t layer = -1;
    char which = 0;
    if (!split_name(t.name, module, layer, which)) {
      if (t.name.find("lora_embedding") != std::string::npos || t.name.find("embed_tokens") != std::string::npos ||
          t.name.find("lm_head") != std::string::npos)
        return unexpected(unsupported(wf, t.name, "adapters of the embedding or output head are not read"));
      return unexpected(bad(wf, t.name, "not a per-layer lora_A / lora_B weight"));
    }
    auto m = as_f32(t.view, wf, t.name);
    if (!m) return unexpected(m.error());
    auto& e = by_key[{layer, module}];
    e.module = module;
    e.layer = layer;
    tensor& slot = which == 'A' ? e.a : e.b;
    if (slot.shape().rank() != 0) return unexpected(load_error{load_error_code::duplicate_name, wf, t.name, "a second lora_" + std::string(1, which) + " for this linear"});
    slot = std::move(*m);
  }
  for (auto& [key, m] : by_key) {
    const std::string item = "layers." + std::to_string(key.first) + "." + key.second;
    if (m.a.shape().rank() != 2 || m.b.shape().rank() != 2) return unexpected(bad(wf, item, "has only one of lora_A and lora_B"));
    if (m.a.shape()[0] != a->rank || m.b.shape()[1] != a->rank)
      return unexpected(bad(wf, item, "lora_A " + m.a.shape().str() + " and lora_B " + m.b.shape().str() + " disagree with r = " + std::to_string(a->rank)));
    a->modules.push_back(std::move(m));
  }
  if (a->modules.empty()) return unexpected(bad(wf, "", "holds no lora_A / lora_B pair"));
  return a;
}

result<peft_adapter, load_error> read_gguf_lora(const std::filesystem::path& path) {
  auto g = gguf_file::open(path);
  if (!g) return unexpected(g.error());
  const std::string file = path.string();
  auto str = [&](std::string_view key) -> std::string {
    const auto v = g->find_value(key);
    const auto* s = v ? v->get().get_if<std::string>() : nullptr;
    return s ? *s : std::string();
  };
  if (str("general.type") != "adapter") return unexpected(unsupported(file, "general.type", "'" + str("general.type") + "', not a llama.cpp adapter"));
  if (str("adapter.type") != "lora") return unexpected(unsupported(file, "adapter.type", "'" + str("adapter.type") + "', not lora"));
  if (g->find_value("adapter.alora.invocation_tokens")) return unexpected(unsupported(file, "adapter.alora.invocation_tokens", "activated LoRA is not read"));
  peft_adapter a;
  a.gguf_layout = true;
  a.arch = str("general.architecture");
  if (const auto v = g->find_value("adapter.lora.alpha")) {
    const auto* f = v->get().get_if<float>();
    if (!f) return unexpected(load_error{load_error_code::wrong_type, file, "adapter.lora.alpha", "not an f32"});
    a.alpha = *f;
  }
  std::map<std::pair<std::int32_t, std::string>, peft_module> by_key;
  for (const auto& t : g->tensors()) {
    const std::string_view n = t.name;
    char which = 0;
    if (n.ends_with(".weight.lora_a")) which = 'A';
    else if (n.ends_with(".weight.lora_b")) which = 'B';
    if (!which || !n.starts_with("blk.")) return unexpected(unsupported(file, t.name, "not a per-layer blk.N.<name>.weight.lora_a / lora_b tensor"));
    const auto stem = n.substr(4, n.size() - 4 - 14);  // "N.<name>"
    const auto dot = stem.find('.');
    int layer = -1;
    const auto [end, ec] = std::from_chars(stem.data(), stem.data() + (dot == std::string_view::npos ? stem.size() : dot), layer);
    if (ec != std::errc{} || dot == std::string_view::npos || end != stem.data() + dot) return unexpected(bad(file, t.name, "no layer number"));
    auto m = as_f32(t.view, file, t.name);
    if (!m) return unexpected(m.error());
    auto& e = by_key[{layer, std::string(stem.substr(dot + 1))}];
    e.module = std::string(stem.substr(dot + 1));
    e.layer = layer;
    tensor& slot = which == 'A' ? e.a : e.b;
    if (slot.shape().rank() != 0) return unexpected(load_error{load_error_code::duplicate_name, file, t.name, "given twice"});
    slot = std::move(*m);
  }
  for (auto& [key, m] : by_key) {
    const std::string item = "blk." + std::to_string(key.first) + "." + key.second;
    if (m.a.shape().rank() != 2 || m.b.shape().rank() != 2) return unexpected(bad(file, item, "has only one of lora_a and lora_b"));
    if (m.a.shape()[0] != m.b.shape()[1]) return unexpected(bad(file, item, "lora_a " + m.a.shape().str() + " and lora_b " + m.b.shape().str() + " disagree on the rank"));
    if (a.rank == 0) a.rank = m.a.shape()[0];
    if (m.a.shape()[0] != a.rank) return unexpected(unsupported(file, item, "rank " + std::to_string(m.a.shape()[0]) + " where others have " + std::to_string(a.rank)));
    a.modules.push_back(std::move(m));
  }
  if (a.modules.empty()) return unexpected(bad(file, "", "holds no lora_a / lora_b pair"));
  return a;
}

result<peft_adapter, load_error> read_lora_adapter(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec) && path.extension() == ".gguf") return read_gguf_lora(path);
  return read_peft_adapter(path);
}

}  // namespace troupe::load

#include "families/pooling.hpp"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace troupe::families {

std::string_view name(pooling_mode m) {
  switch (m) {
    case pooling_mode::mean: return "mean";
    case pooling_mode::cls: return "cls";
    case pooling_mode::last: return "last";
  }
  return "last";
}

std::optional<pooling_mode> pooling_named(std::string_view n) {
  if (n == "mean") return pooling_mode::mean;
  if (n == "cls") return pooling_mode::cls;
  if (n == "last") return pooling_mode::last;
  return std::nullopt;
}

namespace {

std::optional<nlohmann::json> read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  auto j = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}), nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

pooling pooling_of(const std::filesystem::path& path, const load::raw_config& cfg) {
  pooling p;
  if (cfg.source() == load::config_source::gguf) {
    // llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last, 4 rank. None and rank keep the default.
    auto arch = cfg.get_string("general.architecture");
    if (arch)
      if (auto t = cfg.get_int(*arch + ".pooling_type"); t && *t >= 1 && *t <= 3) {
        p.mode = *t == 1 ? pooling_mode::mean : *t == 2 ? pooling_mode::cls : pooling_mode::last;
        p.declared_by = "gguf pooling_type";
      }
    return p;
  }
  // sentence-transformers: modules.json lists the pipeline; its Pooling module's folder holds the mode
  // flags, and a Normalize module asks for unit vectors.
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return p;
  auto modules = read_json(path / "modules.json");
  if (!modules || !modules->is_array()) return p;
  bool normalize = false, found = false;
  for (const auto& m : *modules) {
    if (!m.is_object()) continue;
    const auto type = m.value("type", std::string());
    if (type.ends_with("Normalize")) normalize = true;
    if (!type.ends_with("Pooling")) continue;
    auto conf = read_json(path / m.value("path", std::string("1_Pooling")) / "config.json");
    if (!conf || !conf->is_object()) continue;
    if (conf->value("pooling_mode_cls_token", false)) p.mode = pooling_mode::cls, found = true;
    else if (conf->value("pooling_mode_mean_tokens", false)) p.mode = pooling_mode::mean, found = true;
    else if (conf->value("pooling_mode_lasttoken", false)) p.mode = pooling_mode::last, found = true;
  }
  if (found) {
    p.normalize = normalize;
    p.declared_by = "sentence-transformers";
  }
  return p;
}

}  // namespace troupe::families

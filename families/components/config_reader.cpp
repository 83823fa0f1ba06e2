#include "families/components/config_reader.hpp"

namespace troupe::families {

std::string message(const model_error& e) {
  return std::visit([](const auto& x) { return x.message(); }, e);
}

config_reader::config_reader(const load::raw_config& cfg, std::string family) : cfg_(cfg), family_(std::move(family)) {
  if (gguf()) arch_ = cfg_.get_string("general.architecture").value_or("");
}

std::string config_reader::key(const std::string& hf, const std::string& gguf_key) const {
  if (!gguf()) return hf;
  return gguf_key.empty() ? "" : arch_ + "." + gguf_key;
}

result<std::int64_t, config_error> config_reader::positive(const std::string& hf, const std::string& g) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return unexpected(error(k.empty() ? hf : k, "missing"));
  auto v = cfg_.get_int(k);
  if (!v) return unexpected(error(k, v.error().reason));
  if (*v <= 0) return unexpected(error(k, "must be positive, is " + std::to_string(*v)));
  return *v;
}

result<std::int64_t, config_error> config_reader::positive_or(const std::string& hf, const std::string& g, std::int64_t fallback) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return fallback;
  return positive(hf, g);
}

result<std::int64_t, config_error> config_reader::count_or(const std::string& hf, const std::string& g, std::int64_t fallback) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return fallback;
  auto v = cfg_.get_int(k);
  if (!v) return unexpected(error(k, v.error().reason));
  if (*v < 0) return unexpected(error(k, "must not be negative, is " + std::to_string(*v)));
  return *v;
}

result<double, config_error> config_reader::number_or(const std::string& hf, const std::string& g, double fallback) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return fallback;
  auto v = cfg_.get_float(k);
  if (!v) return unexpected(error(k, v.error().reason));
  return *v;
}

result<bool, config_error> config_reader::flag_or(const std::string& hf, const std::string& g, bool fallback) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return fallback;
  auto v = cfg_.get_bool(k);
  if (!v) return unexpected(error(k, v.error().reason));
  return *v;
}

std::optional<std::string> config_reader::text(const std::string& hf, const std::string& g) const {
  const auto k = key(hf, g);
  if (k.empty() || !cfg_.has(k)) return std::nullopt;
  auto v = cfg_.get_string(k);
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

std::vector<std::int32_t> config_reader::eos_ids() const {
  const std::string k = gguf() ? "tokenizer.ggml.eos_token_id" : "eos_token_id";
  if (auto v = cfg_.get_int(k)) return {static_cast<std::int32_t>(*v)};
  if (auto a = cfg_.get_int_array(k)) return std::vector<std::int32_t>(a->begin(), a->end());
  return {};
}

std::int32_t config_reader::bos_id() const {
  const std::string k = gguf() ? "tokenizer.ggml.bos_token_id" : "bos_token_id";
  auto v = cfg_.get_int(k);
  return v ? static_cast<std::int32_t>(*v) : -1;
}

}  // namespace troupe::families

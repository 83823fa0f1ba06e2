#pragma once
// Typed, named lookups over a raw configuration for a family that reads both checkpoint forms: each
// value has a Hugging Face key and a GGUF key (under the file's architecture prefix), and every
// refusal names the key that was read.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/load/raw_config.hpp"
#include "families/family_error.hpp"

namespace troupe::families {

// The first refusal among several reads, if any.
template <class... R>
std::optional<config_error> first_error(const R&... reads) {
  std::optional<config_error> e;
  ((e = e ? e : (reads ? std::nullopt : std::optional<config_error>(reads.error()))), ...);
  return e;
}

class config_reader {
 public:
  config_reader(const load::raw_config& cfg, std::string family);

  bool gguf() const { return cfg_.source() == load::config_source::gguf; }
  const load::raw_config& raw() const { return cfg_; }
  // The full key for this form: the HF key, or "<arch>.<gguf>" for GGUF ("" means: not in this form).
  std::string key(const std::string& hf, const std::string& gguf) const;

  result<std::int64_t, config_error> positive(const std::string& hf, const std::string& gguf) const;
  result<std::int64_t, config_error> positive_or(const std::string& hf, const std::string& gguf, std::int64_t fallback) const;
  // A count that may be 0 (q_lora_rank, shared experts, leading dense layers); absent or null: fallback.
  result<std::int64_t, config_error> count_or(const std::string& hf, const std::string& gguf, std::int64_t fallback) const;
  result<double, config_error> number_or(const std::string& hf, const std::string& gguf, double fallback) const;
  result<bool, config_error> flag_or(const std::string& hf, const std::string& gguf, bool fallback) const;
  std::optional<std::string> text(const std::string& hf, const std::string& gguf) const;
  // eos ids: HF eos_token_id (an int or a list), GGUF tokenizer.ggml.eos_token_id.
  std::vector<std::int32_t> eos_ids() const;
  std::int32_t bos_id() const;

  config_error error(const std::string& field, std::string reason) const { return {family_, field, std::move(reason)}; }

 private:
  const load::raw_config& cfg_;
  std::string family_;
  std::string arch_;
};

}  // namespace troupe::families

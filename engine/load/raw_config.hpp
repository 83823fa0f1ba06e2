#pragma once
// A model's configuration as stored: Hugging Face config.json or the metadata of a GGUF file, behind
// one interface of typed lookups. It knows nothing of families: it answers "what does key K hold" and
// names the key when the answer is "nothing" or "not that type". JSON keys may be dotted to reach into
// nested objects ("rope_scaling.factor"); GGUF keys are used as stored ("llama.block_count"). Lookups
// are strict: an integer is never read from a float, though a float may be read from an integer, and a
// JSON null counts as absent (Hugging Face writes null for an unset option).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/load/gguf.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load {

enum class config_source { hf_json, gguf };

class raw_config {
 public:
  // A config.json file, a directory holding one, or a .gguf file (its metadata).
  static result<raw_config, load_error> open(const std::filesystem::path& path);
  static result<raw_config, load_error> from_json_file(const std::filesystem::path& path);
  // `name` stands for the file in errors.
  static result<raw_config, load_error> from_json_string(std::string_view text, std::string name = "config.json");
  // Shares the file's metadata (and so its mapping) rather than copying it.
  static raw_config from_gguf(const gguf_file& file);

  // The JSON object under `key` as a config of its own (a vision-language checkpoint's text_config),
  // named "<name>:<key>"; nullopt when there is no such object (or this is a GGUF's metadata).
  std::optional<raw_config> section(std::string_view key) const;

  config_source source() const;
  const std::string& name() const;

  bool has(std::string_view key) const;
  result<std::int64_t, load_error> get_int(std::string_view key) const;
  result<double, load_error> get_float(std::string_view key) const;
  result<bool, load_error> get_bool(std::string_view key) const;
  result<std::string, load_error> get_string(std::string_view key) const;
  result<std::vector<std::int64_t>, load_error> get_int_array(std::string_view key) const;
  result<std::vector<double>, load_error> get_float_array(std::string_view key) const;
  result<std::vector<std::string>, load_error> get_string_array(std::string_view key) const;

  // Every key that holds a value: dotted paths to the leaves of the JSON (sorted), or the GGUF keys in
  // file order.
  std::vector<std::string> keys() const;

 private:
  struct impl;
  explicit raw_config(std::shared_ptr<const impl> i) : impl_(std::move(i)) {}
  std::shared_ptr<const impl> impl_;
};

}  // namespace troupe::load

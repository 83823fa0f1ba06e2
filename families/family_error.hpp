#pragma once
// The typed refusals of the model layer before any trace: a configuration value a family cannot use,
// a weight that is missing or misshapen, a checkpoint that cannot be read, or a family nobody ships.
#include <string>
#include <variant>

#include "engine/load/load_error.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

struct config_error {
  std::string family;
  std::string field;   // the config key ("num_key_value_heads", "llama.attention.head_count_kv")
  std::string reason;
  std::string message() const { return family + " config: '" + field + "': " + reason; }
};

struct unregistered {
  std::string source;  // "config.json model_type" or "GGUF general.architecture"
  std::string key;     // the value no family holds
  std::string message() const { return "unsupported model: no family is registered for " + source + " '" + key + "'"; }
};

using model_error = std::variant<config_error, weight_error, load::load_error, unregistered>;
std::string message(const model_error& e);

}  // namespace troupe::families

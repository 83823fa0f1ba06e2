#pragma once
// Which families this build ships. A family_entry is data: the family's name, the config keys that
// select it (Hugging Face model_type, GGUF general.architecture) and its build function. `resolve`
// reads only the configuration, so a checkpoint nobody can run is turned down before any tensor data
// is read. There is no global registry: `registry::builtin()` indexes SHIPPED for its caller.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/load/raw_config.hpp"
#include "engine/load/weight_store.hpp"
#include "families/family_error.hpp"
#include "families/model.hpp"

namespace troupe::families {

struct family_key {
  load::config_source source;
  std::string_view key;
  // A configuration key that must also be present (and, when a number, non-zero) for this claim: GGUF
  // arch `llama` with `llama.expert_count` is Mixtral. A claim with a condition that holds wins over
  // the plain claim of the same key.
  std::string_view when = {};
};

using build_fn = result<std::unique_ptr<model>, model_error> (*)(const load::raw_config&, const load::weight_store&);

struct family_entry {
  std::string_view family;
  std::span<const family_key> keys;
  build_fn build;
};

// Every shipped family, in one list (families/shipped.cpp).
std::span<const family_entry> shipped();

struct duplicate_key {
  std::string key;
  std::string first, second;  // the two families claiming it
  std::string message() const { return "config key '" + key + "' is claimed by both " + first + " and " + second; }
};

class registry {
 public:
  static registry builtin();
  // Indexes `entries`; a key claimed twice is refused.
  static result<registry, duplicate_key> from(std::span<const family_entry> entries);

  // The family for this configuration, from its key alone; an unknown key is `unregistered`.
  result<const family_entry*, unregistered> resolve(const load::raw_config& cfg) const;
  std::span<const family_entry> entries() const { return entries_; }

 private:
  std::span<const family_entry> entries_;
};

}  // namespace troupe::families

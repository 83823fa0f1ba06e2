#include "families/registry.hpp"

#include <cstdlib>
#include <vector>

namespace troupe::families {

result<registry, duplicate_key> registry::from(std::span<const family_entry> entries) {
  struct claim { const family_key* key; std::string_view family; };
  std::vector<claim> claims;
  for (const auto& e : entries)
    for (const auto& k : e.keys) claims.push_back({&k, e.family});
  for (std::size_t i = 0; i < claims.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (claims[j].key->source == claims[i].key->source && claims[j].key->key == claims[i].key->key &&
          claims[j].key->when == claims[i].key->when)
        return unexpected(duplicate_key{std::string(claims[i].key->key), std::string(claims[j].family), std::string(claims[i].family)});
  registry r;
  r.entries_ = entries;
  return r;
}

registry registry::builtin() {
  auto r = from(shipped());
  // SHIPPED is fixed at build time and checked by the registry's tests; a duplicate there is a bug in
  // this build, not an input, so it stops the program at once.
  if (!r) std::abort();
  return *r;
}

result<const family_entry*, unregistered> registry::resolve(const load::raw_config& cfg) const {
  const bool gguf = cfg.source() == load::config_source::gguf;
  const std::string key_name = gguf ? "general.architecture" : "model_type";
  const std::string source = gguf ? "GGUF general.architecture" : "config.json model_type";
  auto key = cfg.get_string(key_name);
  if (!key) return unexpected(unregistered{source, "(absent)"});
  auto holds = [&](std::string_view when) {
    if (!cfg.has(when)) return false;
    const auto n = cfg.get_int(when);
    return !n || *n != 0;  // a number must be non-zero; any other value's presence is enough
  };
  for (const auto& e : entries_)
    for (const auto& k : e.keys)
      if (k.source == cfg.source() && k.key == *key && !k.when.empty() && holds(k.when)) return &e;
  for (const auto& e : entries_)
    for (const auto& k : e.keys)
      if (k.source == cfg.source() && k.key == *key && k.when.empty()) return &e;
  return unexpected(unregistered{source, *key});
}

}  // namespace troupe::families

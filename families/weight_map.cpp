#include "families/weight_map.hpp"

namespace troupe::families {

std::string weight_error::message() const {
  switch (code) {
    case weight_error_code::missing:
      return "weight " + role.str() + ": tensor '" + key + "' is missing (expected shape " + expected + ")";
    case weight_error_code::shape_mismatch:
      return "weight " + role.str() + ": tensor '" + key + "' has shape " + got + ", expected " + expected;
    case weight_error_code::unsupported_dtype:
      return "weight " + role.str() + ": tensor '" + key + "' is stored as " + got + ", expected " + expected;
  }
  return "weight " + role.str();
}

namespace {

std::string key_for(const std::string& pattern, std::int32_t layer) {
  std::string k = pattern;
  const auto at = k.find("{L}");
  if (at != std::string::npos) k.replace(at, 3, std::to_string(layer));
  return k;
}

}  // namespace

result<weight_map, weight_error> weight_map::build(const load::weight_store& store, std::span<const name_rule> rules,
                                                   std::int32_t layers, const expected_shape_fn& expected) {
  weight_map m(store);
  auto resolve = [&](const name_rule& r, std::int32_t layer) -> result<void, weight_error> {
    const graph::weight_role role{r.role, r.per_layer ? layer : -1};
    const auto want = expected(r.role, role.layer);
    std::string key = key_for(r.key, layer);
    auto v = store.find(key);
    stored_as stored = r.stored;
    if (!v && r.presence == presence::tied) {
      for (const auto& t : rules) {
        if (t.role != r.tied_to) continue;
        key = key_for(t.key, layer);
        v = store.find(key);
        stored = t.stored;
      }
    }
    if (!v) {
      if (r.presence == presence::optional) return {};
      return unexpected(weight_error{weight_error_code::missing, role, key, want ? want->str() : "any", ""});
    }
    if (want && v->shape() != *want)
      return unexpected(weight_error{weight_error_code::shape_mismatch, role, key, want->str(), v->shape().str()});
    if (is_integer(v->type()))
      return unexpected(weight_error{weight_error_code::unsupported_dtype, role, key, "a float or block type",
                                     std::string(name(v->type()))});
    m.entries_.push_back({role, key, *v, stored});
    return {};
  };
  for (const auto& r : rules) {
    if (!r.per_layer) {
      if (auto e = resolve(r, -1); !e) return unexpected(e.error());
      continue;
    }
    for (std::int32_t l = 0; l < layers; ++l)
      if (auto e = resolve(r, l); !e) return unexpected(e.error());
  }
  return m;
}

const weight_entry* weight_map::find(const graph::weight_role& role) const {
  for (const auto& e : entries_)
    if (e.role == role) return &e;
  return nullptr;
}

std::optional<tensor_view> weight_map::view(const graph::weight_role& role) const {
  const auto* e = find(role);
  return e ? std::optional<tensor_view>(e->view) : std::nullopt;
}

weight_map weight_map::derive(std::vector<weight_entry> entries, std::vector<std::shared_ptr<const tensor>> owned) const {
  weight_map m(store_);
  m.owned_ = owned_;
  m.owned_.insert(m.owned_.end(), owned.begin(), owned.end());
  m.entries_ = std::move(entries);
  return m;
}

}  // namespace troupe::families

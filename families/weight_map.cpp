#include "families/weight_map.hpp"

#include <algorithm>
#include <cstring>

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

std::string key_for(const std::string& pattern, std::int32_t layer, std::int64_t expert = -1) {
  std::string k = pattern;
  const auto at = k.find("{L}");
  if (at != std::string::npos) k.replace(at, 3, std::to_string(layer));
  const auto ex = k.find("{E}");
  if (ex != std::string::npos && expert >= 0) k.replace(ex, 3, std::to_string(expert));
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
    auto v = r.experts > 0 ? std::optional<tensor_view>{} : store.find(key);
    stored_as stored = r.stored;
    if (r.experts > 0) {
      // Stack the experts' tensors: all present, of one type and shape.
      auto first = store.find(key_for(r.key, layer, 0));
      if (!first) {
        if (r.presence == presence::optional) return {};
        return unexpected(weight_error{weight_error_code::missing, role, key_for(r.key, layer, 0), want ? want->str() : "any", ""});
      }
      std::vector<std::int64_t> dims{r.experts};
      dims.insert(dims.end(), first->shape().dims().begin(), first->shape().dims().end());
      const troupe::shape whole{std::span<const std::int64_t>(dims)};
      bool in_order = true;
      std::vector<tensor_view> parts{*first};
      for (std::int64_t x = 1; x < r.experts; ++x) {
        const auto k = key_for(r.key, layer, x);
        auto p = store.find(k);
        if (!p) return unexpected(weight_error{weight_error_code::missing, role, k, first->shape().str(), ""});
        if (p->type() != first->type() || p->shape() != first->shape())
          return unexpected(weight_error{weight_error_code::shape_mismatch, role, k,
                                         std::string(name(first->type())) + first->shape().str(), std::string(name(p->type())) + p->shape().str()});
        in_order = in_order && p->data() == first->data() + static_cast<std::size_t>(x) * first->bytes();
        parts.push_back(*p);
      }
      if (want && whole != *want)
        return unexpected(weight_error{weight_error_code::shape_mismatch, role, key, want->str(), whole.str()});
      if (in_order) {
        v = tensor_view(first->type(), whole, first->data());
      } else {
        auto t = std::make_shared<tensor>(first->type(), whole);
        for (std::size_t x = 0; x < parts.size(); ++x) std::memcpy(t->data() + x * first->bytes(), parts[x].data(), first->bytes());
        v = t->view();
        m.owned_.push_back(std::move(t));
      }
    }
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
    std::optional<tensor_view> perm;
    auto perm_key = [](const std::string& k) { return k.ends_with(".weight") ? k.substr(0, k.size() - 7) + ".input_perm" : std::string(); };
    if (r.experts > 0) {
      if (store.find(perm_key(key_for(r.key, layer, 0))))
        return unexpected(weight_error{weight_error_code::unsupported_dtype, role, key_for(r.key, layer, 0), "experts without act-order (desc_act)",
                                       "act-order"});
    } else if (const auto pk = perm_key(key); !pk.empty()) {
      perm = store.find(pk);
    }
    m.entries_.push_back({role, key, *v, stored, perm});
    return {};
  };
  auto overridden = [&](role ro, std::int32_t l) {
    return std::any_of(rules.begin(), rules.end(), [&](const name_rule& q) { return q.per_layer && q.layer_only == l && q.role == ro; });
  };
  for (const auto& r : rules) {
    if (!r.per_layer) {
      if (auto e = resolve(r, -1); !e) return unexpected(e.error());
      continue;
    }
    if (r.layer_only >= 0) {
      if (r.layer_only < layers)
        if (auto e = resolve(r, r.layer_only); !e) return unexpected(e.error());
      continue;
    }
    for (std::int32_t l = 0; l < layers; ++l)
      if (!overridden(r.role, l))
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

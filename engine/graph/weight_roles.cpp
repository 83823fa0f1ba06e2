#include "engine/graph/weight_roles.hpp"

#include <array>
#include <string>

namespace troupe::graph {

namespace {
constexpr std::array names{
    std::string_view{"none"},
#define TROUPE_ROLE_NAME(n) std::string_view{#n},
    TROUPE_WEIGHT_ROLES(TROUPE_ROLE_NAME)
#undef TROUPE_ROLE_NAME
};
}  // namespace

std::string_view role_name(tensor_role r) {
  const auto i = static_cast<std::size_t>(r);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::optional<tensor_role> role_from_name(std::string_view name) {
  for (std::size_t i = 1; i < names.size(); ++i)
    if (names[i] == name) return static_cast<tensor_role>(i);
  return std::nullopt;
}

tensor_role bias_of(tensor_role r) {
  if (r == tensor_role::none) return tensor_role::none;
  std::string name{role_name(r)};
  name += "_bias";
  return role_from_name(name).value_or(tensor_role::none);
}

bool is_expert_stack(tensor_role r) {
  using enum tensor_role;
  switch (r) {
    case ffn_gate_exps:
    case ffn_up_exps:
    case ffn_down_exps:
    case ffn_gate_exps_bias:
    case ffn_up_exps_bias:
    case ffn_down_exps_bias:
    case hf_gate_up_exps:
    case hf_gate_up_exps_bias:
    case hf_down_exps: return true;
    default: return false;
  }
}

}  // namespace troupe::graph

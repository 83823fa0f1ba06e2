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

std::optional<lora_pools> lora_pools_of(tensor_role target) {
  using enum tensor_role;
  switch (target) {
    case attn_q: return lora_pools{attn_q_lora_a, attn_q_lora_b};
    case attn_k: return lora_pools{attn_k_lora_a, attn_k_lora_b};
    case attn_v: return lora_pools{attn_v_lora_a, attn_v_lora_b};
    case attn_output: return lora_pools{attn_output_lora_a, attn_output_lora_b};
    case ffn_gate: return lora_pools{ffn_gate_lora_a, ffn_gate_lora_b};
    case ffn_up: return lora_pools{ffn_up_lora_a, ffn_up_lora_b};
    case ffn_down: return lora_pools{ffn_down_lora_a, ffn_down_lora_b};
    default: return std::nullopt;
  }
}

}  // namespace troupe::graph

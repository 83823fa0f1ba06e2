#include "engine/graph/weight_roles.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/graph/builder.hpp"

namespace troupe::graph {
namespace {

TEST(weight_roles, every_role_has_one_name_that_reads_back) {
  std::set<std::string> seen;
  for (auto i = 1u;; ++i) {
    const auto r = static_cast<tensor_role>(i);
    const auto n = role_name(r);
    if (n == "?") break;
    EXPECT_TRUE(seen.insert(std::string(n)).second) << "two roles named " << n;
    ASSERT_EQ(role_from_name(n), r) << n;
  }
  EXPECT_GT(seen.size(), 50u);
  EXPECT_EQ(role_from_name("attn_qq"), std::nullopt);
  EXPECT_EQ(role_from_name(""), std::nullopt);
  EXPECT_EQ(role_name(tensor_role::none), "none");
}

TEST(weight_roles, a_bias_is_its_weights_name_plus_bias) {
  EXPECT_EQ(bias_of(tensor_role::attn_q), tensor_role::attn_q_bias);
  EXPECT_EQ(bias_of(tensor_role::ffn_down_exps), tensor_role::ffn_down_exps_bias);
  EXPECT_EQ(bias_of(tensor_role::token_embd_norm), tensor_role::token_embd_norm_bias);
  EXPECT_EQ(bias_of(tensor_role::attn_q_norm), tensor_role::none);  // no such role
  EXPECT_EQ(bias_of(tensor_role::none), tensor_role::none);
  EXPECT_TRUE(is_expert_stack(tensor_role::ffn_up_exps));
  EXPECT_TRUE(is_expert_stack(tensor_role::hf_gate_up_exps_bias));
  EXPECT_FALSE(is_expert_stack(tensor_role::ffn_up_shexp));
  EXPECT_FALSE(is_expert_stack(tensor_role::ffn_gate_inp));
}

TEST(weight_roles, a_weight_is_named_by_its_role_and_layer_and_needs_a_role) {
  EXPECT_EQ((weight_role{tensor_role::attn_q, 3}.str()), "layers.3.attn_q");
  EXPECT_EQ((weight_role{tensor_role::token_embd}.str()), "token_embd");
  builder b;
  b.weight({}, {dtype::f32, troupe::shape{2}});
  EXPECT_FALSE(b.ok());
}

}  // namespace
}  // namespace troupe::graph

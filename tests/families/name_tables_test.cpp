// The GGUF name tables spell each role as llama.cpp's converter names its tensor (blk.N.<role>.weight,
// <role>.bias for the role's bias), so the enum's name table and the checkpoint keys cannot drift apart.
#include "families/components/name_tables.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace troupe::families {
namespace {

// The rule's key with the layer and expert placeholders and the suffix cut away: "attn_q" for
// "blk.{L}.attn_q.weight" and "blk.{L}.attn_q.bias", "ffn_up.{E}" for a per-expert key.
std::string gguf_base(const std::string& key, bool& bias) {
  std::string k = key;
  if (k.starts_with("blk.{L}.")) k = k.substr(8);
  bias = k.ends_with(".bias");
  for (const char* s : {".weight", ".bias"})
    if (k.ends_with(s)) k.resize(k.size() - std::string(s).size());
  return k;
}

TEST(name_tables, gguf_keys_are_the_roles_names) {
  // Where llama.cpp's name differs from the role's on purpose: Phi-3's fused gate_up is stored as
  // ffn_up; gpt-oss's feed-forward norm as post_attention_norm; DeepSeek's selection bias is
  // exp_probs_b.bias (its own role); pre-merge Mixtral files keep one tensor per expert.
  const std::map<std::string, std::string> renamed = {{"ffn_gate_up", "ffn_up"}, {"ffn_norm", "post_attention_norm"},
                                                      {"exp_probs_b", "exp_probs_b"}, {"ffn_gate_exps", "ffn_gate.{E}"},
                                                      {"ffn_up_exps", "ffn_up.{E}"}, {"ffn_down_exps", "ffn_down.{E}"}};
  std::size_t checked = 0;
  for (name_table_options o : {name_table_options{.gguf = true}, name_table_options{.gguf = true, .qk_norm = true, .sandwich_norms = true},
                               name_table_options{.gguf = true, .fused = true}, name_table_options{.gguf = true, .experts = 8, .shared_expert = true},
                               name_table_options{.gguf = true, .experts = 8, .shared_experts = true, .mla = true},
                               name_table_options{.gguf = true, .experts = 8, .shared_experts = true, .mla = true, .mtp = true},
                               name_table_options{.gguf = true, .experts = 8, .gpt_oss = true}}) {
    for (const auto& r : decoder_name_table(o)) {
      bool bias = false;
      const auto base = gguf_base(r.key, bias);
      std::string want{role_name(r.role)};
      if (want.starts_with("nextn_")) want[5] = '.';  // llama.cpp's blk.N.nextn.eh_proj
      if (bias && r.role != role::exp_probs_b) {
        ASSERT_TRUE(want.ends_with("_bias")) << r.key << " feeds " << want;
        want.resize(want.size() - 5);
      }
      if (base == want) {
        ++checked;
        continue;
      }
      const auto it = renamed.find(want);
      EXPECT_TRUE(it != renamed.end() && it->second == base) << r.key << " feeds role " << role_name(r.role);
    }
  }
  EXPECT_GT(checked, 60u);
}

}  // namespace
}  // namespace troupe::families

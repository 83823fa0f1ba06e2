#include "families/families.hpp"

namespace troupe::families {

// SHIPPED: adding a family is its folder plus one row here.
std::span<const family_entry> shipped() {
  static const family_entry entries[] = {llama_entry, mistral_entry, qwen2_entry, qwen3_entry, gemma2_entry, gemma3_entry, phi3_entry,
                                               qwen3_moe_entry, mixtral_entry, qwen2_moe_entry,
                                               deepseek_v2_entry, deepseek_v3_entry, olmoe_entry, gpt_oss_entry,
                                               olmo2_entry, granite_entry, smollm3_entry, gemma_entry, starcoder2_entry, mamba2_entry,
                                               nemotron_h_entry, qwen3_next_entry, granite_hybrid_entry, falcon_h1_entry, lfm2_entry, bloom_entry, mpt_entry,
                                               bert_entry, nomic_bert_entry};
  return entries;
}

}  // namespace troupe::families

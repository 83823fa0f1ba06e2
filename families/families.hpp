#pragma once
// The entries of the shipped families; `shipped()` (shipped.cpp) lists them in one place.
#include "families/registry.hpp"

namespace troupe::families {

extern const family_entry llama_entry;
extern const family_entry mistral_entry;
extern const family_entry qwen2_entry;
extern const family_entry qwen3_entry;
extern const family_entry gemma2_entry;
extern const family_entry gemma3_entry;
extern const family_entry phi3_entry;
extern const family_entry qwen3_moe_entry;
extern const family_entry mixtral_entry;
extern const family_entry qwen2_moe_entry;
extern const family_entry deepseek_v2_entry;
extern const family_entry deepseek_v3_entry;
extern const family_entry olmoe_entry;
extern const family_entry gpt_oss_entry;
extern const family_entry olmo2_entry;
extern const family_entry granite_entry;
extern const family_entry smollm3_entry;
extern const family_entry gemma_entry;
extern const family_entry starcoder2_entry;
extern const family_entry mamba2_entry;
extern const family_entry nemotron_h_entry;
extern const family_entry qwen3_next_entry;
extern const family_entry bloom_entry;
extern const family_entry mpt_entry;
extern const family_entry granite_hybrid_entry;
extern const family_entry falcon_h1_entry;
extern const family_entry lfm2_entry;
extern const family_entry bert_entry;
extern const family_entry nomic_bert_entry;

}  // namespace troupe::families

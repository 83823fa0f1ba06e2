#pragma once
// `troupe generate`, `troupe fixture` and `troupe feature-matrix`: the model layer from the command line.
#include <cstdint>
#include <string>
#include <vector>

#include "apps/speculation_flags.hpp"

namespace troupe::app {

struct generate_options {
  std::string model;
  std::string mmproj;               // a vision tower (llama.cpp's mmproj GGUF) beside a GGUF model
  std::vector<std::string> images;  // image files, one per <start_of_image> in the prompt
  std::string prompt;
  std::vector<std::int32_t> prompt_ids;
  bool has_prompt_ids = false;
  std::int64_t max_tokens = 16;
  double temperature = 0.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 0;
  std::int64_t logprobs = 0;
  std::string backend = "cpu";
  int device = 0;  // --backend cuda: which GPU
  std::int64_t threads = 0;
  int pipeline_parallel = 1;  // stages of one replica, each over a range of the layers
  int tensor_parallel = 1;  // ranks of one replica split over simulated CPU devices in this process
  std::string kv_type = "f16";  // the KV cache's element type (model::with_kv_type), every backend
  int expert_parallel = 1;  // its ranks hold whole experts (the group is this many ranks; tensor_parallel 1 or equal)
  bool json = false;
  // A constrained output (at most one; the driver path, --backend cpu or cuda): a JSON schema (text, or
  // @path), any JSON object, a regular expression, a GBNF grammar (text, or @path), a list of choices.
  std::string json_schema;
  bool json_object = false;
  std::string regex;
  std::string grammar;
  std::vector<std::string> choices;
  speculation_flags speculation;  // the driver path: --speculative ngram[:K] | --draft-model PATH
  int beams = 1;                   // the driver path: > 1, a beam search of that width (every hypothesis printed)
  double length_penalty = 1.0;
  bool early_stopping = false;
  std::int64_t chain = 1;          // the driver path: chained decode, up to this many steps per executor call
  std::string adapter;             // the driver path (cpu): a PEFT LoRA adapter directory applied to the request
};
int run_generate(const generate_options& opt);

struct fixture_options {
  std::string family;
  std::string out;
  bool gguf = false;
  std::vector<std::int64_t> dims;  // vocab, hidden, ffn, layers, heads, kv_heads, head_dim (any prefix)
  std::string type = "f32";        // how matrices are stored
  bool tied = false;
  bool legacy_gguf = false;
  bool mtp = false;  // deepseek_v3: a multi-token-prediction layer
  std::vector<std::int64_t> experts;  // routed families: experts, experts per token, expert width, shared width (any prefix)
  std::vector<std::int64_t> ssm;      // recurrent families: state size, groups, conv kernel, expansion (any prefix)
  std::string lora_over;              // write a PEFT LoRA adapter over this HF checkpoint to --out instead
  std::int64_t lora_rank = 4;
  std::uint64_t seed = 1;
  std::string merged_with;            // write --lora-over's checkpoint with this adapter merged to --out instead
  std::string lora_to_gguf;           // write this PEFT adapter in llama.cpp's GGUF LoRA form (for --gguf-base) to --out
  std::string gguf_base;
  std::string hf_quant;               // the Hugging Face form as a quantizer stores it (gptq, awq, fp8-block, ...)
  bool hf_quant_reference = false;    // with hf_quant: the f32 checkpoint of the values it decodes to
};
int run_fixture(const fixture_options& opt);

// Prints docs/feature-matrix.md: each shipped family's fixture traced in every program and form.
int run_feature_matrix();

}  // namespace troupe::app

#pragma once
// LoRA adapters as PEFT saves them (docs/adapters.md): a directory with adapter_config.json and
// adapter_model.safetensors. Each adapted linear of layer L is a pair lora_A [r, K] and lora_B [N, r]
// under "<prefix>.layers.L.<...>.<module>.lora_A.weight"; the adapter adds scale * B (A x) to the
// linear's output, scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). What troupe does not
// implement is refused by its field (unsupported_adapter): DoRA, fan_in_fan_out, per-module rank or
// alpha patterns, trained biases, modules_to_save, embedding adapters; tensors that disagree with each
// other or the config are bad_adapter naming the tensor.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load {

struct peft_module {
  std::string module;  // the adapted linear's own name: "q_proj", "down_proj", ...
  std::int32_t layer = -1;
  tensor a;  // f32 [r, K]
  tensor b;  // f32 [N, r]
};

struct peft_adapter {
  std::int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;
  std::vector<std::string> target_modules;
  std::vector<peft_module> modules;  // by (layer, module)
  // A GGUF LoRA (llama.cpp's convert_lora_to_gguf): modules are GGUF role names ("attn_q"), laid out
  // as the GGUF base's weights are (Q/K rows permuted where its converter permutes them), for `arch`.
  bool gguf_layout = false;
  std::string arch;
  double scale() const;
};

// A per-layer linear's place in a Hugging Face tensor name without its suffix,
// "<...>.layers.L.<...>.<module>" -> (L, module); nullopt when the name has no layer number.
std::optional<std::pair<std::int32_t, std::string>> layer_linear(std::string_view stem);

// Parses adapter_config.json's text (`name` stands for the file in errors).
result<peft_adapter, load_error> parse_peft_config(std::string_view json, const std::string& name);
// Reads a PEFT adapter directory: its config and every lora_A / lora_B pair (f32, f16 or bf16 as stored,
// widened to f32).
result<peft_adapter, load_error> read_peft_adapter(const std::filesystem::path& dir);
// Reads a GGUF LoRA file as llama.cpp does (general.type "adapter", adapter.type "lora",
// adapter.lora.alpha; blk.N.<name>.weight.lora_a [r, K] and .lora_b [N, r]); scale alpha / r, or 1
// without alpha. One rank for every pair (a file of mixed ranks is refused).
result<peft_adapter, load_error> read_gguf_lora(const std::filesystem::path& file);
// A .gguf file through read_gguf_lora, anything else as a PEFT directory.
result<peft_adapter, load_error> read_lora_adapter(const std::filesystem::path& path);

}  // namespace troupe::load

#pragma once
// How a model's encode hidden states become one embedding per input: the pooling a checkpoint declares
// (a GGUF's `<arch>.pooling_type`; a sentence-transformers directory's modules.json, its Pooling
// module's config.json and a Normalize module), else the decoder default: the last token's state,
// L2-normalized (what Qwen3-Embedding-style decoder embedders use, and llama.cpp's `last`).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "engine/load/raw_config.hpp"

namespace troupe::families {

enum class pooling_mode : std::uint8_t { mean, cls, last };
std::string_view name(pooling_mode m);
std::optional<pooling_mode> pooling_named(std::string_view name);

struct pooling {
  pooling_mode mode = pooling_mode::last;
  bool normalize = true;
  std::string declared_by = "default";  // "gguf pooling_type", "sentence-transformers", "default"
};

// `path`: the checkpoint (a GGUF file or a directory); `cfg`: its configuration.
pooling pooling_of(const std::filesystem::path& path, const load::raw_config& cfg);

}  // namespace troupe::families

#include "engine/core/dtype.hpp"

#include <array>
#include <limits>

namespace troupe {
namespace {

constexpr std::array<dtype_info, dtype_count> table = {{
    {"f64", 1, 8, true, false, 28u, "F64"},
    {"f32", 1, 4, true, false, 0u, "F32"},
    {"f16", 1, 2, true, false, 1u, "F16"},
    {"bf16", 1, 2, true, false, 30u, "BF16"},
    {"fp8_e4m3", 1, 1, true, false, std::nullopt, "F8_E4M3"},
    {"fp8_e5m2", 1, 1, true, false, std::nullopt, "F8_E5M2"},
    {"i64", 1, 8, false, true, 27u, "I64"},
    {"i32", 1, 4, false, true, 26u, "I32"},
    {"i16", 1, 2, false, true, 25u, "I16"},
    {"i8", 1, 1, false, true, 24u, "I8"},
    {"u8", 1, 1, false, true, std::nullopt, "U8"},
    {"bool", 1, 1, false, true, std::nullopt, "BOOL"},
    {"q4_0", 32, 18, false, false, 2u, std::nullopt},
    {"q4_1", 32, 20, false, false, 3u, std::nullopt},
    {"q5_0", 32, 22, false, false, 6u, std::nullopt},
    {"q5_1", 32, 24, false, false, 7u, std::nullopt},
    {"q8_0", 32, 34, false, false, 8u, std::nullopt},
    {"q8_1", 32, 36, false, false, 9u, std::nullopt},
    {"q2_k", 256, 84, false, false, 10u, std::nullopt},
    {"q3_k", 256, 110, false, false, 11u, std::nullopt},
    {"q4_k", 256, 144, false, false, 12u, std::nullopt},
    {"q5_k", 256, 176, false, false, 13u, std::nullopt},
    {"q6_k", 256, 210, false, false, 14u, std::nullopt},
    {"q8_k", 256, 292, false, false, 15u, std::nullopt},
    {"mxfp4", 32, 17, false, false, 39u, std::nullopt},
    {"iq4_nl", 32, 18, false, false, 20u, std::nullopt},
    {"iq4_xs", 256, 136, false, false, 23u, std::nullopt},
    {"q4_a32", 32, 20, false, false, std::nullopt, std::nullopt},
    {"q8_a32", 32, 40, false, false, std::nullopt, std::nullopt},
    {"fp8_s32", 32, 36, false, false, std::nullopt, std::nullopt},
}};

}  // namespace

const dtype_info& info(dtype t) { return table[static_cast<std::size_t>(t)]; }

std::optional<dtype> dtype_from_name(std::string_view name) {
  for (int i = 0; i < dtype_count; ++i)
    if (table[i].name == name) return static_cast<dtype>(i);
  return std::nullopt;
}

std::optional<dtype> dtype_from_gguf(std::uint32_t ggml_type) {
  for (int i = 0; i < dtype_count; ++i)
    if (table[i].gguf_id == ggml_type) return static_cast<dtype>(i);
  return std::nullopt;
}

std::optional<dtype> dtype_from_safetensors(std::string_view code) {
  for (int i = 0; i < dtype_count; ++i)
    if (table[i].safetensors == code) return static_cast<dtype>(i);
  return std::nullopt;
}

std::optional<std::size_t> storage_bytes(dtype t, std::uint64_t elems) {
  const auto& in = info(t);
  if (elems % in.block_elems != 0) return std::nullopt;
  const std::uint64_t blocks = elems / in.block_elems;
  if (blocks > std::numeric_limits<std::size_t>::max() / in.block_bytes) return std::nullopt;
  return static_cast<std::size_t>(blocks * in.block_bytes);
}

}  // namespace troupe

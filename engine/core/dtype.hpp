#pragma once
// Element types of tensors: plain scalars and the block-quantized formats of GGUF. A block type packs
// `block_elems` values into `block_bytes` bytes; a plain type is a block of one. The numbering of the
// GGUF types is the file format's (ggml_type); conversion to and from names lives here too.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

enum class dtype : std::uint8_t {
  f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2,
  i64, i32, i16, i8, u8, boolean,
  q4_0, q4_1, q5_0, q5_1, q8_0, q8_1,
  q2_k, q3_k, q4_k, q5_k, q6_k, q8_k,
  mxfp4,  // OCP microscaling FP4: 32 E2M1 values and one E8M0 scale a block (gpt-oss's experts)
  iq4_nl,  // ggml IQ4_NL: 32 codes into a fixed non-linear table of 16 int8 values, one f16 scale a block
  iq4_xs,  // ggml IQ4_XS: IQ4_NL's table in 256-superblocks, a 6-bit scale per 32 and one f16 scale
  // troupe's own row forms of the Hugging Face quantized linears (GPTQ, AWQ, compressed-tensors, FP8),
  // which the loader builds from the stored tensors (engine/load/hf_quant.hpp); never in a file:
  q4_a32,   // 4-bit affine: per 32, f16 scale d, u8 zero z, u8 0, 16 bytes of nibbles (q4_0's order): d (q - z)
  q8_a32,   // 8-bit affine: per 32, f32 d, u8 z, 3 zero bytes, 32 u8 codes: d (q - z) (int8 checkpoints keep
            // per-channel f32 scales, which f16 would round)
  fp8_s32,  // FP8 E4M3 with a scale: per 32, f32 s, 32 E4M3 codes: s e4m3(q)
};
inline constexpr int dtype_count = static_cast<int>(dtype::fp8_s32) + 1;

struct dtype_info {
  std::string_view name;        // "f32", "q4_k"
  std::size_t block_elems;      // 1 for plain types
  std::size_t block_bytes;      // bytes of one block (of one element for plain types)
  bool is_float;                // a plain floating-point type
  bool is_integer;              // a plain integer (or boolean) type
  std::optional<std::uint32_t> gguf_id;        // ggml_type, when GGUF can store it
  std::optional<std::string_view> safetensors;  // "F32", when safetensors can store it
};

const dtype_info& info(dtype t);
inline std::string_view name(dtype t) { return info(t).name; }
inline bool is_quantized(dtype t) { return info(t).block_elems > 1; }
inline bool is_float(dtype t) { return info(t).is_float; }
inline bool is_integer(dtype t) { return info(t).is_integer; }

std::optional<dtype> dtype_from_name(std::string_view name);
std::optional<dtype> dtype_from_gguf(std::uint32_t ggml_type);
std::optional<dtype> dtype_from_safetensors(std::string_view code);

// Bytes needed for `elems` elements, or nullopt when elems is not a whole number of blocks or the
// byte count overflows.
std::optional<std::size_t> storage_bytes(dtype t, std::uint64_t elems);

}  // namespace troupe

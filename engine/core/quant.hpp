#pragma once
// Row conversion between f32 and the element types that hold real numbers: the GGUF block formats
// and the plain floats. Layouts and arithmetic are ggml's reference code (ggml-quants.c), so rows
// decode to llama.cpp's floats and quantize to its bytes. A reference path, not a kernel: scalar
// code, no importance-matrix quantization.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/dtype.hpp"
#include "engine/core/result.hpp"

namespace troupe {

enum class quant_error_code {
  not_whole_blocks,  // the element count is negative or not a multiple of the block size
  unsupported_type,  // no conversion for this type in this direction
};

struct quant_error {
  quant_error_code code;
  dtype type;
  std::int64_t elems;
  std::string message() const;
};

// dequantize_row: every block format and every plain float type. quantize_row: q4_0, q4_1, q5_0,
// q5_1, q8_0, q8_k, q4_k, q5_k, q6_k, mxfp4, iq4_nl, iq4_xs, the repacked forms and the plain float types.
bool supports_dequantize(dtype t);
bool supports_quantize(dtype t);

// Decodes `n` elements of type `t` at `src` (storage_bytes(t, n) bytes, any alignment) into `dst`.
// MXFP4 blocks rewritten as q8_0 blocks with the same values, exactly: each E2M1 code (doubled, an
// integer in [-12, 12]) as an int8 and the E8M0 scale (halved) as q8_0's f16 d. False, with dst
// unspecified, when a block's scale is outside f16's range (below 2^-24 or above 2^15).
[[nodiscard]] bool mxfp4_as_q8_0(const std::byte* src, std::byte* dst, std::int64_t blocks);

[[nodiscard]] result<void, quant_error> dequantize_row(dtype t, const std::byte* src, float* dst,
                                                       std::int64_t n);

// Encodes `n` floats into storage_bytes(t, n) bytes at `dst`, byte for byte as ggml's
// quantize_row_*_ref wherever that is defined (it breaks down once a block scale overflows f16).
// Non-finite or extreme inputs give defined but meaningless codes, never undefined behaviour.
[[nodiscard]] result<void, quant_error> quantize_row(dtype t, const float* src, std::byte* dst,
                                                     std::int64_t n);

}  // namespace troupe

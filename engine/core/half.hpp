#pragma once
// Conversions between f32 and the narrow float formats: IEEE binary16, bfloat16 and the two OCP fp8
// formats (e4m3fn: no infinities, 0x7f/0xff are NaN; e5m2: IEEE-like). Rounding is to nearest, ties to
// even, as hardware and PyTorch do; values past an fp8 range saturate to its largest finite value.
#include <cstdint>

namespace troupe {

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16(float f);
float fp8_e4m3_to_f32(std::uint8_t v);
std::uint8_t f32_to_fp8_e4m3(float f);
float fp8_e5m2_to_f32(std::uint8_t v);
std::uint8_t f32_to_fp8_e5m2(float f);

}  // namespace troupe

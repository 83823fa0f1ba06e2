#pragma once
// Images as a vision tower's front end reads them (docs/vision.md): decoded bytes and Pillow's
// resampling. Depends on nothing but the standard library and result.hpp (fuzzed alone:
// fuzz/image_decode_fuzz.cpp).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe::families {

// An 8-bit RGB image, rows top to bottom, pixels interleaved.
struct image_u8 {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
};

struct image_error {
  std::string reason;
  std::string message() const { return "image: " + reason; }
};

// Decodes PNG (libpng) or JPEG (libjpeg-turbo) bytes to 8-bit RGB; other formats are refused. At most
// `max_pixels` pixels; refused with a reason otherwise.
result<image_u8, image_error> decode_image(std::span<const std::uint8_t> bytes, std::int64_t max_pixels = 64LL << 20);

// Pillow's separable resampling (as llama.cpp's mtmd and transformers' image processors do), with
// 22-bit fixed-point weights: bilinear (support 1), bicubic (a = -0.5, support 2), lanczos (3).
enum class resample : std::uint8_t { bilinear, bicubic, lanczos };
image_u8 resize(const image_u8& img, std::int64_t width, std::int64_t height, resample how);

}  // namespace troupe::families

// PNG layouts decoded as llama.cpp's reader (stb_image) decodes them, so an image reaches the vision
// tower with the bytes llama.cpp's mtmd sees: stored values with no gamma or colour-space conversion,
// 16-bit samples cut to their high byte, palettes and low-depth grey expanded, grey replicated, alpha
// and tRNS dropped. Each file is written here byte by byte (stored deflate blocks), so the test needs
// no encoder that could share a decoder's assumptions.
#include "families/vision/image.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::families {
namespace {

using bytes = std::vector<std::uint8_t>;

std::uint32_t crc32(const std::uint8_t* p, std::size_t n, std::uint32_t c = 0xffffffffu) {
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c;
}

void be32(bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

void chunk(bytes& out, const char* type, const bytes& data) {
  be32(out, static_cast<std::uint32_t>(data.size()));
  bytes td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  out.insert(out.end(), td.begin(), td.end());
  be32(out, crc32(td.data(), td.size()) ^ 0xffffffffu);
}

// A zlib stream of stored blocks (no compression) around `raw`.
bytes zlib_stored(const bytes& raw) {
  bytes z{0x78, 0x01};
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - at);
    z.push_back(at + n == raw.size() ? 1 : 0);
    z.push_back(static_cast<std::uint8_t>(n)), z.push_back(static_cast<std::uint8_t>(n >> 8));
    z.push_back(static_cast<std::uint8_t>(~n)), z.push_back(static_cast<std::uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(at), raw.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < raw.size());
  std::uint32_t a = 1, b = 0;
  for (auto v : raw) a = (a + v) % 65521, b = (b + a) % 65521;
  be32(z, (b << 16) | a);
  return z;
}

struct png_spec {
  std::uint32_t w = 0, h = 0;
  std::uint8_t depth = 8, type = 2;
  std::vector<bytes> rows;  // each row's samples, without the filter byte
  std::vector<std::pair<const char*, bytes>> extra;  // chunks before IDAT
};

bytes png(const png_spec& s) {
  bytes out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  bytes ihdr;
  be32(ihdr, s.w), be32(ihdr, s.h);
  ihdr.insert(ihdr.end(), {s.depth, s.type, 0, 0, 0});
  chunk(out, "IHDR", ihdr);
  for (const auto& [t, d] : s.extra) chunk(out, t, d);
  bytes raw;
  for (const auto& r : s.rows) {
    raw.push_back(0);
    raw.insert(raw.end(), r.begin(), r.end());
  }
  chunk(out, "IDAT", zlib_stored(raw));
  chunk(out, "IEND", {});
  return out;
}

std::uint8_t sample(std::uint32_t x, std::uint32_t y, int c) { return static_cast<std::uint8_t>(17 * x + 53 * y + 101 * c + 7); }

image_u8 decoded(const bytes& file) {
  auto img = decode_image(file);
  EXPECT_TRUE(img) << (img ? "" : img.error().message());
  return img ? *img : image_u8{};
}

void expect_pixels(const image_u8& img, std::uint32_t w, std::uint32_t h, auto&& want) {
  ASSERT_EQ(img.width, w);
  ASSERT_EQ(img.height, h);
  ASSERT_EQ(img.rgb.size(), std::size_t{w} * h * 3);
  for (std::uint32_t y = 0; y < h; ++y)
    for (std::uint32_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(img.rgb[(std::size_t{y} * w + x) * 3 + static_cast<std::size_t>(c)], want(x, y, c)) << x << "," << y << " channel " << c;
}

constexpr std::uint32_t W = 7, H = 5;

TEST(png_decode, rgb_is_kept_as_stored_whatever_gamma_or_colour_space_the_file_names) {
  png_spec s{W, H, 8, 2, {}, {}};
  for (std::uint32_t y = 0; y < H; ++y) {
    bytes r;
    for (std::uint32_t x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) r.push_back(sample(x, y, c));
    s.rows.push_back(r);
  }
  const auto want = [](std::uint32_t x, std::uint32_t y, int c) { return sample(x, y, c); };
  expect_pixels(decoded(png(s)), W, H, want);
  // gAMA 1.0 (libpng's simplified reader turned these into sRGB), gAMA 1/2.2 with sRGB, and a cHRM.
  for (const auto& extra : std::vector<std::vector<std::pair<const char*, bytes>>>{
           {{"gAMA", {0, 1, 0x86, 0xa0}}},
           {{"sRGB", {0}}, {"gAMA", {0, 0, 0xb1, 0x8f}}},
           {{"gAMA", {0, 0, 0x75, 0x30}}, {"cHRM", bytes(32, 1)}}}) {
    auto g = s;
    g.extra = extra;
    expect_pixels(decoded(png(g)), W, H, want);
  }
}

TEST(png_decode, sixteen_bit_samples_keep_their_high_byte) {
  png_spec rgb{W, H, 16, 2, {}, {}}, grey_alpha{W, H, 16, 4, {}, {}};
  for (std::uint32_t y = 0; y < H; ++y) {
    bytes r, g;
    for (std::uint32_t x = 0; x < W; ++x) {
      for (int c = 0; c < 3; ++c) r.insert(r.end(), {sample(x, y, c), static_cast<std::uint8_t>(255 - c)});  // low bytes near 255
      g.insert(g.end(), {sample(x, y, 1), 0xff, static_cast<std::uint8_t>(x * 30), 0x80});
    }
    rgb.rows.push_back(r);
    grey_alpha.rows.push_back(g);
  }
  expect_pixels(decoded(png(rgb)), W, H, [](std::uint32_t x, std::uint32_t y, int c) { return sample(x, y, c); });
  expect_pixels(decoded(png(grey_alpha)), W, H, [](std::uint32_t x, std::uint32_t y, int) { return sample(x, y, 1); });
}

TEST(png_decode, palettes_grey_and_alpha_expand_to_rgb_without_compositing) {
  // RGBA: the colour channels as stored, the alpha dropped (stb_image does not blend onto white).
  png_spec rgba{W, H, 8, 6, {}, {}};
  for (std::uint32_t y = 0; y < H; ++y) {
    bytes r;
    for (std::uint32_t x = 0; x < W; ++x) r.insert(r.end(), {sample(x, y, 0), sample(x, y, 1), sample(x, y, 2), static_cast<std::uint8_t>(x * 40)});
    rgba.rows.push_back(r);
  }
  expect_pixels(decoded(png(rgba)), W, H, [](std::uint32_t x, std::uint32_t y, int c) { return sample(x, y, c); });
  // A 4-colour palette of 2-bit indices with a tRNS: the palette's colours.
  png_spec pal{W, H, 2, 3, {}, {{"PLTE", {10, 20, 30, 40, 50, 60, 70, 80, 90, 200, 210, 220}}, {"tRNS", {0, 128}}}};
  auto index = [](std::uint32_t x, std::uint32_t y) { return static_cast<std::uint8_t>((x + 2 * y) % 4); };
  for (std::uint32_t y = 0; y < H; ++y) {
    bytes r((W * 2 + 7) / 8, 0);
    for (std::uint32_t x = 0; x < W; ++x) r[x / 4] |= static_cast<std::uint8_t>(index(x, y) << (6 - 2 * (x % 4)));
    pal.rows.push_back(r);
  }
  const std::uint8_t colours[4][3] = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}, {200, 210, 220}};
  expect_pixels(decoded(png(pal)), W, H, [&](std::uint32_t x, std::uint32_t y, int c) { return colours[index(x, y)][c]; });
  // 4-bit grey: v x 17 in every channel.
  png_spec grey{W, H, 4, 0, {}, {}};
  for (std::uint32_t y = 0; y < H; ++y) {
    bytes r((W + 1) / 2, 0);
    for (std::uint32_t x = 0; x < W; ++x) r[x / 2] |= static_cast<std::uint8_t>(((x + y) % 16) << (x % 2 ? 0 : 4));
    grey.rows.push_back(r);
  }
  expect_pixels(decoded(png(grey)), W, H, [](std::uint32_t x, std::uint32_t y, int) { return static_cast<std::uint8_t>(17 * ((x + y) % 16)); });
}

TEST(png_decode, damaged_files_are_refused_with_a_reason) {
  png_spec s{W, H, 8, 2, {}, {}};
  for (std::uint32_t y = 0; y < H; ++y) s.rows.push_back(bytes(W * 3, 9));
  const auto good = png(s);
  ASSERT_TRUE(decode_image(good));
  // Cut inside the image data, a flipped CRC, a bad bit depth, and more pixels than allowed.
  for (std::size_t cut : {good.size() / 2, std::size_t{40}, std::size_t{12}}) {
    auto r = decode_image(std::span(good.data(), cut));
    ASSERT_FALSE(r) << cut;
    EXPECT_NE(r.error().reason.find("PNG"), std::string::npos) << r.error().message();
  }
  auto crc = good;
  crc[29] ^= 0xff;  // IHDR's CRC
  EXPECT_FALSE(decode_image(crc));
  auto depth = s;
  depth.depth = 5;
  EXPECT_FALSE(decode_image(png(depth)));
  auto big = decode_image(good, W * H - 1);
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().reason.find("pixels"), std::string::npos) << big.error().message();
}

}  // namespace
}  // namespace troupe::families

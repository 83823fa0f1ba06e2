#include "families/vision/image.hpp"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <optional>
#include <string_view>

namespace troupe::families {

namespace {

// A PNG as stb_image (llama.cpp's reader) gives it: 8-bit RGB with the stored values as they are. No
// gamma or colour-space conversion (gAMA, sRGB, iCCP and cHRM are ignored; libpng's simplified reader
// converted a gAMA 1.0 or 16-bit file to sRGB, 0.17 of log-probability away from llama.cpp), 16-bit
// samples cut to their high byte, palettes and low-depth grey expanded, grey replicated, alpha (and
// tRNS) dropped without compositing. libpng reports errors by longjmp: nothing with a destructor is
// created between setjmp and the last libpng call, and the output buffer is sized before it.
struct png_read_state {
  std::span<const std::uint8_t> bytes;
  std::size_t at = 8;  // past the signature, which the caller checked
  char message[160] = {};
};

void png_read_bytes(png_structp p, png_bytep out, png_size_t n) {
  auto* st = static_cast<png_read_state*>(png_get_io_ptr(p));
  if (n > st->bytes.size() - st->at) png_error(p, "the file ends early");
  std::memcpy(out, st->bytes.data() + st->at, n);
  st->at += n;
}

void png_fail(png_structp p, png_const_charp msg) {
  auto* st = static_cast<png_read_state*>(png_get_error_ptr(p));
  std::snprintf(st->message, sizeof st->message, "%s", msg);
  png_longjmp(p, 1);
}

void png_quiet(png_structp, png_const_charp) {}

// Reads the header (setjmp scope 1), then the rows into `rgb`, sized from the header (scope 2).
bool png_read_header(png_structp p, png_infop info, png_uint_32& w, png_uint_32& h) {
  if (setjmp(png_jmpbuf(p))) return false;
  png_set_sig_bytes(p, 8);
  png_read_info(p, info);
  w = png_get_image_width(p, info);
  h = png_get_image_height(p, info);
  const int type = png_get_color_type(p, info);
  png_set_expand(p);  // palette -> RGB, grey below 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(p);
  png_set_strip_alpha(p);
  if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(p);
  png_set_interlace_handling(p);
  png_read_update_info(p, info);
  return png_get_rowbytes(p, info) == static_cast<png_size_t>(w) * 3;
}

bool png_read_rows(png_structp p, png_bytepp rows) {
  if (setjmp(png_jmpbuf(p))) return false;
  png_read_image(p, rows);
  png_read_end(p, nullptr);
  return true;
}

result<std::vector<std::uint8_t>, image_error> decode_png_rgb8(std::span<const std::uint8_t> bytes, std::int64_t max_pixels,
                                                                std::int64_t& width, std::int64_t& height) {
  png_read_state st{bytes};
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &st, png_fail, png_quiet);
  if (!p) return unexpected(image_error{"PNG: cannot start the decoder"});
  png_infop info = png_create_info_struct(p);
  if (!info) {
    png_destroy_read_struct(&p, nullptr, nullptr);
    return unexpected(image_error{"PNG: cannot start the decoder"});
  }
  png_set_read_fn(p, &st, png_read_bytes);
  png_uint_32 w = 0, h = 0;
  const bool header = png_read_header(p, info, w, h);
  auto fail = [&](std::string why) {
    png_destroy_read_struct(&p, &info, nullptr);
    return unexpected(image_error{"PNG: " + std::move(why)});
  };
  if (!header) return fail(st.message[0] ? st.message : "an unsupported pixel layout");
  const auto W = static_cast<std::int64_t>(w), H = static_cast<std::int64_t>(h);
  if (W < 1 || H < 1 || W * H > max_pixels)
    return fail(std::to_string(W) + " x " + std::to_string(H) + " pixels: none, or more than " + std::to_string(max_pixels));
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(W * H * 3));
  std::vector<png_bytep> rows(static_cast<std::size_t>(H));
  for (std::int64_t y = 0; y < H; ++y) rows[static_cast<std::size_t>(y)] = rgb.data() + y * W * 3;
  if (!png_read_rows(p, rows.data())) return fail(st.message[0] ? st.message : "unreadable rows");
  png_destroy_read_struct(&p, &info, nullptr);
  width = W, height = H;
  return rgb;
}

}  // namespace

result<image_u8, image_error> decode_image(std::span<const std::uint8_t> bytes, std::int64_t max_pixels) {
  if (bytes.empty() || bytes.size() > (std::size_t{1} << 30)) return unexpected(image_error{"no bytes, or more than 1 GiB"});
  auto starts = [&](std::string_view magic) {
    return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
  };
  auto too_big = [&](std::int64_t w, std::int64_t h) -> std::optional<image_error> {
    if (w < 1 || h < 1 || w * h > max_pixels)
      return image_error{std::to_string(w) + " x " + std::to_string(h) + " pixels: none, or more than " + std::to_string(max_pixels)};
    return std::nullopt;
  };
  image_u8 img;
  if (starts("\x89PNG\r\n\x1a\n")) {
    auto rgb = decode_png_rgb8(bytes, max_pixels, img.width, img.height);
    if (!rgb) return unexpected(rgb.error());
    img.rgb = std::move(*rgb);
    return img;
  }
  if (starts("\xff\xd8\xff")) {
    // libjpeg-turbo: the accurate integer IDCT and smooth upsampling (its defaults).
    tjhandle t = tjInitDecompress();
    if (!t) return unexpected(image_error{"JPEG: cannot start the decoder"});
    int w = 0, h = 0, sub = 0, space = 0;
    auto fail = [&](const char* what) {
      image_error e{std::string("JPEG: ") + what + ": " + tjGetErrorStr2(t)};
      tjDestroy(t);
      return unexpected(e);
    };
    if (tjDecompressHeader3(t, bytes.data(), static_cast<unsigned long>(bytes.size()), &w, &h, &sub, &space) != 0) return fail("header");
    if (auto e = too_big(w, h)) {
      tjDestroy(t);
      return unexpected(*e);
    }
    img.width = w, img.height = h;
    img.rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
    if (tjDecompress2(t, bytes.data(), static_cast<unsigned long>(bytes.size()), img.rgb.data(), w, 0, h, TJPF_RGB, 0) != 0) return fail("data");
    tjDestroy(t);
    return img;
  }
  return unexpected(image_error{"not a PNG or JPEG image"});
}

namespace {

double filter(resample how, double x) {
  if (how == resample::lanczos) {
    auto sinc = [](double v) { return v == 0.0 ? 1.0 : std::sin(v * std::numbers::pi) / (v * std::numbers::pi); };
    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0;
  }
  x = std::abs(x);
  if (how == resample::bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

constexpr int precision_bits = 32 - 8 - 2;

// Pillow's coefficients for one axis: each output pixel's first input, count and fixed-point weights.
struct axis_weights {
  std::int64_t ksize = 0;
  std::vector<std::int64_t> first, count;
  std::vector<std::int32_t> w;
};

axis_weights weights_for(std::int64_t in, std::int64_t out, resample how) {
  const double support_unit = how == resample::bilinear ? 1.0 : how == resample::bicubic ? 2.0 : 3.0;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = support_unit * filterscale;
  axis_weights a;
  a.ksize = static_cast<std::int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<std::size_t>(out));
  a.count.resize(static_cast<std::size_t>(out));
  a.w.assign(static_cast<std::size_t>(out * a.ksize), 0);
  std::vector<double> pre(static_cast<std::size_t>(a.ksize));
  for (std::int64_t xx = 0; xx < out; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    auto xmin = static_cast<std::int64_t>(center - support + 0.5);
    xmin = std::max<std::int64_t>(xmin, 0);
    auto xmax = static_cast<std::int64_t>(center + support + 0.5);
    xmax = std::min(xmax, in) - xmin;
    double ww = 0.0;
    for (std::int64_t x = 0; x < xmax; ++x) {
      pre[static_cast<std::size_t>(x)] = filter(how, (static_cast<double>(x + xmin) - center + 0.5) * ss);
      ww += pre[static_cast<std::size_t>(x)];
    }
    for (std::int64_t x = 0; x < a.ksize; ++x) {
      double v = x < xmax ? (ww != 0.0 ? pre[static_cast<std::size_t>(x)] / ww : pre[static_cast<std::size_t>(x)]) : 0.0;
      v = v * std::ldexp(1.0, precision_bits) + (v < 0 ? -0.5 : 0.5);
      a.w[static_cast<std::size_t>(xx * a.ksize + x)] = static_cast<std::int32_t>(v);
    }
    a.first[static_cast<std::size_t>(xx)] = xmin;
    a.count[static_cast<std::size_t>(xx)] = xmax;
  }
  return a;
}

std::uint8_t clip8(std::int64_t v) { return static_cast<std::uint8_t>(std::clamp<std::int64_t>(v, 0, 255)); }

}  // namespace

image_u8 resize(const image_u8& img, std::int64_t width, std::int64_t height, resample how) {
  if (img.width == width && img.height == height) return img;
  image_u8 cur = img;
  if (width != img.width) {  // horizontal pass
    const auto a = weights_for(img.width, width, how);
    image_u8 out{width, cur.height, std::vector<std::uint8_t>(static_cast<std::size_t>(width * cur.height * 3))};
    for (std::int64_t y = 0; y < cur.height; ++y)
      for (std::int64_t xx = 0; xx < width; ++xx) {
        std::int32_t s[3] = {1 << (precision_bits - 1), 1 << (precision_bits - 1), 1 << (precision_bits - 1)};
        const auto* k = &a.w[static_cast<std::size_t>(xx * a.ksize)];
        const auto* p = &cur.rgb[static_cast<std::size_t>((y * cur.width + a.first[static_cast<std::size_t>(xx)]) * 3)];
        for (std::int64_t x = 0; x < a.count[static_cast<std::size_t>(xx)]; ++x, p += 3)
          for (int c = 0; c < 3; ++c) s[c] += p[c] * k[x];
        for (int c = 0; c < 3; ++c) out.rgb[static_cast<std::size_t>((y * width + xx) * 3 + c)] = clip8(s[c] >> precision_bits);
      }
    cur = std::move(out);
  }
  if (height != img.height) {  // vertical pass
    const auto a = weights_for(img.height, height, how);
    const std::int64_t row = cur.width * 3;
    image_u8 out{cur.width, height, std::vector<std::uint8_t>(static_cast<std::size_t>(row * height))};
    std::vector<std::int32_t> acc(static_cast<std::size_t>(row));
    for (std::int64_t yy = 0; yy < height; ++yy) {
      std::fill(acc.begin(), acc.end(), 1 << (precision_bits - 1));
      const auto* k = &a.w[static_cast<std::size_t>(yy * a.ksize)];
      for (std::int64_t y = 0; y < a.count[static_cast<std::size_t>(yy)]; ++y) {
        const auto* src = &cur.rgb[static_cast<std::size_t>((a.first[static_cast<std::size_t>(yy)] + y) * row)];
        for (std::int64_t i = 0; i < row; ++i) acc[static_cast<std::size_t>(i)] += src[i] * k[y];
      }
      for (std::int64_t i = 0; i < row; ++i) out.rgb[static_cast<std::size_t>(yy * row + i)] = clip8(acc[static_cast<std::size_t>(i)] >> precision_bits);
    }
    cur = std::move(out);
  }
  return cur;
}

}  // namespace troupe::families

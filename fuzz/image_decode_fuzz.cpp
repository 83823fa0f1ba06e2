// Feeds arbitrary bytes to the image front end (families/vision/image.hpp): decode_image (libpng,
// libjpeg-turbo) either decodes an RGB image of at most 1 Mi pixels or refuses with a reason; a decoded
// image is resampled to a few sizes with each filter, which must give the asked size. (stb_image, the
// first reader here, failed this target within a minute: PNM and JPEG memory errors.)

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "families/vision/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::families;
  auto img = decode_image(std::span(data, size), std::int64_t{1} << 20);
  if (!img) return 0;
  if (img->width < 1 || img->height < 1 || static_cast<std::int64_t>(img->rgb.size()) != img->width * img->height * 3) std::abort();
  const std::int64_t w = 1 + static_cast<std::int64_t>(size % 37), h = 1 + static_cast<std::int64_t>(size % 23);
  for (auto how : {resample::bilinear, resample::bicubic, resample::lanczos}) {
    const auto r = resize(*img, w, h, how);
    if (r.width != w || r.height != h || static_cast<std::int64_t>(r.rgb.size()) != w * h * 3) std::abort();
  }
  return 0;
}

// Feeds arbitrary bytes to the safetensors reader twice: as a whole file, and as the JSON header of a
// file whose length field and data section are made up around it (so most inputs reach the header
// checks instead of failing on the length). Every accepted tensor's bytes are read, so a view that
// points outside the input is caught by AddressSanitizer.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/load/safetensors.hpp"

namespace {

using troupe::load::safetensors_file;

volatile unsigned sink = 0;

void exercise(const troupe::result<safetensors_file, troupe::load::load_error>& r) {
  if (!r) {
    sink = sink + static_cast<unsigned>(r.error().message().size());
    return;
  }
  unsigned sum = 0;
  for (const auto& t : r->tensors()) {
    for (const std::byte b : t.view.byte_span()) sum += static_cast<unsigned>(b);
    if (!r->find(t.name)) __builtin_trap();  // every listed tensor must be found by its name
  }
  for (const auto& [k, v] : r->metadata()) sum += static_cast<unsigned>(k.size() + v.size());
  sink = sink + sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  exercise(safetensors_file::parse({bytes, size}, "fuzz.safetensors"));

  constexpr std::size_t data_section = 256;
  std::vector<std::byte> image(8 + size + data_section);
  for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>((static_cast<std::uint64_t>(size) >> (8 * i)) & 0xff);
  for (std::size_t i = 0; i < size; ++i) image[8 + i] = bytes[i];
  for (std::size_t i = 0; i < data_section; ++i) image[8 + size + i] = static_cast<std::byte>(i);
  exercise(safetensors_file::parse(image, "fuzz.safetensors"));
  return 0;
}

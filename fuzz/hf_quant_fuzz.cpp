// Feeds arbitrary bytes to the quantized-checkpoint reader: a 4-byte little-endian length L, L bytes of
// config.json, and the rest a safetensors image. Whatever the config and the tensors say (shapes that
// disagree, packed words out of range, groups past the scales, zero points past 255), parsing and
// converting either succeed with every row form's bytes in bounds or fail with a load_error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "engine/load/hf_quant.hpp"
#include "engine/load/safetensors.hpp"

namespace {
volatile unsigned sink = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::load;
  if (size < 4) return 0;
  std::uint32_t len;
  std::memcpy(&len, data, 4);
  if (len > size - 4) return 0;
  const std::string_view config(reinterpret_cast<const char*>(data + 4), len);
  auto q = parse_hf_quant(config, "", "fuzz.json");
  if (!q || !*q) {
    if (!q) sink = sink + static_cast<unsigned>(q.error().message().size());
    return 0;
  }
  const auto* rest = reinterpret_cast<const std::byte*>(data + 4 + len);
  auto file = safetensors_file::parse(std::span<const std::byte>(rest, size - 4 - len), "fuzz.safetensors");
  if (!file) return 0;
  std::vector<std::string> names;
  for (const auto& t : file->tensors()) names.push_back(t.name);
  auto find = [&](std::string_view n) { return file->find(n); };
  auto linears = convert_hf_quant(**q, names, find, "fuzz.json");
  if (!linears) {
    sink = sink + static_cast<unsigned>(linears.error().message().size());
    return 0;
  }
  unsigned sum = 0;
  for (const auto& l : *linears) {
    const auto v = l.weight.view();
    for (std::size_t i = 0; i < v.bytes(); i += 97) sum += static_cast<unsigned>(v.data()[i]);
  }
  sink = sink + sum;
  return 0;
}

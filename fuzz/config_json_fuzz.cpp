// Feeds arbitrary text to raw_config as a config.json, then asks every key it lists for every type:
// no input may crash it, and every listed key must be present.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/load/raw_config.hpp"

namespace {
volatile unsigned sink = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using troupe::load::raw_config;
  const auto c = raw_config::from_json_string({reinterpret_cast<const char*>(data), size}, "fuzz.json");
  if (!c) {
    sink = sink + static_cast<unsigned>(c.error().message().size());
    return 0;
  }
  unsigned sum = 0;
  for (const auto& key : c->keys()) {
    if (!c->has(key)) __builtin_trap();
    sum += c->get_int(key).has_value() + c->get_float(key).has_value() + c->get_bool(key).has_value() +
           c->get_string(key).has_value() + c->get_int_array(key).has_value() + c->get_float_array(key).has_value() +
           c->get_string_array(key).has_value();
  }
  sum += c->has("a.b.c");
  sink = sink + sum;
  return 0;
}

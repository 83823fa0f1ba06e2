// Feeds arbitrary bytes to the GGUF reader. What it accepts is walked completely (metadata, nested
// arrays, every tensor byte, the raw_config view of the metadata) and written back with gguf_writer: a
// file the reader accepted must be writable, and the written file must read back and write again to
// the same bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/load/gguf.hpp"
#include "engine/load/raw_config.hpp"

namespace {

using namespace troupe::load;

volatile unsigned sink = 0;

unsigned walk(const gguf_value& v) {
  if (const auto* a = v.get_if<gguf_array>()) {
    unsigned n = static_cast<unsigned>(a->type);
    for (std::size_t i = 0; i < a->size(); ++i) n += walk(a->at(i));
    return n;
  }
  if (const auto* s = v.get_if<std::string>()) return static_cast<unsigned>(s->size());
  return static_cast<unsigned>(v.as_int().value_or(0)) + static_cast<unsigned>(v.type());
}

troupe::result<std::vector<std::byte>, load_error> rewrite(const gguf_file& f) {
  gguf_writer w({.version = f.version(), .alignment = f.alignment()});
  for (const auto& kv : f.metadata()) w.add(kv.key, kv.value);
  for (const auto& t : f.tensors()) w.add_tensor(t.name, t.view);
  return w.serialize("rewrite.gguf");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto r = gguf_file::parse({reinterpret_cast<const std::byte*>(data), size}, "fuzz.gguf");
  if (!r) {
    sink = sink + static_cast<unsigned>(r.error().message().size());
    return 0;
  }
  unsigned sum = 0;
  for (const auto& kv : r->metadata()) sum += walk(kv.value);
  for (const auto& t : r->tensors()) {
    for (const std::byte b : t.view.byte_span()) sum += static_cast<unsigned>(b);
    if (!r->find(t.name)) __builtin_trap();
  }
  const auto config = raw_config::from_gguf(*r);
  for (const auto& key : config.keys()) {
    sum += config.get_int(key).has_value() + config.get_float(key).has_value() + config.get_bool(key).has_value() +
           config.get_string(key).has_value() + config.get_int_array(key).has_value() +
           config.get_float_array(key).has_value() + config.get_string_array(key).has_value();
  }
  sink = sink + sum;

  // Padding to a huge (valid) alignment would only measure the allocator.
  if (r->alignment() > 65536) return 0;
  const auto first = rewrite(*r);
  if (!first) __builtin_trap();
  const auto again = gguf_file::parse(*first, "rewrite.gguf");
  if (!again) __builtin_trap();
  const auto second = rewrite(*again);
  if (!second || *second != *first) __builtin_trap();
  return 0;
}

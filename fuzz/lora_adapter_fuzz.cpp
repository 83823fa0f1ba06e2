// Feeds arbitrary bytes to the LoRA adapter readers: the first byte picks the form. PEFT: the rest is an
// adapter_config.json text (parse_peft_config). GGUF: the rest is a GGUF image read as llama.cpp's LoRA
// file would be (written to a temporary file, read_gguf_lora). Either reads or refuses with a
// load_error; every pair it returns has an A of the adapter's rank and a B of the same rank.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "engine/load/peft.hpp"

namespace {
volatile unsigned sink = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::load;
  if (size < 1) return 0;
  const bool gguf = data[0] & 1;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  troupe::result<peft_adapter, load_error> a = troupe::unexpected(load_error{});
  if (!gguf) {
    a = parse_peft_config(rest, "fuzz.json");
  } else {
    static const std::string path = "/tmp/troupe-lora-fuzz-" + std::to_string(::getpid()) + ".gguf";
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(rest.data(), 1, rest.size(), f);
      std::fclose(f);
      a = read_gguf_lora(path);
    }
  }
  if (!a) {
    sink = sink + static_cast<unsigned>(a.error().message().size());
    return 0;
  }
  for (const auto& m : a->modules)
    if (m.a.shape().rank() != 2 || m.b.shape().rank() != 2 || m.a.shape()[0] != a->rank || m.b.shape()[1] != a->rank) __builtin_trap();
  sink = sink + static_cast<unsigned>(a->modules.size()) + static_cast<unsigned>(a->scale() > 0);
  return 0;
}

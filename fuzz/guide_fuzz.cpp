// Feeds arbitrary text to the constrained-decoding parsers: the first byte picks GBNF, a JSON schema or
// a regular expression, the rest is the source; what compiles is run over a few inputs (the source's
// own bytes as a candidate sentence, step by step). No input may crash, hang, exhaust the stack or
// grow without bound; every refusal is a typed guide_error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/guide/automaton.hpp"
#include "engine/guide/grammar.hpp"
#include "engine/guide/json_schema.hpp"
#include "engine/guide/regex_gbnf.hpp"

namespace {
volatile std::size_t sink = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 4096) return 0;
  const std::string_view source(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace troupe::guide;
  std::string gbnf;
  switch (data[0] % 3) {
    case 0: gbnf = std::string(source); break;
    case 1: {
      auto g = json_schema_to_gbnf(source);
      if (!g) {
        sink = sink + g.error().message().size();
        return 0;
      }
      gbnf = std::move(*g);
      break;
    }
    default: {
      auto g = regex_to_gbnf(source, "root");
      if (!g) {
        sink = sink + g.error().message().size();
        return 0;
      }
      gbnf = std::move(*g);
      break;
    }
  }
  grammar_limits limits;
  limits.max_elements = 1u << 16;
  limits.max_repeat = 256;
  auto g = parse_gbnf(gbnf, "root", limits);
  if (!g) {
    sink = sink + g.error().message().size();
    // A generated grammar always parses: a failure here is the generator's bug.
    if (data[0] % 3 != 0 && g.error().code != guide_error_code::too_large) __builtin_trap();
    return 0;
  }
  automaton a(std::make_shared<const grammar>(std::move(*g)));
  auto s = a.start();
  for (char c : source) {
    s = a.next(s, static_cast<std::uint8_t>(c));
    if (s == automaton::dead) break;
    a.maybe_reset(4096, 1u << 16);
  }
  sink = sink + a.states();
  return 0;
}

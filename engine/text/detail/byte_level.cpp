#include "engine/text/detail/byte_level.hpp"

#include <array>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text::detail {

namespace {

struct tables {
  std::array<std::string, 256> encoded;  // byte -> UTF-8 of its character
  std::array<int, 512> decoded{};        // character (all lie below U+0200) -> byte, or -1
  tables() {
    decoded.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      append_utf8(encoded[b], c);
      decoded[c] = b;
    }
  }
};

const tables& the_tables() {
  static const tables t;
  return t;
}

}  // namespace

std::string_view byte_level_char(unsigned char b) { return the_tables().encoded[b]; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& t = the_tables();
  for (const char ch : bytes) out += t.encoded[static_cast<unsigned char>(ch)];
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const auto& t = the_tables();
  const std::size_t mark = out.size();
  std::size_t i = 0;
  while (i < token.size()) {
    const char32_t c = next_scalar(token, i);
    if (c >= t.decoded.size() || t.decoded[c] < 0) {
      out.resize(mark);
      return false;
    }
    out += static_cast<char>(t.decoded[c]);
  }
  return true;
}

}  // namespace troupe::text::detail

// Feeds arbitrary bytes to the transport codec's decoder (every actor's first contact with a peer's
// bytes). What it accepts must encode again, and that encoding must decode and encode to the same bytes; nothing may throw, crash
// or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "transport/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::transport;
  decode_limits limits;
  limits.max_bytes = 1 << 20;
  limits.traversal_words = 1 << 17;
  auto m = decode(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!m) return 0;
  // Compared as bytes: a NaN field makes == false on equal messages.
  const auto bytes = encode(*m);
  auto again = decode(bytes);
  if (!again || encode(*again) != bytes) std::abort();
  return 0;
}

#pragma once
// Between the domain messages (transport/messages.hpp) and their wire bytes (a Cap'n Proto Envelope,
// unpacked, flat). Decoding never throws: bytes over the size bound, bytes that are not whole words,
// a malformed or over-deep or over-large structure (Cap'n Proto's traversal and nesting limits), an
// unknown body kind and values out of range are all typed errors.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/result.hpp"
#include "transport/messages.hpp"

namespace troupe::transport {

struct decode_limits {
  std::size_t max_bytes = std::size_t{8} << 20;       // the whole message
  std::uint64_t traversal_words = std::uint64_t{2} << 20;  // words a reader may visit (16 MiB), and at most
                                                          // twice the message's own words
  int nesting = 16;                                   // pointer depth
};

enum class decode_error_code : std::uint8_t {
  too_large,       // more bytes than max_bytes
  not_words,       // empty, or not a whole number of 8-byte words
  malformed,       // Cap'n Proto refused the structure (bad pointers, truncation, limits)
  unknown_kind,    // a body this build does not know (a newer sender)
  bad_version,     // version 0 (never sent by a troupe)
  bad_value,       // a field out of range (negative max tokens, an unknown enum, ...)
};
std::string_view name(decode_error_code c);

struct decode_error {
  decode_error_code code;
  std::string reason;
  std::string message() const;
  // What the receiver tells the sender.
  transport::retry retry() const { return code == decode_error_code::unknown_kind ? retry::unimplemented : retry::failed; }
};

std::string encode(const message& m);
result<message, decode_error> decode(std::string_view bytes, const decode_limits& limits = {});

// The kind of a message, for logs and dispatch: "submit", "chunk", ...
std::string_view kind(const message& m);

}  // namespace troupe::transport
